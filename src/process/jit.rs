//! The files in which runtimes that generate code name it, opened while the
//! process lives so that its frames can be named after it exited, and after
//! its mount namespace (a container's private `/tmp`) is gone: the open
//! file keeps it readable.
//! - The perf map, `/tmp/perf-PID.map` (node `--perf-basic-prof`, CPython
//!   `-X perf`, JVM agents), found by name.
//! - The jitdump file, `jit-PID.dump` (node `--perf-prof`, JVM and LLVM
//!   agents), found through the process's executable mapping of it (the
//!   marker perf's jitdump convention has writers leave), in any directory.
//!
//! [`JitdumpCursor`] reads a jitdump file's records as it grows, for both
//! of its readers: the symbolizer (names) and the unwind tables (the
//! unwinding information some writers add to their code).
//!
//! Jitdump layout (perf's `jitdump-specification.txt`, native byte order):
//! a file header (`magic` "JiTD" as a u32, `version`, `total_size` of the
//! header, `elf_mach`, `pad1`, `pid`, `timestamp` u64, `flags` u64), then
//! records, each `id` u32, `total_size` u32 (header included), `timestamp`
//! u64 and a body.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::maps::MapsEntry;
use super::untrusted::{self, read_span, Count, READ_CHUNK};

/// An open JIT symbol file (perf map or jitdump) of a process, opened by
/// [`untrusted::open`]: a regular file owned by the process's user or root.
#[derive(Debug)]
pub struct JitFile {
    /// The file as opened (`/proc/PID/root/tmp/perf-NSPID.map`,
    /// `/proc/PID/root/DIR/jit-NSPID.dump`).
    pub path: PathBuf,
    /// The open file; read with `pread` ([`FileExt::read_at`]), so that
    /// several readers of one file never share an offset.
    pub file: File,
}

impl JitFile {
    /// Opens process `pid`'s perf map; `None` when it has none (or is gone)
    /// or it was refused ([`untrusted::open`]). May block (a file on FUSE):
    /// call it on a reader thread ([`JitSlot::open_later`]).
    pub fn perf_map(pid: u32) -> Option<JitFile> {
        Self::open(perf_map_path(pid)?, pid)
    }

    /// Opens the file at `path` (from [`jitdump_path`]) as process `pid`'s;
    /// `None` when missing or refused. May block, as [`Self::perf_map`].
    pub fn open(path: PathBuf, pid: u32) -> Option<JitFile> {
        match untrusted::open(&path, pid) {
            Ok(file) => Some(JitFile { path, file }),
            Err(err) => {
                if err.kind() != std::io::ErrorKind::NotFound {
                    tracing::debug!("pid {pid}: {err}");
                }
                None
            }
        }
    }
}

/// Longest the tracker (on the sampling thread) waits for a JIT file's
/// open, once per process and file.
pub const OPEN_WAIT: Duration = Duration::from_millis(5);

/// Where a process's JIT file of one kind is, once a reader thread opened
/// it: the tracker asks for it without waiting ([`Self::open_later`]) and
/// readers take it when it is there ([`Self::get`]).
#[derive(Debug, Default)]
pub struct JitSlot {
    file: OnceLock<JitFile>,
    opening: AtomicBool,
}

impl JitSlot {
    /// The file, once opened.
    pub fn get(&self) -> Option<&JitFile> {
        self.file.get()
    }

    /// Runs `open` on a reader thread ([`untrusted::spawn`]) and keeps what
    /// it opens, unless the file is open or being opened; waits at most
    /// [`OPEN_WAIT`] for it (an open takes well under that; one that hangs,
    /// on a FUSE filesystem say, is left to finish on its own). A call
    /// while `open` hangs does nothing.
    pub fn open_later(self: &Arc<Self>, open: impl FnOnce() -> Option<JitFile> + Send + 'static) {
        if self.get().is_some() || self.opening.swap(true, Ordering::AcqRel) {
            return;
        }
        let slot = self.clone();
        let started = untrusted::spawn(move || {
            if let Some(file) = open() {
                let _ = slot.file.set(file);
            }
            slot.opening.store(false, Ordering::Release);
        });
        match started {
            Some(pending) => {
                let _ = pending.wait(OPEN_WAIT, Duration::MAX);
            }
            None => self.opening.store(false, Ordering::Release),
        }
    }
}

