//! The shapes Python code takes, on every walked CPython that is installed
//! (`super::WALKED_MINORS`): recursion 50 deep, methods and a lambda, a
//! generator, a coroutine driven by asyncio, Python called back from C
//! (`sorted(key=...)`, `map`), three threads each in its own function, and
//! a script started by `lightswitch record`. One interpreter process per
//! version runs the scenarios in turn (tests/python/scenarios.py), each in
//! its own thread for [`SECONDS`], profiled at 999 Hz by lightswitch (pprof,
//! read by `go tool pprof`) and by py-spy at once. A sample belongs to the
//! scenario of its thread (pprof's `tid` label; py-spy's by the script's
//! outermost frame); for each scenario, at least 95% of our samples must
//! name the exact chain (names, files, lines, and the native frames of
//! `sorted` and `map` between the Python ones), and our share must be within
//! 2 points of py-spy's or better.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::chains::{
    body_of, line_of, pprof_stacks, spy_stacks, traces_of, Expected, Frame, Stack, Step,
};
use super::{interpreters, py_spy, qualified_names, WALKED_MINORS};
use crate::common::*;

/// The workloads.
pub const SCRIPT: &str = include_str!("scenarios.py");
/// How long each scenario runs, s.
const SECONDS: &str = "1.5";
/// Sampling frequency of both tools, Hz.
const FREQ: &str = "999";
/// Fewest samples a scenario needs for its share to mean something.
const MIN_SAMPLES: u64 = 30;

/// A Python step: `name`, at the line marked `# MARK: call` (`mark` is
/// the name unless given), or at the body of `leaf_work`.
fn py(name: &str, mark: &str) -> Step {
    let lines = if name == "leaf_work" {
        body_of(SCRIPT, name)
    } else {
        vec![line_of(SCRIPT, &format!("# {mark}: call"))]
    };
    Step::Python(name.to_string(), lines)
}

/// The chain of the scenario whose root function is `root`, with `script`
/// the path the interpreter ran; `qualified`: the interpreter names frames
/// by `co_qualname` (3.11+), else by `co_name` (`Shape.area` is `area`).
pub fn expected(root: &str, script: &Path, qualified: bool) -> Expected {
    let leaf = || py("leaf_work", "");
    let mut steps = match root {
        "run_recursion" => {
            let mut steps = vec![py(root, root)];
            steps.extend((0..49).map(|_| py("recurse", "recurse")));
            steps.push(Step::Python(
                "recurse".into(),
                vec![line_of(SCRIPT, "# recurse: leaf")],
            ));
            steps.push(leaf());
            steps
        }
        "run_methods" | "<module>" => {
            let mut steps = if root == "<module>" {
                vec![py(root, root)]
            } else {
                vec![]
            };
            steps.extend([
                py("run_methods", "run_methods"),
                py("Shape.area", "Shape.area"),
                py("Shape.area.<locals>.<lambda>", "Shape.area"),
                py("Shape.measure", "Shape.measure"),
                leaf(),
            ]);
            steps
        }
        "run_generator" => vec![py(root, root), py("squares", "squares"), leaf()],
        "run_async" => vec![
            py(root, root),
            py("amain", "amain"),
            py("compute", "compute"),
            leaf(),
        ],
        "run_sorted" => vec![
            py(root, root),
            Step::Native("builtin_sorted"),
            py("sort_key", "sort_key"),
            leaf(),
        ],
        "run_map" => vec![
            py(root, root),
            Step::Native("map_next"),
            py("map_fn", "map_fn"),
            leaf(),
        ],
        "thread_a" | "thread_b" | "thread_c" => vec![py(root, root), leaf()],
        other => panic!("no scenario {other}"),
    };
    if !qualified {
        for step in &mut steps {
            if let Step::Python(name, _) = step {
                *name = co_name(name).to_string();
            }
        }
    }
    Expected {
        script: s(script).to_string(),
        steps,
    }
}

/// Per scenario (root function): samples with the chain, samples, and a
/// few stacks that miss it.
type Tally = BTreeMap<String, (u64, u64, Vec<String>)>;

fn add(tally: &mut Tally, root: &str, stack: &Stack, good: bool) {
    let entry = tally.entry(root.to_string()).or_default();
    entry.1 += stack.count;
    if good {
        entry.0 += stack.count;
    } else if entry.2.len() < 3 {
        entry.2.push(stack.render());
    }
}

/// Whether a sample of ours counts toward its scenario's share: it names
/// one of the script's frames, or it ran the eval loop and the walker named
/// none of its Python frames (none at all, or only `[python: ...]`). Not
/// counted, as py-spy's tally does not count them either: samples whose
/// named Python frames are all outside the script (a thread's start and end
/// in threading.py; the interpreter's start-up, where a module's code
/// object may be freed before its frames are named: `[python: unknown]`),
/// and native code outside the eval loop.
pub fn counted(stack: &Stack, script: &Path) -> bool {
    let named = |f: &&Frame| f.file.ends_with(".py") || f.file.starts_with("<frozen");
    let eval = stack
        .frames
        .iter()
        .any(|f| f.name == "_PyEval_EvalFrameDefault");
    let mut frames = stack.frames.iter().filter(named).peekable();
    let none = frames.peek().is_none();
    (eval && none) || frames.any(|f| f.file == s(script))
}

