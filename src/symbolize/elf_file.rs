//! What the symbolizer reads from an object file itself, where blazesym does
//! not: the separate debug file found by build ID alone (blazesym looks in
//! `.build-id` directories only for objects with a `.gnu_debuglink`), and
//! for objects without section headers (`llvm-objcopy --strip-sections`)
//! the dynamic symbol table, found through `PT_DYNAMIC` (blazesym reads
//! symbols by section); and the names of PLT stubs ([`super::plt`]).

use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::{Dyn, ElfFile64, GnuHashTable, HashTable, ProgramHeader, Sym};
use object::{Endianness, Object, StringTable};

use super::function_symbols::FunctionSymbols;
use super::plt::{self, PltStubs};
use crate::unwind::eh_frame_hdr::loaded_bytes;
use crate::unwind::identity::find_debug_file_by_build_id;

/// Size of one `Elf64_Sym`, bytes.
const SYM64_SIZE: u64 = 24;

/// Most dynamic symbols read from one object (real ones have at most a few
/// hundred thousand).
const MAX_DYNAMIC_SYMBOLS: u64 = 1 << 22;

/// A 64-bit ELF object file, mapped read-only.
pub(super) struct ObjectFile {
    map: memmap2::Mmap,
}

impl ObjectFile {
    /// Maps the file at `path`; `None` when it cannot be read or is not a
    /// 64-bit ELF file.
    pub fn open(path: &Path) -> Option<ObjectFile> {
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: a read-only private mapping of an object file, as blazesym
        // maps them too; a file truncated while it is read can fault.
        let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
        let object = ObjectFile { map };
        object.elf()?;
        Some(object)
    }

    /// Whether any of the virtual `addresses` is in a PLT section (section
    /// headers only: the test before [`Self::plt_stubs`] reads relocations).
    pub fn in_plt(&self, addresses: &[u64]) -> bool {
        self.elf()
            .is_some_and(|elf| plt::any_in_plt(&elf, addresses))
    }

    /// The `name@plt` of each PLT stub ([`PltStubs`]); `None` when no stub
    /// can be named.
    pub fn plt_stubs(&self) -> Option<PltStubs> {
        PltStubs::of(&self.elf()?)
    }

    /// Whether the file has DWARF debugging information of its own (a
    /// `.debug_info` section, or a compressed `.zdebug_info`).
    pub fn has_dwarf(&self) -> bool {
        self.elf().is_some_and(|elf| {
            elf.section_by_name(".debug_info").is_some()
                || elf.section_by_name(".zdebug_info").is_some()
        })
    }

