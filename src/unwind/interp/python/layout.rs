//! Where CPython keeps what the walker and the namer read, per minor
//! version: from CPython's own `_Py_DebugOffsets` (3.13 on: the start of
//! `_PyRuntime`, in the `.PyRuntime` section, after the cookie `xdebugpy`),
//! else from a table (3.8 to 3.12) whose values are `offsetof` of each
//! version's structures in its installed internal headers
//! (`Include/internal/pycore_{runtime,interp,frame,code}.h`,
//! `Include/cpython/{pystate,code,frameobject,unicodeobject}.h`; 3.8:
//! `Include/internal/pycore_pystate.h`), checked against the process at run
//! time (`PyCode_Type.tp_basicsize`, which is [`Layout::code_basicsize`];
//! before 3.11 also `PyFrame_Type.tp_basicsize`, [`Layout::frame_size`]).

use crate::sampling::skel::types;

/// An offset the version does not have (`PYTHON_NO_OFFSET`, generated
/// from `src/sampling/bpf/python.h`).
pub const NONE: u16 = crate::sampling::skel::defines::PYTHON_NO_OFFSET as u16;

/// The layout of one CPython minor version. Offsets in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// `_PyRuntimeState.interpreters.head`.
    pub runtime_interpreters: u16,
    /// `PyInterpreterState.threads.head` (`.tstate_head` before 3.11).
    pub interp_threads: u16,
    /// `PyThreadState.next`.
    pub tstate_next: u16,
    /// `PyThreadState.native_thread_id` (3.11 on); before 3.11
    /// `.thread_id`, the thread's `pthread_t`.
    pub tstate_native_thread_id: u16,
    /// `PyThreadState.cframe` (3.11, 3.12), `.current_frame` (3.13) or
    /// `.frame` (before 3.11).
    pub tstate_frame: u16,
    /// `_PyCFrame.current_frame` ([`NONE`] on 3.13).
    pub cframe_current_frame: u16,
    /// `_PyInterpreterFrame.f_code` / `.f_executable` (`PyFrameObject.f_code` before 3.11).
    pub frame_code: u16,
    /// `_PyInterpreterFrame.previous` (`PyFrameObject.f_back` before 3.11).
    pub frame_previous: u16,
    /// `_PyInterpreterFrame.prev_instr` / `.instr_ptr` ([`NONE`] before 3.11).
    pub frame_instr: u16,
    /// `PyFrameObject.f_lasti`, an `int` (before 3.11; else [`NONE`]).
    pub frame_lasti: u16,
    /// Before 3.11: threads run chains of `PyFrameObject`, each its own
    /// eval-loop call, and are known by their `pthread_t`.
    pub frame_objects: bool,
    /// `PyFrame_Type.tp_basicsize` (`sizeof(PyFrameObject)`) before 3.11,
    /// checked at run time; [`NONE`] from 3.11.
    pub frame_size: u16,
    /// `_PyInterpreterFrame.owner`.
    pub frame_owner: u16,
    /// `_PyInterpreterFrame.is_entry` (3.11 only).
    pub frame_is_entry: u16,
    /// `FRAME_OWNED_BY_CSTACK`: the eval loop's entry shim (3.12 on; 0xff: none).
    pub cstack_owner: u8,
    /// `PyCodeObject.co_firstlineno` (an `int`).
    pub code_firstlineno: u16,
    /// `PyCodeObject.co_filename`, `.co_qualname`, `.co_linetable` (object
    /// pointers). Before 3.11, which has no `co_qualname`, `co_name`; on
    /// 3.8 and 3.9, `co_lnotab` for `co_linetable`.
    pub code_filename: u16,
    /// See [`Layout::code_filename`].
    pub code_qualname: u16,
    /// See [`Layout::code_filename`].
    pub code_linetable: u16,
    /// The format of the table at [`Layout::code_linetable`].
    pub lines: LineTable,
    /// `PyCodeObject.co_code_adaptive`: the first instruction, also what
    /// `PyCode_Type.tp_basicsize` says in a process of this version (3.11
    /// on; [`NONE`] before).
    pub code_adaptive: u16,
    /// `sizeof(PyCodeObject)`: bytes of a code object read to name it.
    pub code_size: u16,
    /// `sizeof(PyASCIIObject)`: where an ASCII string's characters start.
    pub ascii_size: u16,
    /// `sizeof(PyCompactUnicodeObject)`: where another compact string's start.
    pub compact_size: u16,
}

