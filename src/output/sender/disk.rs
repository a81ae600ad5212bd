//! The local-disk sender: writes each profile to a file atomically
//! ([`crate::util::files::write_atomic_with`], encoding straight into it), so a
//! reader never sees a half-written profile.
//!
//! In continuous mode ([`WindowFiles`]) each window gets its own file per
//! format, named after the window's start (UTC): `--profile-name`
//! `profile.pb` becomes `profile-20240501T120000.000Z.pb`; with
//! `--max-profiles N` only the newest N such files per format are kept.

use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use tracing::{debug, info, warn};

use super::{Sender, SenderReport};
use crate::profile::format::{self, Compression, EmptyProfile, ProfileFormat};
use crate::profile::Profile;
use crate::util::files::write_atomic_with;

/// Bytes of encoded profile gathered before each write to a profile's file
/// (a window's, or a one-shot run's output).
const WRITE_BUFFER_BYTES: usize = 1 << 16;

/// Encode `profile` as `format` straight into the file at `path`, through
/// a buffer of [`WRITE_BUFFER_BYTES`], atomically
/// ([`write_atomic_with`]: nothing appears at `path` when encoding or
/// writing fails), with permission bits `mode`. Returns the bytes written.
/// Errors: the encoder's and the file system's, naming the path.
pub fn write_profile(
    profile: &Profile,
    format: ProfileFormat,
    compression: Compression,
    path: &Path,
    mode: u32,
) -> Result<u64> {
    let mut bytes = 0;
    write_atomic_with(path, mode, |file| {
        let mut out = CountingWriter {
            inner: BufWriter::with_capacity(WRITE_BUFFER_BYTES, file),
            bytes: 0,
        };
        format::encode_to(profile, format, compression, &mut out)?;
        out.flush()?;
        bytes = out.bytes;
        Ok(())
    })?;
    Ok(bytes)
}

/// A writer that counts the bytes written through it.
struct CountingWriter<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The file a window starting at `start_unix_ns` is written to, for the
/// single-profile path `base`: the window's UTC start is inserted before the
/// extension (`dir/profile.pb` -> `dir/profile-20240501T120000.000Z.pb`).
pub fn window_path(base: &Path, start_unix_ns: u64) -> PathBuf {
    let (stem, ext) = split_name(base);
    let name = format!(
        "{stem}-{}{ext}",
        crate::util::timefmt::compact(start_unix_ns)
    );
    base.with_file_name(name)
}

/// `profile.pb` -> (`profile`, `.pb`), `profile.json.gz` -> (`profile`,
/// `.json.gz`), `profile.otlp.pb` -> (`profile`, `.otlp.pb`) (the default
/// names' double extensions stay whole); a name without extension has `""`.
fn split_name(base: &Path) -> (String, String) {
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = [".json.gz", ".otlp.pb"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext).filter(|stem| !stem.is_empty()));
    let ext_start = match stem {
        Some(stem) => Some(stem.len()),
        None => name.rfind('.'),
    };
    match ext_start {
        Some(dot) if dot > 0 => (name[..dot].to_string(), name[dot..].to_string()),
        _ => (name, String::new()),
    }
}

/// Whether `name` is a window file of `base` (`stem-YYYYMMDDTHHMMSS.mmmZext`).
fn is_window_file(name: &str, stem: &str, ext: &str) -> bool {
    let Some(middle) = name
        .strip_prefix(stem)
        .and_then(|r| r.strip_prefix('-'))
        .and_then(|r| r.strip_suffix(ext))
    else {
        return false;
    };
    let b = middle.as_bytes();
    b.len() == 20
        && b[8] == b'T'
        && b[15] == b'.'
        && b[19] == b'Z'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 8 | 15 | 19) || c.is_ascii_digit())
}

/// Delete all but the newest `keep` window files of `base` (their names
/// sort by time). Returns the files deleted.
pub fn prune_windows(base: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let dir = base
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let (stem, ext) = split_name(base);
    let mut names: Vec<String> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| is_window_file(n, &stem, &ext))
        .collect();
    names.sort();
    let excess = names.len().saturating_sub(keep);
    let mut deleted = Vec::new();
    for name in names.into_iter().take(excess) {
        let path = dir.join(name);
        match fs::remove_file(&path) {
            Ok(()) => deleted.push(path),
            Err(err) => warn!("cannot delete old profile {}: {err}", path.display()),
        }
    }
    Ok(deleted)
}

/// The continuous-mode disk sender: one file per window and format.
pub struct WindowFiles {
    outputs: Vec<(ProfileFormat, PathBuf)>,
    compression: Compression,
    max_profiles: Option<usize>,
    mode: u32,
    written: Vec<PathBuf>,
    count: u64,
    /// Windows of which no file was written (no samples, and only formats
    /// that cannot draw an empty profile).
    windows_empty: u64,
}

