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
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::maps::MapsEntry;

/// An open JIT symbol file (perf map or jitdump) and a path that reads it
/// from the profiler (`/proc/self/fd/N`, valid while this value lives).
#[derive(Debug)]
pub struct JitFile {
    /// The file as opened (`/proc/PID/root/tmp/perf-NSPID.map`,
    /// `/proc/PID/root/DIR/jit-NSPID.dump`).
    pub path: PathBuf,
    /// `/proc/self/fd/N` of [`Self::file`].
    pub open_path: PathBuf,
    /// The open map.
    pub file: File,
}

impl JitFile {
    /// Opens process `pid`'s perf map; `None` when it has none (or is gone).
    pub fn perf_map(pid: u32) -> Option<JitFile> {
        Self::open(perf_map_path(pid)?)
    }

    /// Opens the jitdump file process `pid` (with maps `entries`) mapped;
    /// `None` when it mapped none.
    pub fn jitdump(pid: u32, entries: &[MapsEntry]) -> Option<JitFile> {
        let entry = entries
            .iter()
            .find(|e| e.executable && e.is_file_backed() && is_jitdump_name(&e.path))?;
        Self::open(PathBuf::from(format!("/proc/{pid}/root{}", entry.path)))
    }

    fn open(path: PathBuf) -> Option<JitFile> {
        let file = File::open(&path).ok()?;
        let open_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Some(JitFile {
            path,
            open_path,
            file,
        })
    }
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

/// How far a reader got in one jitdump file: records are read as the file
/// grows, each once.
#[derive(Debug, Default)]
pub struct JitdumpCursor {
    /// `(device, inode)` of the file read.
    identity: (u64, u64),
    /// Bytes consumed: the header and every complete record.
    consumed: u64,
}

impl JitdumpCursor {
    /// Bytes of the file consumed so far (header and complete records).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Reads the records added to the jitdump file at `path` since the last
    /// call, handing each to `apply` as [`JitdumpRecord::Record`] in file
    /// order. When the file was replaced (another inode) or shrank,
    /// `apply` gets [`JitdumpRecord::Restart`] first and the whole file is
    /// read again. A record still being written (the
    /// file ends inside it) is left for the next call. At most the first
    /// 1 GiB of a file is read. Errors: the file cannot be read, or does
    /// not start with a jitdump header.
    pub fn read_new(
        &mut self,
        path: &Path,
        mut apply: impl FnMut(JitdumpRecord<'_>),
    ) -> std::io::Result<()> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        if identity != self.identity || meta.len() < self.consumed {
            if self.consumed > 0 {
                apply(JitdumpRecord::Restart);
            }
            *self = JitdumpCursor {
                identity,
                consumed: 0,
            };
        }
        let limit = meta.len().min(MAX_JITDUMP_BYTES);
        if limit <= self.consumed {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.consumed))?;
        let mut data = Vec::new();
        file.take(limit - self.consumed).read_to_end(&mut data)?;
        let mut pos = 0;
        if self.consumed == 0 {
            pos = header_size(&data).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not a jitdump file")
            })?;
        }
        while let Some(record) = data.get(pos..pos + RECORD_HEADER_SIZE) {
            let id = ne_u32(record, 0);
            let size = ne_u32(record, 4) as usize;
            let Some(body) = (size >= RECORD_HEADER_SIZE)
                .then(|| data.get(pos + RECORD_HEADER_SIZE..pos + size))
                .flatten()
            else {
                break; // incomplete (being written) or malformed
            };
            apply(JitdumpRecord::Record { id, body });
            pos += size;
        }
        self.consumed += pos as u64;
        Ok(())
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
/// if `data` starts with a jitdump header.
fn header_size(data: &[u8]) -> Option<usize> {
    let header = data.get(..FILE_HEADER_SIZE)?;
    if ne_u32(header, 0) != MAGIC {
        return None;
    }
    let size = ne_u32(header, 8) as usize;
    (size >= FILE_HEADER_SIZE && size <= data.len()).then_some(size)
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

    #[test]
    fn the_cursor_reads_each_complete_record_once_and_restarts_on_a_new_file() {
        use std::io::Write;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jit-1.dump");
        let mut file = File::create(&path).expect("create");
        file.write_all(&header()).unwrap();
        file.write_all(&record(0, b"one")).unwrap();
        let two = record(4, b"second");
        file.write_all(&two[..20]).unwrap();
        let mut cursor = JitdumpCursor::default();
        let mut seen = Vec::new();
        let read = |cursor: &mut JitdumpCursor, seen: &mut Vec<(u32, Vec<u8>)>| {
            let mut restarted = false;
            cursor
                .read_new(&path, |r| match r {
                    JitdumpRecord::Restart => restarted = true,
                    JitdumpRecord::Record { id, body } => seen.push((id, body.to_vec())),
                })
                .expect("read");
            restarted
        };
        assert!(!read(&mut cursor, &mut seen));
        assert_eq!(seen, vec![(0, b"one".to_vec())]);
        file.write_all(&two[20..]).unwrap();
        assert!(!read(&mut cursor, &mut seen));
        assert_eq!(seen[1], (4, b"second".to_vec()));
        assert_eq!(cursor.consumed(), (header().len() + 19 + two.len()) as u64);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, [header(), record(1, b"new")].concat()).unwrap();
        assert!(read(&mut cursor, &mut seen), "a new file restarts");
        assert_eq!(seen[2], (1, b"new".to_vec()));
        std::fs::write(&path, b"JUNK but long enough to hold a whole header ...").unwrap();
        assert!(JitdumpCursor::default().read_new(&path, |_| {}).is_err());
    }
}
