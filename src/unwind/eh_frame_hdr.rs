//! `.eh_frame` found through the `PT_GNU_EH_FRAME` program header, for
//! objects without section headers (`llvm-objcopy --strip-sections`, some
//! packers and in-memory images).
//!
//! `PT_GNU_EH_FRAME` covers `.eh_frame_hdr` (LSB 5.0, "Exception Frames"):
//! a version byte, the encodings of the `.eh_frame` pointer, of the FDE
//! count and of the search table, the encoded `.eh_frame` pointer, then an
//! optional sorted table of (initial location, FDE address) pairs. gimli's
//! [`EhFrameHdr`] decodes it. The header does not give `.eh_frame`'s length:
//! it is bounded by the end of the file-backed part of the `PT_LOAD` segment
//! that holds it and, when the search table is present, by the end of the
//! FDE with the highest address (so bytes after `.eh_frame` in the same
//! segment are not read as CFI). Within that bound, gimli stops at the
//! zero-length terminator.

use gimli::{BaseAddresses, EhFrameHdr, LittleEndian, Pointer};
use object::elf;
use object::read::elf::{ElfFile64, ProgramHeader};
use object::Endianness;

/// `.eh_frame` located through the program headers: slices of the ELF
/// file's bytes and virtual addresses from its program headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentEhFrame<'d> {
    /// The `.eh_frame` bytes (from its start to the bound described in the
    /// module documentation).
    pub data: &'d [u8],
    /// Virtual address of `.eh_frame`'s first byte.
    pub address: u64,
    /// Virtual address of `.eh_frame_hdr` (the `PT_GNU_EH_FRAME` segment).
    pub hdr_address: u64,
}

impl SegmentEhFrame<'_> {
    /// The base addresses gimli resolves `.eh_frame`'s encoded pointers
    /// against (`.text` and `.got` are unknown without section headers;
    /// x86-64 CFI does not use text- or data-relative pointers).
    pub fn bases(&self) -> BaseAddresses {
        BaseAddresses::default()
            .set_eh_frame(self.address)
            .set_eh_frame_hdr(self.hdr_address)
    }
}

/// The `.eh_frame` of `file` through its `PT_GNU_EH_FRAME` segment, or
/// `None` when it has no such segment (or an empty one). The error says
/// what is malformed about the segment (or the `.eh_frame_hdr` in it, as
/// gimli reports it). Public for the fuzz target `eh_frame_hdr`; the table
/// builder calls it for objects without section headers.
pub fn eh_frame_from_segments<'d>(
    file: &ElfFile64<'d, Endianness>,
) -> Result<Option<SegmentEhFrame<'d>>, String> {
    let endian = file.endian();
    let data = file.data();
    let Some(hdr) = file
        .elf_program_headers()
        .iter()
        .find(|ph| ph.p_type(endian) == elf::PT_GNU_EH_FRAME && ph.p_filesz(endian) > 0)
    else {
        return Ok(None);
    };
    let hdr_address = hdr.p_vaddr(endian);
    let hdr_bytes = hdr
        .data(endian, data)
        .map_err(|()| "segment beyond the end of the file".to_string())?;
    let bases = BaseAddresses::default().set_eh_frame_hdr(hdr_address);
    let parsed = EhFrameHdr::new(hdr_bytes, LittleEndian)
        .parse(&bases, 8)
        .map_err(|e| e.to_string())?;
    let deref = |pointer| match pointer {
        Pointer::Direct(address) => Some(address),
        Pointer::Indirect(address) => {
            let bytes = loaded_bytes(file, address)?.get(..8)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        }
    };
    let (address, mut bytes) = deref(parsed.eh_frame_ptr())
        .and_then(|address| Some((address, loaded_bytes(file, address)?)))
        .ok_or_else(|| "the .eh_frame pointer is outside every PT_LOAD segment".to_string())?;
    if let Some(end) = parsed
        .table()
        .and_then(|t| last_fde_end(&t, &bases, address, bytes))
    {
        bytes = &bytes[..end.min(bytes.len())];
    }
    Ok((!bytes.is_empty()).then_some(SegmentEhFrame {
        data: bytes,
        address,
        hdr_address,
    }))
}

/// The bytes of the file-backed part of the `PT_LOAD` segment holding
/// virtual address `address`, from `address` to the segment's end (also
/// used to read the dynamic symbol table of objects without section
/// headers).
pub(crate) fn loaded_bytes<'d>(file: &ElfFile64<'d, Endianness>, address: u64) -> Option<&'d [u8]> {
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
        .find_map(|ph| {
            let start = ph.p_vaddr(endian);
            let end = start.checked_add(ph.p_filesz(endian))?;
            if !(start..end).contains(&address) {
                return None;
            }
            ph.data_range(endian, file.data(), address, end - address)
                .ok()
                .flatten()
        })
}

