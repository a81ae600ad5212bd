//! Names of PLT stubs: the small entries in `.plt`, `.plt.sec` and
//! `.plt.got` through which an object calls functions of other objects.
//! They have no symbols of their own, so a symbol-table lookup names them
//! after whatever function precedes them (`_init`, from `.init`); perf and
//! objdump call them `name@plt`, and so does this module.
//!
//! Each stub is an indirect jump through a GOT slot (`jmp *slot(%rip)`,
//! opcode `ff 25`, after an `endbr64` and a `bnd` prefix where IBT or MPX
//! built them), and the dynamic relocation of that slot names the function
//! (`R_X86_64_JUMP_SLOT` in `.rela.plt`, `R_X86_64_GLOB_DAT` in `.rela.dyn`
//! for `.plt.got`; an `R_X86_64_IRELATIVE` slot by the IFUNC symbol at its
//! addend). Decoding the jump rather than counting entries keeps the names
//! right however the linker ordered the slots. x86-64 only: other
//! machines' stubs are other instruction sequences.

use std::collections::HashMap;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, SectionHeader};
use object::{
    Endianness, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, RelocationTarget,
};

/// The sections that hold PLT stubs.
const PLT_SECTIONS: [&str; 3] = [".plt", ".plt.sec", ".plt.got"];

/// Size of a stub when the section header does not say, bytes.
const DEFAULT_STUB_BYTES: u64 = 16;

/// Most stubs read from one section (real objects have a few thousand).
const MAX_STUBS: u64 = 1 << 20;

/// One PLT section of an object.
#[derive(Debug, Clone, Copy)]
struct PltSection<'data> {
    /// Virtual address of its first byte.
    start: u64,
    /// Size of each stub, bytes.
    stub_bytes: u64,
    /// Its bytes.
    data: &'data [u8],
}

impl PltSection<'_> {
    /// Start of the stub holding virtual address `address`, if the section does.
    fn stub_of(&self, address: u64) -> Option<u64> {
        let offset = address.checked_sub(self.start)?;
        (offset < self.data.len() as u64)
            .then(|| self.start + offset / self.stub_bytes * self.stub_bytes)
    }
}

/// The PLT sections of `file`; none unless it is an x86-64 object.
fn plt_sections<'data>(file: &ElfFile64<'data, Endianness>) -> Vec<PltSection<'data>> {
    if file.elf_header().e_machine(file.endian()) != elf::EM_X86_64 {
        return Vec::new();
    }
    PLT_SECTIONS
        .iter()
        .filter_map(|name| {
            let section = file.section_by_name(name)?;
            let data = section.data().ok()?;
            let entsize = section.elf_section_header().sh_entsize(file.endian());
            let stub_bytes = if entsize == 0 {
                DEFAULT_STUB_BYTES
            } else {
                entsize
            };
            Some(PltSection {
                start: section.address(),
                stub_bytes,
                data,
            })
        })
        .collect()
}

/// Whether any of the virtual `addresses` is in a PLT section of `file`:
/// the cheap test (section headers only) before [`PltStubs::of`] reads the
/// dynamic relocations.
pub(super) fn any_in_plt(file: &ElfFile64<'_, Endianness>, addresses: &[u64]) -> bool {
    let sections = plt_sections(file);
    addresses
        .iter()
        .any(|&a| sections.iter().any(|s| s.stub_of(a).is_some()))
}

/// The function each PLT stub of one object calls, by stub address.
#[derive(Debug, Default)]
pub(super) struct PltStubs {
    /// Address ranges of the PLT sections, `[start, end)`, with their stub
    /// size in bytes.
    sections: Vec<(u64, u64, u64)>,
    /// Stub start address -> the (mangled) name of the function it calls.
    stubs: HashMap<u64, String>,
}