/// The path of the jitdump file process `pid` (with maps `entries`) mapped
/// executable, under its root; `None` when it mapped none.
pub fn jitdump_path(pid: u32, entries: &[MapsEntry]) -> Option<PathBuf> {
    let entry = entries
        .iter()
        .find(|e| e.executable && e.is_file_backed() && is_jitdump_name(&e.path))?;
    Some(PathBuf::from(format!("/proc/{pid}/root{}", entry.path)))
}

/// "JiTD" read as a native-endian u32.
const MAGIC: u32 = 0x4A69_5444;
/// Size of the file header a reader needs, bytes.
const FILE_HEADER_SIZE: usize = 40;
/// Size of a record header, bytes.
const RECORD_HEADER_SIZE: usize = 16;
/// Record type of a piece of code loaded (jitdump spec: `JIT_CODE_LOAD`).
pub const JIT_CODE_LOAD: u32 = 0;
/// Record type of a piece of code moved (`JIT_CODE_MOVE`).
pub const JIT_CODE_MOVE: u32 = 1;
/// Record type of the unwinding information (`.eh_frame_hdr` and
/// `.eh_frame`) of the next piece of code loaded (`JIT_CODE_UNWINDING_INFO`).
pub const JIT_CODE_UNWINDING_INFO: u32 = 4;
/// Most bytes of one jitdump file read (code bytes included).
const MAX_JITDUMP_BYTES: u64 = 1 << 30;
/// Largest record kept, bytes (header included); a larger one is skipped
/// without being read ([`untrusted::Counts::records_skipped`]).
pub const MAX_RECORD_BYTES: u64 = 4 << 20;

/// How far a reader got in one jitdump file: records are read as the file
/// grows, each byte once. A record the file ends inside waits, its bytes so
/// far held, for the rest; a record over [`MAX_RECORD_BYTES`] is skipped.
#[derive(Debug, Default)]
pub struct JitdumpCursor {
    /// Bytes of the file read so far (into records handed out, `partial`,
    /// or skipped).
    offset: u64,
    /// The start of a record the file ended inside, read so far.
    partial: Vec<u8>,
    /// Bytes of an oversized record still to skip.
    skip: u64,
    /// The file is not a jitdump file, or a record header is malformed:
    /// nothing more is read from it.
    broken: bool,
    /// Bytes past [`MAX_JITDUMP_BYTES`] already counted as unread.
    unread_counted: u64,
    /// The file header was read.
    header_read: bool,
}

impl JitdumpCursor {
    /// Bytes of the file consumed so far: the header, every complete
    /// record, and skipped ones.
    pub fn consumed(&self) -> u64 {
        self.offset - self.partial.len() as u64
    }

    /// Bytes of the file read or skipped so far (complete records and the
    /// start of an incomplete one): grows whenever a read found more.
    pub fn bytes_read(&self) -> u64 {
        self.offset
    }

