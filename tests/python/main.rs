//! Python frames in native stacks, with real CPython interpreters, as
//! root with real BPF sampling: for each CPython the walker supports that
//! is installed (Debian's `/usr/bin/python3.11`: non-PIE, libpython linked
//! in, no `.symtab`; pyenv's shared-libpython 3.8 to 3.13), a
//! script whose hot loop is `<module> -> outer -> Worker.middle -> a
//! lambda -> leaf_work` is profiled for 2 s into pprof, read back by
//! `go tool pprof -traces -lines`, and by py-spy (PyPI; scripts/setup.sh
//! installs it into the target directory) at the same time. Each version
//! must name the exact chain (qualified names, file and lines) in at least
//! 95% of its samples, and its share must be within 2 points of py-spy's
//! or better (before 3.11, which has no `co_qualname`, both name the
//! method and the lambda by `co_name`: `middle`, `<lambda>`). A version
//! that is not installed is skipped with a message. An unsupported version
//! (pyenv's 3.7) must show `[python: unsupported 3.7]` at its eval-loop
//! frames, never a name. `scenarios` covers the shapes Python code takes
//! (recursion, methods, generators, coroutines, callbacks from C, threads,
//! `record`), `container` an interpreter only visible under
//! `/proc/PID/root`, `many_threads` a thread behind a hundred others in
//! the interpreter's list, `off_cpu` Python chains of `--off-cpu` waits,
//! and `unsupported` CPython 3.14, a free-threaded build and PyPy.

mod chains;
#[path = "../common/mod.rs"]
mod common;
mod container;
mod many_threads;
mod off_cpu;
mod scenarios;
mod unsupported;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use common::*;

/// Minor versions of CPython 3 the BPF walker walks: every test here runs
/// on each installed interpreter of these.
const WALKED_MINORS: &[u32] = &[8, 9, 10, 11, 12, 13];

/// The workload; `argv[1]` is how long it runs, s.
const SCRIPT: &str = "import sys, time
class Worker:
    def middle(self, n):
        return (lambda k: leaf_work(k))(n)
def leaf_work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def outer(n):
    return Worker().middle(n)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    outer(20000)
";

/// A chain of Python frames, root first: (name, accepted lines).
type Chain = [(&'static str, &'static [u32]); 5];

/// The chain, root first, as 3.11 and later name it (`co_qualname`).
const CHAIN: Chain = [
    ("<module>", &[14]),
    ("outer", &[11]),
    ("Worker.middle", &[4]),
    ("Worker.middle.<locals>.<lambda>", &[4]),
    ("leaf_work", &[6, 7, 8, 9]),
];

/// The chain as 3.8 to 3.10 name it (`co_name`: no qualified names).
const CHAIN_CO_NAME: Chain = [
    ("<module>", &[14]),
    ("outer", &[11]),
    ("middle", &[4]),
    ("<lambda>", &[4]),
    ("leaf_work", &[6, 7, 8, 9]),
];

/// The chain `python` (`.../python3.MINOR`) names.
fn chain_of(python: &Path) -> &'static Chain {
    if qualified_names(python) {
        &CHAIN
    } else {
        &CHAIN_CO_NAME
    }
}

/// Whether `python` (`.../python3.MINOR`) names frames by `co_qualname`
/// (3.11+) rather than `co_name`.
fn qualified_names(python: &Path) -> bool {
    let name = python.file_name().unwrap_or_default().to_string_lossy();
    !matches!(name.trim_start_matches("python3.").parse::<u32>(), Ok(minor) if minor < 11)
}

/// Installed CPythons of `minor` versions: Debian's and pyenv's.
fn interpreters(minors: &[u32]) -> Vec<PathBuf> {
    let pyenv = std::env::var("PYENV_ROOT")
        .unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap_or_default()));
    let mut found = Vec::new();
    for minor in minors {
        let debian = PathBuf::from(format!("/usr/bin/python3.{minor}"));
        if debian.exists() {
            found.push(debian);
        }
        if let Ok(versions) = std::fs::read_dir(format!("{pyenv}/versions")) {
            for v in versions.flatten() {
                let python = v.path().join(format!("bin/python3.{minor}"));
                if v.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("3.{minor}."))
                    && python.exists()
                {
                    found.push(python);
                }
            }
        }
    }
    if found.is_empty() {
        eprintln!("skipped: no CPython 3.{minors:?} installed (/usr/bin, pyenv)");
    }
    found
}

/// py-spy: on the PATH, else in the target directory's `py-spy-venv`.
fn py_spy() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()?
        .join("py-spy-venv/bin/py-spy");
    if venv.exists() {
        return Some(venv);
    }
    let on_path = Command::new("py-spy").arg("--version").output().ok()?;
    on_path.status.success().then(|| "py-spy".into())
}