/// Our tally: each sample goes to the scenario of its thread.
fn our_tally(
    stacks: &[Stack],
    roots: &BTreeMap<u32, String>,
    script: &Path,
    qualified: bool,
) -> Tally {
    let mut tally = Tally::new();
    for stack in stacks.iter().filter(|st| counted(st, script)) {
        if let Some(root) = roots.get(&stack.tid) {
            add(
                &mut tally,
                root,
                stack,
                expected(root, script, qualified).matches(stack, true),
            );
        }
    }
    tally
}

/// py-spy's tally: each sample goes to the scenario of its outermost script frame.
fn spy_tally(
    stacks: &[Stack],
    roots: &BTreeMap<u32, String>,
    script: &Path,
    qualified: bool,
) -> Tally {
    let probe = expected("thread_a", script, qualified);
    let mut tally = Tally::new();
    for stack in stacks {
        if let Some(root) = probe.root(stack).filter(|r| roots.values().any(|v| v == r)) {
            add(
                &mut tally,
                &root,
                stack,
                expected(&root, script, qualified).matches(stack, false),
            );
        }
    }
    tally
}

/// Start py-spy on `pid` (999 Hz, raw, until the process exits) writing `out`.
pub fn start_spy(spy: &Path, pid: u32, out: &Path) -> Child {
    Command::new(spy)
        .args(["record", "-p", &pid.to_string(), "-r", FREQ, "-d", "120"])
        .args(["-f", "raw", "--nonblocking", "--full-filenames", "-o"])
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("py-spy")
}

/// Run every scenario on `python`; our tally and py-spy's.
fn run_all(python: &Path, spy: Option<&Path>) -> (Tally, Option<Tally>) {
    let dir = tempdir();
    let script = dir.path().join("scenarios.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    let mut child = Command::new(python)
        .arg(&script)
        .args(["drive", SECONDS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python");
    let pid = child.id();
    let out_dir = dir.path().join("out");
    let mut profiler = Lightswitch::spawn(&[
        "--pids",
        &pid.to_string(),
        "--sample-freq",
        FREQ,
        "--profile-format",
        "pprof",
        "--profile-path",
        s(&out_dir),
    ]);
    profiler.expect_sampling();
    let spy_out = dir.path().join("spy.txt");
    let spy_run = spy.map(|spy| start_spy(spy, pid, &spy_out));
    // Both attach (the profiler's BPF programs, py-spy's first read) while the driver waits.
    thread::sleep(Duration::from_millis(700));
    writeln!(child.stdin.take().unwrap(), "go").expect("start the scenarios");
    let mut roots = BTreeMap::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.expect("driver output");
        if let Some((root, tid)) = line.split_once(' ') {
            roots.insert(tid.parse().expect("tid"), root.to_string());
        }
    }
    let status = child.wait().expect("python");
    assert!(status.success(), "{}: the driver failed", python.display());
    // The profiler stops once the process it profiles is gone.
    let out = profiler.wait(Duration::from_secs(60));
    out.assert_success();
    let spy_tally = spy_run.map(|mut run| {
        let _ = run.wait();
        let raw = std::fs::read_to_string(&spy_out).unwrap_or_default();
        spy_tally(&spy_stacks(&raw), &roots, &script, qualified_names(python))
    });
    let traces = traces_of(&out_dir.join("profile.pb"));
    let ours = our_tally(
        &pprof_stacks(&traces),
        &roots,
        &script,
        qualified_names(python),
    );
    assert_eq!(
        roots.len(),
        9,
        "{}: scenario threads {roots:?}",
        python.display()
    );
    (ours, spy_tally)
}

/// Share of a tally entry.
fn share((good, all, _): &(u64, u64, Vec<String>)) -> f64 {
    *good as f64 / (*all).max(1) as f64
}

/// Assert each scenario's share, ours and against py-spy's; print them all.
pub fn check(label: &str, ours: &Tally, spy: Option<&Tally>) {
    let mut failures = Vec::new();
    for (root, counts) in ours {
        let (mine, spy_share) = (share(counts), spy.and_then(|t| t.get(root)).map(share));
        eprintln!(
            "{label} {root}: lightswitch {mine:.3} of {} samples, py-spy {}",
            counts.1,
            spy_share.map_or("-".into(), |s| format!("{s:.3}"))
        );
        if counts.1 < MIN_SAMPLES {
            failures.push(format!("{root}: only {} samples", counts.1));
        } else if mine < 0.95 {
            failures.push(format!(
                "{root}: the chain in {mine:.3} of samples; some of its stacks:\n{}",
                counts.2.join("\n--\n")
            ));
        } else if spy_share.is_some_and(|s| mine < s - 0.02) {
            failures.push(format!("{root}: ours {mine:.3}, py-spy {spy_share:?}"));
        }
    }
    assert!(failures.is_empty(), "{label}:\n{}", failures.join("\n"));
}

#[test]
fn scenarios_name_their_chains_as_py_spy_does() {
    let _serial = serial();
    let spy = py_spy();
    if spy.is_none() {
        eprintln!("py-spy not found (scripts/setup.sh installs it): no reference shares");
    }
    for python in interpreters(WALKED_MINORS) {
        let started = Instant::now();
        let (ours, spy_tally) = run_all(&python, spy.as_deref());
        let label = python.display().to_string();
        eprintln!("{label}: {:.1} s", started.elapsed().as_secs_f64());
        for root in expected_roots() {
            assert!(ours.contains_key(root), "{label}: no samples of {root}");
        }
        check(&label, &ours, spy_tally.as_ref());
    }
}

/// Every scenario's root function.
fn expected_roots() -> [&'static str; 9] {
    [
        "run_recursion",
        "run_methods",
        "run_generator",
        "run_async",
        "run_sorted",
        "run_map",
        "thread_a",
        "thread_b",
        "thread_c",
    ]
}

/// The pid of a child of `parent` (forked by any of its threads), once it runs `comm_prefix`.
pub fn child_running(parent: u32, comm_prefix: &str, timeout: Duration) -> Option<u32> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).ok()?;
        for task in tasks.flatten() {
            let children = std::fs::read_to_string(task.path().join("children"));
            for pid in children.unwrap_or_default().split_whitespace() {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
                if comm.unwrap_or_default().starts_with(comm_prefix) {
                    return pid.parse().ok();
                }
            }
        }
        thread::sleep(Duration::from_millis(5));
    }
    None
}

