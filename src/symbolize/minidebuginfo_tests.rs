//! MiniDebugInfo read from a program built here the Fedora way, and the
//! same section corrupted in every way a reader meets: never a panic,
//! always counted and skipped.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSymbol};

use super::*;
use crate::symbolize::elf_file::ObjectFile;

const SOURCE: &str = "\
static int __attribute__((noinline)) hidden_helper(int x) { return x * 3 + 1; }\n\
int __attribute__((noinline)) visible_entry(int x) { return hidden_helper(x) + 2; }\n\
int main(int argc, char **argv) { return visible_entry(argc); }\n";

/// Runs a tool; `false` (and a note) when it is missing or fails.
fn ran(command: &mut Command) -> bool {
    let ok = command.status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: {command:?} failed");
    }
    ok
}

/// A program with a static function, stripped, with the `.gnu_debugdata`
/// Fedora's find-debuginfo would give it (only `.symtab` of the functions
/// `.dynsym` lacks, xz-compressed by liblzma here), its unstripped original,
/// and the compressed section; `None` when gcc or binutils are missing.
fn fedora_program(dir: &Path) -> Option<(PathBuf, PathBuf, Vec<u8>)> {
    let source = dir.join("p.c");
    fs::write(&source, SOURCE).expect("write source");
    let original = dir.join("p.orig");
    let gcc = Command::new("gcc")
        .args(["-O2", "-g", "-o"])
        .arg(&original)
        .arg(&source)
        .status();
    if !gcc.is_ok_and(|s| s.success()) {
        eprintln!("skipped: gcc failed");
        return None;
    }
    let keep = dir.join("keep");
    // The program exports nothing: every function goes into the table.
    fs::write(&keep, "hidden_helper\nvisible_entry\nmain\n").expect("write");
    let mini = dir.join("mini");
    let objcopy = Command::new("objcopy")
        .args(["-S", "--remove-section", ".gdb_index", "--remove-section"])
        .arg(".comment")
        .arg(format!("--keep-symbols={}", keep.display()))
        .arg(&original)
        .arg(&mini)
        .status();
    if !objcopy.is_ok_and(|s| s.success()) {
        eprintln!("skipped: objcopy failed");
        return None;
    }
    let xz = liblzma::encode_all(&*fs::read(&mini).expect("read"), 6).expect("xz");
    let program = dir.join("p");
    fs::copy(&original, &program).expect("copy");
    let section = dir.join("mini.xz");
    fs::write(&section, &xz).expect("write");
    let stripped = ran(Command::new("strip").arg("--strip-all").arg(&program))
        && ran(Command::new("objcopy")
            .arg(format!(
                "--add-section=.gnu_debugdata={}",
                section.display()
            ))
            .arg(&program));
    stripped.then_some((program, original, xz))
}

/// `(address, size)` of function `name` in the ELF file at `path`.
fn function(path: &Path, name: &str) -> (u64, u64) {
    let bytes = fs::read(path).expect("read");
    let file = ElfFile64::<Endianness>::parse(&*bytes).expect("parse");
    let symbol = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no {name}"));
    (symbol.address(), symbol.size())
}

/// `program` with its `.gnu_debugdata` replaced by `section`.
fn with_section(program: &Path, section: &[u8], dir: &Path) -> Option<PathBuf> {
    let data = dir.join("section");
    fs::write(&data, section).expect("write");
    let out = dir.join("p.corrupt");
    ran(Command::new("objcopy")
        .arg(format!(
            "--update-section=.gnu_debugdata={}",
            data.display()
        ))
        .arg(program)
        .arg(&out))
    .then_some(out)
}

#[test]
fn static_functions_are_named_from_gnu_debugdata() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((program, original, _)) = fedora_program(dir.path()) else {
        return;
    };
    let object = ObjectFile::open(&program).expect("opens");
    let before = stats().read;
    let symbols = object.mini_debug_info(&program).expect("read");
    assert!(stats().read > before);
    for name in ["hidden_helper", "visible_entry", "main"] {
        let (start, size) = function(&original, name);
        assert!(size > 0, "{name}");
        assert_eq!(symbols.name_of(start), Some(name));
        assert_eq!(symbols.name_of(start + size - 1), Some(name));
    }
    // The original has a `.symtab`: its symbols are read directly.
    let original = ObjectFile::open(&original).expect("opens");
    assert!(original.mini_debug_info(Path::new("p.orig")).is_none());
}

/// Every kind of damage is refused, counted, and leaves the object without
/// MiniDebugInfo names; nothing panics.
#[test]
fn corrupt_sections_are_counted_and_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((program, _, xz)) = fedora_program(dir.path()) else {
        return;
    };
    let size = decompressed_size(&xz).expect("size");
    assert!(size > 1000, "{size}");
    // Damaged copies: each byte flipped in turn at a stride that reaches
    // the header, blocks, index and footer; truncations; garbage; padding.
    let mut damaged: Vec<Vec<u8>> = (0..xz.len())
        .step_by(7)
        .chain([xz.len() - 1, xz.len() - 12, 0, 6])
        .map(|i| {
            let mut copy = xz.clone();
            copy[i] ^= 0x55;
            copy
        })
        .collect();
    damaged.extend([1, 12, xz.len() / 2, xz.len() - 1].map(|n| xz[..n].to_vec()));
    damaged.push(vec![0xfd; 64]);
    damaged.push(Vec::new());
    let mut two_streams = xz.clone();
    two_streams.extend_from_slice(&liblzma::encode_all(&b"more"[..], 0).expect("xz"));
    damaged.push(two_streams);
    for (i, bytes) in damaged.iter().enumerate() {
        assert!(
            matches!(read_symbols(bytes), Err(Unreadable::Corrupt(_))),
            "damaged copy {i} was read"
        );
    }
    // Through the object: counted, and no table.
    let corrupt_program = with_section(&program, &damaged[3], dir.path()).expect("objcopy");
    let object = ObjectFile::open(&corrupt_program).expect("opens");
    let before = stats().corrupt;
    assert!(object.mini_debug_info(&corrupt_program).is_none());
    assert!(stats().corrupt > before);
}

/// A section whose index announces more than [`MAX_DECOMPRESSED_BYTES`]
/// is refused before anything is inflated.
#[test]
fn oversized_sections_are_refused_from_their_index() {
    let zeros = vec![0u8; MAX_DECOMPRESSED_BYTES as usize + 1];
    let xz = liblzma::encode_all(&*zeros, 0).expect("xz");
    drop(zeros);
    assert_eq!(decompressed_size(&xz), Ok(MAX_DECOMPRESSED_BYTES + 1));
    assert_eq!(
        read_symbols(&xz).err(),
        Some(Unreadable::TooLarge(MAX_DECOMPRESSED_BYTES + 1))
    );
}
