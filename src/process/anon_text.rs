//! Text moved to anonymous memory: programs run under libhugetlbfs'
//! `hugectl --text`, Facebook's hugify, HHVM and the like copy their own
//! code into anonymous memory (backed by huge pages, to cut iTLB misses) at
//! the same addresses, so `/proc/PID/maps` shows an anonymous executable
//! mapping where the file's text was. Such a mapping is taken as the
//! file's: when it lies where an executable `PT_LOAD` segment of a file
//! the process maps is, at that file's load bias, and the bytes it holds
//! are that segment's, it becomes a mapping of that object at the matching
//! file offset. The walker then unwinds it with the object's table and the
//! symbolizer names it from the object, as if the file were still mapped.

use std::fs::File;
use std::os::unix::fs::FileExt;

use tracing::debug;

use super::maps::MapsEntry;
use super::{ObjectId, ProcessTracker};

/// Page size assumed for mapping boundaries, bytes.
const PAGE: u64 = 4096;

/// Most pages of a candidate mapping compared with its file (spread over
/// the mapping): enough to tell a copy of the text from other code, cheap
/// for a text of hundreds of MiB.
const COMPARED_PAGES: u64 = 16;

/// A `PT_LOAD` segment: `(p_offset, p_vaddr, p_filesz, p_memsz,
/// executable)`.
type Segment = (u64, u64, u64, u64, bool);

impl ProcessTracker {
    /// The object whose text `anon` (an anonymous executable mapping of
    /// `pid`, one of `entries`, its maps as just read) holds, and the file
    /// offset of its first byte; `None` when it lies in no executable
    /// segment of a file the process maps at that file's load bias, or
    /// holds other bytes (JIT code, a trampoline). Opens the file's object
    /// if it was not open yet.
    pub(super) fn anonymous_text(
        &mut self,
        pid: u32,
        anon: &MapsEntry,
        entries: &[MapsEntry],
    ) -> Option<(ObjectId, u64)> {
        for file_entry in files_around(anon.start, entries) {
            let Some(object) = self.intern_object(pid, file_entry) else {
                continue;
            };
            let file = &self.objects.get(&object)?.file;
            let found = text_offset(file, file_entry, anon)
                .filter(|&(offset, segment)| same_bytes(pid, file, anon, offset, segment));
            if let Some((offset, _)) = found {
                debug!(
                    "pid {pid}: anonymous code at {:#x}-{:#x} is {}'s text from offset {offset:#x}",
                    anon.start, anon.end, file_entry.path
                );
                return Some((object, offset));
            }
        }
        None
    }
}

/// For each file whose mappings in `entries` span `address` (lowest start
/// at or below it, highest end above it), its mapping with the lowest
/// start.
fn files_around(address: u64, entries: &[MapsEntry]) -> Vec<&MapsEntry> {
    let mut files: Vec<(&MapsEntry, u64)> = Vec::new();
    for entry in entries.iter().filter(|e| e.is_file_backed()) {
        let key = (entry.dev, entry.inode);
        match files.iter_mut().find(|(e, _)| (e.dev, e.inode) == key) {
            Some((lowest, end)) => {
                if entry.start < lowest.start {
                    *lowest = entry;
                }
                *end = (*end).max(entry.end);
            }
            None => files.push((entry, entry.end)),
        }
    }
    files
        .into_iter()
        .filter(|&(lowest, end)| lowest.start <= address && address < end)
        .map(|(lowest, _)| lowest)
        .collect()
}

/// The `PT_LOAD` segments of the ELF file `file` (empty when it is not one).
fn load_segments(file: &File) -> Vec<Segment> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::read::ReadCache;
    let cache = ReadCache::new(file);
    let Ok(elf) = ElfFile64::<object::Endianness, _>::parse(&cache) else {
        return Vec::new();
    };
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .map(|ph| {
            let executable = ph.p_flags(endian).0 & object::elf::PF_X.0 != 0;
            let (offset, vaddr) = (ph.p_offset(endian), ph.p_vaddr(endian));
            (
                offset,
                vaddr,
                ph.p_filesz(endian),
                ph.p_memsz(endian),
                executable,
            )
        })
        .collect()
}

/// The file offset that `anon`'s start corresponds to in `file` (mapped at
/// `file_entry`, which gives the load bias), with the executable segment
/// that holds it; `None` when it falls in none.
fn text_offset(file: &File, file_entry: &MapsEntry, anon: &MapsEntry) -> Option<(u64, Segment)> {
    let segments = load_segments(file);
    let holding = |offset: u64| {
        segments
            .iter()
            .find(|&&(off, _, filesz, _, _)| off & !(PAGE - 1) <= offset && offset < off + filesz)
    };
    let &(off, vaddr, ..) = holding(file_entry.file_offset)?;
    let bias = file_entry
        .start
        .wrapping_sub(file_entry.file_offset.wrapping_sub(off).wrapping_add(vaddr));
    let at = anon.start.wrapping_sub(bias);
    let segment = *segments.iter().find(|&&(_, vaddr, _, memsz, executable)| {
        executable && vaddr & !(PAGE - 1) <= at && at < vaddr.saturating_add(memsz)
    })?;
    let (off, vaddr, ..) = segment;
    let offset = (at.wrapping_sub(vaddr)).wrapping_add(off);
    // A start below the segment's page-aligned offset is no file offset.
    (offset >= off & !(PAGE - 1)).then_some((offset, segment))
}

/// Whether `anon` holds the bytes of `file` from `offset` on, where both
/// have them (the segment's file-backed part): up to [`COMPARED_PAGES`]
/// pages spread over that range (the last one possibly partial), read from
/// the process's memory; `false` when nothing can be compared.
fn same_bytes(pid: u32, file: &File, anon: &MapsEntry, offset: u64, segment: Segment) -> bool {
    let (seg_offset, _, filesz, _, _) = segment;
    let file_end = seg_offset.saturating_add(filesz);
    let length = (anon.end - anon.start).min(file_end.saturating_sub(offset));
    if length == 0 {
        return false;
    }
    let Ok(memory) = File::open(format!("/proc/{pid}/mem")) else {
        return false;
    };
    let pages = length.div_ceil(PAGE);
    let step = (pages / COMPARED_PAGES).max(1);
    let (mut in_memory, mut in_file) = (vec![0u8; PAGE as usize], vec![0u8; PAGE as usize]);
    (0..pages).step_by(step as usize).all(|page| {
        let delta = page * PAGE;
        let size = PAGE.min(length - delta) as usize;
        let (in_memory, in_file) = (&mut in_memory[..size], &mut in_file[..size]);
        memory.read_exact_at(in_memory, anon.start + delta).is_ok()
            && file.read_exact_at(in_file, offset + delta).is_ok()
            && in_memory == in_file
    })
}

#[cfg(test)]
#[path = "anon_text_tests.rs"]
mod tests;
