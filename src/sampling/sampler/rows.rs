//! Writing unwind rows into the `unwind_rows` BPF map through short-lived
//! memory mappings.

use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{anyhow, bail, Context, Result};

use crate::sampling::unwind_row::RawRow;

/// Writer of the `unwind_rows` map (BPF_F_MMAPABLE): each write maps just
/// the pages it covers, copies the rows in and unmaps them. The kernel
/// backs the whole map with memory from its creation; mapping it only
/// while writing keeps those pages out of this process's resident set.
pub(super) struct MappedRows {
    fd: OwnedFd,
    /// Bytes of the map's value area (rows * 8, rounded up to pages).
    len: usize,
}

const PAGE_SIZE: usize = 4096;

impl MappedRows {
    /// A writer of the map behind `fd`, which holds `rows` rows.
    pub(super) fn new(fd: std::os::fd::BorrowedFd<'_>, rows: u32) -> Result<Self> {
        Ok(MappedRows {
            fd: fd
                .try_clone_to_owned()
                .context("duplicating the unwind_rows map's fd")?,
            len: (rows as usize * 8).div_ceil(PAGE_SIZE) * PAGE_SIZE,
        })
    }

    /// Write `rows` from row index `first` on. Errors: rows past the
    /// map's end, or the pages cannot be mapped.
    pub(super) fn write(&self, first: u32, rows: &[RawRow]) -> Result<()> {
        let start = first as usize * 8;
        let end = start + rows.len() * 8;
        if end > self.len {
            bail!(
                "rows {first}..{} exceed the unwind_rows map",
                first as usize + rows.len()
            );
        }
        if rows.is_empty() {
            return Ok(());
        }
        let map_start = start / PAGE_SIZE * PAGE_SIZE;
        let map_len = end.div_ceil(PAGE_SIZE) * PAGE_SIZE - map_start;
        // SAFETY: mapping pages [map_start, map_start + map_len) of a BPF
        // array created with BPF_F_MMAPABLE; the kernel checks the range
        // against the map's size, and the mapping is released below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                map_start as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(anyhow!(std::io::Error::last_os_error()))
                .context("mapping the unwind_rows map");
        }
        let base: *mut u8 = base.cast();
        for (i, row) in rows.iter().enumerate() {
            let bytes = row.to_bytes();
            // SAFETY: start - map_start + 8 * (i + 1) <= end - map_start <=
            // map_len: every row lands inside the live mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    base.add(start - map_start + 8 * i),
                    bytes.len(),
                )
            };
        }
        // SAFETY: base/map_len are exactly what mmap returned; nothing
        // refers to the mapping after this.
        unsafe { libc::munmap(base.cast(), map_len) };
        Ok(())
    }
}
