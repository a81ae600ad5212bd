//! `--spool-dir DIR`: a network sender's undelivered profiles kept on disk,
//! so that they survive a restart of the agent (a deploy, a crash, an OOM
//! kill).
//!
//! Every profile the queue takes ([`super::queue::Queue::push`]) is written
//! to `DIR/CREATED-SEQ.spool` (CREATED: ns since the Unix epoch, zero-padded,
//! so names sort by age) atomically ([`crate::util::files::write_atomic`]:
//! temporary file, fsync, rename, fsync of the directory) before it is
//! queued, and removed once the server acknowledged it (or refused it for
//! good). What is left at exit stays for the next start, which queues it
//! first, byte for byte as it was (the window's original times; the
//! collector counts a window it already stored once). The spool is bounded:
//! beyond `--spool-max-bytes` the oldest files are removed, and files older
//! than `--spool-max-age` are removed at start and when a profile is added
//! (a removed file's profile may still be delivered from memory).
//!
//! A file is a line `lightswitch-spool 1`, a JSON header line ([`Header`]:
//! host, creation time, description, request headers, body length and
//! xxh3), then the request body. A file of another host, or one that does
//! not check, is skipped and counted, and moved to `DIR/skipped/` (never
//! sent, never deleted). A write that fails (a full disk) leaves the
//! profile in memory only; it is counted and logged once per episode.

use std::collections::VecDeque;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::item::Item;
use crate::util::files::{write_atomic, TMP_PREFIX};

const MAGIC: &[u8] = b"lightswitch-spool 1\n";
const SUFFIX: &str = ".spool";
const SKIPPED_DIR: &str = "skipped";

/// `--spool-dir`, `--spool-max-bytes`, `--spool-max-age`, and the host the
/// spooled profiles belong to.
#[derive(Debug, Clone)]
pub struct SpoolSettings {
    /// The directory (created if missing, mode 0700).
    pub dir: PathBuf,
    /// Most bytes of spool files kept (bodies and headers).
    pub max_bytes: u64,
    /// Files older than this are removed.
    pub max_age: Duration,
    /// This machine's host name; files of another host are skipped.
    pub host: String,
}

/// What the spool did, for the summary and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpoolStats {
    /// Profiles written to the spool.
    pub kept: u64,
    /// Profiles found in the spool at start and queued again.
    pub resent: u64,
    /// Files found at start that belong to another host or do not check:
    /// moved to `DIR/skipped/`.
    pub skipped: u64,
    /// Profiles that could not be written (a full disk): in memory only.
    pub failed: u64,
    /// Files removed undelivered to stay within `--spool-max-bytes` or
    /// `--spool-max-age`.
    pub evicted: u64,
    /// Profiles still undelivered at exit, left in the spool for the next start.
    pub left: u64,
}

impl std::fmt::Display for SpoolStats {
    /// `kept=N resent=N skipped=N failed=N evicted=N left=N`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kept={} resent={} skipped={} failed={} evicted={} left={}",
            self.kept, self.resent, self.skipped, self.failed, self.evicted, self.left
        )
    }
}

/// The header line of a spool file.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    host: String,
    created_unix_ns: u64,
    description: String,
    headers: Vec<(String, String)>,
    body_len: u64,
    body_xxh3: u64,
}

/// One spool file on disk.
#[derive(Debug)]
struct File {
    path: PathBuf,
    bytes: u64,
    created: u64,
}

/// The spool of one network sender (see the module docs).
#[derive(Debug)]
pub struct Spool {
    settings: SpoolSettings,
    files: VecDeque<File>,
    bytes: u64,
    next_seq: u64,
    failing: bool,
    /// The counters so far.
    pub stats: SpoolStats,
}

