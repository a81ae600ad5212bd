//! The CPython unwinder (docs/python.md). An object exporting `_PyRuntime`
//! is a CPython interpreter (an executable with libpython linked in, or
//! libpython itself); its version comes from `Py_Version` (3.11 on), else
//! its file name (`libpython3.9.so`, `python3.9`). Offsets come from the
//! interpreter's `_Py_DebugOffsets` (3.13) or the table in [`layout`]
//! (3.8 to 3.12), checked against the process's `PyCode_Type.tp_basicsize`
//! (and before 3.11 `PyFrame_Type.tp_basicsize`); any other
//! version, or a check that finds other values, gets one
//! `[python: unsupported …]` frame at each eval-loop frame; a check that
//! cannot read the process's memory yet (just after exec) is no verdict:
//! the process is looked at again at its next mapping. The eval loop is
//! `_PyEval_EvalFrameDefault` and its `.cold` part where a symbol table
//! names it.

pub mod layout;
mod lines;
mod names;

use std::ops::Range;

use object::{Object, ObjectSymbol};
use rustc_hash::FxHashMap;
use tracing::debug;

use super::{intern, unknown_frame, Attachment, FrameName, MappedObject, NotWalked, Unwinder};
use layout::Layout;
use names::{read_memory, CodeCache};

/// The profile mapping Python frames are shown in.
pub const MAPPING_NAME: &str = "[python]";

/// python_frame.word bit 63 (`PYTHON_ENTRY_BIT` in `src/sampling/bpf/python.h`).
const ENTRY_BIT: u64 = 1 << 63;

/// What an interpreter object's symbols say (object vaddrs).
#[derive(Debug, Clone)]
struct Symbols {
    runtime: u64,
    version: Option<u64>,
    code_type: Option<u64>,
    frame_type: Option<u64>,
    eval: Vec<Range<u64>>,
    /// (major, minor) from the file name, and whether it names a
    /// free-threaded build (`python3.13t`).
    file_version: Option<(u8, u8, bool)>,
}

/// A process whose frames this names.
#[derive(Debug, Clone, Copy)]
struct Proc {
    layout: Layout,
    code_type: u64,
}

/// The CPython unwinder.
#[derive(Debug, Default)]
pub struct Python {
    /// Symbols by object file (device, inode, path; `None`: not an interpreter).
    objects: FxHashMap<(u64, u64, String), Option<Symbols>>,
    procs: FxHashMap<u32, Proc>,
    codes: CodeCache,
    /// Tagged addresses by (pid, code address, guard, instruction offset).
    frames: FxHashMap<(u32, u64, u32, u32), u64>,
}

/// (major, minor, free-threaded) from a file name like `libpython3.12.so.1.0` or `python3.13t`.
fn version_in_name(path: &str) -> Option<(u8, u8, bool)> {
    let name = path.rsplit('/').next()?;
    let rest = &name[name.find("python")? + "python".len()..];
    let (major, rest) = rest.split_once('.')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let free_threaded = rest[digits.len()..].starts_with('t');
    Some((major.parse().ok()?, digits.parse().ok()?, free_threaded))
}

/// The interpreter symbols of the object at `open_path`, if it exports `_PyRuntime`.
fn read_symbols(open_path: &std::path::Path, path: &str) -> Option<Symbols> {
    let file = std::fs::File::open(open_path).ok()?;
    // SAFETY: a read-only private mapping; a file changed under it gives
    // wrong symbols at worst, which the run-time checks catch.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    let mut symbols = Symbols {
        runtime: 0,
        version: None,
        code_type: None,
        frame_type: None,
        eval: Vec::new(),
        file_version: version_in_name(path),
    };
    // Only an object exporting _PyRuntime is read further (most objects
    // are not interpreters: their static symbols are never iterated).
    if !elf.dynamic_symbols().any(|s| s.name() == Ok("_PyRuntime")) {
        return None;
    }
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        let range = sym.address()..sym.address() + sym.size().max(1);
        match sym.name() {
            Ok("_PyRuntime") => symbols.runtime = sym.address(),
            Ok("Py_Version") => symbols.version = Some(sym.address()),
            Ok("PyCode_Type") => symbols.code_type = Some(sym.address()),
            Ok("PyFrame_Type") => symbols.frame_type = Some(sym.address()),
            Ok("_PyEval_EvalFrameDefault" | "_PyEval_EvalFrameDefault.cold")
                if !symbols.eval.contains(&range) =>
            {
                symbols.eval.push(range);
            }
            _ => {}
        }
    }
    (symbols.runtime != 0 && !symbols.eval.is_empty()).then_some(symbols)
}

