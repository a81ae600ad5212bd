//! Which CPython a process runs, as the process itself says where it can:
//! `Py_Version` (3.11 on: `PY_VERSION_HEX` of `Include/patchlevel.h`, a
//! constant in the interpreter object's data) and, from 3.13, the header
//! of `_Py_DebugOffsets` at the start of `_PyRuntime` (cookie `xdebugpy`,
//! then `version` and `free_threaded`, u64 each: the same three fields on
//! 3.13 and 3.14, `Include/internal/pycore_runtime.h`,
//! `pycore_debug_offsets.h`). Before 3.11 the process exposes no version:
//! the object's file name (`libpython3.9.so.1.0`, `python3.9`) gives it.

use super::{layout, read_u64, Failed, Symbols};
use crate::unwind::interp::python::names::read_memory;

/// A CPython version, as read from its process (or, before 3.11, its
/// interpreter's file name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// 3 for every version read here.
    pub major: u8,
    /// The minor version (14 for 3.14).
    pub minor: u8,
    /// The micro version, from `Py_Version`; `None` when the file name gave
    /// the version.
    pub micro: Option<u8>,
    /// `_Py_DebugOffsets.free_threaded` (3.13 on): a build without the GIL
    /// (`Py_GIL_DISABLED`, `python3.13t`), whose structures differ.
    pub free_threaded: bool,
}

impl std::fmt::Display for Version {
    /// `3.14.0`, `3.13.0t (free-threaded)`, `3.9` (from a file name).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if let Some(micro) = self.micro {
            write!(f, ".{micro}")?;
        }
        if self.free_threaded {
            write!(f, "t (free-threaded)")?;
        }
        Ok(())
    }
}

/// (major, minor) from a file name like `libpython3.12.so.1.0` or `python3.13t`.
pub fn version_in_name(path: &str) -> Option<(u8, u8)> {
    let name = path.rsplit('/').next()?;
    let rest = &name[name.find("python")? + "python".len()..];
    let (major, rest) = rest.split_once('.')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((major.parse().ok()?, digits.parse().ok()?))
}

/// The version of `pid`'s interpreter (object symbols `s` at `bias`):
/// from `Py_Version` when the object has it, else from its file name;
/// `Ok(None)` when neither gives one. `Py_Version` unreadable or 0 (the
/// object's data not mapped in yet) is an error (why): no verdict.
/// Whether it is free-threaded is read later, with `_Py_DebugOffsets`
/// ([`debug_offsets`]).
pub(super) fn read(pid: u32, s: &Symbols, bias: u64) -> Result<Option<Version>, &'static str> {
    let Some(at) = s.version else {
        return Ok(s.file_version.map(|(major, minor)| Version {
            major,
            minor,
            micro: None,
            free_threaded: false,
        }));
    };
    let hex = read_u64(pid, at.wrapping_add(bias))
        .filter(|&v| v != 0)
        .ok_or("Py_Version unreadable")?;
    Ok(Some(Version {
        major: (hex >> 24) as u8,
        minor: (hex >> 16) as u8,
        micro: Some((hex >> 8) as u8),
        free_threaded: false,
    }))
}

/// The `_Py_DebugOffsets` words (u64 each, after the cookie) of `pid`'s
/// interpreter, whose `_PyRuntime` is at `runtime` (absolute), checked
/// against `version` (read from `Py_Version`); sets
/// `version.free_threaded` from them. Unreadable, or still zeros (the
/// section not mapped in yet), is [`Failed::Unreadable`]; another cookie,
/// or another version than `Py_Version`'s, is a mismatch.
pub(super) fn debug_offsets(
    pid: u32,
    runtime: u64,
    version: &mut Version,
) -> Result<Box<[u64; layout::DEBUG_OFFSETS_WORDS]>, Failed> {
    let mut raw = [0u8; 8 * (layout::DEBUG_OFFSETS_WORDS + 1)];
    if !read_memory(pid, runtime, &mut raw) || raw[..24].iter().all(|&b| b == 0) {
        return Err(Failed::Unreadable("_Py_DebugOffsets unreadable"));
    }
    if &raw[..8] != layout::DEBUG_COOKIE {
        return Err("no _Py_DebugOffsets cookie".into());
    }
    let mut words = Box::new([0u64; layout::DEBUG_OFFSETS_WORDS]);
    for (w, chunk) in words.iter_mut().zip(raw[8..].chunks_exact(8)) {
        *w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
    let (major, minor) = ((words[0] >> 24) & 0xff, (words[0] >> 16) & 0xff);
    if (major, minor) != (u64::from(version.major), u64::from(version.minor)) {
        return Err(Failed::Mismatch(format!(
            "_Py_DebugOffsets of {major}.{minor}"
        )));
    }
    version.free_threaded = words[1] != 0;
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_in_file_names() {
        assert_eq!(
            version_in_name("/usr/lib/libpython3.9.so.1.0"),
            Some((3, 9))
        );
        assert_eq!(version_in_name("/usr/bin/python3.13t"), Some((3, 13)));
        assert_eq!(version_in_name("/usr/bin/python3"), None);
        assert_eq!(version_in_name("/usr/lib/libc.so.6"), None);
    }

    #[test]
    fn labels() {
        let v = |minor, micro, free_threaded| {
            Version {
                major: 3,
                minor,
                micro,
                free_threaded,
            }
            .to_string()
        };
        assert_eq!(v(14, Some(0), false), "3.14.0");
        assert_eq!(v(13, Some(1), true), "3.13.1t (free-threaded)");
        assert_eq!(v(9, None, false), "3.9");
    }

    /// `_PyRuntime` of an interpreter, in this test's own memory: the
    /// cookie, then `version` and `free_threaded`, then zeros.
    fn runtime(version: u64, free_threaded: u64) -> Vec<u64> {
        let mut words = vec![0u64; layout::DEBUG_OFFSETS_WORDS + 1];
        words[0] = u64::from_le_bytes(*layout::DEBUG_COOKIE);
        words[1] = version;
        words[2] = free_threaded;
        words
    }

    #[test]
    fn debug_offsets_header_is_checked() {
        let pid = std::process::id();
        let at = |w: &[u64]| w.as_ptr() as u64;
        let mut v = Version {
            major: 3,
            minor: 13,
            micro: Some(0),
            free_threaded: false,
        };
        let gil = runtime(0x030d_00f0, 0);
        assert!(debug_offsets(pid, at(&gil), &mut v).is_ok());
        assert!(!v.free_threaded);
        let free = runtime(0x030d_00f0, 1);
        assert!(debug_offsets(pid, at(&free), &mut v).is_ok());
        assert!(v.free_threaded);
        // Py_Version said 3.13, the header another version.
        let other = runtime(0x030e_00f0, 0);
        assert!(matches!(
            debug_offsets(pid, at(&other), &mut v),
            Err(Failed::Mismatch(_))
        ));
        // Zeros: not mapped in yet.
        let zeros = vec![0u64; layout::DEBUG_OFFSETS_WORDS + 1];
        assert!(matches!(
            debug_offsets(pid, at(&zeros), &mut v),
            Err(Failed::Unreadable(_))
        ));
        let mut no_cookie = runtime(0x030d_00f0, 0);
        no_cookie[0] = 1;
        assert!(matches!(
            debug_offsets(pid, at(&no_cookie), &mut v),
            Err(Failed::Mismatch(_))
        ));
    }
}
