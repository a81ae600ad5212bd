//! Interpreters the walker does not walk, reported honestly: native frames
//! and one `[python: unsupported …]` frame, never a Python name, and the
//! processes counted in the summary. One 2 s run profiles at once:
//!
//! - CPython 3.14: pyenv's 3.13 with a copy of its libpython whose
//!   `Py_Version` and `_Py_DebugOffsets.version` say 3.14.0, loaded
//!   through `LD_LIBRARY_PATH` (which comes before the binary's RUNPATH);
//! - a free-threaded CPython: the same copy with
//!   `_Py_DebugOffsets.free_threaded` set;
//! - PyPy: Debian's `pypy3` (scripts/setup.sh installs it).
//!
//! No 3.14 or free-threaded build can be installed here (no pyenv
//! download); the patched copies stand for them because the detector
//! decides from exactly these fields, read from the process's memory
//! before anything else (`src/unwind/interp/python/version.rs`): a real
//! 3.14 or 3.13t differs beyond them only in structures that are then never
//! read. CPython itself reads neither field (they are for outside readers),
//! so the copy runs the script as the original does; the file name still
//! says 3.13, which checks that the version comes from the process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use object::{Object, ObjectSection, ObjectSymbol};

use super::chains::{pprof_stacks, traces_of, Stack};
use super::{interpreters, SCRIPT};
use crate::common::*;

/// `PY_VERSION_HEX` of 3.13.0 (final) and of the 3.14.0 it is made to say.
const V3_13_0: u64 = 0x030d_00f0;
const V3_14_0: u64 = 0x030e_00f0;

/// A copy in `dir` of `lib` (a 3.13.0 libpython) with `Py_Version` set to
/// `version` and `_Py_DebugOffsets`' `version` and `free_threaded` (the
/// words after the cookie at the start of `_PyRuntime`) to `version` and
/// `free_threaded`. Checks first that `lib` holds 3.13.0's values there.
fn patched_libpython(lib: &Path, dir: &Path, version: u64, free_threaded: u64) -> PathBuf {
    let mut bytes = std::fs::read(lib).expect("read libpython");
    let file_offset = |name: &str| {
        let elf = object::File::parse(&*bytes).expect("libpython is ELF");
        let sym = elf
            .dynamic_symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("{name} not exported"));
        let section = elf
            .section_by_index(sym.section_index().expect("defined"))
            .expect("its section");
        let (start, _) = section.file_range().expect("in the file");
        (start + sym.address() - section.address()) as usize
    };
    let (py_version, runtime) = (file_offset("Py_Version"), file_offset("_PyRuntime"));
    let word = |bytes: &[u8], at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    assert_eq!(
        &bytes[runtime..runtime + 8],
        b"xdebugpy",
        "no _Py_DebugOffsets"
    );
    assert_eq!(
        (
            word(&bytes, py_version),
            word(&bytes, runtime + 8),
            word(&bytes, runtime + 16)
        ),
        (V3_13_0, V3_13_0, 0),
        "{}: not 3.13.0 with the GIL",
        lib.display()
    );
    for (at, value) in [
        (py_version, version),
        (runtime + 8, version),
        (runtime + 16, free_threaded),
    ] {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }
    std::fs::create_dir_all(dir).expect("mkdir");
    std::fs::write(dir.join(lib.file_name().unwrap()), bytes).expect("write the copy");
    dir.to_path_buf()
}

/// One process of the run and what its stacks must show.
struct Case {
    child: Child,
    /// The frame its eval-loop frames (or, PyPy, its stacks) get.
    label: String,
    /// A native frame its stacks keep (CPython's eval loop); `None` for
    /// PyPy, whose object has no symbol table.
    native: Option<&'static str>,
}

/// `interpreter` running the chain script, with `lib_dir` first in its
/// library path when given.
fn start(interpreter: &Path, script: &Path, lib_dir: Option<&Path>) -> Child {
    let mut cmd = Command::new(interpreter);
    cmd.arg(script).arg("40").stdout(Stdio::null());
    if let Some(dir) = lib_dir {
        cmd.env("LD_LIBRARY_PATH", dir);
    }
    cmd.spawn().expect("start the interpreter")
}

