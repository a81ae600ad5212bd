//! Files a profiled process controls, read so that no local user can stall,
//! starve or inflate the root profiler.
//!
//! Whole-machine, the profiler reads files any local user's process writes:
//! its perf map (`/tmp/perf-PID.map` under its root) and its jitdump file.
//! Such a file may be a FIFO that never gets a writer, a symlink to a file
//! the user cannot read, a sparse file of a GiB, or a file on a FUSE
//! filesystem the user mounted in their own namespace, whose reads never
//! return. So every such file is:
//! - opened with `O_NONBLOCK | O_NOFOLLOW` ([`open`]), and kept only when it
//!   is a regular file owned by the process's user or by root (perf's rule);
//! - read on a short-lived reader thread, never on the thread that drains the
//!   ring buffers or answers HTTP: [`run`] waits for a read up to a deadline
//!   (the window thread), [`spawn`] hands back a [`Pending`] result that the
//!   sampling thread polls without waiting. A reader that does not return
//!   is left behind; at most [`MAX_READERS`] exist at once, past that reads
//!   are refused at once;
//! - read a bounded number of bytes at a time ([`READ_CHUNK`]) into bounded
//!   state (names cut to [`MAX_NAME_BYTES`], budgets per file and in total
//!   kept by the readers).
//!
//! What was refused or cut is counted in [`counters`] (the run's summary,
//! `/metrics`).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// Most reader threads alive at once, stuck ones included.
pub const MAX_READERS: usize = 8;
/// Longest a read of one file may take before its reader is left behind.
pub const READ_DEADLINE: Duration = Duration::from_secs(1);
/// Most bytes read from one file by one read: a file that grew by more is
/// read on over the following reads (the growth a process can make the
/// profiler read is bounded by this per read, and reads are spaced).
pub const READ_CHUNK: u64 = 1 << 20;
/// Bytes of one file its [`Allowance`] lets be read per second, once its
/// first [`ALLOWANCE_BURST`] is spent.
pub const READ_RATE: u64 = 4 << 20;
/// Bytes of one file an [`Allowance`] lets be read at once (the first read
/// of a map a runtime wrote before the profiler started, say).
pub const ALLOWANCE_BURST: u64 = 16 << 20;
/// Longest name kept from a perf map line or jitdump record, bytes; a
/// longer one is cut to this and ends in [`CUT_MARKER`].
pub const MAX_NAME_BYTES: usize = 4096;
/// What ends a name cut to [`MAX_NAME_BYTES`].
pub const CUT_MARKER: &str = "…[cut]";

/// What was refused or cut reading files processes control, since the
/// start (all counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Files not opened: not a regular file (a FIFO, a device), a symlink,
    /// or owned by someone other than the process's user and root.
    pub files_refused: u64,
    /// Reads that passed [`READ_DEADLINE`] (their reader was left behind;
    /// the process's JIT names or tables are given up).
    pub reads_timed_out: u64,
    /// Reads not started because [`MAX_READERS`] readers were busy.
    pub reads_refused: u64,
    /// Names cut to [`MAX_NAME_BYTES`].
    pub names_cut: u64,
    /// Entries (named code ranges, pieces of code) not kept because a
    /// file's or the total budget was full.
    pub entries_dropped: u64,
    /// Jitdump records skipped for being larger than the record budget.
    pub records_skipped: u64,
    /// Bytes of files left unread: past a file's byte budget.
    pub bytes_unread: u64,
}

/// One kind of [`Counts`].
#[derive(Debug, Clone, Copy)]
pub enum Count {
    /// [`Counts::files_refused`].
    FileRefused,
    /// [`Counts::reads_timed_out`].
    ReadTimedOut,
    /// [`Counts::reads_refused`].
    ReadRefused,
    /// [`Counts::names_cut`].
    NameCut,
    /// [`Counts::entries_dropped`].
    EntryDropped,
    /// [`Counts::records_skipped`].
    RecordSkipped,
    /// [`Counts::bytes_unread`].
    BytesUnread,
}