impl Spool {
    /// Open the spool: create the directory, remove files past their age,
    /// move aside files of other hosts and files that do not check, and
    /// return the profiles found, oldest first, each with its file.
    /// Errors: the directory cannot be created or listed.
    pub fn open(settings: SpoolSettings) -> Result<(Spool, Vec<(PathBuf, Item)>)> {
        let dir = &settings.dir;
        // Private (0700): spooled profiles are profiles.
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .with_context(|| format!("creating --spool-dir {}", dir.display()))?;
        let mut names: Vec<PathBuf> = fs::read_dir(dir)
            .with_context(|| format!("listing --spool-dir {}", dir.display()))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                if name.starts_with(TMP_PREFIX) {
                    // A write cut short by a crash: never renamed, never acknowledged.
                    let _ = fs::remove_file(p);
                    return false;
                }
                name.ends_with(SUFFIX)
            })
            .collect();
        names.sort();
        let mut spool = Spool {
            settings,
            files: VecDeque::new(),
            bytes: 0,
            next_seq: 0,
            failing: false,
            stats: SpoolStats::default(),
        };
        let now = crate::util::timefmt::now_unix_ns();
        let mut found = Vec::new();
        for path in names {
            match read(&path, spool.settings.max_bytes) {
                Ok((header, _)) if header.host != spool.settings.host => {
                    let why = format!("it belongs to host {:?}", header.host);
                    spool.skip(&path, &why);
                }
                Ok((header, _)) if spool.expired(header.created_unix_ns, now) => {
                    spool.stats.evicted += 1;
                    warn!(
                        "spool: {} is older than --spool-max-age: removed",
                        path.display()
                    );
                    let _ = fs::remove_file(&path);
                }
                Ok((header, body)) => {
                    let bytes = fs::metadata(&path).map_or(0, |m| m.len());
                    spool.bytes += bytes;
                    spool.files.push_back(File {
                        path: path.clone(),
                        bytes,
                        created: header.created_unix_ns,
                    });
                    let item = Item {
                        body,
                        headers: header.headers,
                        description: header.description,
                    };
                    found.push((path, item));
                }
                Err(e) => spool.skip(&path, &format!("{e:#}")),
            }
        }
        spool.stats.resent = found.len() as u64;
        if !found.is_empty() {
            info!(
                "spool: sending {} profile(s) kept by an earlier run first",
                found.len()
            );
        }
        Ok((spool, found))
    }

    fn expired(&self, created: u64, now: u64) -> bool {
        now.saturating_sub(created) > self.settings.max_age.as_nanos() as u64
    }

    /// Move `path` to `DIR/skipped/` and count it.
    fn skip(&mut self, path: &Path, why: &str) {
        self.stats.skipped += 1;
        let aside = self.settings.dir.join(SKIPPED_DIR);
        let moved = fs::create_dir_all(&aside)
            .and_then(|()| fs::rename(path, aside.join(path.file_name().unwrap_or_default())));
        match moved {
            Ok(()) => warn!(
                "spool: skipped {} ({why}); moved to {}",
                path.display(),
                aside.display()
            ),
            Err(e) => warn!(
                "spool: skipped {} ({why}); left in place ({e})",
                path.display()
            ),
        }
    }

    /// Write `item` to the spool. Returns its file, and the files removed
    /// to stay within the bounds (their profiles are no longer on disk).
    /// `None` when it could not be written (counted; logged once until a
    /// write succeeds again).
    pub fn keep(&mut self, item: &Item) -> (Option<PathBuf>, Vec<PathBuf>) {
        let now = crate::util::timefmt::now_unix_ns();
        let header = Header {
            host: self.settings.host.clone(),
            created_unix_ns: now,
            description: item.description.clone(),
            headers: item.headers.clone(),
            body_len: item.body.len() as u64,
            body_xxh3: xxhash_rust::xxh3::xxh3_64(&item.body),
        };
        let mut bytes = MAGIC.to_vec();
        // A struct of strings and numbers always serializes.
        bytes.extend(serde_json::to_vec(&header).unwrap_or_default());
        bytes.push(b'\n');
        bytes.extend_from_slice(&item.body);
        let size = bytes.len() as u64;
        let mut evicted = Vec::new();
        if size > self.settings.max_bytes {
            let why = format!("{size} bytes exceed --spool-max-bytes");
            return (self.write_failed(&why), evicted);
        }
        while let Some(oldest) = self.files.front() {
            let over = self.bytes + size > self.settings.max_bytes;
            if !over && !self.expired(oldest.created, now) {
                break;
            }
            let oldest = self.files.pop_front().expect("a front file");
            self.remove_file(&oldest);
            self.stats.evicted += 1;
            evicted.push(oldest.path);
        }
        let path = self
            .settings
            .dir
            .join(format!("{now:020}-{:06}{SUFFIX}", self.next_seq));
        self.next_seq += 1;
        if let Err(e) = write_atomic(&path, &bytes, 0o600) {
            let _ = fs::remove_file(&path);
            return (self.write_failed(&format!("{e:#}")), evicted);
        }
        if std::mem::take(&mut self.failing) {
            info!("spool: writing to {} again", self.settings.dir.display());
        }
        self.stats.kept += 1;
        self.bytes += size;
        self.files.push_back(File {
            path: path.clone(),
            bytes: size,
            created: now,
        });
        (Some(path), evicted)
    }

    fn write_failed(&mut self, why: &str) -> Option<PathBuf> {
        self.stats.failed += 1;
        if !std::mem::replace(&mut self.failing, true) {
            warn!(
                "spool: cannot keep a profile in {}: {why}; it is kept in memory only \
                 (counted as spool failed=)",
                self.settings.dir.display()
            );
        }
        None
    }

    /// The profile in `path` was acknowledged (or refused for good, or
    /// dropped): remove its file.
    pub fn remove(&mut self, path: &Path) {
        if let Some(at) = self.files.iter().position(|f| f.path == path) {
            if let Some(file) = self.files.remove(at) {
                self.remove_file(&file);
            }
        }
    }

    fn remove_file(&mut self, file: &File) {
        self.bytes = self.bytes.saturating_sub(file.bytes);
        if let Err(e) = fs::remove_file(&file.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!("spool: cannot remove {}: {e}", file.path.display());
            }
        }
    }
}