/// Check `stacks` (those of the case's process) and return a failure, if any.
fn check(case: &Case, stacks: &[&Stack], script: &str) -> Option<String> {
    let samples: u64 = stacks.iter().map(|s| s.count).sum();
    let show = || {
        let head: Vec<String> = stacks.iter().take(3).map(|s| s.render()).collect();
        head.join("\n")
    };
    if samples < 30 {
        return Some(format!("{}: {samples} samples:\n{}", case.label, show()));
    }
    if let Some(named) = stacks
        .iter()
        .find(|s| s.frames.iter().any(|f| f.file == script))
    {
        return Some(format!(
            "{}: a Python name:\n{}",
            case.label,
            named.render()
        ));
    }
    let marked: u64 = stacks
        .iter()
        .filter(|s| s.frames.iter().any(|f| f.name == case.label))
        .map(|s| s.count)
        .sum();
    // Samples outside the interpreter's code (start-up, a signal) have no
    // place for the frame; nearly all of a busy script's are in it.
    if (marked as f64) < 0.9 * samples as f64 {
        return Some(format!(
            "{}: in {marked} of {samples} samples:\n{}",
            case.label,
            show()
        ));
    }
    for stack in stacks {
        let labels = stack
            .frames
            .iter()
            .filter(|f| f.name.starts_with("[python"))
            .count();
        let evals = case.native.map_or(1, |native| {
            stack.frames.iter().filter(|f| f.name == native).count()
        });
        if labels > evals {
            return Some(format!(
                "{}: {labels} frames:\n{}",
                case.label,
                stack.render()
            ));
        }
    }
    None
}

#[test]
fn unsupported_interpreters_get_one_honest_frame() {
    let _serial = serial();
    let dir = tempdir();
    let script = dir.path().join("chain.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    let mut cases = Vec::new();
    let pyenv_3_13 = interpreters(&[13]).into_iter().find(|p| {
        p.ancestors()
            .nth(2)
            .is_some_and(|prefix| prefix.join("lib/libpython3.13.so.1.0").exists())
    });
    match pyenv_3_13 {
        Some(python) => {
            let lib = python
                .ancestors()
                .nth(2)
                .unwrap()
                .join("lib/libpython3.13.so.1.0");
            let v3_14 = patched_libpython(&lib, &dir.path().join("3.14"), V3_14_0, 0);
            let free = patched_libpython(&lib, &dir.path().join("3.13t"), V3_13_0, 1);
            cases.push(Case {
                child: start(&python, &script, Some(&v3_14)),
                label: "[python: unsupported 3.14.0]".into(),
                native: Some("_PyEval_EvalFrameDefault"),
            });
            cases.push(Case {
                child: start(&python, &script, Some(&free)),
                label: "[python: unsupported 3.13.0t (free-threaded)]".into(),
                native: Some("_PyEval_EvalFrameDefault"),
            });
        }
        None => eprintln!("skipped 3.14 and free-threaded: no pyenv 3.13 with a shared libpython"),
    }
    let pypy = Path::new("/usr/bin/pypy3");
    if pypy.exists() {
        // Its version as PyPy itself gives it.
        let version = Command::new(pypy)
            .args([
                "-c",
                "import sys; print('%d.%d.%d' % sys.pypy_version_info[:3])",
            ])
            .output()
            .expect("pypy3");
        let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
        cases.push(Case {
            child: start(pypy, &script, None),
            label: format!("[python: unsupported PyPy {version}]"),
            native: None,
        });
    } else {
        eprintln!("skipped PyPy: no /usr/bin/pypy3 (scripts/setup.sh installs it)");
    }
    if cases.is_empty() {
        return;
    }
    // The interpreters start (a patched copy must still run the script).
    std::thread::sleep(Duration::from_millis(500));
    let pids: Vec<String> = cases.iter().map(|c| c.child.id().to_string()).collect();
    let out_dir = dir.path().join("out");
    let out = Command::new(BIN)
        .args([
            "--pids",
            &pids.join(","),
            "--duration",
            "2",
            "--sample-freq",
            "499",
        ])
        .args(["--profile-format", "pprof", "--profile-path"])
        .arg(&out_dir)
        .output()
        .expect("lightswitch");
    let mut exited = Vec::new();
    for case in &mut cases {
        if let Ok(Some(status)) = case.child.try_wait() {
            exited.push(format!("{}: exited early, {status}", case.label));
        }
        let _ = case.child.kill();
        let _ = case.child.wait();
    }
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lightswitch failed:\n{text}");
    assert!(exited.is_empty(), "{exited:?}");
    let stacks = pprof_stacks(&traces_of(&out_dir.join("profile.pb")));
    let mut failures = Vec::new();
    for case in &cases {
        // The main thread's samples: its tid is the pid.
        let mine: Vec<&Stack> = stacks.iter().filter(|s| s.tid == case.child.id()).collect();
        failures.extend(check(case, &mine, s(&script)));
    }
    let counted = format!("unsupported={}", cases.len());
    if !text.contains("python processes: walked=0 ") || !text.contains(&counted) {
        failures.push(format!(
            "no `python processes: walked=0 {counted}` line:\n{text}"
        ));
    }
    for case in &cases {
        if !text.contains(&case.label) {
            failures.push(format!("the summary does not name {}:\n{text}", case.label));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
