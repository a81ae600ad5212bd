//! Opening the objects profiled processes map, off the sampling thread and
//! within a deadline, so that a file system whose reads never answer (a
//! FUSE mount a local user made in their own namespace, a dead NFS server)
//! never stalls sampling, nor keeps the profiler from exiting.
//!
//! Opening an object (`/proc/PID/map_files/START-END`, else
//! `/proc/PID/root/PATH`), its `fstat` and the reads of its ELF headers and
//! build ID all go to the file system, and each may wait on it for good. So
//! they are one request to a helper (helper.rs: a process of its own,
//! talking over a socket pair; job.rs: the opening) that the tracker waits
//! for at most [`OPEN_DEADLINE`]:
//! - a helper past its deadline is killed and left behind (a read its file
//!   system's server has taken ends only when answered); the next request
//!   gets a new helper, and at most [`MAX_STUCK`] left-behind helpers that
//!   have not ended exist at once (past that, objects are not tried);
//! - the object is given up for the run, counted in
//!   [`Counts::timed_out`], and its mappings keep no object: their frames
//!   are named `[read timed out: NAME]+0xOFFSET` and unwound by frame
//!   pointers;
//! - further objects on the same device (the file system of the stuck
//!   read) are not tried while that helper has not ended, counted in
//!   [`Counts::not_tried`], so one hung mount costs one helper and one
//!   deadline, however many objects it serves.
//!
//! An object on a file system that can hang (FUSE, NFS, CIFS, 9p, ...:
//! [`job::can_hang`]) is copied by the helper into a memfd within the same
//! deadline, and the descriptor handed on is the copy's: every later read
//! (unwind tables, symbols, anonymous text) goes to memory, never to that
//! file system. One larger than [`job::MAX_COPY_BYTES`] is given up
//! ([`Counts::too_large`], frames `[too large to copy: NAME]+0xOFFSET`).
//! Objects on local file systems are handed on as opened.

mod helper;
mod job;

use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::LoadSegments;
pub use helper::{is_helper, HELPER_ARG};
pub use job::{can_hang, MAX_COPY_BYTES};

/// Longest the tracker waits for one object to be opened and its ELF
/// identity read (and, on a file system that can hang, copied). Local file
/// systems take microseconds; a file system slower than this is treated as
/// hung for the object.
pub const OPEN_DEADLINE: Duration = Duration::from_millis(500);

/// Most helpers left behind past their deadline that have not ended yet.
pub const MAX_STUCK: usize = 8;

/// Whether the running executable serves as the helper ([`serve_if_helper`]
/// was called): helpers are then processes of their own.
static EXE_SERVES: AtomicBool = AtomicBool::new(false);

/// Call first in `main` (before parsing arguments): when this process was
/// started as an opener helper ([`HELPER_ARG`]), serve as one and exit;
/// otherwise note that this executable can serve, so that helpers are
/// processes of their own (`/proc/self/exe` run again), not threads.
pub fn serve_if_helper() {
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(HELPER_ARG)) {
        helper::process_main();
    }
    EXE_SERVES.store(true, Ordering::Release);
}

/// An object opened and its ELF identity read, by the helper.
#[derive(Debug)]
pub struct Opened {
    /// The open file, or its copy in a memfd when its file system can hang.
    pub file: File,
    /// Its size, bytes (`fstat`).
    pub bytes: u64,
    /// `(dev, inode)` from `fstat` of the file itself, dev as
    /// `/proc/PID/maps` shows it (major << 32 | minor).
    pub file_key: (u64, u64),
    /// Its executable `PT_LOAD` segments (empty: not a readable ELF file).
    pub load_segments: LoadSegments,
    /// Its GNU build ID, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// The type of the file system it was copied from (`file` is then a
    /// memfd), when that file system can hang.
    pub copied_from: Option<String>,
}

/// What opening one object came to.
#[derive(Debug)]
pub enum Outcome {
    /// Opened, identity read.
    Opened(Opened),
    /// No path could be opened (the process exited, permissions), or no
    /// helper could be started: the error.
    Failed(std::io::Error),
    /// Not done within [`OPEN_DEADLINE`] (counted in [`Counts::timed_out`]).
    TimedOut,
    /// Not tried: a helper stuck on its device has not ended, or
    /// [`MAX_STUCK`] have not (counted in [`Counts::not_tried`]).
    NotTried,
    /// On a file system that can hang, and larger than
    /// [`MAX_COPY_BYTES`] (counted in [`Counts::too_large`]).
    TooLarge {
        /// Its size, bytes.
        bytes: u64,
        /// Its file system type.
        fs: String,
    },
}

