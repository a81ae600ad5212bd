//! User-stack unwinding from DWARF CFI, end to end: small programs compiled
//! here (C and C++ without frame pointers, a Rust release binary, Go) are
//! profiled by pid and their exact call chains, root to leaf, are checked in
//! the folded output. Also: deep recursion, 100 KiB and 600 KiB stack frames,
//! a library `dlopen`ed while profiling, a signal handler frame, a deleted
//! binary, a process in its own pid namespace, the frame limit, and
//! `show-unwind`. `compat.rs` runs some of them again with the BPF
//! programs built for kernels without `bpf_loop` (5.10 to 5.16).
//!
//! Needs root (BPF), gcc, g++, rustc and util-linux; the Go test needs `go`.
//!
//! Tables are built in the background when the profiler first sees a
//! process, so the first few dozen milliseconds of samples may end as
//! `[unwind: no_table]`. Every check counts those separately (they must stay
//! under 10% of the samples) and requires the exact chain on at least 95% of
//! the rest.

#[path = "../common/mod.rs"]
mod common;
mod compat;
mod languages;
mod processes;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Longest any single profiler run may take before the test gives up.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Sampling frequency of every run.
const FREQ: &str = "499";

/// C and C++ flags: optimized, no frame pointers (only CFI to unwind with).
const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];

/// Fewer samples than this make percentages meaningless.
const MIN_SAMPLES: u64 = 100;

/// A never-true flag: loops on it are not `noreturn`, so callers keep real
/// code after their calls.
const STOP_FLAG: &str = "volatile int stop;\nvolatile unsigned long sink;\n";

// ---------------------------------------------------------------------------
// Workloads

/// A running program (any language, possibly behind a wrapper such as
/// `unshare`), killed with its wrapper on drop. It gets SIGKILL if the
/// thread that spawned it dies first.
struct Target {
    child: Child,
    /// The pid to profile (the child itself, or the program the wrapper started).
    pid: u32,
    stdin: Option<ChildStdin>,
}