/// How a code object maps its instructions to source lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineTable {
    /// `co_lnotab` (3.8, 3.9): (bytes, signed lines) increments.
    Lnotab,
    /// 3.10's `co_linetable`: (bytes, signed lines) per range, -128 for none.
    Ranges,
    /// The location table of 3.11 on (`Objects/locations.md`).
    Locations,
}

/// CPython 3.8 and 3.9 (measured on 3.8.18 and 3.9.18: the same offsets).
const V3_8: Layout = Layout {
    runtime_interpreters: 32,
    interp_threads: 8,
    tstate_next: 8,
    tstate_native_thread_id: 176,
    tstate_frame: 24,
    cframe_current_frame: NONE,
    frame_code: 32,
    frame_previous: 24,
    frame_instr: NONE,
    frame_lasti: 104,
    frame_objects: true,
    frame_size: 368,
    frame_owner: NONE,
    frame_is_entry: NONE,
    cstack_owner: 0xff,
    code_firstlineno: 40,
    code_filename: 104,
    code_qualname: 112,
    code_linetable: 120,
    lines: LineTable::Lnotab,
    code_adaptive: NONE,
    code_size: 176,
    ascii_size: 48,
    compact_size: 72,
};

/// CPython 3.10 (measured on 3.10.13): 3.9's but for the frame object and
/// the line table.
const V3_10: Layout = Layout {
    frame_lasti: 96,
    frame_size: 360,
    lines: LineTable::Ranges,
    ..V3_8
};

/// CPython 3.11 (measured on 3.11.7; Debian's 3.11.2 matches at run time).
const V3_11: Layout = Layout {
    runtime_interpreters: 40,
    interp_threads: 16,
    tstate_next: 8,
    tstate_native_thread_id: 160,
    tstate_frame: 56,
    cframe_current_frame: 8,
    frame_code: 32,
    frame_previous: 48,
    frame_instr: 56,
    frame_lasti: NONE,
    frame_objects: false,
    frame_size: NONE,
    frame_owner: 69,
    frame_is_entry: 68,
    cstack_owner: 0xff,
    code_firstlineno: 72,
    code_filename: 112,
    code_qualname: 128,
    code_linetable: 136,
    lines: LineTable::Locations,
    code_adaptive: 184,
    code_size: 192,
    ascii_size: 48,
    compact_size: 72,
};

/// CPython 3.12 (measured on 3.12.1).
const V3_12: Layout = Layout {
    runtime_interpreters: 40,
    interp_threads: 72,
    tstate_next: 8,
    tstate_native_thread_id: 144,
    tstate_frame: 56,
    cframe_current_frame: 0,
    frame_code: 0,
    frame_previous: 8,
    frame_instr: 56,
    frame_lasti: NONE,
    frame_objects: false,
    frame_size: NONE,
    frame_owner: 70,
    frame_is_entry: NONE,
    cstack_owner: 3,
    code_firstlineno: 68,
    code_filename: 112,
    code_qualname: 128,
    code_linetable: 136,
    lines: LineTable::Locations,
    code_adaptive: 192,
    code_size: 200,
    ascii_size: 40,
    compact_size: 56,
};

/// The table's layout for CPython `minor` (3.x), if it has one.
pub fn table(minor: u8) -> Option<Layout> {
    match minor {
        8 | 9 => Some(V3_8),
        10 => Some(V3_10),
        11 => Some(V3_11),
        12 => Some(V3_12),
        _ => None,
    }
}

/// `_Py_DebugOffsets` words (u64 each, after the 8-byte cookie) read here,
/// in CPython 3.13's order: version 0, free_threaded 1; runtime_state from
/// 2 (size, finalizing, interpreters_head); interpreter_state from 5 (13
/// words: threads_head is the 4th); thread_state from 18 (9: next 3rd,
/// current_frame 5th, native_thread_id 7th); interpreter_frame from 27 (6:
/// size, previous, executable, instr_ptr, localsplus, owner); code_object
/// from 33 (10: size, filename, name, qualname, linetable, firstlineno,
/// argcount, localsplusnames, localspluskinds, co_code_adaptive).
pub const DEBUG_OFFSETS_WORDS: usize = 43;

