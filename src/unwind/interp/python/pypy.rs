//! PyPy, recognised so that it is reported, not walked (docs/python.md,
//! "What is not covered"): its frames are RPython objects and JIT code, not
//! CPython's structures. An object is PyPy's when it exports
//! `pypy_main_startup` (the entry its launcher calls) or `PyPy_GetVersion`
//! (its C API): [`EXPORTS`]. PyPy keeps no version number in memory that a reader could
//! find by a symbol (`PyPy_GetVersion` builds its string at run time); its
//! version is the text its own `sys.version` shows, stored in the object's
//! data (`... [PyPy 7.3.11 with GCC ...]`). Its eval loop has no symbol
//! (Debian's `libpypy3.9-c.so` has no `.symtab`), so the code it is known
//! by is the object's executable segments.

use std::ops::Range;

use object::{Object, ObjectSegment, SegmentFlags};

/// What marks PyPy's version in its `sys.version` text.
const VERSION_MARK: &[u8] = b"[PyPy ";

/// A PyPy interpreter object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyPy {
    /// `7.3.11`, from the object's version text; `None` when it has none.
    pub version: Option<String>,
    /// Object vaddr ranges of its executable segments.
    pub code: Vec<Range<u64>>,
}

impl PyPy {
    /// The frame its processes' stacks get: `[python: unsupported PyPy 7.3.11]`.
    pub fn label(&self) -> String {
        match &self.version {
            Some(v) => format!("[python: unsupported PyPy {v}]"),
            None => "[python: unsupported PyPy]".to_string(),
        }
    }
}

/// Exports of which one makes an object PyPy's.
pub const EXPORTS: [&str; 2] = ["pypy_main_startup", "PyPy_GetVersion"];

/// What PyPy's object `elf` (one exporting one of [`EXPORTS`], whose file's
/// bytes are `bytes`) says of it.
pub fn read(elf: &object::File<'_>, bytes: &[u8]) -> PyPy {
    let code = elf
        .segments()
        .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.contains(object::elf::PF_X)))
        .map(|s| s.address()..s.address() + s.size())
        .collect::<Vec<_>>();
    PyPy {
        version: version_text(bytes),
        code,
    }
}

/// The version after the first `[PyPy ` in `bytes`: digits and dots, at
/// most 16 bytes (`7.3.11`).
fn version_text(bytes: &[u8]) -> Option<String> {
    let at = memchr::memmem::find(bytes, VERSION_MARK)? + VERSION_MARK.len();
    let version: String = bytes[at..]
        .iter()
        .take(16)
        .take_while(|b| b.is_ascii_digit() || **b == b'.')
        .map(|&b| char::from(b))
        .collect();
    let version = version.trim_end_matches('.');
    (!version.is_empty() && version.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| version.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_the_sys_version_text() {
        let text = b"\x003.9.16 (7.3.11+dfsg-2, Dec 30 2024)\n[PyPy 7.3.11 with GCC 12.2.0]\x00";
        assert_eq!(version_text(text).as_deref(), Some("7.3.11"));
        assert_eq!(version_text(b"[PyPy ]"), None);
        assert_eq!(version_text(b"[PyPy .x"), None);
        assert_eq!(version_text(b"no mark"), None);
        let pypy = PyPy {
            version: None,
            code: Vec::new(),
        };
        assert_eq!(pypy.label(), "[python: unsupported PyPy]");
    }
}