    /// Reads the records added to the jitdump `file` since the last call,
    /// at most [`READ_CHUNK`] bytes of it, handing each to `apply` as
    /// [`JitdumpRecord::Record`] in file order. When the file shrank,
    /// `apply` gets [`JitdumpRecord::Restart`] first and the file is read
    /// again from its start. At most the first 1 GiB of a file is read.
    /// Errors: the file cannot be read, does not start with a jitdump
    /// header, or has a record shorter than its own header (then every later
    /// call fails too).
    pub fn read_new(
        &mut self,
        file: &File,
        mut apply: impl FnMut(JitdumpRecord<'_>),
    ) -> std::io::Result<()> {
        let invalid = |what| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let len = file.metadata()?.len();
        if len < self.offset {
            if self.consumed() > 0 {
                apply(JitdumpRecord::Restart);
            }
            *self = JitdumpCursor::default();
        }
        if self.broken {
            return Err(invalid("not a jitdump file, or a malformed record"));
        }
        if len > MAX_JITDUMP_BYTES && len - MAX_JITDUMP_BYTES > self.unread_counted {
            untrusted::add(
                Count::BytesUnread,
                len - MAX_JITDUMP_BYTES - self.unread_counted,
            );
            self.unread_counted = len - MAX_JITDUMP_BYTES;
        }
        let limit = len.min(MAX_JITDUMP_BYTES);
        self.skip_ahead(limit);
        if self.skip > 0 || limit <= self.offset {
            return Ok(());
        }
        let fresh = read_span(file, self.offset, (limit - self.offset).min(READ_CHUNK))?;
        self.offset += fresh.len() as u64;
        let mut data = std::mem::take(&mut self.partial);
        data.extend_from_slice(&fresh);
        drop(fresh);
        let mut pos = 0;
        if !self.header_read {
            if data.len() < FILE_HEADER_SIZE {
                self.partial = data;
                return Ok(());
            }
            pos = header_size(&data).ok_or_else(|| {
                self.broken = true;
                invalid("not a jitdump file")
            })?;
            if pos > data.len() {
                self.partial = data;
                return Ok(());
            }
            self.header_read = true;
        }
        while let Some(record) = data.get(pos..pos + RECORD_HEADER_SIZE) {
            let id = ne_u32(record, 0);
            let size = u64::from(ne_u32(record, 4));
            if size < RECORD_HEADER_SIZE as u64 {
                self.broken = true;
                return Err(invalid("a record shorter than its header"));
            }
            let available = (data.len() - pos) as u64;
            if size > MAX_RECORD_BYTES {
                untrusted::add(Count::RecordSkipped, 1);
                self.skip = size.saturating_sub(available);
                pos += size.min(available) as usize;
                continue;
            }
            let Some(body) = data.get(pos + RECORD_HEADER_SIZE..pos + size as usize) else {
                break; // the rest is still being written
            };
            apply(JitdumpRecord::Record { id, body });
            pos += size as usize;
        }
        data.drain(..pos);
        // Only the incomplete record is kept, not the chunk's capacity: a
        // cursor lives as long as its process (two per jitdump file), and
        // would hold about 1 MiB each between reads.
        data.shrink_to_fit();
        self.partial = data;
        self.skip_ahead(limit);
        Ok(())
    }

    /// Skips what is left of an oversized record, up to byte `limit`.
    fn skip_ahead(&mut self, limit: u64) {
        let skipped = self.skip.min(limit.saturating_sub(self.offset));
        self.skip -= skipped;
        self.offset += skipped;
    }
}

/// What [`JitdumpCursor::read_new`] hands its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum JitdumpRecord<'a> {
    /// The file was replaced or shrank: forget what earlier records said.
    Restart,
    /// One complete record: its `id` and `body` (what follows the 16-byte
    /// record header).
    Record {
        /// The record type (0: code load, 1: move, 4: unwinding info, ...).
        id: u32,
        /// The record's bytes after its header.
        body: &'a [u8],
    },
}

/// The size of the file header at the start of `data` (its `total_size`),
/// if `data` starts with a jitdump header of a sane size (that may be
/// longer than `data`).
fn header_size(data: &[u8]) -> Option<usize> {
    let header = data.get(..FILE_HEADER_SIZE)?;
    if ne_u32(header, 0) != MAGIC {
        return None;
    }
    let size = ne_u32(header, 8) as usize;
    (size >= FILE_HEADER_SIZE && size as u64 <= MAX_RECORD_BYTES).then_some(size)
}

/// The native-endian u32 at byte `at` of `bytes`. Panics when `bytes` is
/// shorter than `at + 4` (callers check lengths first).
pub fn ne_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The native-endian u64 at byte `at` of `bytes`. Panics when `bytes` is
/// shorter than `at + 8` (callers check lengths first).
pub fn ne_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether `path` names a jitdump file: `jit-N.dump`.
fn is_jitdump_name(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("jit-")?.strip_suffix(".dump"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a process with these maps may have a JIT symbol file: it has
/// executable memory no file backs (JIT code), other than the kernel's
/// `[vdso]`/`[vsyscall]`.
pub fn has_anonymous_code(entries: &[MapsEntry]) -> bool {
    entries
        .iter()
        .any(|e| e.executable && !e.is_file_backed() && !e.path.starts_with("[v"))
}

/// The path of process `pid`'s perf map as it sees it:
/// `/proc/PID/root/tmp/perf-NSPID.map`, NSPID its pid in its own PID
/// namespace. `None` when the process is gone.
pub fn perf_map_path(pid: u32) -> Option<PathBuf> {
    let ns_pid = namespace_pid(pid)?;
    let path = format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map");
    Some(Path::new(&path).to_path_buf())
}

/// Process `pid`'s id in its own (innermost) PID namespace: the last field
/// of `NSpid` in `/proc/PID/status` (`pid` itself on kernels before 4.1,
/// which have no `NSpid`). `None` when the process is gone.
pub fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_ns_pid(&status).unwrap_or(pid))
}