/// Read and check one spool file (at most `max_bytes` plus its header).
fn read(path: &Path, max_bytes: u64) -> Result<(Header, Vec<u8>)> {
    let len = fs::metadata(path)?.len();
    if len > max_bytes.saturating_add(1 << 20) {
        bail!("{len} bytes, more than --spool-max-bytes");
    }
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let rest = bytes
        .strip_prefix(MAGIC)
        .context("not a spool file (no lightswitch-spool 1 line)")?;
    let end = rest
        .iter()
        .position(|&b| b == b'\n')
        .context("no header line")?;
    let header: Header = serde_json::from_slice(&rest[..end]).context("a damaged header")?;
    let body = rest[end + 1..].to_vec();
    if body.len() as u64 != header.body_len {
        bail!(
            "cut short: {} of {} body bytes",
            body.len(),
            header.body_len
        );
    }
    if xxhash_rust::xxh3::xxh3_64(&body) != header.body_xxh3 {
        bail!("its body does not match its checksum");
    }
    Ok((header, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path, host: &str) -> SpoolSettings {
        SpoolSettings {
            dir: dir.to_path_buf(),
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(3600),
            host: host.into(),
        }
    }

    fn item(name: &str, size: usize) -> Item {
        Item {
            body: vec![name.as_bytes()[0]; size],
            headers: vec![("X-Window".into(), name.into())],
            description: name.into(),
        }
    }

    #[test]
    fn kept_profiles_come_back_in_order_and_acknowledged_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spool, found) = Spool::open(settings(dir.path(), "h")).unwrap();
        assert!(found.is_empty());
        let a = spool.keep(&item("a", 10)).0.unwrap();
        spool.keep(&item("b", 20)).0.unwrap();
        spool.keep(&item("c", 30)).0.unwrap();
        spool.remove(&a);
        let (reopened, found) = Spool::open(settings(dir.path(), "h")).unwrap();
        let names: Vec<_> = found.iter().map(|(_, i)| i.description.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(found[1].1.body, vec![b'c'; 30]);
        assert_eq!(found[1].1.headers, item("c", 1).headers);
        assert_eq!(reopened.stats.resent, 2);
    }

    #[test]
    fn other_hosts_and_damaged_files_are_skipped_and_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (mut other, _) = Spool::open(settings(dir.path(), "other")).unwrap();
        other.keep(&item("o", 10)).0.unwrap();
        let (mut mine, _) = Spool::open(settings(dir.path(), "h")).unwrap();
        let torn = mine.keep(&item("t", 100)).0.unwrap();
        let bytes = fs::read(&torn).unwrap();
        fs::write(&torn, &bytes[..bytes.len() - 1]).unwrap();
        fs::write(
            dir.path().join("00000000000000000001-000000.spool"),
            b"junk",
        )
        .unwrap();
        mine.keep(&item("g", 10)).0.unwrap();
        let (spool, found) = Spool::open(settings(dir.path(), "h")).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1.description, "g");
        // The other host's file was moved aside when `mine` opened.
        assert_eq!((mine.stats.skipped, spool.stats.skipped), (1, 2));
        assert_eq!(
            fs::read_dir(dir.path().join(SKIPPED_DIR)).unwrap().count(),
            3
        );
    }

    #[test]
    fn the_oldest_files_go_beyond_the_byte_bound_and_an_impossible_write_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(dir.path(), "h");
        s.max_bytes = 1000;
        let (mut spool, _) = Spool::open(s.clone()).unwrap();
        let first = spool.keep(&item("a", 200)).0.unwrap();
        spool.keep(&item("b", 200)).0.unwrap();
        let (kept, evicted) = spool.keep(&item("c", 200));
        assert!(kept.is_some());
        assert_eq!(evicted, vec![first]);
        assert_eq!(spool.stats.evicted, 1);
        assert!(spool.bytes <= 1000);
        // Too large for the spool at all: in memory only, counted.
        assert_eq!(spool.keep(&item("d", 1000)).0, None);
        assert_eq!(spool.stats.failed, 1);
        let (_, found) = Spool::open(s).unwrap();
        assert_eq!(found.len(), 2);
    }
}