/// Objects given up and copied since the start, process-wide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Objects whose open, ELF identity read or copy passed
    /// [`OPEN_DEADLINE`].
    pub timed_out: u64,
    /// Objects not tried because a helper stuck on their device had not
    /// ended, or [`MAX_STUCK`] had not.
    pub not_tried: u64,
    /// Objects on a file system that can hang, larger than
    /// [`MAX_COPY_BYTES`].
    pub too_large: u64,
    /// Objects copied into memory from a file system that can hang.
    pub copied: u64,
    /// Helpers left behind that have not ended.
    pub stuck_now: u64,
}

static TIMED_OUT: AtomicU64 = AtomicU64::new(0);
static NOT_TRIED: AtomicU64 = AtomicU64::new(0);
static TOO_LARGE: AtomicU64 = AtomicU64::new(0);
static COPIED: AtomicU64 = AtomicU64::new(0);
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// What was given up and copied so far, process-wide (the run's summary,
/// `/metrics`).
pub fn counters() -> Counts {
    Counts {
        timed_out: TIMED_OUT.load(Ordering::Relaxed),
        not_tried: NOT_TRIED.load(Ordering::Relaxed),
        too_large: TOO_LARGE.load(Ordering::Relaxed),
        copied: COPIED.load(Ordering::Relaxed),
        stuck_now: STUCK.load(Ordering::Relaxed) as u64,
    }
}

/// A helper left behind, and the device its request was for.
#[derive(Debug)]
struct Stuck {
    device: u64,
    helper: helper::Abandoned,
}

/// Opens objects through a helper, with a deadline (module docs).
#[derive(Debug, Default)]
pub struct Opener {
    /// The current helper; `None` before the first request and after one
    /// was left behind (until the next request, or [`Self::start`]).
    helper: Option<helper::Helper>,
    /// Helpers left behind that have not ended yet.
    stuck: Vec<Stuck>,
}

impl Opener {
    /// Start a helper now, unless one runs, so that the first object does
    /// not wait for its start-up. An error is the next request's to report.
    pub fn start(&mut self) {
        let _ = self.helper();
    }

    /// The current helper, started if there is none.
    fn helper(&mut self) -> std::io::Result<&mut helper::Helper> {
        if self.helper.is_none() {
            let exe = EXE_SERVES
                .load(Ordering::Acquire)
                .then_some(Path::new("/proc/self/exe"));
            self.helper = Some(helper::Helper::start(exe)?);
        }
        Ok(self.helper.as_mut().expect("started above"))
    }

    /// Open the first of `paths` that opens (on `device`, as
    /// `/proc/PID/maps` shows it) and read its ELF identity, waiting at
    /// most `deadline`.
    pub fn open(&mut self, paths: Vec<PathBuf>, device: u64, deadline: Duration) -> Outcome {
        self.reap();
        if self.stuck.iter().any(|s| s.device == device) || self.stuck.len() >= MAX_STUCK {
            NOT_TRIED.fetch_add(1, Ordering::Relaxed);
            return Outcome::NotTried;
        }
        let request = job::Request {
            paths: paths
                .iter()
                .map(|p| p.as_os_str().as_bytes().to_vec())
                .collect(),
        };
        let helper = match self.helper() {
            Ok(helper) => helper,
            Err(err) => {
                return Outcome::Failed(std::io::Error::other(format!(
                    "no opener helper could be started: {err}"
                )))
            }
        };
        match helper.ask(&request, deadline) {
            Ok((reply, file)) => outcome(reply, file),
            Err(helper::AskError::TimedOut) => {
                self.leave_helper(device);
                TIMED_OUT.fetch_add(1, Ordering::Relaxed);
                // The next object gets a helper ready at once.
                self.start();
                Outcome::TimedOut
            }
            Err(helper::AskError::Broken(err)) => {
                // Ended or failed: not stuck on the device, but counted
                // until it has ended.
                self.leave_helper(u64::MAX);
                Outcome::Failed(std::io::Error::other(format!(
                    "the opener helper failed: {err}"
                )))
            }
        }
    }

    /// Leave the current helper behind, stuck on `device`.
    fn leave_helper(&mut self, device: u64) {
        if let Some(helper) = self.helper.take() {
            STUCK.fetch_add(1, Ordering::AcqRel);
            self.stuck.push(Stuck {
                device,
                helper: helper.abandon(),
            });
        }
    }