fn parse_ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Builders of jitdump bytes for tests (native endianness, x86-64 header).
#[cfg(test)]
pub mod test_dumps {
    use super::*;

    /// A file header.
    pub fn header() -> Vec<u8> {
        let mut h = Vec::new();
        for v in [MAGIC, 1, FILE_HEADER_SIZE as u32, 62, 0, 1] {
            h.extend_from_slice(&v.to_ne_bytes());
        }
        h.extend_from_slice(&[0; 16]);
        h
    }

    /// A record of type `id` (timestamp 7) around `body`.
    pub fn record(id: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&id.to_ne_bytes());
        r.extend_from_slice(&((RECORD_HEADER_SIZE + body.len()) as u32).to_ne_bytes());
        r.extend_from_slice(&7u64.to_ne_bytes());
        r.extend_from_slice(body);
        r
    }

    /// A `JIT_CODE_LOAD` of `code` named `name` at `addr` (pid and tid 1).
    pub fn load(addr: u64, name: &str, code: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&[1, 0, 0, 0, 1, 0, 0, 0]);
        for v in [addr, addr, code.len() as u64, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(code);
        record(JIT_CODE_LOAD, &b)
    }

    /// A `JIT_CODE_MOVE` of `size` bytes of code from `old` to `new`.
    pub fn moved(old: u64, new: u64, size: u64) -> Vec<u8> {
        let mut b = vec![1, 0, 0, 0, 1, 0, 0, 0];
        for v in [new, old, new, size, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        record(JIT_CODE_MOVE, &b)
    }
}

#[cfg(test)]
mod tests {
    use super::test_dumps::{header, record};
    use super::*;

    #[test]
    fn namespace_pid_is_the_innermost_nspid() {
        let status = "Name:\tnode\nTgid:\t27137\nNSpid:\t27137\t1\nPPid:\t1\n";
        assert_eq!(parse_ns_pid(status), Some(1));
        assert_eq!(parse_ns_pid("Name:\tx\n"), None);
        let me = std::process::id();
        assert_eq!(namespace_pid(me), Some(me));
        assert!(is_jitdump_name("/home/u/jit-1234.dump"));
        assert!(!is_jitdump_name("/home/u/jit-.dump"));
        assert!(!is_jitdump_name("/home/u/jit-12a.dump"));
        assert_eq!(
            perf_map_path(me),
            Some(PathBuf::from(format!("/proc/{me}/root/tmp/perf-{me}.map")))
        );
    }

    /// Reads `file` with `cursor`: whether it restarted, and the records.
    fn read(cursor: &mut JitdumpCursor, file: &File) -> (bool, Vec<(u32, Vec<u8>)>) {
        let (mut restarted, mut seen) = (false, Vec::new());
        cursor
            .read_new(file, |r| match r {
                JitdumpRecord::Restart => restarted = true,
                JitdumpRecord::Record { id, body } => seen.push((id, body.to_vec())),
            })
            .expect("read");
        (restarted, seen)
    }

