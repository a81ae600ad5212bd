//! Whether the storage takes writes: which failures may pass (a full disk,
//! a quota, an I/O error), the counters `/metrics` shows, and the log lines
//! of a failure episode (one when writes start failing, one when they work
//! again, not one per request).
//!
//! Every file the store writes goes through [`write_file`], which unit
//! tests can make fail ([`fail_writes_after`]) to check that a failed
//! ingest leaves nothing behind.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::Result;
use tracing::warn;

/// Whether `error` is a storage failure that may pass with time: no space
/// left (`ENOSPC`), a quota reached (`EDQUOT`) or an I/O error (`EIO`), on
/// any write, fsync, rename or directory creation in its chain. The
/// collector answers these with `503 Service Unavailable` and `Retry-After`
/// so that the sender keeps the data and tries again.
pub fn is_transient(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.raw_os_error(),
                Some(libc::ENOSPC | libc::EDQUOT | libc::EIO)
            ) || matches!(
                io.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            )
        })
    })
}

/// Failed and recovered writes of one storage root, for `/metrics` and the
/// log.
#[derive(Debug, Default)]
pub struct Health {
    /// Requests whose storing failed (any cause), monotonic.
    pub failed_writes: AtomicU64,
    /// Of those, the ones answered 503 (a failure that may pass).
    pub unavailable: AtomicU64,
    /// Whether the last write failed (an episode is going on).
    failing: AtomicBool,
    /// Failed writes in the current episode.
    episode: AtomicU64,
}

impl Health {
    /// Count a failed write; the first of an episode is logged (as a
    /// warning, with `error`), later ones are not.
    pub fn failed(&self, error: &anyhow::Error) {
        self.failed_writes.fetch_add(1, Ordering::Relaxed);
        let transient = is_transient(error);
        if transient {
            self.unavailable.fetch_add(1, Ordering::Relaxed);
        }
        self.episode.fetch_add(1, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            let answer = if transient {
                "answering 503 with Retry-After until a write succeeds"
            } else {
                "answering 500"
            };
            warn!("storing received samples failed: {error:#}; {answer}");
        }
    }

    /// Note a successful write; ends an episode with one log line.
    pub fn succeeded(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            let n = self.episode.swap(0, Ordering::Relaxed);
            warn!("storage writable again after {n} failed request(s)");
        }
    }

    /// Whether writes are failing now (the last one failed).
    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

/// Bytes free for an unprivileged writer on the file system of `path`
/// (`statvfs`'s `f_bavail · f_frsize`); `None` if it cannot be read.
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a zeroed struct to fill.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    let (avail, fragment): (u64, u64) = (stat.f_bavail, stat.f_frsize);
    (rc == 0).then(|| avail.saturating_mul(fragment))
}

/// Write `bytes` to `path` atomically ([`crate::util::files::write_atomic`]); the
/// one way the store writes a file.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    #[cfg(test)]
    faults::check(path)?;
    crate::util::files::write_atomic(path, bytes, mode)
}

/// Make the store's writes fail, in tests: after `n` more successful file
/// writes on this thread, every write fails with `ENOSPC` until
/// [`heal_writes`]. Blocks and stack-table segments count alike.
#[cfg(test)]
pub fn fail_writes_after(n: u32) {
    faults::LEFT.with(|left| left.set(Some(n)));
}

/// Let the store's writes succeed again (see [`fail_writes_after`]).
#[cfg(test)]
pub fn heal_writes() {
    faults::LEFT.with(|left| left.set(None));
}

#[cfg(test)]
mod faults {
    use std::cell::Cell;
    use std::path::Path;

    use anyhow::Context;

    thread_local! {
        pub static LEFT: Cell<Option<u32>> = const { Cell::new(None) };
    }

    pub fn check(path: &Path) -> anyhow::Result<()> {
        LEFT.with(|left| match left.get() {
            Some(0) => Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
                .with_context(|| format!("writing {}", path.display())),
            Some(n) => {
                left.set(Some(n - 1));
                Ok(())
            }
            None => Ok(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn full_disks_quotas_and_io_errors_may_pass_others_not() {
        for code in [libc::ENOSPC, libc::EDQUOT, libc::EIO] {
            let e = Err::<(), _>(std::io::Error::from_raw_os_error(code))
                .context("renaming into x")
                .unwrap_err();
            assert!(is_transient(&e), "{e:#}");
        }
        let denied = anyhow::Error::from(std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(!is_transient(&denied));
        assert!(!is_transient(&anyhow::anyhow!("a bug")));
    }

    #[test]
    fn an_episode_logs_once_and_counts_every_failure() {
        let health = Health::default();
        let full = anyhow::Error::from(std::io::Error::from_raw_os_error(libc::ENOSPC));
        for _ in 0..3 {
            health.failed(&full);
        }
        assert!(health.is_failing());
        assert_eq!(health.failed_writes.load(Ordering::Relaxed), 3);
        assert_eq!(health.unavailable.load(Ordering::Relaxed), 3);
        health.succeeded();
        assert!(!health.is_failing());
        assert_eq!(health.episode.load(Ordering::Relaxed), 0);
    }
}