impl WindowFiles {
    /// Write each window in every `(format, base path)` of `outputs` as
    /// files of `mode` (less the umask), keeping the newest `max_profiles`
    /// files per format if given.
    pub fn new(
        outputs: Vec<(ProfileFormat, PathBuf)>,
        compression: Compression,
        max_profiles: Option<usize>,
        mode: u32,
    ) -> Self {
        WindowFiles {
            outputs,
            compression,
            max_profiles,
            mode,
            written: Vec::new(),
            count: 0,
            windows_empty: 0,
        }
    }
}

impl Sender for WindowFiles {
    fn send(&mut self, profile: &Profile) -> Result<()> {
        let mut written = 0;
        for (format, base) in &self.outputs {
            if let Err(EmptyProfile(noun)) = format::check_encodable(profile, *format) {
                info!(
                    "no samples in the window starting {}: no {noun} written",
                    crate::util::timefmt::rfc3339(profile.start_unix_ns),
                );
                continue;
            }
            let path = window_path(base, profile.start_unix_ns);
            // Encoded straight into the file: a 10 s window under process
            // churn is 3.5 MB of gzip'd pprof, which collected in a growing
            // `Vec` took about 10 MiB of resident pages at every close
            // (docs/decisions/0010-window-close-memory.md).
            write_profile(profile, *format, self.compression, &path, self.mode)?;
            debug!("profile written to {}", path.display());
            self.count += 1;
            written += 1;
            self.written.push(path);
            if let Some(keep) = self.max_profiles {
                let deleted = prune_windows(base, keep)?;
                self.written.retain(|p| !deleted.contains(p));
            }
        }
        if written == 0 {
            self.windows_empty += 1;
        }
        Ok(())
    }

    fn finish(self: Box<Self>, _deadline: Instant) -> SenderReport {
        let destination = self
            .outputs
            .first()
            .and_then(|(_, p)| p.parent())
            .map_or_else(|| ".".to_string(), |p| p.display().to_string());
        SenderReport {
            destination,
            files: self.written,
            delivery: None,
            windows_empty: self.windows_empty,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::files::{write_atomic, PROFILE_MODE};

    #[test]
    fn window_files_are_named_by_start_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("profile.pb");
        let second = 1_000_000_000u64;
        let t = 1_714_564_800 * second; // 2024-05-01T12:00:00Z
        assert_eq!(
            window_path(&base, t).file_name().unwrap(),
            "profile-20240501T120000.000Z.pb"
        );
        // The double extension of the firefox format stays whole.
        assert_eq!(
            window_path(&dir.path().join("profile.json.gz"), t)
                .file_name()
                .unwrap(),
            "profile-20240501T120000.000Z.json.gz"
        );
        assert_eq!(
            window_path(&dir.path().join("profile.otlp.pb"), t)
                .file_name()
                .unwrap(),
            "profile-20240501T120000.000Z.otlp.pb"
        );
        for i in 0..5 {
            write_atomic(&window_path(&base, t + i * second), b"x", PROFILE_MODE).unwrap();
        }
        fs::write(dir.path().join("profile.pb"), b"keep").unwrap();
        fs::write(dir.path().join("profile-other.pb"), b"keep").unwrap();
        let deleted = prune_windows(&base, 2).unwrap();
        assert_eq!(deleted.len(), 3);
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                "profile-20240501T120003.000Z.pb",
                "profile-20240501T120004.000Z.pb",
                "profile-other.pb",
                "profile.pb"
            ]
        );
    }

    #[test]
    fn a_window_without_samples_counts_as_empty_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("flamegraph.svg");
        let pb = dir.path().join("profile.pb");
        let empty = Profile::default();
        let mut only_svg = Box::new(WindowFiles::new(
            vec![(ProfileFormat::FlameGraph, svg.clone())],
            Compression::None,
            None,
            PROFILE_MODE,
        ));
        only_svg.send(&empty).unwrap();
        let report = only_svg.finish(Instant::now());
        assert_eq!(report.windows_empty, 1);
        assert!(report.files.is_empty());
        // A format that encodes an empty profile writes the window.
        let mut both = Box::new(WindowFiles::new(
            vec![(ProfileFormat::Pprof, pb), (ProfileFormat::FlameGraph, svg)],
            Compression::None,
            None,
            PROFILE_MODE,
        ));
        both.send(&empty).unwrap();
        let report = both.finish(Instant::now());
        assert_eq!(report.windows_empty, 0);
        assert_eq!(report.files.len(), 1);
    }
}