impl PltStubs {
    /// The stubs of `file`; `None` when it is not an x86-64 object or has
    /// no PLT section with a named stub.
    pub fn of(file: &ElfFile64<'_, Endianness>) -> Option<PltStubs> {
        let sections = plt_sections(file);
        if sections.is_empty() {
            return None;
        }
        let slots = slot_names(file);
        let mut plt = PltStubs::default();
        for section in sections {
            for (i, stub) in section
                .data
                .chunks_exact(section.stub_bytes as usize)
                .take(MAX_STUBS as usize)
                .enumerate()
            {
                let address = section.start + i as u64 * section.stub_bytes;
                if let Some(name) = jump_slot(stub, address).and_then(|slot| slots.get(&slot)) {
                    plt.stubs.insert(address, name.clone());
                }
            }
            let end = section.start + section.data.len() as u64;
            plt.sections.push((section.start, end, section.stub_bytes));
        }
        (!plt.stubs.is_empty()).then_some(plt)
    }

    /// The heap the table holds, bytes (estimated from its capacities).
    pub fn heap_bytes(&self) -> u64 {
        let slot = std::mem::size_of::<(u64, String)>() + 1;
        let names: usize = self.stubs.values().map(String::capacity).sum();
        let sections = self.sections.capacity() * std::mem::size_of::<(u64, u64, u64)>();
        (self.stubs.capacity() * slot + names + sections) as u64
    }

    /// The function the stub holding virtual address `address` calls
    /// (mangled; a frame shows it as `name@plt`); `None`
    /// outside the PLT sections and for stubs that jump through no named
    /// slot (the resolver stub at the start of `.plt`).
    pub fn name_of(&self, address: u64) -> Option<&str> {
        let &(start, _, stub_bytes) = self
            .sections
            .iter()
            .find(|&&(start, end, _)| (start..end).contains(&address))?;
        let stub = start + (address - start) / stub_bytes * stub_bytes;
        self.stubs.get(&stub).map(String::as_str)
    }
}

/// The GOT slot an x86-64 stub at virtual address `address` jumps through:
/// the first `ff 25 rel32` (`jmp *rel32(%rip)`) in its bytes; the slot is
/// relative to the end of that 6-byte instruction.
fn jump_slot(stub: &[u8], address: u64) -> Option<u64> {
    let at = stub.windows(6).position(|w| w[0] == 0xff && w[1] == 0x25)?;
    let rel32 = i32::from_le_bytes(stub[at + 2..at + 6].try_into().ok()?);
    let next = address + at as u64 + 6;
    Some(next.wrapping_add_signed(i64::from(rel32)))
}

/// The function each GOT slot of `file` is relocated to, from its dynamic
/// relocations: slot address -> function name (mangled, without version).
fn slot_names(file: &ElfFile64<'_, Endianness>) -> HashMap<u64, String> {
    let Some(relocations) = file.dynamic_relocations() else {
        return HashMap::new();
    };
    let symbols = file.dynamic_symbol_table();
    let mut ifuncs: Option<HashMap<u64, String>> = None;
    let mut names = HashMap::new();
    for (slot, relocation) in relocations {
        let name = match (relocation.flags(), relocation.target()) {
            (
                object::RelocationFlags::Elf {
                    r_type: elf::R_X86_64_JUMP_SLOT | elf::R_X86_64_GLOB_DAT,
                },
                RelocationTarget::Symbol(index),
            ) => symbols
                .as_ref()
                .and_then(|s| s.symbol_by_index(index).ok())
                .and_then(|s| s.name().ok().map(str::to_string)),
            (
                object::RelocationFlags::Elf {
                    r_type: elf::R_X86_64_IRELATIVE,
                },
                _,
            ) => {
                let ifuncs = ifuncs.get_or_insert_with(|| ifunc_names(file));
                u64::try_from(relocation.addend())
                    .ok()
                    .and_then(|resolver| ifuncs.get(&resolver).cloned())
            }
            _ => None,
        };
        if let Some(name) = name.filter(|n| !n.is_empty()) {
            names.insert(slot, name);
        }
    }
    names
}

