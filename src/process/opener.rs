//! Opening the objects profiled processes map, off the sampling thread and
//! within a deadline, so that a file system whose reads never answer (a
//! FUSE mount a local user made in their own namespace, a dead NFS server)
//! never stalls sampling.
//!
//! Opening an object (`/proc/PID/map_files/START-END`, else
//! `/proc/PID/root/PATH`), its `fstat` and the reads of its ELF headers and
//! build ID ([`super::elf_identity`]) all go to the file system, and each
//! may wait on it for good. So they run as one job on an opener thread
//! that the tracker waits for at most [`OPEN_DEADLINE`]:
//! - a job past its deadline leaves its thread stuck; the next job gets a
//!   new thread, and at most [`MAX_STUCK`] stuck ones exist at once (past
//!   that, objects are not tried);
//! - the object is given up for the run, counted in
//!   [`Counts::timed_out`], and its mappings keep no object: their frames
//!   are named `[read timed out: NAME]+0xOFFSET` and unwound by frame
//!   pointers;
//! - further objects on the same device (the file system of the stuck
//!   read) are not tried while that read is stuck, counted in
//!   [`Counts::not_tried`], so one hung mount costs one thread and one
//!   deadline, however many objects it serves.
//!
//! Everything later read from an opened object (unwind tables, symbols)
//! goes through the descriptor the job opened, off the sampling thread
//! (the table builders, the symbolizer). Not covered: a file system that
//! answers the opener's reads and hangs later ones (docs/reliability.md).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use super::LoadSegments;

/// Longest the tracker waits for one object to be opened and its ELF
/// identity read. Local file systems take microseconds; a file system
/// slower than this is treated as hung for the object.
pub const OPEN_DEADLINE: Duration = Duration::from_millis(500);

/// Most opener threads stuck at once in a job past its deadline.
pub const MAX_STUCK: usize = 8;

/// An object opened and its ELF identity read, by an opener thread.
#[derive(Debug)]
pub struct Opened {
    /// The open file.
    pub file: File,
    /// Its size, bytes (`fstat`).
    pub bytes: u64,
    /// `(dev, inode)` from `fstat`, dev as `/proc/PID/maps` shows it
    /// (major << 32 | minor).
    pub file_key: (u64, u64),
    /// Its executable `PT_LOAD` segments (empty: not a readable ELF file).
    pub load_segments: LoadSegments,
    /// Its GNU build ID, if it has one.
    pub build_id: Option<Vec<u8>>,
}

/// What opening one object came to.
#[derive(Debug)]
pub enum Outcome {
    /// Opened, identity read.
    Opened(Opened),
    /// No path could be opened (the process exited, permissions): the error
    /// of the last one.
    Failed(std::io::Error),
    /// Not done within [`OPEN_DEADLINE`] (counted in [`Counts::timed_out`]).
    TimedOut,
    /// Not tried: a read on its device is stuck, or [`MAX_STUCK`] opener
    /// threads are (counted in [`Counts::not_tried`]).
    NotTried,
}

/// Objects given up since the start, process-wide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Objects whose open or ELF identity read passed [`OPEN_DEADLINE`].
    pub timed_out: u64,
    /// Objects not tried because a read on their device was stuck, or
    /// [`MAX_STUCK`] opener threads were.
    pub not_tried: u64,
    /// Opener threads stuck in a job now.
    pub stuck_now: u64,
}

