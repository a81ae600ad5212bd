//! Jitdump files as a symbol source: the binary format perf defined for
//! runtimes that generate code (node `--perf-prof`, the JVM's and LLVM's
//! perf agents), `jit-PID.dump`, which the writer maps executable so that a
//! profiler finds it among the process's mappings
//! ([`crate::process::jit`] opens it while the process lives).
//!
//! Layout (native byte order): a file header (`magic` "JiTD" as a u32,
//! `version`, `total_size` of the header, `elf_mach`, `pad1`, `pid`,
//! `timestamp` u64, `flags` u64), then records, each `id` u32,
//! `total_size` u32 (header included), `timestamp` u64 and a body.
//! `JIT_CODE_LOAD` (0): `pid`, `tid` u32, `vma`, `code_addr`, `code_size`,
//! `code_index` u64, the NUL-terminated name, the code. `JIT_CODE_MOVE`
//! (1): `pid`, `tid`, `vma`, `old_code_addr`, `new_code_addr`,
//! `code_size`, `code_index`. Other records (debug info, unwinding info,
//! close) are skipped. Files are re-read from the last complete record as
//! they grow.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use tracing::debug;

use super::lines::{line_of, Lines};
use super::perf_map::CodeRanges;
use super::sources::{Batch, FrameRef, Site, SymbolSource};
use super::vdso::VDSO_MAPPING_NAME;
use super::MappingSource;

/// "JiTD" read as a native-endian u32.
const MAGIC: u32 = 0x4A69_5444;
/// Size of the file header this reader needs, bytes.
const FILE_HEADER_SIZE: usize = 40;
/// Size of a record header, bytes.
const RECORD_HEADER_SIZE: usize = 16;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
/// Most bytes of one jitdump file read (code bytes included).
const MAX_JITDUMP_BYTES: u64 = 1 << 30;

/// Names frames in memory no object file backs from the process's jitdump
/// file, for processes that mapped one; sites are `(pid, address)`.
#[derive(Default)]
pub(super) struct JitDumps {
    dumps: RefCell<HashMap<u32, JitDump>>,
}

