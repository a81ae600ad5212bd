//! The collector's storage: one gzip'd pprof file per received profile,
//! `ROOT/HOST/DAY/START-END-HASH.pb.gz` (DAY = UTC day of the window start,
//! START/END = the window in ns since the Unix epoch, HASH = xxh3 of the
//! content, so the same profile received twice, e.g. retried after a lost
//! answer, is stored once).
//!
//! Writes are durable: a temporary file in the destination directory,
//! fsync, rename, fsync of the directory (and of directories created on
//! the way). Files are created 0600 and directories 0700 by default (less
//! the umask; `--profile-mode` loosens both): profiles name every sampled
//! process and hold kernel addresses. The names carry everything a listing needs, so listing reads
//! directories only. Temporary files start with `.` and are never listed.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::util::files::{sync_dir, write_atomic};

const SUFFIX: &str = ".pb.gz";

/// One stored profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredProfile {
    /// Host it came from (sanitized for the file system).
    pub host: String,
    /// Window start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Window end, ns since the Unix epoch.
    pub end_unix_ns: u64,
    /// The file (gzip'd pprof).
    pub path: PathBuf,
    /// File size, bytes.
    pub size: u64,
}

/// Which profiles a listing or merge wants: the host (exact) and the time
/// range `[from, to)`, ns since the Unix epoch; a profile is in the range
/// if its window overlaps it.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Only this host.
    pub host: Option<String>,
    /// Windows ending after this.
    pub from: Option<u64>,
    /// Windows starting before this.
    pub to: Option<u64>,
}

impl Filter {
    fn matches(&self, p: &StoredProfile) -> bool {
        self.host
            .as_ref()
            .is_none_or(|h| sanitize_host(h) == p.host)
            && self
                .from
                .is_none_or(|from| p.end_unix_ns > from || p.start_unix_ns >= from)
            && self.to.is_none_or(|to| p.start_unix_ns < to)
    }
}

/// A host name made safe as one path component: `[A-Za-z0-9._-]` kept,
/// anything else and leading dots become `_`; empty becomes `unknown`.
pub fn sanitize_host(host: &str) -> String {
    let clean: String = host
        .chars()
        .take(253)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        return "unknown".to_string();
    }
    // No leading dot: `.` and `..` are not names, and dot files are hidden.
    let dots = clean.len() - clean.trim_start_matches('.').len();
    format!("{}{}", "_".repeat(dots), &clean[dots..])
}

/// The storage directory.
#[derive(Debug)]
pub struct Storage {
    root: PathBuf,
    /// Mode of stored files (before the umask).
    file_mode: u32,
}

/// A builder of directories for files of `file_mode`: its read and write
/// bits, and search where it reads (0600 -> 0700, 0640 -> 0750), less the umask.
pub(super) fn dir_builder(file_mode: u32) -> fs::DirBuilder {
    let mut builder = fs::DirBuilder::new();
    builder.mode(file_mode | ((file_mode & 0o444) >> 2));
    builder
}

/// Create `dir` and any missing parents up to `root`, syncing each parent
/// that gained an entry.
pub(super) fn create_dirs(root: &Path, dir: &Path, file_mode: u32) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        if parent != root && parent.starts_with(root) {
            create_dirs(root, parent, file_mode)?;
        }
    }
    match dir_builder(file_mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

fn parse_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(SUFFIX)?;
    let mut parts = stem.splitn(3, '-');
    let start = parts.next()?.parse().ok()?;
    let end = parts.next()?.parse().ok()?;
    parts.next()?;
    Some((start, end))
}

impl Storage {
    /// Use (and create if missing) `root`, storing files of `file_mode`
    /// (before the umask). Errors if it cannot be created.
    pub fn open(root: &Path, file_mode: u32) -> Result<Self> {
        dir_builder(file_mode)
            .recursive(true)
            .create(root)
            .with_context(|| format!("creating {}", root.display()))?;
        Ok(Storage {
            root: root.to_path_buf(),
            file_mode,
        })
    }

    /// The storage directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Store a gzip'd pprof profile of `host`'s window `[start, end)`
    /// durably. Errors are I/O errors naming the path.
    pub fn store(
        &self,
        host: &str,
        start_unix_ns: u64,
        end_unix_ns: u64,
        gzipped: &[u8],
    ) -> Result<StoredProfile> {
        let host = sanitize_host(host);
        let dir = self
            .root
            .join(&host)
            .join(crate::util::timefmt::day(start_unix_ns));
        create_dirs(&self.root, &dir, self.file_mode)?;
        let hash = xxhash_rust::xxh3::xxh3_64(gzipped);
        let name = format!("{start_unix_ns}-{end_unix_ns}-{hash:016x}{SUFFIX}");
        let path = dir.join(&name);
        write_atomic(&path, gzipped, self.file_mode)?;
        Ok(StoredProfile {
            host,
            start_unix_ns,
            end_unix_ns,
            path,
            size: gzipped.len() as u64,
        })
    }