    fn elf(&self) -> Option<ElfFile64<'_, Endianness>> {
        ElfFile64::parse(&*self.map).ok()
    }

    /// The virtual address (the object's own, before any load bias) of the
    /// byte at `file_offset`: through the file-backed part of the `PT_LOAD`
    /// segment that holds it.
    pub fn virtual_address(&self, file_offset: u64) -> Option<u64> {
        let file = self.elf()?;
        let endian = file.endian();
        file.elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .find_map(|ph| {
                let delta = file_offset.checked_sub(ph.p_offset(endian))?;
                (delta < ph.p_filesz(endian)).then(|| ph.p_vaddr(endian).wrapping_add(delta))
            })
    }

    /// The separate debug file of an object without DWARF of its own
    /// (`.debug_info`): `ROOT/.build-id/xx/yyyy.debug` under the first of
    /// `debug_dirs` that has it. Objects with a `.gnu_debuglink` are looked
    /// up here too (Debian's debug packages install both names; blazesym
    /// follows the link when this finds nothing), so that the symbolizer
    /// knows which file it reads ([`super::debug_copy`]).
    pub fn debug_file_by_build_id(&self, debug_dirs: &[PathBuf]) -> Option<PathBuf> {
        let file = self.elf()?;
        if file.section_by_name(".debug_info").is_some() {
            return None;
        }
        find_debug_file_by_build_id(file.build_id().ok()??, debug_dirs)
    }

    /// The GNU build ID of an object whose debug information is nowhere
    /// on this machine: no DWARF of its own (`.debug_info`), no debug file
    /// by build ID under `debug_dirs`, no file by its `.gnu_debuglink` name
    /// (beside `real_path`, the object's path as its process saw it, in its
    /// `.debug/` directory, or under `debug_dirs`; only whether such a file
    /// exists is checked, not its CRC, so that this costs a few `stat`s per
    /// window). `None` otherwise, and for objects without a build ID.
    pub fn build_id_without_local_debug_info(
        &self,
        real_path: &Path,
        debug_dirs: &[PathBuf],
    ) -> Option<Vec<u8>> {
        let file = self.elf()?;
        if file.section_by_name(".debug_info").is_some() {
            return None;
        }
        let id = file.build_id().ok()??;
        if find_debug_file_by_build_id(id, debug_dirs).is_some() {
            return None;
        }
        if let Ok(Some((name, _))) = file.gnu_debuglink() {
            let name = Path::new(std::str::from_utf8(name).ok()?);
            let dir = real_path.parent()?;
            let relative = dir.strip_prefix("/").unwrap_or(dir);
            let mut candidates = [dir.join(name), dir.join(".debug").join(name)]
                .into_iter()
                .chain(debug_dirs.iter().map(|root| root.join(relative).join(name)));
            if candidates.any(|c| c != real_path && c.is_file()) {
                return None;
            }
        }
        Some(id.to_vec())
    }

    /// The function symbols of the dynamic symbol table of an object without
    /// section headers, found through `PT_DYNAMIC` (`DT_SYMTAB`, `DT_STRTAB`,
    /// `DT_STRSZ`; the count from `DT_GNU_HASH` or `DT_HASH`). `None` for
    /// objects with section headers (blazesym reads their symbols) and
    /// objects without a readable dynamic symbol table.
    pub fn dynamic_symbols(&self) -> Option<FunctionSymbols> {
        let file = self.elf()?;
        if !file.elf_section_table().is_empty() {
            return None;
        }
        let endian = file.endian();
        let data = file.data();
        let dynamic = file
            .elf_program_headers()
            .iter()
            .find_map(|ph| ph.dynamic(endian, data).ok().flatten())?;
        let value = |tag| {
            dynamic
                .iter()
                .take_while(|d| d.d_tag(endian) != elf::DT_NULL)
                .find(|d| d.d_tag(endian) == tag)
                .map(|d| d.d_val(endian))
        };
        let loaded = |address| loaded_bytes(&file, address);
        let (symtab, strtab) = (value(elf::DT_SYMTAB)?, value(elf::DT_STRTAB)?);
        let count = match (value(elf::DT_GNU_HASH), value(elf::DT_HASH)) {
            (Some(gnu), _) => {
                GnuHashTable::<elf::FileHeader64<Endianness>>::parse(endian, loaded(gnu)?)
                    .ok()?
                    .symbol_table_length(endian)?
            }
            (None, Some(sysv)) => {
                HashTable::<elf::FileHeader64<Endianness>>::parse(endian, loaded(sysv)?)
                    .ok()?
                    .symbol_table_length()
            }
            (None, None) => u32::try_from(strtab.checked_sub(symtab)? / SYM64_SIZE).ok()?,
        };
        let count = u64::from(count).min(MAX_DYNAMIC_SYMBOLS);
        let sym_bytes = loaded(symtab)?.get(..usize::try_from(count * SYM64_SIZE).ok()?)?;
        let (syms, _) =
            object::pod::slice_from_bytes::<elf::Sym64<Endianness>>(sym_bytes, count as usize)
                .ok()?;
        let strtab_bytes = loaded(strtab)?;
        let strsz = value(elf::DT_STRSZ).unwrap_or(strtab_bytes.len() as u64);
        let strings = StringTable::new(strtab_bytes, 0, strsz);
        let functions = syms
            .iter()
            .filter(|s| {
                matches!(s.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC) && !s.is_undefined(endian)
            })
            .filter_map(|s| {
                let name = strings.get(s.st_name(endian)).ok()?;
                Some((s.st_value(endian), s.st_size(endian), name))
            });
        Some(FunctionSymbols::new(functions))
    }

    /// The function symbols of the object's MiniDebugInfo (`.gnu_debugdata`,
    /// see [`super::minidebuginfo`]); `None` when it has none, has a
    /// `.symtab` of its own, or the section cannot be read (counted).
    /// `path` is for messages.
    pub fn mini_debug_info(&self, path: &Path) -> Option<FunctionSymbols> {
        super::minidebuginfo::function_symbols(&self.elf()?, path)
    }
}

#[cfg(test)]
mod tests {
    use object::{ObjectSymbol, SymbolKind};