impl SymbolSource for JitDumps {
    fn locate(&self, tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site> {
        match frame {
            FrameRef::User { address, mapping }
                if mapping.object.is_none()
                    && mapping.name != VDSO_MAPPING_NAME
                    && tracker.jitdump(mapping.pid).is_some() =>
            {
                Some((u64::from(mapping.pid), address))
            }
            _ => None,
        }
    }

    /// JIT code moves: an address may name another function later.
    fn cacheable(&self) -> bool {
        false
    }

    fn symbolize(&self, tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines> {
        let mut dumps = self.dumps.borrow_mut();
        dumps.retain(|&pid, _| batch.contains_key(&u64::from(pid)));
        let mut lines = HashMap::new();
        for (&group, addresses) in batch {
            let Ok(pid) = u32::try_from(group) else {
                continue;
            };
            let Some(path) = tracker.jitdump(pid) else {
                continue;
            };
            let mut dump = dumps.remove(&pid).unwrap_or_default();
            if let Err(err) = dump.read_from(path) {
                debug!("{}: {err}", path.display());
                continue;
            }
            for &address in addresses {
                if let Some(name) = dump.ranges.name_of(address) {
                    lines.insert((group, address), (vec![line_of(name, None)], true));
                }
            }
            dumps.insert(pid, dump);
        }
        lines
    }
}

/// One process's jitdump file as read so far.
#[derive(Debug, Default)]
struct JitDump {
    /// `(device, inode)` of the file read.
    identity: (u64, u64),
    /// Bytes consumed: the header and every complete record.
    consumed: u64,
    ranges: CodeRanges,
}

impl JitDump {
    /// Brings this dump up to date with the file at `path`: the records
    /// added since the last read, or the whole file again if it was
    /// replaced or shrank.
    fn read_from(&mut self, path: &Path) -> std::io::Result<()> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        if identity != self.identity || meta.len() < self.consumed {
            *self = JitDump {
                identity,
                ..Default::default()
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
            let id = u32_at(record, 0);
            let size = u32_at(record, 4) as usize;
            let Some(body) = (size >= RECORD_HEADER_SIZE)
                .then(|| data.get(pos + RECORD_HEADER_SIZE..pos + size))
                .flatten()
            else {
                break; // incomplete (being written) or malformed
            };
            self.apply(id, body);
            pos += size;
        }
        self.consumed += pos as u64;
        Ok(())
    }

    /// Applies one record's body.
    fn apply(&mut self, id: u32, body: &[u8]) {
        match id {
            JIT_CODE_LOAD if body.len() > 40 => {
                let (addr, size) = (u64_at(body, 16), u64_at(body, 24));
                let name = &body[40..];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                let name = String::from_utf8_lossy(name);
                self.ranges
                    .insert(addr, addr.saturating_add(size), Arc::from(name.as_ref()));
            }
            JIT_CODE_MOVE if body.len() >= 48 => {
                let (old, new, size) = (u64_at(body, 16), u64_at(body, 24), u64_at(body, 32));
                if let Some((_, name)) = self.ranges.take(old) {
                    self.ranges.insert(new, new.saturating_add(size), name);
                }
            }
            _ => {}
        }
    }
}

/// The size of the file header at the start of `data` (its `total_size`),
/// if `data` starts with a jitdump header.
fn header_size(data: &[u8]) -> Option<usize> {
    let header = data.get(..FILE_HEADER_SIZE)?;
    if u32_at(header, 0) != MAGIC {
        return None;
    }
    let size = u32_at(header, 8) as usize;
    (size >= FILE_HEADER_SIZE && size <= data.len()).then_some(size)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn record(id: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&id.to_ne_bytes());
        r.extend_from_slice(&((RECORD_HEADER_SIZE + body.len()) as u32).to_ne_bytes());
        r.extend_from_slice(&7u64.to_ne_bytes());
        r.extend_from_slice(body);
        r
    }

    fn load(addr: u64, size: u64, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes());
        for v in [addr, addr, size, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend(std::iter::repeat_n(0x90, size as usize));
        record(JIT_CODE_LOAD, &b)
    }

    fn moved(old: u64, new: u64, size: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&1u32.to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes());
        for v in [new, old, new, size, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        record(JIT_CODE_MOVE, &b)
    }

    fn header() -> Vec<u8> {
        let mut h = Vec::new();
        for v in [MAGIC, 1, FILE_HEADER_SIZE as u32, 62, 0, 1] {
            h.extend_from_slice(&v.to_ne_bytes());
        }
        h.extend_from_slice(&0u64.to_ne_bytes());
        h.extend_from_slice(&0u64.to_ne_bytes());
        h
    }

    #[test]
    fn reads_loads_and_moves_and_what_is_appended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jit-1.dump");
        let mut file = File::create(&path).expect("create");
        file.write_all(&header()).unwrap();
        file.write_all(&load(0x1000, 0x20, "first")).unwrap();
        file.write_all(&record(3, &[])).unwrap(); // a close record: skipped
        let second = load(0x2000, 0x10, "second");
        file.write_all(&second[..second.len() - 4]).unwrap(); // not complete yet
        let mut dump = JitDump::default();
        dump.read_from(&path).expect("read");
        assert_eq!(dump.ranges.name_of(0x101f), Some("first"));
        assert_eq!(dump.ranges.name_of(0x1020), None);
        assert_eq!(dump.ranges.name_of(0x2000), None, "incomplete record");
        file.write_all(&second[second.len() - 4..]).unwrap();
        file.write_all(&moved(0x1000, 0x3000, 0x20)).unwrap();
        dump.read_from(&path).expect("read again");
        assert_eq!(dump.ranges.name_of(0x2008), Some("second"));
        assert_eq!(dump.ranges.name_of(0x1000), None, "moved away");
        assert_eq!(dump.ranges.name_of(0x3010), Some("first"));
    }

    #[test]
    fn rejects_files_without_the_magic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jit-1.dump");
        let mut bytes = header();
        bytes[0] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        assert!(JitDump::default().read_from(&path).is_err());
        assert_eq!(header_size(&header()[..20]), None);
    }
}
