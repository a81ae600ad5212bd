//! Finding `.eh_frame` through `PT_GNU_EH_FRAME` and its `.eh_frame_hdr`
//! (`unwind::eh_frame_hdr::eh_frame_from_segments`), which the agent does
//! as root for every object without section headers that a process maps.
//! An input that is an ELF file is read as it is. Any other is wrapped in
//! a minimal ELF64 file, so that mutations reach the header's own fields:
//! its first two bytes (little-endian) say where `.eh_frame_hdr` ends in
//! the rest, which is
//! one `PT_LOAD` segment at virtual address 0 holding the whole file and
//! the `PT_GNU_EH_FRAME` segment over `.eh_frame_hdr`. An accepted
//! `.eh_frame` is non-empty and lies inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lightswitch::unwind::eh_frame_hdr::eh_frame_from_segments;
use object::read::elf::ElfFile64;
use object::Endianness;

/// ELF64 header and program header sizes.
const EHDR: usize = 64;
const PHDR: usize = 56;

fuzz_target!(|data: &[u8]| {
    let owned;
    let elf = if data.starts_with(b"\x7fELF") {
        data
    } else {
        owned = wrap(data);
        &owned
    };
    let Ok(file) = ElfFile64::<Endianness>::parse(elf) else {
        return;
    };
    if let Ok(Some(found)) = eh_frame_from_segments(&file) {
        assert!(!found.data.is_empty());
        let range = elf.as_ptr_range();
        let inside = found.data.as_ptr_range();
        assert!(range.start <= inside.start && inside.end <= range.end);
        found.bases();
    }
});

/// A little-endian x86-64 ELF64 shared object: header, two program
/// headers, then `data[2..]` at offset 176, as many of its first bytes as
/// `data[..2]` says (little-endian) the `PT_GNU_EH_FRAME` segment.
fn wrap(data: &[u8]) -> Vec<u8> {
    let (hdr_len, rest) = match data {
        [low, high, rest @ ..] => (u16::from_le_bytes([*low, *high]), rest),
        _ => (0, data),
    };
    let start = EHDR + 2 * PHDR;
    let mut elf = vec![0u8; start];
    elf[..16].copy_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    elf[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    elf[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    elf[20..24].copy_from_slice(&1u32.to_le_bytes());
    elf[32..40].copy_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    elf[52..54].copy_from_slice(&(EHDR as u16).to_le_bytes());
    elf[54..56].copy_from_slice(&(PHDR as u16).to_le_bytes());
    elf[56..58].copy_from_slice(&2u16.to_le_bytes()); // e_phnum
    elf.extend_from_slice(rest);
    let total = elf.len() as u64;
    let hdr_len = u64::from(hdr_len).min(rest.len() as u64);
    // (type, offset, vaddr, filesz)
    let segments = [
        (1u32, 0u64, 0u64, total),                          // PT_LOAD
        (0x6474_e550, start as u64, start as u64, hdr_len), // PT_GNU_EH_FRAME
    ];
    for (i, (kind, offset, vaddr, size)) in segments.into_iter().enumerate() {
        let ph = &mut elf[EHDR + i * PHDR..EHDR + (i + 1) * PHDR];
        ph[0..4].copy_from_slice(&kind.to_le_bytes());
        ph[4..8].copy_from_slice(&4u32.to_le_bytes()); // PF_R
        ph[8..16].copy_from_slice(&offset.to_le_bytes());
        ph[16..24].copy_from_slice(&vaddr.to_le_bytes());
        ph[24..32].copy_from_slice(&vaddr.to_le_bytes());
        ph[32..40].copy_from_slice(&size.to_le_bytes());
        ph[40..48].copy_from_slice(&size.to_le_bytes());
        ph[48..56].copy_from_slice(&8u64.to_le_bytes());
    }
    elf
}