/// The cookie `_Py_DebugOffsets` starts with.
pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// The layout `_Py_DebugOffsets` gives (`words`: the u64 words after the
/// cookie), for 3.13 (the only version whose word order this knows; the
/// caller checks the version). `None` for a free-threaded build or an
/// offset too large for the walker.
pub fn from_debug_offsets(words: &[u64; DEBUG_OFFSETS_WORDS]) -> Option<Layout> {
    if words[1] != 0 {
        return None;
    }
    let w = |i: usize| u16::try_from(words[i]).ok().filter(|&v| v != NONE);
    Some(Layout {
        runtime_interpreters: w(4)?,
        interp_threads: w(5 + 3)?,
        tstate_next: w(18 + 2)?,
        tstate_native_thread_id: w(18 + 6)?,
        tstate_frame: w(18 + 4)?,
        cframe_current_frame: NONE,
        frame_code: w(27 + 2)?,
        frame_previous: w(27 + 1)?,
        frame_instr: w(27 + 3)?,
        frame_lasti: NONE,
        frame_objects: false,
        frame_size: NONE,
        frame_owner: w(27 + 5)?,
        frame_is_entry: NONE,
        cstack_owner: 3,
        code_firstlineno: w(33 + 5)?,
        code_filename: w(33 + 1)?,
        code_qualname: w(33 + 3)?,
        code_linetable: w(33 + 4)?,
        lines: LineTable::Locations,
        code_adaptive: w(33 + 9)?,
        code_size: w(33)?,
        ascii_size: 40,
        compact_size: 56,
    })
}

impl Layout {
    /// What `PyCode_Type.tp_basicsize` is in a process of this version:
    /// the fixed part up to the first instruction from 3.11
    /// (`Objects/codeobject.c`), `sizeof(PyCodeObject)` before.
    pub fn code_basicsize(&self) -> u16 {
        if self.frame_objects {
            self.code_size
        } else {
            self.code_adaptive
        }
    }

    /// The walker's map value for a process whose `_PyRuntime` is at
    /// `runtime` (absolute), as bytes of `struct python_proc`.
    pub fn walker_entry(&self, runtime: u64) -> Vec<u8> {
        let offsets = types::python_offsets {
            runtime_interpreters: self.runtime_interpreters,
            interp_threads: self.interp_threads,
            tstate_next: self.tstate_next,
            tstate_native_thread_id: self.tstate_native_thread_id,
            tstate_frame: self.tstate_frame,
            cframe_current_frame: self.cframe_current_frame,
            frame_code: self.frame_code,
            frame_previous: self.frame_previous,
            frame_instr: self.frame_instr,
            frame_owner: self.frame_owner,
            frame_is_entry: self.frame_is_entry,
            code_firstlineno: self.code_firstlineno,
            code_linetable: self.code_linetable,
            code_adaptive: self.code_adaptive,
            frame_lasti: self.frame_lasti,
            cstack_owner: self.cstack_owner,
            frame_objects: u8::from(self.frame_objects),
        };
        let value = types::python_proc { runtime, offsets };
        // SAFETY: python_proc is plain old data generated from the BPF
        // object's BTF (no pointers, every bit pattern valid).
        unsafe { plain::as_bytes(&value) }.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPython 3.13.0's `_Py_DebugOffsets` as its libpython's
    /// `.PyRuntime` section holds it (read with readelf and Python's
    /// struct module), the first 43 words after the cookie.
    const PY_3_13_0: [u64; DEBUG_OFFSETS_WORDS] = [
        0x030d00f0, 0, 283320, 608, 632, 194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16,
        7752, 0, 7768, 7760, 304, 0, 8, 16, 72, 152, 160, 232, 32, 80, 8, 0, 56, 72, 70, 208, 112,
        120, 128, 136, 68, 52, 96, 104, 200,
    ];

    #[test]
    fn debug_offsets_of_3_13_match_its_headers() {
        // offsetof() in 3.13.0's installed internal headers.
        let l = from_debug_offsets(&PY_3_13_0).unwrap();
        assert_eq!(
            (l.runtime_interpreters, l.interp_threads, l.tstate_next),
            (632, 7344, 8)
        );
        assert_eq!((l.tstate_native_thread_id, l.tstate_frame), (160, 72));
        assert_eq!(
            (l.frame_code, l.frame_previous, l.frame_instr, l.frame_owner),
            (0, 8, 56, 70)
        );
        assert_eq!(
            (l.code_firstlineno, l.code_filename, l.code_qualname),
            (68, 112, 128)
        );
        assert_eq!(
            (l.code_linetable, l.code_adaptive, l.code_size),
            (136, 200, 208)
        );
        let mut free_threaded = PY_3_13_0;
        free_threaded[1] = 1;
        assert!(from_debug_offsets(&free_threaded).is_none());
    }
}
