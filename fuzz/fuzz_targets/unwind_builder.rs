//! The unwind-table builder (`unwind::build_table`) on hostile objects: the
//! agent builds tables from every executable mapping on the machine, so an
//! object anyone can run must not crash it. The first byte picks how the
//! rest is used: as a whole ELF file, or as the contents of the `.eh_frame`
//! or `.debug_frame` section of a minimal x86-64 ELF shared object made
//! here (so mutations reach gimli's CFI parsing and the row builder, not
//! only the ELF header checks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use lightswitch::unwind::build_table;

/// Address the wrapped section is loaded at.
const SECTION_ADDR: u64 = 0x1000;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let elf;
    let bytes = match mode % 3 {
        0 => rest,
        1 => {
            elf = elf_with_section(b".eh_frame", rest);
            &elf
        }
        _ => {
            elf = elf_with_section(b".debug_frame", rest);
            &elf
        }
    };
    if let Ok(table) = build_table(bytes) {
        // Every row of an accepted table decodes and is found by lookup.
        for row in table.iter_rows() {
            assert_eq!(table.lookup(row.start), row.rule);
        }
    }
});

/// A little-endian ELF64 `ET_DYN` for x86-64 whose only sections are
/// `name` (holding `contents`, at [`SECTION_ADDR`]) and `.shstrtab`.
fn elf_with_section(name: &[u8], contents: &[u8]) -> Vec<u8> {
    let mut shstrtab = vec![0u8];
    shstrtab.extend_from_slice(name);
    shstrtab.push(0);
    shstrtab.extend_from_slice(b".shstrtab\0");
    let section_offset = 64u64;
    let shstrtab_offset = section_offset + contents.len() as u64;
    let shoff = (shstrtab_offset + shstrtab.len() as u64).next_multiple_of(8);

    let mut out = Vec::with_capacity(shoff as usize + 3 * 64);
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    out.extend_from_slice(&3u16.to_le_bytes()); // e_type: ET_DYN
    out.extend_from_slice(&62u16.to_le_bytes()); // e_machine: EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes()); // e_version
    out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    out.extend_from_slice(&0u64.to_le_bytes()); // e_phoff
    out.extend_from_slice(&shoff.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    for v in [64u16, 56, 0, 64, 3, 2] {
        // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(contents);
    out.extend_from_slice(&shstrtab);
    out.resize(shoff as usize, 0);
    out.extend_from_slice(&[0u8; 64]); // the null section
    let flags_alloc = 2u64;
    section_header(
        &mut out,
        1,
        1,
        flags_alloc,
        SECTION_ADDR,
        section_offset,
        contents.len() as u64,
    );
    let shstrtab_name = 1 + name.len() as u32 + 1;
    section_header(
        &mut out,
        shstrtab_name,
        3,
        0,
        0,
        shstrtab_offset,
        shstrtab.len() as u64,
    );
    out
}

/// Appends one `Elf64_Shdr` (no link, info or entry size; alignment 1).
fn section_header(
    out: &mut Vec<u8>,
    name: u32,
    kind: u32,
    flags: u64,
    addr: u64,
    offset: u64,
    size: u64,
) {
    out.extend_from_slice(&name.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    for v in [flags, addr, offset, size] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&0u32.to_le_bytes()); // sh_link
    out.extend_from_slice(&0u32.to_le_bytes()); // sh_info
    out.extend_from_slice(&1u64.to_le_bytes()); // sh_addralign
    out.extend_from_slice(&0u64.to_le_bytes()); // sh_entsize
}