    /// Forget the helpers left behind that have ended (reaped, without
    /// waiting): their devices are tried again.
    fn reap(&mut self) {
        let before = self.stuck.len();
        self.stuck.retain_mut(|s| !s.helper.ended());
        STUCK.fetch_sub(before - self.stuck.len(), Ordering::AcqRel);
    }
}

impl Drop for Opener {
    fn drop(&mut self) {
        self.reap();
        STUCK.fetch_sub(self.stuck.len(), Ordering::AcqRel);
    }
}

/// The outcome of the helper's `reply`, with the `file` that came with it.
fn outcome(reply: job::Reply, file: Option<File>) -> Outcome {
    match (reply, file) {
        (
            job::Reply::Opened {
                bytes,
                dev,
                ino,
                load_segments,
                build_id,
                copied_from,
            },
            Some(file),
        ) => {
            if copied_from.is_some() {
                COPIED.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Opened(Opened {
                file,
                bytes,
                file_key: (
                    (u64::from(libc::major(dev)) << 32) | u64::from(libc::minor(dev)),
                    ino,
                ),
                load_segments,
                build_id,
                copied_from,
            })
        }
        (job::Reply::Opened { .. }, None) => {
            Outcome::Failed(std::io::Error::other("the helper sent no descriptor"))
        }
        (
            job::Reply::Failed {
                errno: Some(errno), ..
            },
            _,
        ) => Outcome::Failed(std::io::Error::from_raw_os_error(errno)),
        (job::Reply::Failed { message, .. }, _) => Outcome::Failed(std::io::Error::other(message)),
        (job::Reply::TooLarge { bytes, fs }, _) => {
            TOO_LARGE.fetch_add(1, Ordering::Relaxed);
            Outcome::TooLarge { bytes, fs }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn opens_and_reads_the_identity_of_an_elf_file() {
        let exe = std::env::current_exe().expect("own executable");
        let mut opener = Opener::default();
        let missing = PathBuf::from("/nonexistent/object");
        let Outcome::Opened(opened) =
            opener.open(vec![missing.clone(), exe.clone()], 0, OPEN_DEADLINE * 20)
        else {
            panic!("not opened");
        };
        assert!(!opened.load_segments.is_empty());
        assert_eq!(opened.bytes, std::fs::metadata(&exe).unwrap().len());
        assert_eq!(opened.file_key.1, std::fs::metadata(&exe).unwrap().ino());
        let failed = opener.open(vec![missing], 0, OPEN_DEADLINE * 20);
        assert!(matches!(failed, Outcome::Failed(e) if e.kind() == std::io::ErrorKind::NotFound));
        let mut text = tempfile::NamedTempFile::new().unwrap();
        text.write_all(b"not an ELF file").unwrap();
        let Outcome::Opened(plain) = opener.open(vec![text.path().into()], 0, OPEN_DEADLINE * 20)
        else {
            panic!("not opened");
        };
        assert!(plain.load_segments.is_empty() && plain.build_id.is_none());
    }

    #[test]
    fn a_stuck_open_costs_one_helper_and_its_device_is_not_tried_meanwhile() {
        // A FIFO without a writer: opening it for reading waits for good,
        // as a read of a hung file system does; a writer ends it.
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("hung");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (hung_dev, other_dev) = (u64::MAX - 1, u64::MAX - 2);
        let mut opener = Opener::default();
        let before = counters();
        let short = Duration::from_millis(100);
        assert!(matches!(
            opener.open(vec![fifo.clone()], hung_dev, short),
            Outcome::TimedOut
        ));
        assert!(matches!(
            opener.open(vec![fifo.clone()], hung_dev, short),
            Outcome::NotTried
        ));
        // Another device gets a new helper at once.
        let exe = std::env::current_exe().unwrap();
        assert!(matches!(
            opener.open(vec![exe.clone()], other_dev, OPEN_DEADLINE * 20),
            Outcome::Opened(_)
        ));
        let after = counters();
        assert!(after.timed_out > before.timed_out);
        assert!(after.not_tried > before.not_tried);
        // The stuck open ends: its device is tried again.
        let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        drop(writer); // its reads then end at once
        let started = std::time::Instant::now();
        while opener.stuck.iter_mut().any(|s| !s.helper.ended()) {
            assert!(started.elapsed() < Duration::from_secs(10), "never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(matches!(
            opener.open(vec![exe], hung_dev, OPEN_DEADLINE * 20),
            Outcome::Opened(_)
        ));
    }
}
