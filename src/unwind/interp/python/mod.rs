//! The CPython unwinder (docs/python.md). An object exporting `_PyRuntime`
//! is a CPython interpreter (an executable with libpython linked in, or
//! libpython itself); its version and build come from the process
//! ([`version`]: `Py_Version` from 3.11, `_Py_DebugOffsets` from 3.13; the
//! file name before 3.11). Offsets come from the interpreter's
//! `_Py_DebugOffsets` (3.13) or the table in [`layout`] (3.8 to 3.12),
//! checked against the process's `PyCode_Type.tp_basicsize` (and before
//! 3.11 `PyFrame_Type.tp_basicsize`); any other version (3.14, 3.7), a
//! free-threaded build, or a check that finds other values, gets one
//! `[python: unsupported …]` frame at each eval-loop frame. PyPy
//! ([`pypy`]) gets one such frame per stack. A check that cannot read the
//! process's memory yet (just after exec) is no verdict: the process is
//! looked at again (`crate::unwind::interp::retry`). The eval loop is
//! `_PyEval_EvalFrameDefault` and its `.cold` part where a symbol table
//! names it.

pub mod layout;
mod lines;
mod names;
pub mod pypy;
pub mod version;

use std::ops::Range;

use object::{Object, ObjectSymbol};
use rustc_hash::FxHashMap;
use tracing::debug;

use super::{intern, unknown_frame, Attachment, FrameName, MappedObject, NotWalked, Unwinder};
use layout::Layout;
use names::{read_memory, CodeCache};
use version::Version;

/// The profile mapping Python frames are shown in.
pub const MAPPING_NAME: &str = "[python]";

/// python_frame.word's bit marking the outermost frame of an eval-loop call.
const ENTRY_BIT: u64 = crate::sampling::skel::defines::PYTHON_ENTRY_BIT;

/// What an interpreter object's symbols say (object vaddrs).
#[derive(Debug, Clone)]
struct Symbols {
    runtime: u64,
    version: Option<u64>,
    code_type: Option<u64>,
    frame_type: Option<u64>,
    eval: Vec<Range<u64>>,
    /// (major, minor) from the file name (before 3.11 the process has no
    /// `Py_Version`).
    file_version: Option<(u8, u8)>,
}

/// An interpreter object: a CPython's symbols, or PyPy.
#[derive(Debug, Clone)]
enum Found {
    CPython(Symbols),
    PyPy(pypy::PyPy),
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
    /// Interpreters by object file (device, inode, path; `None`: not an interpreter).
    objects: FxHashMap<(u64, u64, String), Option<Found>>,
    procs: FxHashMap<u32, Proc>,
    codes: CodeCache,
    /// Tagged addresses by (pid, code address, guard, instruction offset).
    frames: FxHashMap<(u32, u64, u32, u32), u64>,
}