/// Offset (from `.eh_frame`'s start at `eh_frame`, whose bytes are `bytes`)
/// of the end of the FDE with the highest address in the search table.
fn last_fde_end(
    table: &gimli::EhHdrTable<'_, gimli::EndianSlice<'_, LittleEndian>>,
    bases: &BaseAddresses,
    eh_frame: u64,
    bytes: &[u8],
) -> Option<usize> {
    let mut entries = table.iter(bases);
    let mut last = None;
    while let Ok(Some((_, Pointer::Direct(fde)))) = entries.next() {
        last = last.max(Some(fde));
    }
    let offset = usize::try_from(last?.checked_sub(eh_frame)?).ok()?;
    let at = |start: usize, len: usize| bytes.get(start..start.checked_add(len)?);
    match u32::from_le_bytes(at(offset, 4)?.try_into().ok()?) {
        0xffff_ffff => {
            let long = u64::from_le_bytes(at(offset.checked_add(4)?, 8)?.try_into().ok()?);
            offset
                .checked_add(12)?
                .checked_add(usize::try_from(long).ok()?)
        }
        length => offset.checked_add(4)?.checked_add(length as usize),
    }
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection};

    use super::*;
    use crate::unwind::cfi::build_table;
    use crate::unwind::CfiSource;

    /// `elf` as `llvm-objcopy --strip-sections` leaves it for a reader: no
    /// section header table (`e_shoff`, `e_shnum`, `e_shstrndx` zeroed).
    fn without_section_headers(elf: &[u8]) -> Vec<u8> {
        let mut bytes = elf.to_vec();
        bytes[0x28..0x30].fill(0);
        bytes[0x3c..0x40].fill(0);
        bytes
    }

    fn libc() -> Option<Vec<u8>> {
        let path = "/lib/x86_64-linux-gnu/libc.so.6";
        let bytes = std::fs::read(path).ok();
        if bytes.is_none() {
            eprintln!("skipped: {path} is absent");
        }
        bytes
    }

    #[test]
    fn segments_find_the_eh_frame_section_bounded_by_its_last_fde() {
        let Some(libc) = libc() else { return };
        let file = ElfFile64::<Endianness>::parse(&*libc).expect("libc parses");
        let section = file.section_by_name(".eh_frame").expect(".eh_frame");
        let hdr = file
            .section_by_name(".eh_frame_hdr")
            .expect(".eh_frame_hdr");
        let found = eh_frame_from_segments(&file)
            .expect("well-formed")
            .expect("PT_GNU_EH_FRAME");
        assert_eq!(found.address, section.address());
        assert_eq!(found.hdr_address, hdr.address());
        let data = section.data().expect("data");
        // Everything but the 4-byte zero terminator after the last FDE.
        assert_eq!(found.data.len(), data.len() - 4);
        assert_eq!(found.data, &data[..data.len() - 4]);
        assert_eq!(&data[data.len() - 4..], [0; 4]);
    }

    #[test]
    fn object_without_section_headers_gets_the_same_table() {
        let Some(libc) = libc() else { return };
        let with_sections = build_table(&libc).expect("libc table");
        let stripped = without_section_headers(&libc);
        let file = ElfFile64::<Endianness>::parse(&*stripped).expect("still parses");
        assert!(file.elf_section_table().is_empty());
        let without = build_table(&stripped).expect("table from PT_GNU_EH_FRAME");
        assert!(with_sections.stats().fdes > 1000);
        assert_eq!(without.stats().source, CfiSource::EhFrame);
        assert_eq!(without, with_sections);
    }

    #[test]
    fn eh_frame_pointer_outside_the_segments_is_an_error() {
        let Some(libc) = libc() else { return };
        let mut stripped = without_section_headers(&libc);
        let file = ElfFile64::<Endianness>::parse(&*stripped).expect("parses");
        let endian = file.endian();
        let hdr = file
            .elf_program_headers()
            .iter()
            .find(|ph| ph.p_type(endian) == elf::PT_GNU_EH_FRAME)
            .expect("PT_GNU_EH_FRAME");
        let at = hdr.p_offset(endian) as usize;
        // Version 1, eh_frame_ptr encoded as an absolute udata8 (0x04), no
        // table (DW_EH_PE_omit), pointing far beyond every segment.
        stripped[at..at + 4].copy_from_slice(&[1, 0x04, 0xff, 0xff]);
        stripped[at + 4..at + 12].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let err = build_table(&stripped).expect_err("no .eh_frame there");
        assert!(
            err.to_string().contains("outside every PT_LOAD segment"),
            "{err}"
        );
    }

    #[test]
    fn fde_address_far_past_eh_frame_is_no_bound() {
        // Version 1, pointers as absolute udata8 (0x04): .eh_frame at
        // 0x100, one table entry whose FDE is 2^64-2, past every offset.
        let mut hdr = vec![1, 0x04, 0x04, 0x04];
        for word in [0x100u64, 1, 0x1000, u64::MAX - 1] {
            hdr.extend_from_slice(&word.to_le_bytes());
        }
        let bases = BaseAddresses::default();
        let parsed = EhFrameHdr::new(&hdr, LittleEndian)
            .parse(&bases, 8)
            .expect("parses");
        let table = parsed.table().expect("a table");
        // Was an overflow (a panic where overflow is checked) computing the
        // FDE's length field range.
        assert_eq!(last_fde_end(&table, &bases, 0x100, &[0xff; 64]), None);
        assert_eq!(last_fde_end(&table, &bases, 1, &[0xff; 64]), None);
    }
}
