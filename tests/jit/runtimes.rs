//! Frames of real runtimes that name their generated code: node's perf
//! map, and CPython's perf map (`-X perf`) and jitdump (`-X perf_jit`).
//! Each test is skipped, with the reason printed, where its runtime is
//! absent.

use super::*;

/// `node --perf-basic-prof` names its JavaScript functions in its perf
/// map: `outerJsWork` (into which the optimizing compiler inlines
/// `innerJsWork`) or `innerJsWork` is named on nearly every sample.
#[test]
fn node_perf_basic_prof() {
    let _serial = serial();
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("skipped: node is not installed (scripts/setup.sh installs nodejs)");
        return;
    }
    let dir = tempdir();
    let script = dir.path().join("jit.js");
    fs::write(
        &script,
        "function innerJsWork(n) { let s = 0; for (let i = 0; i < n; i++) s = (s + i * 31) | 0; return s; }\n\
         function outerJsWork() { let t = 0; for (let k = 0; k < 50; k++) t ^= innerJsWork(100000); return t; }\n\
         const end = Date.now() + 20000; let x = 0;\n\
         while (Date.now() < end) x ^= outerJsWork();\n\
         console.log(x);\n",
    )
    .expect("write script");
    let mut node = Command::new("node")
        .arg("--perf-basic-prof")
        .arg(&script)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("node");
    let pid = node.id();
    let map = format!("/tmp/perf-{pid}.map");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !fs::read_to_string(&map).is_ok_and(|m| m.contains("innerJsWork")) {
        assert!(
            Instant::now() < deadline,
            "node wrote no map naming innerJsWork"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    let (stacks, out) = profile(pid, comm.trim_end());
    let _ = node.kill();
    let _ = node.wait();
    let _ = fs::remove_file(&map);
    let all = total(&stacks);
    let named: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.contains("JsWork")))
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 100, "only {all} samples:\n{out}");
    assert!(
        named as f64 >= 0.9 * all as f64,
        "{named} of {all} samples name a JsWork function:\n{}\n{out}",
        show(&refs)
    );
}

/// A CPython of at least 3.`minor`: `python3.13`, `python3.12` or
/// `python3` on the PATH, else one of pyenv's versions. 3.12 writes a
/// perf map naming each Python function's trampoline (`-X perf`); 3.13
/// also a jitdump with their unwinding information (`-X perf_jit`).
fn python_at_least(minor: u32) -> Option<String> {
    let pyenv = std::env::var("PYENV_ROOT")
        .unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap_or_default()));
    let mut candidates: Vec<String> = ["python3.13", "python3.12", "python3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Ok(versions) = fs::read_dir(format!("{pyenv}/versions")) {
        let mut found: Vec<String> = versions
            .flatten()
            .map(|v| format!("{}/bin/python3", v.path().display()))
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev());
    }
    candidates.into_iter().find(|python| {
        Command::new(python)
            .arg("-c")
            .arg(format!(
                "import sys; sys.exit(sys.version_info < (3, {minor}))"
            ))
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// CPython 3.12+ `-X perf` names the trampolines of Python functions in
/// its perf map; most samples carry `inner_py_work`/`outer_py_work`. Its
/// perf map carries no unwind information (`-X perf_jit`'s jitdump does:
/// [`python_x_perf_jit`]), so the documented limit below stays.
#[test]
fn python_x_perf() {
    let _serial = serial();
    let Some(python) = python_at_least(12) else {
        eprintln!("skipped: no CPython 3.12 or later found (python3.12, python3.13, pyenv)");
        return;
    };
    let dir = tempdir();
    let script = dir.path().join("work.py");
    fs::write(
        &script,
        "import time\n\
         def inner_py_work(n):\n    s = 0\n    for i in range(n):\n        s = (s + i * 31) & 0xffffffff\n    return s\n\
         def outer_py_work():\n    t = 0\n    for _ in range(5):\n        t ^= inner_py_work(20000)\n    return t\n\
         end = time.time() + 20\nx = 0\nwhile time.time() < end:\n    x ^= outer_py_work()\nprint(x)\n",
    )
    .expect("write script");
    let (stacks, out) = profile_python(&python, "perf", &script, "inner_py_work");
    let all = total(&stacks);
    let named: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            frames
                .iter()
                .any(|f| python_function(f, "inner_py_work") || python_function(f, "outer_py_work"))
        })
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 50, "only {all} samples:\n{out}");
    // CPython 3.12 and 3.13's trampolines (`sub $8,%rsp; call *%rcx`) keep
    // no frame pointer and have no CFI: the walk ends at the innermost
    // Python function's trampoline (perf's DWARF walk does the same), so a
    // sample counts when it names either function; outer Python frames are
    // not asked for. Samples in the interpreter's own start-up name neither.
    assert!(
        named as f64 >= 0.6 * all as f64,
        "{named} of {all} samples name a py_work function:\n{}\n{out}",
        show(&refs)
    );
}