/// `lightswitch record -- python scenarios.py main`: the chain from
/// `<module>` on the main thread, from the process's first samples: a
/// sample of the hot loop that the walker missed (no Python frame, or
/// `[python: unknown]`) counts against the share ([`counted`]).
#[test]
fn record_covers_a_script_from_its_first_samples() {
    let _serial = serial();
    let spy = py_spy();
    for python in interpreters(WALKED_MINORS) {
        let dir = tempdir();
        let script = dir.path().join("scenarios.py");
        std::fs::write(&script, SCRIPT).expect("write script");
        let out_dir = dir.path().join("out");
        let mut cmd = Command::new(BIN);
        cmd.args([
            "record",
            "-F",
            FREQ,
            "--profile-format",
            "pprof",
            "--profile-path",
        ])
        .arg(&out_dir)
        .arg("--")
        .arg(&python)
        .arg(&script)
        .args(["main", "1.5"]);
        let profiler = Lightswitch::spawn_command(cmd);
        let comm = python.file_name().unwrap().to_string_lossy();
        let pid = child_running(profiler.pid(), &comm, Duration::from_secs(30));
        // py-spy gives up on a process whose libpython is not mapped yet
        // (an interpreter without one: py-spy starts 200 ms late).
        let deadline = Instant::now() + Duration::from_millis(200);
        while let Some(pid) = pid.filter(|_| Instant::now() < deadline) {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            if maps.contains("libpython") {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        let spy_out = dir.path().join("spy.txt");
        let spy_run = spy
            .as_deref()
            .zip(pid)
            .map(|(spy, pid)| start_spy(spy, pid, &spy_out));
        let out = profiler.wait(Duration::from_secs(60));
        out.assert_success();
        let traces = traces_of(&out_dir.join("profile.pb"));
        let chain = expected("<module>", &script, qualified_names(&python));
        let mut ours = Tally::new();
        for stack in pprof_stacks(&traces)
            .iter()
            .filter(|st| counted(st, &script))
        {
            add(&mut ours, "<module>", stack, chain.matches(stack, true));
        }
        let spy_tally = spy_run.map(|mut run| {
            let _ = run.wait();
            let raw = std::fs::read_to_string(&spy_out).unwrap_or_default();
            let mut tally = Tally::new();
            for stack in spy_stacks(&raw) {
                if chain.root(&stack).is_some() {
                    add(&mut tally, "<module>", &stack, chain.matches(&stack, false));
                }
            }
            tally
        });
        let label = format!("record {}", python.display());
        assert!(ours.contains_key("<module>"), "{label}: no samples:\n{out}");
        check(&label, &ours, spy_tally.as_ref());
    }
}

/// Where an interpreter's install lives: its pyenv version directory, if it has one.
pub fn pyenv_root(python: &Path) -> Option<PathBuf> {
    let bin = python.parent()?;
    (bin.file_name()? == "bin" && bin.parent()?.parent()?.file_name()? == "versions")
        .then(|| bin.parent().unwrap().to_path_buf())
}

/// A qualified name's last part, as `co_name` has it: `Shape.area` is
/// `area`, `Shape.area.<locals>.<lambda>` is `<lambda>`.
fn co_name(qualified: &str) -> &str {
    qualified.rsplit('.').next().unwrap_or(qualified)
}