    /// The stored profiles that `filter` selects, sorted by start time (then
    /// host). Unreadable directories are skipped.
    pub fn list(&self, filter: &Filter) -> Result<Vec<StoredProfile>> {
        let mut out = Vec::new();
        let keep_host = |host: &str| {
            !host.starts_with('.')
                && filter
                    .host
                    .as_ref()
                    .is_none_or(|h| sanitize_host(h) == host)
        };
        walk_host_days(&self.root, keep_host, |host, file| {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                return;
            }
            let Some((start, end)) = parse_name(&name) else {
                return;
            };
            let profile = StoredProfile {
                host: host.to_string(),
                start_unix_ns: start,
                end_unix_ns: end,
                path: file.path(),
                size: file.metadata().map_or(0, |m| m.len()),
            };
            if filter.matches(&profile) {
                out.push(profile);
            }
        })?;
        out.sort_by(|a, b| {
            (a.start_unix_ns, &a.host, &a.path).cmp(&(b.start_unix_ns, &b.host, &b.path))
        });
        Ok(out)
    }

    /// The bytes of a stored profile (gzip'd pprof).
    pub fn read(&self, profile: &StoredProfile) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        File::open(&profile.path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .with_context(|| format!("reading {}", profile.path.display()))?;
        Ok(bytes)
    }
}

/// Calls `visit(host, file)` for every entry of every `root/HOST/DAY/`
/// (the layout of the archive and of the sample store's blocks), for the
/// host directories whose name `keep_host` accepts; entries of `root` that
/// are not directories, and host or day directories that cannot be read,
/// are skipped. Errors: `root` cannot be listed.
pub(crate) fn walk_host_days(
    root: &Path,
    mut keep_host: impl FnMut(&str) -> bool,
    mut visit: impl FnMut(&str, fs::DirEntry),
) -> Result<()> {
    let hosts = fs::read_dir(root).with_context(|| format!("listing {}", root.display()))?;
    for host in hosts.flatten() {
        let host_name = host.file_name().to_string_lossy().into_owned();
        if !keep_host(&host_name) || !host.path().is_dir() {
            continue;
        }
        let Ok(days) = fs::read_dir(host.path()) else {
            continue;
        };
        for day in days.flatten() {
            let Ok(files) = fs::read_dir(day.path()) else {
                continue;
            };
            for file in files.flatten() {
                visit(&host_name, file);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::files::PROFILE_MODE;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn stores_lists_and_filters() {
        let _umask = crate::util::files::UMASK
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(&dir.path().join("store"), PROFILE_MODE).unwrap();
        let s = 1_000_000_000u64;
        let t = 1_714_564_800 * s;
        let a = storage.store("web-1", t, t + s, b"a").unwrap();
        storage.store("web-1", t + s, t + 2 * s, b"b").unwrap();
        storage.store("../etc", t + s, t + 2 * s, b"c").unwrap();
        // The same content again is the same file.
        assert_eq!(storage.store("web-1", t, t + s, b"a").unwrap().path, a.path);
        assert!(a
            .path
            .starts_with(dir.path().join("store/web-1/2024-05-01")));
        assert_eq!(storage.read(&a).unwrap(), b"a");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        // Private whatever the umask (0022 or 0077 here) allows.
        assert_eq!(mode(&a.path), 0o600);
        assert_eq!(mode(&dir.path().join("store")), 0o700);
        assert_eq!(mode(&dir.path().join("store/web-1/2024-05-01")), 0o700);
        let all = storage.list(&Filter::default()).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].start_unix_ns, t);
        assert!(all.iter().any(|p| p.host == "___etc"));
        let web = Filter {
            host: Some("web-1".into()),
            ..Default::default()
        };
        assert_eq!(storage.list(&web).unwrap().len(), 2);
        let second = Filter {
            from: Some(t + s),
            to: Some(t + 2 * s),
            ..Default::default()
        };
        let got = storage.list(&second).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|p| p.start_unix_ns == t + s));
        assert_eq!(sanitize_host(".."), "__");
        assert_eq!(sanitize_host(""), "unknown");
        assert_eq!(sanitize_host("a/b c"), "a_b_c");
    }
}