impl Target {
    /// Start `cmd` and wait until the process `comm` is running: the child
    /// itself or, with `wrapped`, a child of it (a wrapper that forks).
    fn spawn(mut cmd: Command, comm: &str, wrapped: bool) -> Self {
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let mut target = Target {
            pid: child.id(),
            child,
            stdin,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let candidates = if wrapped {
                children(target.child.id())
            } else {
                vec![target.child.id()]
            };
            if let Some(&pid) = candidates.iter().find(|&&p| comm_of(p) == comm) {
                target.pid = pid;
                return target;
            }
            if let Ok(Some(status)) = target.child.try_wait() {
                panic!("{cmd:?} exited ({status}) before {comm} ran");
            }
            assert!(
                Instant::now() < deadline,
                "{comm} did not start within 10 s ({cmd:?})"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Start the executable `path` (its file name is its comm).
    fn run(path: &Path) -> Self {
        Self::spawn(Command::new(path), &file_name(path), false)
    }

    /// Write a byte to the program's stdin (programs that wait to start read it).
    fn release(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"g")
            .expect("writing to the target's stdin");
        stdin.flush().expect("flushing the target's stdin");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if self.pid != self.child.id() {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `comm` of `pid` ("" if it is gone).
fn comm_of(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

/// The children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

/// Run `cmd` (a compiler) and panic with its output if it fails.
fn build(mut cmd: Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?} (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {cmd:?}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// Profiling and checking

/// One finished profiler run and its folded stacks.
struct Profiled {
    out: Output,
    stacks: Vec<Stack>,
    /// The `user stacks:` counts of the summary (`complete` -> N, ...).
    unwind: BTreeMap<String, u64>,
}

/// The profiler's arguments for `seconds` of folded output about `pid`
/// into `out_dir`, with its own (empty) unwind-table cache so that no
/// cached table of another build of lightswitch is used.
fn profile_args(pid: u32, seconds: &str, out_dir: &Path) -> Vec<String> {
    [
        "--pids",
        &pid.to_string(),
        "--duration",
        seconds,
        "--sample-freq",
        FREQ,
        "--profile-format",
        "folded",
        "--profile-path",
        s(out_dir),
        "--profile-name",
        "folded.txt",
        "--unwind-cache-dir",
        s(&out_dir.join("cache")),
    ]
    .map(String::from)
    .to_vec()
}

/// Parse what a finished run wrote (it must have succeeded).
fn finish(out: Output, out_dir: &Path) -> Profiled {
    out.assert_success();
    let summary = out.summary();
    let stacks = read_folded(&out_dir.join("folded.txt"));
    let unwind = unwind_counts(&out.stdout)
        .unwrap_or_else(|| panic!("no `user stacks:` line in stdout:\n{out}"));
    let all: Vec<&Stack> = stacks.iter().collect();
    assert_eq!(
        total(&stacks),
        summary.samples,
        "folded counts must add up to the summary's sample count:\n{}\n{out}",
        show(&all)
    );
    assert_eq!(
        unwind.values().sum::<u64>(),
        summary.samples,
        "the unwind results must add up to the sample count:\n{out}"
    );
    Profiled {
        out,
        stacks,
        unwind,
    }
}

/// Profile `target` for `seconds` (it is already running and busy).
fn profile(target: &Target, seconds: &str) -> Profiled {
    let dir = tempdir();
    let out = run(&profile_args(target.pid, seconds, dir.path()), TIMEOUT);
    finish(out, dir.path())
}

/// How a folded stack's user walk ended, when it did not complete
/// (`[unwind: REASON]` right after the comm).
fn unwind_marker(frames: &[String]) -> Option<&str> {
    frames.get(1)?.strip_prefix("[unwind: ")?.strip_suffix(']')
}

/// Samples of one process, split by how they matched an expectation.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    total: u64,
    no_table: u64,
    matching: u64,
}

/// Count `comm`'s samples, its `no_table` samples and those whose user
/// frames (root to leaf, a leading `[unwind: ..]` marker included, kernel
/// frames removed) satisfy `expected`.
fn tally(stacks: &[Stack], comm_name: &str, expected: impl Fn(&[&str]) -> bool) -> Tally {
    let mut t = Tally::default();
    for (frames, n) in stacks.iter().filter(|(f, _)| comm(f) == comm_name) {
        t.total += n;
        if unwind_marker(frames) == Some("no_table") {
            t.no_table += n;
        }
        if expected(&user_frames(frames)) {
            t.matching += n;
        }
    }
    t
}

/// Assert that `comm`'s samples are plentiful, that at most 10% of them
/// waited for a table, and that at least `share` of the others match.
fn assert_share(p: &Profiled, comm_name: &str, what: &str, share: f64, t: Tally) {
    let mine = of_process(&p.stacks, comm_name);
    let others: Vec<&Stack> = p
        .stacks
        .iter()
        .filter(|(f, _)| comm(f) != comm_name)
        .collect();
    assert!(
        others.is_empty(),
        "only {comm_name} was profiled, yet other processes have samples:\n{}",
        show(&others)
    );
    assert!(
        t.total >= MIN_SAMPLES,
        "only {} samples of {comm_name}:\n{}\n{}",
        t.total,
        show(&mine),
        p.out
    );
    assert_eq!(
        t.no_table,
        p.unwind.get("no_table").copied().unwrap_or(0),
        "`[unwind: no_table]` stacks disagree with the summary:\n{}",
        p.out
    );
    assert!(
        t.no_table * 10 < t.total,
        "{} of {} samples had no unwind table yet (tables must load within the first moments):\n{}",
        t.no_table,
        t.total,
        show(&mine)
    );
    let considered = t.total - t.no_table;
    assert!(
        t.matching as f64 >= share * considered as f64,
        "only {} of {considered} samples (not counting {} no_table) of {comm_name} are {what}:\n{}\n{}",
        t.matching,
        t.no_table,
        show(&mine),
        p.out
    );
}

/// Require the exact user stack `expected` on 95% of `comm`'s samples
/// (see [`assert_share`]).
fn assert_chain(p: &Profiled, comm_name: &str, what: &str, expected: impl Fn(&[&str]) -> bool) {
    let t = tally(&p.stacks, comm_name, expected);
    assert_share(p, comm_name, what, 0.95, t);
}

/// `user` is a complete stack: rooted at `_start`, then only libc start-up
/// frames, then exactly `chain` (which starts at `main`).
fn complete_chain(user: &[&str], chain: &[&str]) -> bool {
    user.first() == Some(&"_start") && ends_with_chain(user, chain)
}

/// Print the exact chain expectation for messages.
fn describe(chain: &[&str]) -> String {
    format!("_start;[libc start;]{}", chain.join(";"))
}

// ---------------------------------------------------------------------------
// Programs

/// `main -> a -> b -> c -> d -> hot`, none inlined, no tail calls.
fn c_chain_source() -> String {
    format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
__attribute__((noinline)) void hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void d(void) {{ hot(); sink++; }}
__attribute__((noinline)) void c(void) {{ d(); sink++; }}
__attribute__((noinline)) void b(void) {{ c(); sink++; }}
__attribute__((noinline)) void a(void) {{ b(); sink++; }}
int main(void) {{ a(); sink++; return 0; }}
"
    )
}

const C_CHAIN: &[&str] = &["main", "a", "b", "c", "d", "hot"];

/// `main -> recurse x depth -> hot`.
fn recursion_source(depth: u32) -> String {
    format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
__attribute__((noinline)) void hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void recurse(int n) {{
    if (n > 1) recurse(n - 1); else hot();
    sink++;
}}
int main(void) {{ recurse({depth}); sink++; return 0; }}
"
    )
}

/// The user stack of the recursion: libc start, `main`, exactly `depth`
/// `recurse` frames, `hot`.
fn recursion_chain(depth: usize) -> Vec<&'static str> {
    let mut chain = vec!["main"];
    chain.extend(std::iter::repeat_n("recurse", depth));
    chain.push("hot");
    chain
}