/// IFUNC symbols of `file` by address (its resolver's): how an
/// `R_X86_64_IRELATIVE` slot, which names no symbol, is named. Dynamic
/// symbols first, then the static symbol table where the object has one.
fn ifunc_names(file: &ElfFile64<'_, Endianness>) -> HashMap<u64, String> {
    let mut names = HashMap::new();
    for symbol in file.dynamic_symbols().chain(file.symbols()) {
        let is_ifunc = matches!(
            symbol.flags(),
            object::SymbolFlags::Elf { st_info, .. } if st_info.st_type() == elf::STT_GNU_IFUNC
        );
        if is_ifunc && symbol.address() != 0 {
            if let Ok(name) = symbol.name() {
                names
                    .entry(symbol.address())
                    .or_insert_with(|| name.to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    use super::*;

    /// objdump's names of the PLT stubs of `path`: `address -> name`,
    /// from the `<name@plt>:` labels of `objdump -d` over the PLT sections
    /// (binutils decodes the stubs on its own).
    fn objdump_stubs(path: &Path) -> HashMap<u64, String> {
        let mut args = vec!["-d".to_string()];
        for section in PLT_SECTIONS {
            args.push(format!("--section={section}"));
        }
        let out = Command::new("objdump")
            .args(&args)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "objdump failed on {}", path.display());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| {
                let (address, label) = line.strip_suffix(">:")?.split_once(" <")?;
                let name = label.strip_suffix("@plt")?;
                // Unnamed IFUNC slots (`*ABS*+0x9f550@plt`) and the
                // resolver stub (`...@plt-0x10`) are not compared.
                (!name.starts_with("*ABS*")).then(|| {
                    (
                        u64::from_str_radix(address, 16).unwrap(),
                        name.split('@').next().unwrap().to_string(),
                    )
                })
            })
            .collect()
    }

    fn stubs_of(path: &Path) -> PltStubs {
        let data = std::fs::read(path).unwrap();
        let file = ElfFile64::<Endianness>::parse(&*data).unwrap();
        PltStubs::of(&file).unwrap_or_default()
    }

    /// Every stub objdump names is named the same, at its first byte and
    /// 7 bytes in (the last byte of the shortest stubs, `.plt.got`'s); the
    /// resolver stub at the start of `.plt` is not.
    fn assert_like_objdump(path: &Path) {
        let expected = objdump_stubs(path);
        assert!(!expected.is_empty(), "{}: no PLT stubs", path.display());
        let stubs = stubs_of(path);
        for (&address, name) in &expected {
            assert_eq!(stubs.name_of(address), Some(name.as_str()), "{address:#x}");
            let last = address + DEFAULT_STUB_BYTES / 2 - 1;
            assert_eq!(stubs.name_of(last), Some(name.as_str()), "{last:#x}");
        }
        if let Some(&(start, _, _)) = stubs.sections.first() {
            let first_named = expected.keys().min().copied().unwrap();
            if first_named > start {
                assert_eq!(stubs.name_of(start), None, "the resolver stub");
            }
        }
    }

    #[test]
    fn libc_stubs_are_named_like_objdump_names_them() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        assert_like_objdump(libc);
        // The cheap test agrees: a stub's address is in a PLT section, an
        // address past them (in `.text`) is not.
        let data = std::fs::read(libc).unwrap();
        let file = ElfFile64::<Endianness>::parse(&*data).unwrap();
        let stub = *objdump_stubs(libc).keys().next().unwrap();
        let text = file.section_by_name(".text").unwrap().address();
        assert!(any_in_plt(&file, &[text, stub + 3]));
        assert!(!any_in_plt(&file, &[text]));
    }

    /// Programs linked two ways: lazy binding (`.plt`) and IBT stubs
    /// (`.plt` plus `.plt.sec`).
    #[test]
    fn program_stubs_are_named_like_objdump_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("calls.c");
        std::fs::write(
            &source,
            "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
             int main(void) { void *p = malloc(getpid() % 7 + 1); puts(\"x\"); free(p); return 0; }\n",
        )
        .unwrap();
        for (name, flags) in [
            ("lazy", &["-Wl,-z,lazy"][..]),
            ("ibt", &["-fcf-protection=full", "-Wl,-z,ibtplt"][..]),
        ] {
            let exe = dir.path().join(name);
            let status = Command::new("gcc")
                .args(flags)
                .arg("-o")
                .arg(&exe)
                .arg(&source)
                .status()
                .unwrap();
            assert!(status.success(), "gcc {flags:?}");
            assert_like_objdump(&exe);
            let stubs = stubs_of(&exe);
            let names: Vec<&str> = stubs.stubs.values().map(String::as_str).collect();
            for wanted in ["malloc", "puts", "getpid", "free"] {
                assert!(names.contains(&wanted), "{name}: {wanted} in {names:?}");
            }
        }
    }
}
