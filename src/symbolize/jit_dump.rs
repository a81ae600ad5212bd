//! Jitdump files as a symbol source: the binary format perf defined for
//! runtimes that generate code (node `--perf-prof`, the JVM's and LLVM's
//! perf agents), `jit-PID.dump`, which the writer maps executable so that a
//! profiler finds it among the process's mappings
//! ([`crate::process::jit`] opens it while the process lives).
//!
//! Records ([`crate::process::jit::JitdumpCursor`] reads them as the file
//! grows): `JIT_CODE_LOAD` (0): `pid`, `tid` u32, `vma`, `code_addr`,
//! `code_size`, `code_index` u64, the NUL-terminated name, the code.
//! `JIT_CODE_MOVE` (1): `pid`, `tid`, `vma`, `old_code_addr`,
//! `new_code_addr`, `code_size`, `code_index`. Other records (debug info,
//! unwinding info, close) are skipped here (the unwind tables read the
//! unwinding info: [`crate::unwind::jit`]).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::time::Instant;

use tracing::debug;

use super::jit_perf_map::{CodeRanges, READ_TIME, WINDOW_READ_TIME};
use super::lines::{line_of, Lines};
use super::symbol_source::{Batch, FrameRef, Site, SymbolSource};
use super::vdso::VDSO_MAPPING_NAME;
use super::MappingSource;
use crate::process::jit::{
    ne_u64 as u64_at, JitdumpCursor, JitdumpRecord, JIT_CODE_LOAD, JIT_CODE_MOVE,
};
use crate::process::untrusted::{self, Allowance, READ_DEADLINE};

/// Names frames in memory no object file backs from the process's jitdump
/// file, for processes that mapped one; sites are `(pid, address)`. Each
/// dump is read on a reader thread within [`READ_DEADLINE`]
/// ([`untrusted::run`]); a process whose read passed it is read no more.
#[derive(Default)]
pub(super) struct JitDumps {
    dumps: RefCell<HashMap<u32, JitDump>>,
    stalled: RefCell<HashSet<u32>>,
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
        let mut stalled = self.stalled.borrow_mut();
        dumps.retain(|&pid, _| batch.contains_key(&u64::from(pid)));
        let mut lines = HashMap::new();
        let window_until = Instant::now() + WINDOW_READ_TIME;
        for (&group, addresses) in batch {
            let Ok(pid) = u32::try_from(group) else {
                continue;
            };
            let Some(file) = tracker.jitdump(pid).and_then(|f| f.file.try_clone().ok()) else {
                continue;
            };
            if stalled.contains(&pid) || Instant::now() >= window_until {
                continue;
            }
            let mut dump = dumps.remove(&pid).unwrap_or_default();
            let until = window_until.min(Instant::now() + READ_TIME);
            let read = untrusted::run(READ_DEADLINE, move || {
                let read = dump.read_from(&file, until);
                (dump, read)
            });
            let Some((dump, read)) = read else {
                debug!("pid {pid}'s jitdump: no answer within {READ_DEADLINE:?}");
                stalled.insert(pid);
                continue;
            };
            if let Err(err) = read {
                debug!("pid {pid}'s jitdump: {err}");
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
    cursor: JitdumpCursor,
    /// How much more may be read now.
    allowance: Allowance,
    ranges: CodeRanges,
}

impl JitDump {
    /// Brings this dump up to date with `file`: the records added since
    /// the last read (as many chunks of them as its [`Allowance`] lets be
    /// read, until `until`), or the whole file again if it shrank. Errors:
    /// as [`JitdumpCursor::read_new`].
    fn read_from(&mut self, file: &File, until: Instant) -> std::io::Result<()> {
        let JitDump {
            cursor,
            allowance,
            ranges,
        } = self;
        while allowance.available() > 0 && Instant::now() < until {
            let before = cursor.bytes_read();
            cursor.read_new(file, |record| match record {
                JitdumpRecord::Restart => ranges.clear(),
                JitdumpRecord::Record { id, body } => apply(ranges, id, body),
            })?;
            let read = cursor.bytes_read().saturating_sub(before);
            if read == 0 {
                break;
            }
            allowance.spend(read);
        }
        Ok(())
    }
}

/// Applies one record's body to `ranges`.
fn apply(ranges: &mut CodeRanges, id: u32, body: &[u8]) {
    match id {
        JIT_CODE_LOAD if body.len() > 40 => {
            let (addr, size) = (u64_at(body, 16), u64_at(body, 24));
            let name = &body[40..];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            let name = String::from_utf8_lossy(name);
            ranges.insert(addr, addr.saturating_add(size), &name);
        }
        JIT_CODE_MOVE if body.len() >= 48 => {
            let (old, new, size) = (u64_at(body, 16), u64_at(body, 24), u64_at(body, 32));
            ranges.relocate(old, new, size);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use std::fs::File;

    use crate::process::jit::test_dumps::{header, moved, record};

    /// A time no test reaches.
    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    /// A load of `size` bytes of nops.
    fn load(addr: u64, size: u64, name: &str) -> Vec<u8> {
        crate::process::jit::test_dumps::load(addr, name, &vec![0x90; size as usize])
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
        let reader = File::open(&path).expect("open");
        let mut dump = JitDump::default();
        dump.read_from(&reader, far()).expect("read");
        assert_eq!(dump.ranges.name_of(0x101f), Some("first"));
        assert_eq!(dump.ranges.name_of(0x1020), None);
        assert_eq!(dump.ranges.name_of(0x2000), None, "incomplete record");
        file.write_all(&second[second.len() - 4..]).unwrap();
        file.write_all(&moved(0x1000, 0x3000, 0x20)).unwrap();
        dump.read_from(&reader, far()).expect("read again");
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
        let reader = File::open(&path).expect("open");
        assert!(JitDump::default().read_from(&reader, far()).is_err());
    }
}