static COUNTERS: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
static READERS: AtomicUsize = AtomicUsize::new(0);

/// Adds `n` to the counter of `kind`.
pub fn add(kind: Count, n: u64) {
    COUNTERS[kind as usize].fetch_add(n, Ordering::Relaxed);
}

/// What was refused or cut so far, process-wide.
pub fn counters() -> Counts {
    let c = |kind: Count| COUNTERS[kind as usize].load(Ordering::Relaxed);
    Counts {
        files_refused: c(Count::FileRefused),
        reads_timed_out: c(Count::ReadTimedOut),
        reads_refused: c(Count::ReadRefused),
        names_cut: c(Count::NameCut),
        entries_dropped: c(Count::EntryDropped),
        records_skipped: c(Count::RecordSkipped),
        bytes_unread: c(Count::BytesUnread),
    }
}

/// Opens `path`, a file process `pid` controls, for reading, without
/// blocking and without following a symlink at its last component
/// (`O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC`), and keeps it only
/// when it is a regular file owned by root or by the process's user (the
/// owner of `/proc/PID`). Errors: the file is missing (not counted), or it
/// was refused ([`Counts::files_refused`]), with the reason.
pub fn open(path: &Path, pid: u32) -> std::io::Result<File> {
    let owner = std::fs::metadata(format!("/proc/{pid}"))?.uid();
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .inspect_err(|err| {
            // ELOOP: the last component is a symlink.
            if err.raw_os_error() == Some(libc::ELOOP) {
                add(Count::FileRefused, 1);
            }
        })?;
    let meta = file.metadata()?;
    let refuse = |why: String| {
        add(Count::FileRefused, 1);
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            why,
        ))
    };
    if !meta.file_type().is_file() {
        return refuse(format!("{}: not a regular file", path.display()));
    }
    if meta.uid() != 0 && meta.uid() != owner {
        return refuse(format!(
            "{}: owned by uid {}, not by root or the process's uid {owner}",
            path.display(),
            meta.uid()
        ));
    }
    Ok(file)
}

/// Runs `job` on a reader thread and waits for it at most `deadline`.
/// `None` when it took longer (counted in [`Counts::reads_timed_out`]; the
/// reader is left to finish or hang on its own) or could not start
/// ([`Counts::reads_refused`]).
pub fn run<T: Send + 'static>(
    deadline: Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let pending = spawn(job)?;
    match pending.rx.recv_timeout(deadline) {
        Ok(value) => Some(value),
        Err(RecvTimeoutError::Timeout) => {
            add(Count::ReadTimedOut, 1);
            None
        }
        Err(RecvTimeoutError::Disconnected) => None, // the job panicked
    }
}

/// Starts `job` on a reader thread; its result is polled with
/// [`Pending::poll`]. `None` when [`MAX_READERS`] readers are alive
/// (counted in [`Counts::reads_refused`]) or no thread could be made.
pub fn spawn<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Option<Pending<T>> {
    if READERS.fetch_add(1, Ordering::AcqRel) >= MAX_READERS {
        READERS.fetch_sub(1, Ordering::AcqRel);
        add(Count::ReadRefused, 1);
        return None;
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let started = std::thread::Builder::new()
        .name("ls-jit-reader".into())
        .stack_size(256 << 10)
        .spawn(move || {
            struct Leave;
            impl Drop for Leave {
                fn drop(&mut self) {
                    READERS.fetch_sub(1, Ordering::AcqRel);
                }
            }
            let _leave = Leave;
            let _ = tx.send(job());
        });
    if started.is_err() {
        READERS.fetch_sub(1, Ordering::AcqRel);
        add(Count::ReadRefused, 1);
        return None;
    }
    Some(Pending {
        rx,
        started: Instant::now(),
    })
}

/// The result of a job [`spawn`]ed on a reader thread.
#[derive(Debug)]
pub struct Pending<T> {
    rx: Receiver<T>,
    started: Instant,
}

/// What [`Pending::poll`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Poll<T> {
    /// The job's result.
    Ready(T),
    /// Not finished yet, still within its deadline.
    Waiting,
    /// Past its deadline (counted in [`Counts::reads_timed_out`]), or it
    /// panicked: no result will come.
    Lost,
}