static TIMED_OUT: AtomicU64 = AtomicU64::new(0);
static NOT_TRIED: AtomicU64 = AtomicU64::new(0);
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// What was given up so far, process-wide (the run's summary, `/metrics`).
pub fn counters() -> Counts {
    Counts {
        timed_out: TIMED_OUT.load(Ordering::Relaxed),
        not_tried: NOT_TRIED.load(Ordering::Relaxed),
        stuck_now: STUCK.load(Ordering::Relaxed) as u64,
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Opens objects on a thread of its own, with a deadline (module docs).
#[derive(Debug, Default)]
pub struct Opener {
    /// The current opener thread's queue; `None` before the first job and
    /// after its thread was left stuck.
    worker: Option<Sender<Job>>,
    /// Devices with a job stuck past its deadline, with the flag that job
    /// sets once it ends.
    stuck_on: HashMap<u64, Arc<AtomicBool>>,
}

impl Opener {
    /// Open the first of `paths` that opens (on `device`, as
    /// `/proc/PID/maps` shows it) and read its ELF identity, waiting at
    /// most `deadline`.
    pub fn open(&mut self, paths: Vec<PathBuf>, device: u64, deadline: Duration) -> Outcome {
        self.stuck_on
            .retain(|_, done| !done.load(Ordering::Acquire));
        if self.stuck_on.contains_key(&device) || STUCK.load(Ordering::Acquire) >= MAX_STUCK {
            NOT_TRIED.fetch_add(1, Ordering::Relaxed);
            return Outcome::NotTried;
        }
        let done = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::sync_channel(1);
        let finished = done.clone();
        let job: Job = Box::new(move || {
            let _ = tx.send(open_object(&paths));
            finished.store(true, Ordering::Release);
        });
        if !self.submit(job) {
            return Outcome::Failed(std::io::Error::other("no opener thread could be started"));
        }
        match rx.recv_timeout(deadline) {
            Ok(outcome) => outcome,
            Err(RecvTimeoutError::Timeout) => {
                // Its thread stays in the job: the next job gets another.
                self.worker = None;
                self.stuck_on.insert(device, done);
                TIMED_OUT.fetch_add(1, Ordering::Relaxed);
                Outcome::TimedOut
            }
            Err(RecvTimeoutError::Disconnected) => {
                Outcome::Failed(std::io::Error::other("the opener thread panicked"))
            }
        }
    }

    /// Hand `job` to the opener thread, starting one if there is none (or
    /// it has ended); `false` when no thread could be started.
    fn submit(&mut self, job: Job) -> bool {
        let job = match &self.worker {
            Some(tx) => match tx.send(job) {
                Ok(()) => return true,
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::channel();
        if std::thread::Builder::new()
            .name("ls-opener".into())
            .stack_size(256 << 10)
            .spawn(move || serve(rx))
            .is_err()
        {
            return false;
        }
        let sent = tx.send(job).is_ok();
        self.worker = Some(tx);
        sent
    }
}

/// An opener thread: runs jobs until its queue is dropped. While it runs
/// a job it counts as stuck; the count is taken back when the job ends, so
/// [`STUCK`] holds the threads in a job, of which all but at most one (the
/// current opener's) were left past their deadline.
fn serve(jobs: Receiver<Job>) {
    /// Takes the count back when the job ends, also by a panic.
    struct InJob;
    impl Drop for InJob {
        fn drop(&mut self) {
            STUCK.fetch_sub(1, Ordering::AcqRel);
        }
    }
    while let Ok(job) = jobs.recv() {
        STUCK.fetch_add(1, Ordering::AcqRel);
        let _in_job = InJob;
        job();
    }
}

/// The job: open the first of `paths` that opens, `fstat` it, read its ELF
/// identity (an unreadable ELF file is opened with no segments and no
/// build ID).
fn open_object(paths: &[PathBuf]) -> Outcome {
    let mut last = std::io::Error::from(std::io::ErrorKind::NotFound);
    for path in paths {
        let file = match File::open(path) {
            Ok(file) => file,
            Err(err) => {
                last = err;
                continue;
            }
        };
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(err) => return Outcome::Failed(err),
        };
        let dev = meta.dev();
        let file_key = (
            (u64::from(libc::major(dev)) << 32) | u64::from(libc::minor(dev)),
            meta.ino(),
        );
        let (load_segments, build_id) = elf_identity(&file).unwrap_or_else(|err| {
            tracing::debug!("{}: not a readable ELF file: {err}", path.display());
            (Vec::new(), None)
        });
        return Outcome::Opened(Opened {
            file,
            bytes: meta.len(),
            file_key,
            load_segments,
            build_id,
        });
    }
    Outcome::Failed(last)
}

/// The executable `PT_LOAD` program headers of an ELF file and its GNU
/// build ID (a `.note.gnu.build-id`-style note: owner `GNU`, type 3; other
/// owners' type-3 notes, such as SystemTap's, are not build IDs). Reads
/// only the headers and notes, not the whole file.
fn elf_identity(file: &File) -> object::read::Result<(LoadSegments, Option<Vec<u8>>)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::read::{Object, ReadCache};
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<object::Endianness, _>::parse(&cache)?;
    let endian = elf.endian();
    let segments = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| {
            ph.p_type(endian) == object::elf::PT_LOAD
                && ph.p_flags(endian).0 & object::elf::PF_X.0 != 0
        })
        .map(|ph| (ph.p_offset(endian), ph.p_vaddr(endian), ph.p_filesz(endian)))
        .collect();
    let build_id = elf.build_id()?.map(<[u8]>::to_vec);
    Ok((segments, build_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
    fn a_stuck_open_costs_one_thread_and_its_device_is_not_tried_meanwhile() {
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
        // Another device gets a new opener thread at once.
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
        while opener
            .stuck_on
            .values()
            .any(|done| !done.load(Ordering::Acquire))
        {
            assert!(started.elapsed() < Duration::from_secs(10), "never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(matches!(
            opener.open(vec![exe], hung_dev, OPEN_DEADLINE * 20),
            Outcome::Opened(_)
        ));
    }
}