/// The interpreter in the object at `open_path` (mapped from `path`): a
/// CPython (it exports `_PyRuntime`), or PyPy.
fn read_object(open_path: &std::path::Path, path: &str) -> Option<Found> {
    let file = std::fs::File::open(open_path).ok()?;
    // SAFETY: a read-only private mapping; a file changed under it gives
    // wrong symbols at worst, which the run-time checks catch.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    // Only an object exporting _PyRuntime is read further (most objects
    // are not interpreters: their static symbols are never iterated).
    let (mut cpython, mut is_pypy) = (false, false);
    // Defined here, not imported (the launcher imports PyPy's entry).
    for sym in elf.dynamic_symbols().filter(|s| s.is_definition()) {
        match sym.name() {
            Ok("_PyRuntime") => cpython = true,
            Ok(name) if pypy::EXPORTS.contains(&name) => is_pypy = true,
            _ => {}
        }
    }
    if !cpython {
        return is_pypy.then(|| Found::PyPy(pypy::read(&elf, &map)));
    }
    let mut symbols = Symbols {
        runtime: 0,
        version: None,
        code_type: None,
        frame_type: None,
        eval: Vec::new(),
        file_version: version::version_in_name(path),
    };
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
    (symbols.runtime != 0 && !symbols.eval.is_empty()).then_some(Found::CPython(symbols))
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

/// The layout for `pid`'s interpreter of `version` (whose `_PyRuntime` is
/// at `runtime`), or why there is none. From 3.13 the process's
/// `_Py_DebugOffsets` are read first: they say whether it is free-threaded.
fn layout_of(pid: u32, version: &mut Version, runtime: u64) -> Result<Layout, Failed> {
    let debug = if (version.major, version.minor) >= (3, 13) {
        Some(version::debug_offsets(pid, runtime, version)?)
    } else {
        None
    };
    if version.free_threaded {
        return Err("free-threaded build".into());
    }
    match (version.major, version.minor, debug) {
        (3, 8..=12, _) => layout::table(version.minor).ok_or_else(|| "no table".into()),
        (3, 13, Some(words)) => {
            layout::from_debug_offsets(&words).ok_or_else(|| "offsets the walker cannot use".into())
        }
        _ => Err("version not supported".into()),
    }
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
        let mut version = match version::read(pid, s, bias) {
            Ok(version) => version,
            Err(why) => return not_yet(pid, eval, why),
        };
        let checked = match version.as_mut() {
            Some(v) => layout_of(pid, v, runtime).and_then(|layout| check(pid, s, bias, layout)),
            None => Err("no version in its memory or file name".into()),
        };
        match checked {
            Ok(proc) => {
                self.procs.insert(pid, proc);
                Attachment {
                    eval,
                    whole_code: false,
                    walker: Ok(proc.layout.walker_entry(runtime)),
                }
            }
            Err(Failed::Unreadable(why)) => not_yet(pid, eval, why),
            Err(Failed::Mismatch(why)) => {
                let label = version.map_or_else(|| "of unknown version".into(), |v| v.to_string());
                unsupported(pid, eval, &label, &why)
            }
        }
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
    debug!("pid {pid}: CPython: {why}, looking again later");
    Attachment {
        eval,
        whole_code: false,
        walker: Err(NotWalked::NotYet),
    }
}

/// The attachment of a CPython `label` (`3.14.0`) the walker does not walk, and why.
fn unsupported(pid: u32, eval: Vec<Range<u64>>, label: &str, why: &str) -> Attachment {
    debug!("pid {pid}: CPython {label}: {why}");
    Attachment {
        eval,
        whole_code: false,
        walker: Err(NotWalked::Unsupported(format!(
            "[python: unsupported {label}]"
        ))),
    }
}

impl Unwinder for Python {
    fn attach(&mut self, pid: u32, objects: &[MappedObject]) -> Option<Attachment> {
        for object in objects {
            let found = self
                .objects
                .entry((object.file_key.0, object.file_key.1, object.path.clone()))
                .or_insert_with(|| read_object(&object.open_path, &object.path))
                .clone();
            match found {
                Some(Found::CPython(s)) => return Some(self.attach_with(pid, &s, object.bias)),
                Some(Found::PyPy(pypy)) => {
                    debug!("pid {pid}: {}: PyPy, not walked", object.path);
                    let bias = object.bias;
                    return Some(Attachment {
                        eval: pypy
                            .code
                            .iter()
                            .map(|r| r.start.wrapping_add(bias)..r.end.wrapping_add(bias))
                            .collect(),
                        whole_code: true,
                        walker: Err(NotWalked::Unsupported(pypy.label())),
                    });
                }
                None => {}
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
            file_version: Some(file_version),
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

    /// `_PyRuntime`'s first words: `_Py_DebugOffsets`' cookie, `version`,
    /// `free_threaded`, then zeros.
    fn runtime(version: u64, free_threaded: u64) -> Vec<u64> {
        let mut words = vec![0u64; layout::DEBUG_OFFSETS_WORDS + 1];
        words[0] = u64::from_le_bytes(*layout::DEBUG_COOKIE);
        (words[1], words[2]) = (version, free_threaded);
        words
    }

    /// 3.14 and free-threaded builds: the version and build from the
    /// process (`Py_Version`, `_Py_DebugOffsets`), whatever the file name says.
    #[test]
    fn versions_and_builds_come_from_the_process() {
        let code = std::ptr::addr_of!(WRONG_TYPE) as u64;
        let unsupported = |label: &str| Err(NotWalked::Unsupported(label.to_string()));
        let of = |py_version: &u64, runtime: &[u64]| {
            let mut s = symbols(Some(py_version as *const u64 as u64), code, (3, 13));
            s.runtime = runtime.as_ptr() as u64;
            walker(&s)
        };
        let (v3_14, v3_13) = (0x030e_00f0u64, 0x030d_01f0u64);
        assert_eq!(
            of(&v3_14, &runtime(v3_14, 0)),
            unsupported("[python: unsupported 3.14.0]")
        );
        assert_eq!(
            of(&v3_14, &runtime(v3_14, 1)),
            unsupported("[python: unsupported 3.14.0t (free-threaded)]")
        );
        assert_eq!(
            of(&v3_13, &runtime(v3_13, 1)),
            unsupported("[python: unsupported 3.13.1t (free-threaded)]")
        );
        // _Py_DebugOffsets not mapped in yet (zeros): no verdict.
        let zeros = vec![0u64; layout::DEBUG_OFFSETS_WORDS + 1];
        assert_eq!(of(&v3_14, &zeros), Err(NotWalked::NotYet));
        // Its version is not Py_Version's: not read further.
        assert_eq!(
            of(&v3_13, &runtime(v3_14, 0)),
            unsupported("[python: unsupported 3.13.1]")
        );
    }
}