/// Share of samples in `traces` (`go tool pprof -sample_index=0 -traces
/// -lines` output: blocks of frames, the first line of each starting with
/// the block's count) whose Python frames (those in `script`), root first,
/// are exactly `chain`; and the samples counted.
fn our_share(traces: &str, script: &str, chain: &Chain) -> (f64, u64) {
    let (mut good, mut all) = (0u64, 0u64);
    for block in traces.split("-----------+").skip(1) {
        let mut count = None;
        let mut python = Vec::new();
        for line in block.lines() {
            let mut frame = line.trim();
            if count.is_none() {
                match frame
                    .split_once("   ")
                    .map(|(n, rest)| (n.parse::<u64>(), rest))
                {
                    Some((Ok(n), rest)) => {
                        count = Some(n);
                        frame = rest.trim();
                    }
                    _ => continue,
                }
            }
            if let Some(at) = frame.find(script) {
                // "NAME /path/chain.py:LINE".
                let line: u32 = frame[at + script.len()..]
                    .trim_start_matches(':')
                    .parse()
                    .unwrap_or(0);
                python.push((frame[..at].trim().to_string(), line));
            }
        }
        let count = count.unwrap_or(0);
        all += count;
        python.reverse();
        let exact = python.len() == chain.len()
            && python
                .iter()
                .zip(chain)
                .all(|((name, line), &(want, lines))| name == want && lines.contains(line));
        if exact {
            good += count;
        }
    }
    (good as f64 / all.max(1) as f64, all)
}

/// Share of py-spy's raw samples (`frame (file:line);... count`) with `chain`.
fn spy_share(raw: &str, chain: &Chain) -> f64 {
    let (mut good, mut all) = (0u64, 0u64);
    for l in raw.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        all += n;
        let names: Vec<&str> = stack
            .split(';')
            .filter_map(|f| f.split_once(" (")?.0.into())
            .collect();
        let want: Vec<&str> = chain.iter().map(|(name, _)| *name).collect();
        if names.ends_with(&want) {
            good += n;
        }
    }
    good as f64 / all.max(1) as f64
}

/// Profile `python` running the script for 2 s with lightswitch (pprof)
/// and py-spy at once; (our share, samples, py-spy's share).
fn profile(python: &Path, spy: Option<&Path>) -> (f64, u64, Option<f64>, String) {
    let dir = tempdir();
    let script = dir.path().join("chain.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    let mut child = Command::new(python)
        .arg(&script)
        .arg("40")
        .stdout(Stdio::null())
        .spawn()
        .expect("python");
    let pid = child.id().to_string();
    thread::sleep(Duration::from_millis(300));
    let spy_out = dir.path().join("spy.txt");
    let spy_run = spy.map(|spy| {
        Command::new(spy)
            .args([
                "record",
                "-p",
                &pid,
                "-d",
                "3",
                "-r",
                "499",
                "-f",
                "raw",
                "--nonblocking",
                "-o",
            ])
            .arg(&spy_out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("py-spy")
    });
    let out_dir = dir.path().join("out");
    let out = Command::new(BIN)
        .args(["--pids", &pid, "--duration", "2", "--sample-freq", "499"])
        .args(["--profile-format", "pprof", "--profile-path"])
        .arg(&out_dir)
        .output()
        .expect("lightswitch");
    let stdout =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let spy_share = spy_run.map(|mut run| {
        let _ = run.wait();
        spy_share(
            &std::fs::read_to_string(&spy_out).unwrap_or_default(),
            chain_of(python),
        )
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.status.success(), "lightswitch failed:\n{stdout}");
    let pb = out_dir.join("profile.pb");
    let traces = chains::traces_of(&pb);
    let (share, samples) = our_share(&traces, s(&script), chain_of(python));
    (share, samples, spy_share, traces)
}

#[test]
fn chains_of_supported_versions_match_py_spy() {
    let _serial = serial();
    let spy = py_spy();
    if spy.is_none() {
        eprintln!("py-spy not found (scripts/setup.sh installs it): no reference share");
    }
    for python in interpreters(WALKED_MINORS) {
        let (share, samples, spy_share, traces) = profile(&python, spy.as_deref());
        eprintln!(
            "{}: lightswitch {share:.3} of {samples} samples, py-spy {spy_share:?}",
            python.display()
        );
        assert!(
            samples >= 100,
            "{}: only {samples} samples",
            python.display()
        );
        let head: String = traces.lines().take(60).collect::<Vec<_>>().join("\n");
        // `go tool pprof` shows names in <...> as they are (not cut as a
        // C++ template's arguments).
        for name in ["<module> ", "<lambda> "] {
            assert!(
                traces.contains(name),
                "{}: no {name:?} frame:\n{head}",
                python.display()
            );
        }
        assert!(
            share >= 0.95,
            "{}: the chain in {share:.3} of samples:\n{head}",
            python.display()
        );
        if let Some(spy_share) = spy_share {
            assert!(
                share >= spy_share - 0.02,
                "{}: ours {share:.3}, py-spy {spy_share:.3}",
                python.display()
            );
        }
    }
}

#[test]
fn unsupported_versions_are_marked_never_named() {
    let _serial = serial();
    for python in interpreters(&[7]) {
        let (share, _, _, traces) = profile(&python, None);
        assert_eq!(share, 0.0, "{}", python.display());
        assert!(
            traces.contains("[python: unsupported 3."),
            "{}: no [python: unsupported] frame:\n{}",
            python.display(),
            traces.lines().take(40).collect::<Vec<_>>().join("\n")
        );
    }
}
