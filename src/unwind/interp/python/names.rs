//! Naming CPython frames: code objects read from the process's memory
//! (`process_vm_readv`), with a cache by (pid, code object address, guard).
//! The guard the BPF walker took (`co_firstlineno ^ (co_linetable address
//! >> 4)`, low 31 bits; `src/sampling/bpf/profiler.h`, `struct python_frame`) must
//! match the object read here, and the object's type must be the process's
//! `PyCode_Type`: a code object freed and its memory reused is shown as
//! `[python: unknown]`, never under another function's name.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::layout::{Layout, LineTable};
use super::lines::{line_of, lnotab_line, ranges_line};

/// Most bytes of a name read.
const MAX_NAME_BYTES: usize = 1024;
/// Most bytes of a location table read.
const MAX_TABLE_BYTES: usize = 1 << 20;

/// Read `buf.len()` bytes of `pid`'s memory at `addr`; false if any is unreadable.
pub fn read_memory(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
    if buf.is_empty() {
        return true;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which lives across the call; the
    // remote range is only read by the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    usize::try_from(n).is_ok_and(|n| n == buf.len())
}

/// A little-endian integer of `width` bytes at `off` in `bytes`.
fn field(bytes: &[u8], off: u16, width: usize) -> Option<u64> {
    let off = usize::from(off);
    let raw = bytes.get(off..off + width)?;
    let mut word = [0u8; 8];
    word[..width].copy_from_slice(raw);
    Some(u64::from_le_bytes(word))
}

/// What a code object says about itself.
#[derive(Debug)]
pub struct Code {
    /// `co_qualname` (`co_name` before 3.11).
    pub qualname: Arc<str>,
    /// `co_filename`.
    pub filename: Arc<str>,
    /// `co_firstlineno`.
    pub first_line: i64,
    /// `co_linetable`'s bytes (`co_lnotab`'s on 3.8 and 3.9).
    pub table: Vec<u8>,
    /// The table's format.
    pub format: LineTable,
}

impl Code {
    /// The line of the instruction at `offset` from the first one, as the
    /// walker recorded it: bytes, but code units (2 bytes) on 3.10, whose
    /// `f_lasti` counts those; negative: before the first, as a frame
    /// that has not started yet shows it (its first line).
    pub fn line(&self, offset: i32) -> Option<u32> {
        let Ok(at) = u64::try_from(offset) else {
            return u32::try_from(self.first_line).ok();
        };
        match self.format {
            LineTable::Locations => line_of(&self.table, self.first_line, at / 2),
            LineTable::Lnotab => lnotab_line(&self.table, self.first_line, at),
            LineTable::Ranges => ranges_line(&self.table, self.first_line, at * 2),
        }
    }
}

/// Code objects of processes, read once per (pid, address, guard).
#[derive(Debug, Default)]
pub struct CodeCache {
    codes: FxHashMap<(u32, u64, u32), Option<Arc<Code>>>,
}

impl CodeCache {
    /// The code object at `addr` in `pid` (whose `PyCode_Type` is at
    /// `code_type`), if it is one and its guard is `guard`.
    pub fn get(
        &mut self,
        pid: u32,
        layout: &Layout,
        code_type: u64,
        addr: u64,
        guard: u32,
    ) -> Option<Arc<Code>> {
        self.codes
            .entry((pid, addr, guard))
            .or_insert_with(|| read_code(pid, layout, code_type, addr, guard).map(Arc::new))
            .clone()
    }

    /// Forget every code object of `pid`.
    pub fn forget(&mut self, pid: u32) {
        self.codes.retain(|&(p, _, _), _| p != pid);
    }
}

/// Read the code object at `addr` of `pid`, checking its type and guard.
fn read_code(pid: u32, layout: &Layout, code_type: u64, addr: u64, guard: u32) -> Option<Code> {
    let mut head = vec![0u8; usize::from(layout.code_size)];
    if !read_memory(pid, addr, &mut head) || field(&head, 8, 8)? != code_type {
        return None;
    }
    let first_line = field(&head, layout.code_firstlineno, 4)? as u32;
    let table_addr = field(&head, layout.code_linetable, 8)?;
    if (first_line ^ (table_addr >> 4) as u32) & 0x7fff_ffff != guard {
        return None;
    }
    Some(Code {
        qualname: read_str(pid, layout, field(&head, layout.code_qualname, 8)?)?.into(),
        filename: read_str(pid, layout, field(&head, layout.code_filename, 8)?)?.into(),
        first_line: i64::from(first_line as i32),
        table: read_bytes(pid, table_addr)?,
        format: layout.lines,
    })
}

/// The text of the compact `str` object at `addr` (`PyASCIIObject`: length
/// at 16, state bits at 32: kind in bits 2-4, compact bit 5, ascii bit 6).
fn read_str(pid: u32, layout: &Layout, addr: u64) -> Option<String> {
    let mut head = [0u8; 40];
    if !read_memory(pid, addr, &mut head) {
        return None;
    }
    let length = usize::try_from(field(&head, 16, 8)?).ok()?;
    let state = field(&head, 32, 4)?;
    let kind = ((state >> 2) & 7) as usize;
    let (compact, ascii) = (state & (1 << 5) != 0, state & (1 << 6) != 0);
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = addr
        + u64::from(if ascii {
            layout.ascii_size
        } else {
            layout.compact_size
        });
    let mut bytes = vec![0u8; length.min(MAX_NAME_BYTES / kind) * kind];
    if !read_memory(pid, data, &mut bytes) {
        return None;
    }
    Some(match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16_lossy(&units)
        }
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    })
}

/// The contents of the `bytes` object at `addr` (`ob_size` at 16, data at 32).
fn read_bytes(pid: u32, addr: u64) -> Option<Vec<u8>> {
    let mut size = [0u8; 8];
    if !read_memory(pid, addr + 16, &mut size) {
        return None;
    }
    let size = usize::try_from(u64::from_le_bytes(size)).ok()?;
    if size > MAX_TABLE_BYTES {
        return None;
    }
    let mut bytes = vec![0u8; size];
    read_memory(pid, addr + 32, &mut bytes).then_some(bytes)
}