    #[test]
    fn the_cursor_keeps_only_the_incomplete_record_between_reads() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jit-1.dump");
        let mut file = File::create(&path).expect("create");
        let one = record(0, &[7u8; 1000]);
        let mut data = header();
        while data.len() < READ_CHUNK as usize - 2 * one.len() {
            data.extend_from_slice(&one);
        }
        data.extend_from_slice(&one[..100]);
        file.write_all(&data).unwrap();
        let reader = File::open(&path).expect("open");
        let mut cursor = JitdumpCursor::default();
        let (_, seen) = read(&mut cursor, &reader);
        assert!(seen.len() > 1000, "{} records", seen.len());
        assert_eq!(cursor.partial.len(), 100);
        assert!(
            cursor.partial.capacity() < 4096,
            "a read chunk of capacity held: {} bytes",
            cursor.partial.capacity()
        );
    }

    #[test]
    fn the_cursor_reads_each_complete_record_once_and_restarts_when_the_file_shrinks() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jit-1.dump");
        let mut file = File::create(&path).expect("create");
        let reader = File::open(&path).expect("open");
        let mut cursor = JitdumpCursor::default();
        file.write_all(&header()[..30]).unwrap();
        assert_eq!(read(&mut cursor, &reader), (false, vec![]), "half a header");
        file.write_all(&header()[30..]).unwrap();
        file.write_all(&record(0, b"one")).unwrap();
        let two = record(4, b"second");
        file.write_all(&two[..20]).unwrap();
        assert_eq!(read(&mut cursor, &reader).1, vec![(0, b"one".to_vec())]);
        assert_eq!(cursor.consumed(), (header().len() + 19) as u64);
        assert_eq!(
            cursor.offset,
            (header().len() + 19 + 20) as u64,
            "read once"
        );
        file.write_all(&two[20..]).unwrap();
        assert_eq!(read(&mut cursor, &reader).1, vec![(4, b"second".to_vec())]);
        assert_eq!(cursor.consumed(), (header().len() + 19 + two.len()) as u64);
        file.set_len(header().len() as u64).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(&record(1, b"new")).unwrap();
        assert_eq!(
            read(&mut cursor, &reader),
            (true, vec![(1, b"new".to_vec())])
        );
        std::fs::write(&path, b"JUNK but long enough to hold a whole header ...").unwrap();
        let junk = File::open(&path).unwrap();
        let mut fresh = JitdumpCursor::default();
        assert!(fresh.read_new(&junk, |_| {}).is_err());
        assert!(fresh.read_new(&junk, |_| {}).is_err(), "stays broken");
    }

    #[test]
    fn an_oversized_record_is_skipped_unread_and_growth_is_read_a_chunk_at_a_time() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jit-2.dump");
        let mut file = File::create(&path).expect("create");
        let reader = File::open(&path).expect("open");
        // A record that claims 0xfffffff0 bytes, in a sparse 1 GiB file.
        let mut huge = record(0, b"x");
        huge[4..8].copy_from_slice(&0xffff_fff0u32.to_ne_bytes());
        file.write_all(&[header(), huge].concat()).unwrap();
        file.set_len(1 << 30).unwrap();
        let skipped = untrusted::counters().records_skipped;
        let mut cursor = JitdumpCursor::default();
        assert_eq!(read(&mut cursor, &reader).1, vec![]);
        assert!(untrusted::counters().records_skipped > skipped);
        assert_eq!(
            cursor.offset,
            1 << 30,
            "the rest of the file skipped, not read"
        );
        assert!(cursor.partial.is_empty());
        assert_eq!(read(&mut cursor, &reader).1, vec![], "nothing read again");
        // Growth: 3 chunks' worth of records are read over 3 calls.
        let dir2 = tempfile::tempdir().expect("tempdir");
        let path = dir2.path().join("jit-3.dump");
        let body = vec![7u8; 1 << 20];
        let mut bytes = header();
        for _ in 0..((3 * READ_CHUNK) >> 20) {
            bytes.extend_from_slice(&record(2, &body));
        }
        std::fs::write(&path, &bytes).unwrap();
        let reader = File::open(&path).unwrap();
        let mut cursor = JitdumpCursor::default();
        let mut total = 0;
        for _ in 0..3 {
            let got = read(&mut cursor, &reader).1.len();
            assert!(got as u64 <= READ_CHUNK >> 20, "{got} records in one read");
            total += got;
        }
        total += read(&mut cursor, &reader).1.len();
        assert_eq!(total as u64, (3 * READ_CHUNK) >> 20);
        assert_eq!(cursor.consumed(), bytes.len() as u64);
    }
}