/// CPython 3.13+ `-X perf_jit`: a chain of Python functions (outer ->
/// middle -> inner) whose trampolines the jitdump names and describes
/// with unwinding information. At least 90% of the samples carry the
/// three names in order, below the interpreter's `Py_RunMain` (the walk
/// goes through each trampoline by its CFI and on into the interpreter).
/// CPython writes the jitdump through a 4 KiB stdio buffer, so the script
/// compiles 64 more functions after the chain's: their records push the
/// chain's into the file (as any program that goes on compiling does).
#[test]
fn python_x_perf_jit() {
    let _serial = serial();
    let Some(python) = python_at_least(13) else {
        eprintln!("skipped: no CPython 3.13 or later found (python3.13, pyenv)");
        return;
    };
    let dir = tempdir();
    let script = dir.path().join("chain.py");
    fs::write(
        &script,
        "import time\n\
         def inner_py_jit(n):\n    s = 0\n    for i in range(n):\n        s = (s + i * 31) & 0xffffffff\n    return s\n\
         def middle_py_jit(n):\n    return inner_py_jit(n)\n\
         def outer_py_jit():\n    t = 0\n    for _ in range(5):\n        t ^= middle_py_jit(20000)\n    return t\n\
         outer_py_jit()\n\
         for i in range(64):\n    exec(f'def flush_{i}(): return {i}\\nflush_{i}()')\n\
         end = time.time() + 20\nx = 0\nwhile time.time() < end:\n    x ^= outer_py_jit()\nprint(x)\n",
    )
    .expect("write script");
    let (stacks, out) = profile_python(&python, "perf_jit", &script, "inner_py_jit");
    let chain = [
        "Py_RunMain",
        "outer_py_jit",
        "middle_py_jit",
        "inner_py_jit",
    ];
    let in_order = |frames: &[String]| {
        let mut want = chain.iter().peekable();
        for frame in user_frames(frames) {
            if want.peek().is_some_and(|w| python_function(frame, w)) {
                want.next();
            }
        }
        want.peek().is_none()
    };
    let all = total(&stacks);
    let hit: u64 = stacks
        .iter()
        .filter(|(frames, _)| in_order(frames))
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    eprintln!("{python} -X perf_jit: {hit} of {all} samples have the chain in order");
    assert!(all >= 100, "only {all} samples:\n{}\n{out}", show(&refs));
    assert!(
        hit as f64 >= 0.9 * all as f64,
        "{hit} of {all} samples have {} in order:\n{}\n{out}",
        chain.join(" .. "),
        show(&refs)
    );
}

/// Whether folded frame `frame` names the Python function `name`: as the
/// perf map's trampoline (`py::NAME:FILE`) or, where lightswitch's own
/// Python walker walks the interpreter (docs/python.md: its frames win and
/// the trampolines are left out), by its name.
fn python_function(frame: &str, name: &str) -> bool {
    frame == name
        || frame
            .strip_prefix("py::")
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| rest.starts_with(':'))
}

/// Runs `python -X option script` and profiles it (with [`profile`]) once
/// the file its option writes (`perf`: `/tmp/perf-PID.map`; `perf_jit`:
/// `/tmp/jit-PID.dump`) names `function`, waiting up to 15 s; removes that
/// file after.
fn profile_python(
    python: &str,
    option: &str,
    script: &Path,
    function: &str,
) -> (Vec<Stack>, String) {
    let mut child = Command::new(python)
        .args(["-X", option])
        .arg(script)
        .stdout(Stdio::null())
        .spawn()
        .expect("python");
    let pid = child.id();
    let _kill = KillOnDrop(&mut child);
    let file = match option {
        "perf" => format!("/tmp/perf-{pid}.map"),
        _ => format!("/tmp/jit-{pid}.dump"),
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let names = |data: Vec<u8>| {
        data.windows(function.len())
            .any(|w| w == function.as_bytes())
    };
    while !fs::read(&file).is_ok_and(names) {
        assert!(
            Instant::now() < deadline,
            "{python} -X {option} wrote no {file} naming {function}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    let profiled = profile(pid, comm.trim_end());
    let _ = fs::remove_file(&file);
    profiled
}