    use super::*;

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    /// A copy of `elf` in `dir` without its section header table, as
    /// `llvm-objcopy --strip-sections` leaves it for a reader.
    fn without_section_headers(elf: &[u8], dir: &Path) -> PathBuf {
        let mut bytes = elf.to_vec();
        bytes[0x28..0x30].fill(0);
        bytes[0x3c..0x40].fill(0);
        let path = dir.join("sectionless.so");
        std::fs::write(&path, bytes).expect("write");
        path
    }

    #[test]
    fn dynamic_symbols_through_pt_dynamic_name_what_dynsym_names() {
        let Ok(libc) = std::fs::read(LIBC) else {
            eprintln!("skipped: {LIBC} is absent");
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let sectionless = ObjectFile::open(&without_section_headers(&libc, dir.path()))
            .expect("opens without sections");
        let symbols = sectionless.dynamic_symbols().expect("PT_DYNAMIC symbols");
        assert!(
            ObjectFile::open(Path::new(LIBC))
                .expect("opens")
                .dynamic_symbols()
                .is_none(),
            "objects with section headers are left to blazesym"
        );
        // The reference: `.dynsym` read through the section headers.
        let file = ElfFile64::<Endianness>::parse(&*libc).expect("parses");
        let mut checked = 0;
        for sym in file.dynamic_symbols() {
            if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.size() == 0 {
                continue;
            }
            let name = symbols
                .name_of(sym.address() + sym.size() / 2)
                .expect("named");
            let alias = file.dynamic_symbols().any(|other| {
                other.name_bytes().ok() == Some(name.as_bytes()) && other.address() == sym.address()
            });
            assert!(
                alias,
                "{:?} at {:#x} named {name}",
                sym.name(),
                sym.address()
            );
            checked += 1;
        }
        assert!(checked > 1000, "only {checked} functions");
        assert_eq!(symbols.name_of(0), None);
    }

    #[test]
    fn file_offsets_become_virtual_addresses_through_pt_load() {
        let Some(object) = ObjectFile::open(Path::new(LIBC)) else {
            eprintln!("skipped: {LIBC} is absent");
            return;
        };
        let file = object.elf().expect("parses");
        let text = file.section_by_name(".text").expect(".text");
        let (offset, _) = object::ObjectSection::file_range(&text).expect("in the file");
        let address = object::ObjectSection::address(&text);
        assert_eq!(object.virtual_address(offset + 16), Some(address + 16));
        assert_eq!(object.virtual_address(u64::MAX), None);
    }

    #[test]
    fn debug_file_is_found_by_build_id_without_dwarf_of_its_own() {
        let Ok(libc) = std::fs::read(LIBC) else {
            eprintln!("skipped: {LIBC} is absent");
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let object_path = without_section_headers(&libc, dir.path());
        let object = ObjectFile::open(&object_path).expect("opens");
        let id = object
            .elf()
            .and_then(|f| f.build_id().ok()?)
            .expect("id")
            .to_vec();
        let (empty, root) = (dir.path().join("empty"), dir.path().join("debug"));
        assert_eq!(
            object.debug_file_by_build_id(&[empty.clone(), root.clone()]),
            None
        );
        assert_eq!(
            object.build_id_without_local_debug_info(&object_path, &[empty.clone(), root.clone()]),
            Some(id.clone()),
            "nothing local: ask debuginfod"
        );
        let debug_path = root
            .join(".build-id")
            .join(format!("{:02x}", id[0]))
            .join(format!("{}.debug", crate::unwind::identity::hex(&id[1..])));
        std::fs::create_dir_all(debug_path.parent().expect("parent")).expect("mkdir");
        // Any ELF file with the same build ID will do as its debug file.
        std::fs::copy(&object_path, &debug_path).expect("copy");
        assert_eq!(
            object.debug_file_by_build_id(&[empty.clone(), root.clone()]),
            Some(debug_path.clone())
        );
        assert_eq!(
            object.build_id_without_local_debug_info(&object_path, &[empty, root.clone()]),
            None,
            "found by build ID"
        );
        // A `.gnu_debuglink` does not stop the lookup by build ID.
        let with_link = ObjectFile::open(Path::new(LIBC)).expect("opens");
        assert_eq!(with_link.debug_file_by_build_id(&[root]), Some(debug_path));
    }
}
