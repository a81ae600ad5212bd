//! The files a command's exec maps before its first instruction runs: the
//! executable (for a `#!` script, its interpreter) and the ELF interpreter
//! its `PT_INTERP` names (ld.so). `record` has their unwind tables loaded
//! before it lets the command exec.

use std::io::Read;
use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, PT_INTERP};
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;

/// Most `#!` interpreters followed (the kernel allows 4 levels).
const MAX_SCRIPT_DEPTH: usize = 4;

/// The executable that exec'ing `program` runs (itself, or the
/// interpreter named by its `#!` line, followed as the kernel does) and its
/// `PT_INTERP` interpreter, if it names one. Files that cannot be read or
/// parsed are left out: they only lose this head start.
pub fn exec_images(program: &Path) -> Vec<PathBuf> {
    let mut executable = program.to_path_buf();
    for _ in 0..MAX_SCRIPT_DEPTH {
        match script_interpreter(&executable) {
            Some(interpreter) => executable = interpreter,
            None => break,
        }
    }
    let interpreter = elf_interpreter(&executable);
    std::iter::once(executable).chain(interpreter).collect()
}

/// The interpreter exec'ing `program` would need but that does not exist:
/// the one its `#!` line names, or for an ELF program the ld.so its
/// `PT_INTERP` names. `None` when there is none or it exists (whether it
/// can run is left to exec).
pub fn missing_interpreter(program: &Path) -> Option<PathBuf> {
    let interpreter = script_interpreter(program).or_else(|| elf_interpreter(program))?;
    (!interpreter.exists()).then_some(interpreter)
}

/// The interpreter a `#!` line of `path` names (its first word).
fn script_interpreter(path: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    text.split_whitespace().next().map(PathBuf::from)
}

/// The path in the `PT_INTERP` program header of the 64-bit ELF file at
/// `path`, if it has one.
fn elf_interpreter(path: &Path) -> Option<PathBuf> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping; a file changed meanwhile gives
    // a wrong or no interpreter, never unsoundness in the parse (it works
    // on bytes).
    let data = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let header = FileHeader64::<Endianness>::parse(&*data).ok()?;
    let endian = header.endian().ok()?;
    let interp = header
        .program_headers(endian, &*data)
        .ok()?
        .iter()
        .find(|ph| ph.p_type(endian) == PT_INTERP)?
        .data(endian, &*data)
        .ok()?;
    let interp = interp.split(|&b| b == 0).next()?;
    Some(PathBuf::from(std::str::from_utf8(interp).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary runs under the ld.so its PT_INTERP names, which
    /// this process has mapped; a script runs its `#!` interpreter.
    #[test]
    fn executable_and_interpreter_of_a_program_and_a_script() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let images = exec_images(&exe);
        assert_eq!(images.len(), 2, "{images:?}");
        assert_eq!(images[0], exe);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let ld_so = std::fs::canonicalize(&images[1]).unwrap();
        assert!(maps.contains(&*ld_so.to_string_lossy()), "{images:?}");

        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "#!/bin/sh -e\necho hi\n").unwrap();
        let images = exec_images(&script);
        assert_eq!(images[0], Path::new("/bin/sh"));
        assert_eq!(images.len(), 2, "{images:?}");
        // Not an executable at all: only itself.
        let text = dir.path().join("text");
        std::fs::write(&text, "plain").unwrap();
        assert_eq!(exec_images(&text), vec![text.clone()]);
        assert_eq!(missing_interpreter(&text), None);
        assert_eq!(missing_interpreter(&script), None);
        assert_eq!(missing_interpreter(&exe), None);
        std::fs::write(&script, "#!/nonexistent/interp\n").unwrap();
        assert_eq!(
            missing_interpreter(&script),
            Some(PathBuf::from("/nonexistent/interp"))
        );
    }
}