/// Why a check of a process's interpreter did not pass.
#[derive(Debug)]
enum Failed {
    /// It read values this does not support (a version, a size).
    Mismatch(String),
    /// It could not read what it needs (not mapped or not loaded yet).
    Unreadable(&'static str),
}

impl From<&str> for Failed {
    fn from(why: &str) -> Self {
        Failed::Mismatch(why.to_string())
    }
}

/// A u64 of `pid`'s memory.
fn read_u64(pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    read_memory(pid, addr, &mut b).then(|| u64::from_le_bytes(b))
}

/// The layout for `pid`'s interpreter of version `(major, minor)`, or why there is none.
fn layout_of(pid: u32, minor: u8, runtime: u64) -> Result<Layout, Failed> {
    if minor < 13 {
        return layout::table(minor).ok_or_else(|| "version not supported yet".into());
    }
    let mut raw = [0u8; 8 * (layout::DEBUG_OFFSETS_WORDS + 1)];
    if !read_memory(pid, runtime, &mut raw) {
        return Err(Failed::Unreadable("_Py_DebugOffsets unreadable"));
    }
    if &raw[..8] != layout::DEBUG_COOKIE {
        return Err("no _Py_DebugOffsets".into());
    }
    let mut words = [0u64; layout::DEBUG_OFFSETS_WORDS];
    for (w, chunk) in words.iter_mut().zip(raw[8..].chunks_exact(8)) {
        *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    if (words[0] >> 16) != 0x030d {
        return Err("_Py_DebugOffsets of a version this does not know".into());
    }
    layout::from_debug_offsets(&words).ok_or_else(|| "free-threaded build".into())
}

/// A type object's `tp_basicsize` (bytes 32-39 of a `PyTypeObject`: after
/// `PyObject_VAR_HEAD` and `tp_name`); `None` when unreadable or still 0
/// (a static type object's data not mapped in yet reads as zeros).
fn basicsize(pid: u32, type_object: u64) -> Option<u64> {
    read_u64(pid, type_object.wrapping_add(32)).filter(|&size| size != 0)
}

/// Check `layout` against `pid`'s interpreter (whose object has symbols
/// `s` at `bias`): the sizes its type objects give code objects and
/// (before 3.11) frame objects.
fn check(pid: u32, s: &Symbols, bias: u64, layout: Layout) -> Result<Proc, Failed> {
    let code_type = s
        .code_type
        .map(|a| a.wrapping_add(bias))
        .ok_or("no PyCode_Type")?;
    let size = basicsize(pid, code_type).ok_or(Failed::Unreadable("PyCode_Type unreadable"))?;
    if size != u64::from(layout.code_basicsize()) {
        return Err(Failed::Mismatch(format!("PyCode_Type size {size}")));
    }
    if layout.frame_size != layout::NONE {
        let frame_type = s.frame_type.ok_or("no PyFrame_Type")?;
        let size = basicsize(pid, frame_type.wrapping_add(bias))
            .ok_or(Failed::Unreadable("PyFrame_Type unreadable"))?;
        if size != u64::from(layout.frame_size) {
            return Err(Failed::Mismatch(format!("PyFrame_Type size {size}")));
        }
    }
    Ok(Proc { layout, code_type })
}

impl Python {
    /// Attach to `pid`, whose interpreter object has `symbols` at `bias`.
    fn attach_with(&mut self, pid: u32, s: &Symbols, bias: u64) -> Attachment {
        let eval = s
            .eval
            .iter()
            .map(|r| r.start.wrapping_add(bias)..r.end.wrapping_add(bias))
            .collect();
        let runtime = s.runtime.wrapping_add(bias);
        // Py_Version is a constant in the object's data: unreadable or 0,
        // the data is not mapped in yet (not a version to judge).
        let hex = match s.version {
            Some(v) => match read_u64(pid, v.wrapping_add(bias)).filter(|&v| v != 0) {
                Some(v) => Some(v as u32),
                None => return not_yet(pid, eval, "Py_Version unreadable"),
            },
            None => None,
        };
        let (label, minor) = match (hex, s.file_version) {
            (Some(v), _) => {
                let (major, minor, micro) = (v >> 24, (v >> 16) & 0xff, (v >> 8) & 0xff);
                (
                    format!("{major}.{minor}.{micro}"),
                    (major == 3).then_some(minor as u8),
                )
            }
            (None, Some((major, minor, _))) => {
                (format!("{major}.{minor}"), (major == 3).then_some(minor))
            }
            (None, None) => ("of unknown version".to_string(), None),
        };
        let free_threaded = s.file_version.is_some_and(|(_, _, t)| t);
        let checked = match minor {
            _ if free_threaded => Err("free-threaded build".into()),
            Some(minor @ 8..=13) => {
                layout_of(pid, minor, runtime).and_then(|layout| check(pid, s, bias, layout))
            }
            _ => Err("version not supported".into()),
        };
        let walker = match checked {
            Ok(proc) => {
                self.procs.insert(pid, proc);
                Ok(proc.layout.walker_entry(runtime))
            }
            Err(Failed::Unreadable(why)) => return not_yet(pid, eval, why),
            Err(Failed::Mismatch(why)) => {
                debug!("pid {pid}: CPython {label}: {why}");
                Err(NotWalked::Unsupported(format!(
                    "[python: unsupported {label}]"
                )))
            }
        };
        Attachment { eval, walker }
    }

    /// The tagged address of the frame at `code` (`word`: the walker's second word).
    fn name_one(&mut self, pid: u32, proc: Proc, code: u64, word: u64) -> u64 {
        let offset = word as u32;
        let guard = ((word >> 32) as u32) & 0x7fff_ffff;
        if let Some(&tagged) = self.frames.get(&(pid, code, guard, offset)) {
            return tagged;
        }
        let Some(found) = self
            .codes
            .get(pid, &proc.layout, proc.code_type, code, guard)
        else {
            super::UNKNOWN_FRAMES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return unknown_frame();
        };
        let tagged = intern(FrameName {
            mapping: MAPPING_NAME,
            function: found.qualname.clone(),
            file: Some(found.filename.clone()),
            line: found.line(offset as i32),
        });
        self.frames.insert((pid, code, guard, offset), tagged);
        tagged
    }
}

/// The attachment of an interpreter whose memory cannot be read yet.
fn not_yet(pid: u32, eval: Vec<Range<u64>>, why: &str) -> Attachment {
    debug!("pid {pid}: CPython: {why}, looking again at its next mapping");
    Attachment {
        eval,
        walker: Err(NotWalked::NotYet),
    }
}

impl Unwinder for Python {
    fn attach(&mut self, pid: u32, objects: &[MappedObject]) -> Option<Attachment> {
        for object in objects {
            let symbols = self
                .objects
                .entry((object.file_key.0, object.file_key.1, object.path.clone()))
                .or_insert_with(|| read_symbols(&object.open_path, &object.path))
                .clone();
            if let Some(s) = symbols {
                return Some(self.attach_with(pid, &s, object.bias));
            }
        }
        None
    }

    fn name_frames(&mut self, pid: u32, raw: &[u64], out: &mut Vec<(u64, bool)>) {
        let Some(&proc) = self.procs.get(&pid) else {
            return;
        };
        for pair in raw.chunks_exact(2) {
            let tagged = self.name_one(pid, proc, pair[0], pair[1]);
            out.push((tagged, pair[1] & ENTRY_BIT != 0));
        }
    }

    fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.codes.forget(pid);
        self.frames.retain(|&(p, ..), _| p != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Py_Version` of a 3.11.7 final release, in this process's memory.
    static PY_VERSION: u64 = 0x030b_07f0;
    /// A type object's first 5 words, `tp_basicsize` (word 4) not a code object's.
    static WRONG_TYPE: [u64; 5] = [1, 0, 0, 0, 8];
    /// A type object's first 5 words whose data reads as zeros (not mapped in yet).
    static ZERO_TYPE: [u64; 5] = [0; 5];

    /// Symbols of an interpreter in this test's own process (bias 0):
    /// `version` and `code_type` at the given addresses.
    fn symbols(version: Option<u64>, code_type: u64, file_version: (u8, u8)) -> Symbols {
        Symbols {
            runtime: 0x1000,
            version,
            code_type: Some(code_type),
            frame_type: None,
            eval: std::iter::once(0x10..0x20).collect(),
            file_version: Some((file_version.0, file_version.1, false)),
        }
    }

    fn walker(s: &Symbols) -> Result<Vec<u8>, NotWalked> {
        Python::default()
            .attach_with(std::process::id(), s, 0)
            .walker
    }

    #[test]
    fn unreadable_memory_is_no_verdict() {
        let unmapped = 0x10; // page 0 is never mapped
        let code = std::ptr::addr_of!(WRONG_TYPE) as u64;
        let zeros = std::ptr::addr_of!(ZERO_TYPE) as u64;
        let version = std::ptr::addr_of!(PY_VERSION) as u64;
        // Py_Version unreadable: the version from the file name is not used.
        let s = symbols(Some(unmapped), code, (3, 11));
        assert_eq!(walker(&s), Err(NotWalked::NotYet));
        // Py_Version read, PyCode_Type unreadable or still zeros.
        assert_eq!(
            walker(&symbols(Some(version), unmapped, (3, 11))),
            Err(NotWalked::NotYet)
        );
        assert_eq!(
            walker(&symbols(Some(version), zeros, (3, 11))),
            Err(NotWalked::NotYet)
        );
        // No Py_Version (before 3.11), PyCode_Type unreadable.
        assert_eq!(
            walker(&symbols(None, unmapped, (3, 10))),
            Err(NotWalked::NotYet)
        );
    }

    #[test]
    fn other_values_are_unsupported() {
        let code = std::ptr::addr_of!(WRONG_TYPE) as u64;
        let version = std::ptr::addr_of!(PY_VERSION) as u64;
        let unsupported = |label: &str| Err(NotWalked::Unsupported(label.to_string()));
        // A readable code type of another size: the micro version from Py_Version.
        let s = symbols(Some(version), code, (3, 11));
        assert_eq!(walker(&s), unsupported("[python: unsupported 3.11.7]"));
        // Before 3.11 the label comes from the file name: no micro version.
        assert_eq!(
            walker(&symbols(None, code, (3, 9))),
            unsupported("[python: unsupported 3.9]")
        );
        // 3.7 is not read whatever its memory says.
        assert_eq!(
            walker(&symbols(None, 0x10, (3, 7))),
            unsupported("[python: unsupported 3.7]")
        );
    }

    #[test]
    fn versions_in_file_names() {
        assert_eq!(
            version_in_name("/usr/lib/libpython3.9.so.1.0"),
            Some((3, 9, false))
        );
        assert_eq!(version_in_name("/usr/bin/python3.13t"), Some((3, 13, true)));
        assert_eq!(version_in_name("/usr/bin/python3"), None);
        assert_eq!(version_in_name("/usr/lib/libc.so.6"), None);
    }
}