impl<T> Pending<T> {
    /// The job's result if it is there, without waiting; [`Poll::Lost`]
    /// once `deadline` has passed since it started.
    pub fn poll(&self, deadline: Duration) -> Poll<T> {
        self.wait(Duration::ZERO, deadline)
    }

    /// [`Self::poll`], after waiting at most `wait` for the result (the
    /// sampling thread waits a few ms, once per process, for a first read).
    pub fn wait(&self, wait: Duration, deadline: Duration) -> Poll<T> {
        let got = if wait.is_zero() {
            self.rx
                .try_recv()
                .map_err(|e| e == TryRecvError::Disconnected)
        } else {
            self.rx
                .recv_timeout(wait)
                .map_err(|e| e == RecvTimeoutError::Disconnected)
        };
        match got {
            Ok(value) => Poll::Ready(value),
            Err(true) => Poll::Lost,
            Err(false) if self.started.elapsed() >= deadline => {
                add(Count::ReadTimedOut, 1);
                Poll::Lost
            }
            Err(false) => Poll::Waiting,
        }
    }
}

/// Up to `len` bytes of `file` from `offset` (fewer at its end), read with
/// `pread` (so that readers sharing a file never share an offset).
/// Errors: the read failed.
pub fn read_span(file: &File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; len as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match std::os::unix::fs::FileExt::read_at(file, &mut buf[filled..], offset + filled as u64)
        {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// Most bytes held of what was read from one file (named code ranges,
/// pieces of code): each entry costs its name or data plus
/// [`ENTRY_OVERHEAD`].
pub const MAX_HELD_PER_FILE: usize = 12 << 20;
/// Most bytes held of what was read from all such files together.
pub const MAX_HELD_TOTAL: usize = 24 << 20;
/// What one held entry costs besides its bytes (tree node, pointers).
pub const ENTRY_OVERHEAD: usize = 64;

static HELD_TOTAL: AtomicUsize = AtomicUsize::new(0);

/// The bytes one reader of one file holds, within [`MAX_HELD_PER_FILE`] and
/// (with every other [`Held`]) [`MAX_HELD_TOTAL`]; given back when dropped.
#[derive(Debug, Default)]
pub struct Held {
    bytes: usize,
}

impl Held {
    /// Takes `bytes` more from the budgets; `false` (and counted in
    /// [`Counts::entries_dropped`]) when either is full: the entry must
    /// not be kept.
    pub fn take(&mut self, bytes: usize) -> bool {
        if self.bytes + bytes > MAX_HELD_PER_FILE {
            add(Count::EntryDropped, 1);
            return false;
        }
        let total = HELD_TOTAL.fetch_add(bytes, Ordering::AcqRel);
        if total + bytes > MAX_HELD_TOTAL {
            HELD_TOTAL.fetch_sub(bytes, Ordering::AcqRel);
            add(Count::EntryDropped, 1);
            return false;
        }
        self.bytes += bytes;
        true
    }

    /// Gives back `bytes` taken earlier.
    pub fn give_back(&mut self, bytes: usize) {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        HELD_TOTAL.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD_TOTAL.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// How much more of one file may be read: a bucket of [`ALLOWANCE_BURST`]
/// bytes, full at first, that fills at [`READ_RATE`] bytes a second. A file
/// that grows faster is read behind, not faster.
#[derive(Debug, Clone)]
pub struct Allowance {
    bytes: u64,
    at: Instant,
}

impl Default for Allowance {
    fn default() -> Self {
        Allowance {
            bytes: ALLOWANCE_BURST,
            at: Instant::now(),
        }
    }
}

impl Allowance {
    /// Bytes that may be read now.
    pub fn available(&mut self) -> u64 {
        let now = Instant::now();
        let earned = (now - self.at).as_secs_f64() * READ_RATE as f64;
        self.bytes = (self.bytes + earned as u64).min(ALLOWANCE_BURST);
        self.at = now;
        self.bytes
    }

    /// `bytes` were read.
    pub fn spend(&mut self, bytes: u64) {
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// `name`, or its first [`MAX_NAME_BYTES`] (at a character boundary)
/// followed by [`CUT_MARKER`] when longer (counted in [`Counts::names_cut`]).
pub fn bounded_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= MAX_NAME_BYTES {
        return name.into();
    }
    add(Count::NameCut, 1);
    let mut end = MAX_NAME_BYTES;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{CUT_MARKER}", &name[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn opens_only_regular_files_of_the_owner_or_root_without_following_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        let regular = dir.path().join("perf.map");
        std::fs::write(&regular, "1 2 f\n").unwrap();
        assert!(open(&regular, me).is_ok());
        let before = counters().files_refused;
        let fifo = dir.path().join("fifo.map");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // Without O_NONBLOCK this open would wait for a writer for good.
        let err = open(&fifo, me).expect_err("a FIFO");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let link = dir.path().join("link.map");
        std::os::unix::fs::symlink(&regular, &link).unwrap();
        assert!(open(&link, me).is_err(), "a symlink");
        assert!(open(&dir.path().join("none"), me).is_err());
        assert_eq!(counters().files_refused, before + 2);
        if unsafe { libc::geteuid() } == 0 {
            // Owned by nobody, read for a process of root: refused.
            std::fs::set_permissions(&regular, std::fs::Permissions::from_mode(0o644)).unwrap();
            std::os::unix::fs::chown(&regular, Some(65534), Some(65534)).unwrap();
            let err = open(&regular, me).expect_err("another user's file");
            assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        }
    }

    #[test]
    fn a_job_past_its_deadline_is_left_behind_and_counted() {
        // Other tests running at once may hold readers for a while.
        let free = || {
            let deadline = Instant::now() + Duration::from_secs(10);
            while READERS.load(Ordering::Acquire) + 3 > MAX_READERS {
                assert!(Instant::now() < deadline, "readers never freed");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        free();
        let before = counters().reads_timed_out;
        assert_eq!(run(Duration::from_secs(5), || 7), Some(7));
        let slow = run(Duration::from_millis(20), || {
            std::thread::sleep(Duration::from_millis(300));
            1
        });
        assert_eq!(slow, None);
        let pending = spawn(|| std::thread::sleep(Duration::from_millis(300))).expect("spawned");
        assert_eq!(pending.poll(Duration::from_secs(5)), Poll::Waiting);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(pending.poll(Duration::from_millis(10)), Poll::Lost);
        assert!(counters().reads_timed_out >= before + 2);
        free();
        let done = spawn(|| 3).expect("spawned");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(done.poll(Duration::from_secs(5)), Poll::Ready(3));
    }

    #[test]
    fn held_bytes_stay_within_the_budget_of_a_file_and_are_given_back() {
        let mut a = Held::default();
        assert!(a.take(MAX_HELD_PER_FILE - 10));
        assert!(!a.take(11), "past the file's budget");
        assert!(a.take(10));
        a.give_back(MAX_HELD_PER_FILE);
        assert_eq!(a.bytes(), 0);
        assert!(a.take(100));
        drop(a);
    }

    #[test]
    fn an_allowance_starts_full_and_fills_at_its_rate() {
        let mut a = Allowance::default();
        assert_eq!(a.available(), ALLOWANCE_BURST);
        a.spend(ALLOWANCE_BURST);
        assert!(a.available() < READ_RATE / 10);
        std::thread::sleep(Duration::from_millis(250));
        let later = a.available();
        assert!((READ_RATE / 5..=READ_RATE / 2).contains(&later), "{later}");
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary_with_a_marker() {
        assert_eq!(bounded_name("short"), "short");
        let long = "é".repeat(MAX_NAME_BYTES);
        let cut = bounded_name(&long);
        assert!(cut.ends_with(CUT_MARKER));
        assert!(cut.len() <= MAX_NAME_BYTES + CUT_MARKER.len());
        assert!(cut.len() > MAX_NAME_BYTES - 4);
    }
}
