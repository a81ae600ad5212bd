//! User-stack unwinding from DWARF CFI, end to end: small programs compiled
//! here (C and C++ without frame pointers, a Rust release binary, Go) are
//! profiled by pid and their exact call chains, root to leaf, are checked in
//! the folded output. Also: deep recursion, 100 KiB and 600 KiB stack frames,
//! a library `dlopen`ed while profiling, a signal handler frame, a deleted
//! binary, a process in its own pid namespace, the frame limit, and
//! `show-unwind`.
//!
//! Needs root (BPF), gcc, g++, rustc and util-linux; the Go test needs `go`.
//!
//! Tables are built in the background when the profiler first sees a
//! process, so the first few dozen milliseconds of samples may end as
//! `[unwind: no_table]`. Every check counts those separately (they must stay
//! under 10% of the samples) and requires the exact chain on at least 95% of
//! the rest.

mod common;

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

// ---------------------------------------------------------------------------
// Tests

/// C at -O2 without frame pointers: the whole chain from `_start`, which
/// only the CFI walk can produce.
#[test]
fn c_no_frame_pointers_chain() {
    let _serial = serial();
    let program = compile("lsw_uw_chain", &c_chain_source(), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let t = tally(&p.stacks, &program.name, |u| complete_chain(u, C_CHAIN));
    assert_share(&p, &program.name, &describe(C_CHAIN), 0.95, t);
    // Frame pointers cannot have produced these stacks: the summary counts
    // them as complete CFI walks.
    let complete = p.unwind.get("complete").copied().unwrap_or(0);
    assert!(
        complete as f64 >= 0.95 * (t.total - t.no_table) as f64,
        "only {complete} of {} walks are counted complete:\n{}",
        t.total - t.no_table,
        p.out
    );
}

/// `main -> clocks`, which spends its time in `clock_gettime`, answered by
/// the kernel's vDSO without a system call.
fn vdso_source() -> String {
    format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}#include <time.h>
__attribute__((noinline)) void clocks(void) {{
    struct timespec ts;
    while (!stop) {{ clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }}
}}
int main(void) {{ clocks(); sink++; return 0; }}
"
    )
}

/// Frames in the vDSO are named (from the profiler's own vDSO, the same
/// image), never left as `[vdso]+0x...`, and walks through them complete.
#[test]
fn vdso_frames_named() {
    let _serial = serial();
    let program = compile("lsw_uw_vdso", &vdso_source(), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let mine = of_process(&p.stacks, &program.name);
    let unnamed: Vec<&Stack> = mine
        .iter()
        .copied()
        .filter(|(f, _)| f.iter().any(|x| x.starts_with("[vdso]")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "vDSO frames left unsymbolized:\n{}\n{}",
        show(&unnamed),
        p.out
    );
    // glibc calls the vDSO's entry point (`__vdso_clock_gettime`, also
    // exported as `clock_gettime`) from its own `clock_gettime`.
    let in_vdso = |u: &[&str]| {
        u.len() >= 2
            && u[u.len() - 1].contains("clock_gettime")
            && u[u.len() - 2].contains("clock_gettime")
            && complete_chain(&u[..u.len() - 2], &["main", "clocks"])
    };
    let t = tally(&p.stacks, &program.name, in_vdso);
    assert_share(
        &p,
        &program.name,
        "main;clocks;clock_gettime (libc);clock_gettime (vDSO)",
        0.3,
        t,
    );
}

/// Recursion 300 deep: every one of the 300 frames, in order, between
/// `main` and the leaf.
#[test]
fn c_recursion_300() {
    let _serial = serial();
    let program = compile("lsw_uw_rec300", &recursion_source(300), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let chain = recursion_chain(300);
    assert_chain(
        &p,
        &program.name,
        "main, exactly 300 `recurse` frames and hot, from _start",
        |u| complete_chain(u, &chain),
    );
}

/// `main` calling `left` and `right` in turn, both calling `mid -> spin`.
/// `left` and `right` have the same frame size, so `mid` and `spin` run at
/// the same stack addresses with the same registers on either path: only
/// the return address into `left` or `right` tells them apart.
fn two_paths_source() -> String {
    format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
__attribute__((noinline)) void spin(void) {{ for (int i = 0; i < 20000; i++) sink++; }}
__attribute__((noinline)) void mid(void) {{ spin(); sink++; }}
__attribute__((noinline)) void left(void) {{ mid(); sink += 1; }}
__attribute__((noinline)) void right(void) {{ mid(); sink += 2; }}
int main(void) {{ while (!stop) {{ left(); right(); }} return 0; }}
"
    )
}

/// Each CPU reuses its previous walk when a new one reaches the same
/// registers, after checking every stack word that walk read. Here the
/// two paths alternate every few tens of microseconds with identical
/// registers below `left`/`right`: both must keep about half of the
/// samples, with exact chains. A walk is reused when the previous sample
/// on its CPU took the same path, about half of the time: at least a
/// quarter must be (the debug log's `walks_reused`).
#[test]
fn reused_walks_check_every_caller() {
    let _serial = serial();
    let program = compile("lsw_uw_paths", &two_paths_source(), NO_FP);
    let target = Target::run(&program.path);
    let dir = tempdir();
    let mut args = profile_args(target.pid, "2", dir.path());
    args.extend(["--logging".to_string(), "debug".to_string()]);
    let p = finish(run(&args, TIMEOUT), dir.path());
    let via = |caller: &'static str| {
        move |u: &[&str]| complete_chain(u, &["main", caller, "mid", "spin"])
    };
    let left = tally(&p.stacks, &program.name, via("left"));
    let right = tally(&p.stacks, &program.name, via("right"));
    let both = Tally {
        matching: left.matching + right.matching,
        ..left
    };
    assert_share(&p, &program.name, "main;left|right;mid;spin", 0.95, both);
    for (name, t) in [("left", left), ("right", right)] {
        assert!(
            t.matching * 10 >= both.matching * 3,
            "{name} has {} of the {} samples in spin (expected about half):\n{}",
            t.matching,
            both.matching,
            p.out
        );
    }
    let reused: u64 = p
        .out
        .stderr
        .split("walks_reused: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no walks_reused in the debug log:\n{}", p.out));
    assert!(
        reused * 4 >= both.matching,
        "only {reused} of {} walks were reused:\n{}",
        both.matching,
        p.out
    );
}

const CPP_SOURCE: &str = r#"
#include <functional>
#include <signal.h>
#include <sys/prctl.h>
__attribute__((constructor)) static void die_with_parent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void hot_loop() { while (!stop) sink++; }
template <typename T> __attribute__((noinline)) void run(T &f) { f(); sink++; }
int main() {
    // Work after the call keeps the handler from tail-calling hot_loop.
    std::function<void()> f = [] { hot_loop(); sink++; };
    run(f);
    sink++;
    return 0;
}
"#;

/// C++ without frame pointers: a template calling through `std::function`;
/// every name demangled, the chain complete.
#[test]
fn cpp_std_function_template() {
    let _serial = serial();
    let dir = tempdir();
    let src = dir.path().join("fn.cpp");
    fs::write(&src, CPP_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_cpp");
    let mut cmd = Command::new("g++");
    cmd.args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src);
    build(cmd, "g++");
    let target = Target::run(&bin);
    let p = profile(&target, "2");
    let chain = [
        "main",
        "void run<std::function<void ()> >(std::function<void ()>&)",
        "std::_Function_handler<void (), main::{lambda()#1}>::_M_invoke(std::_Any_data const&)",
        "hot_loop()",
    ];
    assert_chain(&p, "lsw_uw_cpp", &describe(&chain), |u| {
        complete_chain(u, &chain)
    });
}

const RUST_SOURCE: &str = r#"
use std::hint::black_box;

#[inline(never)]
fn hot() -> u64 {
    let mut x = 0u64;
    loop {
        x = black_box(x.wrapping_add(1));
        if black_box(false) {
            return x;
        }
    }
}

#[inline(never)]
fn b() -> u64 {
    black_box(hot()) + 1
}

#[inline(never)]
fn a() -> u64 {
    black_box(b()) + 1
}

fn main() {
    println!("{}", a());
}
"#;

/// Build `RUST_SOURCE` as a release binary (opt-level 3, no frame
/// pointers, line tables only, the default linker: rust-lld, whose layout
/// maps text from a file offset inside the previous segment), run it and
/// profile it.
fn profile_rust_release() -> Profiled {
    let dir = tempdir();
    let src = dir.path().join("main.rs");
    fs::write(&src, RUST_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_rust");
    let mut cmd = Command::new("rustc");
    cmd.args([
        "--edition",
        "2021",
        "--crate-name",
        "unwind_test",
        "-C",
        "opt-level=3",
        "-C",
        "debuginfo=line-tables-only",
        "-o",
    ])
    .arg(&bin)
    .arg(&src);
    build(cmd, "rustc");
    let target = Target::run(&bin);
    profile(&target, "2")
}

/// Whether `user` is the Rust chain, complete: `_start`, libc start-up,
/// the C `main`, std's `lang_start` frames, then exactly `leaf` (frames
/// named by `name`; inlined `black_box` frames, which may follow any
/// frame, left out).
fn rust_chain(user: &[&str], leaf: &[&str], name: impl Fn(&str) -> String) -> bool {
    let u: Vec<String> = user
        .iter()
        .filter(|f| !f.contains("black_box"))
        .map(|f| name(f))
        .collect();
    let Some(main_at) = u.iter().position(|f| f == "main") else {
        return false;
    };
    u[0] == "_start"
        && u[..main_at]
            .iter()
            .all(|f| LIBC_START_FRAMES.contains(&f.as_str()))
        && u.len() >= main_at + 1 + leaf.len()
        && u[u.len() - leaf.len()..]
            .iter()
            .zip(leaf)
            .all(|(f, l)| *f == name(l))
}

/// The Rust chain, its functions' paths as the binary's symbol table has them.
const RUST_LEAF: &[&str] = &[
    "unwind_test::main",
    "unwind_test::a",
    "unwind_test::b",
    "unwind_test::hot",
];

/// A Rust release binary: `unwind_test::main -> a -> b -> hot`, complete
/// from `_start` through `std::rt::lang_start` and the C `main`. Names are
/// compared without their crate path (see `rust_release_names_qualified`).
#[test]
fn rust_release_chain() {
    let _serial = serial();
    let p = profile_rust_release();
    assert_chain(
        &p,
        "lsw_uw_rust",
        "_start;[libc start;]main;..(std::rt::lang_start)..;[unwind_test::]main;a;b;hot \
         (black_box inline frames aside)",
        |u| {
            rust_chain(u, RUST_LEAF, |f| {
                f.strip_prefix("unwind_test::").unwrap_or(f).to_string()
            })
        },
    );
}

/// The same Rust chain with full paths: `unwind_test::a`, not `a`.
#[test]
fn rust_release_names_qualified() {
    let _serial = serial();
    let p = profile_rust_release();
    assert_chain(
        &p,
        "lsw_uw_rust",
        "_start;[libc start;]main;..(std::rt::lang_start)..;unwind_test::main;unwind_test::a;\
         unwind_test::b;unwind_test::hot (black_box inline frames aside)",
        |u| rust_chain(u, RUST_LEAF, str::to_string),
    );
}

/// Profile `main -> a -> big_frame -> hot` where `big_frame` has a
/// `kib` KiB array on its stack, built with stack-clash protection as
/// hardened distributions do (its probe loop is an unsupported rule, the
/// call site is not). The table must hold the large CFA offset and the
/// chain must be complete.
fn stack_frame_chain(name: &str, kib: u64) {
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
__attribute__((noinline)) void hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void big_frame(void) {{
    volatile char buf[{kib} * 1024];
    buf[0] = 1;
    buf[sizeof buf - 1] = 2;
    hot();
    sink += buf[0] + buf[sizeof buf - 1];
}}
__attribute__((noinline)) void a(void) {{ big_frame(); sink++; }}
int main(void) {{ a(); sink++; return 0; }}
"
    );
    let mut flags = NO_FP.to_vec();
    flags.push("-fstack-clash-protection");
    let program = compile(name, &source, &flags);

    let shown = run(&["show-unwind", s(&program.path)], TIMEOUT);
    shown.assert_success();
    let largest = shown
        .stdout
        .lines()
        .filter(|l| l.starts_with("0x"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(1)?
                .strip_prefix("rsp+")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    assert!(
        largest >= kib * 1024,
        "no row with CFA = rsp + {kib} KiB or more in the table:\n{shown}"
    );

    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let chain = ["main", "a", "big_frame", "hot"];
    assert_chain(&p, &program.name, &describe(&chain), |u| {
        complete_chain(u, &chain)
    });
}

/// A 100 KiB frame (CFA = rsp + 102416, stored scaled) in the chain.
#[test]
fn big_stack_frame() {
    let _serial = serial();
    stack_frame_chain("lsw_uw_big", 100);
}

/// A 600 KiB frame: a scaled CFA offset above 16 bits (the high bits in
/// `cfa_type`), which the row format allows up to 8 MiB.
#[test]
fn huge_stack_frame_600k() {
    let _serial = serial();
    stack_frame_chain("lsw_uw_huge", 600);
}

/// A library `dlopen`ed 2 s after profiling started: its new mapping is
/// found while running and its table loaded, so the spin inside it gets
/// complete stacks from `_start` through `main`.
#[test]
fn dlopen_after_start() {
    let _serial = serial();
    let lib_source = format!(
        "{STOP_FLAG}
__attribute__((noinline)) void lib_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void lib_entry(void) {{ lib_hot(); sink++; }}
"
    );
    let mut lib_flags = vec!["-shared", "-fPIC"];
    lib_flags.extend_from_slice(NO_FP);
    let lib = compile("liblswuw.so", &lib_source, &lib_flags);
    let main_source = format!(
        r#"{DIE_WITH_PARENT}
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void spin(double seconds) {{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {{
        for (int i = 0; i < 100000; i++) sink++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    }} while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}}
int main(void) {{
    char go;
    if (read(0, &go, 1) != 1) return 1;
    spin(2.0);
    void *lib = dlopen("{}", RTLD_NOW);
    if (!lib) {{ fprintf(stderr, "%s\n", dlerror()); return 1; }}
    void (*entry)(void) = (void (*)(void))dlsym(lib, "lib_entry");
    if (!entry) return 1;
    entry();
    sink++;
    return 0;
}}
"#,
        lib.path.display()
    );
    let program = compile("lsw_uw_dlopen", &main_source, NO_FP);
    let mut target = Target::run(&program.path);

    let dir = tempdir();
    let mut profiler = Lightswitch::spawn(&profile_args(target.pid, "5", dir.path()));
    profiler.expect_sampling();
    // Sampling has started: the library is loaded 2 s from now.
    target.release();
    let p = finish(profiler.wait(TIMEOUT), dir.path());

    let in_lib = |u: &[&str]| u.last() == Some(&"lib_hot");
    let lib_samples = tally(&p.stacks, &program.name, in_lib);
    let chain = ["main", "lib_entry", "lib_hot"];
    let complete = tally(&p.stacks, &program.name, |u| complete_chain(u, &chain));
    let mine = of_process(&p.stacks, &program.name);
    assert!(
        lib_samples.matching >= MIN_SAMPLES,
        "only {} samples in lib_hot (the library was loaded 2 s into a 5 s run):\n{}\n{}",
        lib_samples.matching,
        show(&mine),
        p.out
    );
    assert!(
        complete.matching as f64 >= 0.9 * lib_samples.matching as f64,
        "only {} of {} samples in lib_hot are complete ({}):\n{}\n{}",
        complete.matching,
        lib_samples.matching,
        describe(&chain),
        show(&mine),
        p.out
    );
    // Before the dlopen the program spins in `spin` (and the vDSO's
    // clock_gettime, and ld.so while loading): those stacks are complete
    // from `_start` through `main` too.
    let t = tally(&p.stacks, &program.name, |u| {
        u.iter()
            .position(|&f| f == "main")
            .is_some_and(|m| m + 1 < u.len() && complete_chain(&u[..=m], &["main"]))
    });
    assert_share(
        &p,
        &program.name,
        "complete from _start through main",
        0.95,
        t,
    );
}

/// A SIGALRM handler that never returns: the walk goes through the
/// signal frame (`__restore_rt`) into the interrupted function and `main`.
#[test]
fn signal_handler_frame() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
#include <signal.h>
#include <unistd.h>
__attribute__((noinline)) void handler_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void handler(int sig) {{ handler_hot(); sink += sig; }}
__attribute__((noinline)) void interrupted(void) {{ while (!stop) sink++; }}
int main(void) {{
    signal(SIGALRM, handler);
    alarm(1);
    interrupted();
    sink++;
    return 0;
}}
"
    );
    let program = compile("lsw_uw_signal", &source, NO_FP);
    let target = Target::run(&program.path);
    // The alarm fires 1 s after start; from then on the handler spins.
    thread::sleep(Duration::from_millis(1300));
    let p = profile(&target, "2");
    assert_chain(
        &p,
        &program.name,
        "_start;[libc start;]main;interrupted;<signal trampoline>;handler;handler_hot",
        |u| {
            let n = u.len();
            n >= 6
                && complete_chain(&u[..n - 3], &["main", "interrupted"])
                && (u[n - 3] == "__restore_rt" || u[n - 3].starts_with("libc"))
                && u[n - 2..] == ["handler", "handler_hot"]
        },
    );
}

/// glibc's x86-64 `vfork` pops its return address into rdi around the
/// system call (CFI `DW_CFA_register 16, 5`): samples taken while the
/// parent is in that call (the kernel copying it into the child) walk
/// through rdi, as the interrupted registers hold it, on to `main`.
#[test]
fn vfork_return_address_in_a_register() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
#include <sys/wait.h>
#include <unistd.h>
__attribute__((noinline)) void spawn_one(void) {{
    pid_t child = vfork();
    if (child == 0)
        _exit(0);
    if (child > 0)
        waitpid(child, 0, 0);
    sink++;
}}
__attribute__((noinline)) void spawner(void) {{ while (!stop) spawn_one(); sink++; }}
int main(void) {{
    spawner();
    return 0;
}}
"
    );
    let program = compile("lsw_uw_vfork", &source, NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let in_vfork = |u: &[&str]| u.last().is_some_and(|leaf| leaf.contains("vfork"));
    let chain = ["main", "spawner", "spawn_one"];
    let samples = tally(&p.stacks, &program.name, in_vfork);
    let complete = tally(&p.stacks, &program.name, |u| {
        in_vfork(u) && complete_chain(&u[..u.len() - 1], &chain)
    });
    let mine = of_process(&p.stacks, &program.name);
    assert!(
        samples.matching >= 20,
        "only {} samples in vfork:\n{}\n{}",
        samples.matching,
        show(&mine),
        p.out
    );
    assert!(
        complete.matching * 100 >= samples.matching * 95,
        "only {} of {} samples in vfork are {}; vfork:\n{}\n{}",
        complete.matching,
        samples.matching,
        describe(&chain),
        show(&mine),
        p.out
    );
}

/// A binary deleted after it started: its table is built from the file
/// the process still maps, and its frames are symbolized.
#[test]
fn deleted_binary() {
    let _serial = serial();
    let program = compile("lsw_uw_chain", &c_chain_source(), NO_FP);
    let dir = tempdir();
    let copy = dir.path().join("lsw_uw_deleted");
    fs::copy(&program.path, &copy).unwrap();
    let target = Target::run(&copy);
    fs::remove_file(&copy).unwrap();
    let p = profile(&target, "2");
    assert_chain(&p, "lsw_uw_deleted", &describe(C_CHAIN), |u| {
        complete_chain(u, C_CHAIN)
    });
}

/// A process in its own pid namespace (and /proc), profiled by its host
/// pid: symbolized and complete.
#[test]
fn pid_namespace() {
    let _serial = serial();
    let program = compile("lsw_uw_pidns", &c_chain_source(), NO_FP);
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(&program.path);
    let target = Target::spawn(cmd, &program.name, true);
    assert_ne!(target.pid, target.child.id());
    let ns_pid = fs::read_to_string(format!("/proc/{}/status", target.pid))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:").map(str::to_string))
        .unwrap_or_default();
    assert!(
        ns_pid.split_whitespace().last() == Some("1"),
        "{} should be pid 1 in its namespace (NSpid: {ns_pid})",
        program.name
    );
    let p = profile(&target, "2");
    assert_chain(&p, &program.name, &describe(C_CHAIN), |u| {
        complete_chain(u, C_CHAIN)
    });
}

const GO_SOURCE: &str = r#"package main

var sink uint64
var stop bool

//go:noinline
func hot() {
	for !stop {
		sink++
	}
}

//go:noinline
func b() {
	hot()
	sink++
}

//go:noinline
func a() {
	b()
	sink++
}

func main() {
	a()
}
"#;

/// A Go program: `main.main -> main.a -> main.b -> main.hot`, rooted at
/// the goroutine's `runtime.goexit -> runtime.main`.
#[test]
fn go_frame_pointers() {
    let _serial = serial();
    if Command::new("go").arg("version").output().is_err() {
        eprintln!(
            "SKIPPED go_frame_pointers: `go` is not on PATH (the setup script installs golang-go)"
        );
        return;
    }
    let dir = tempdir();
    let module = dir.path().join("src");
    fs::create_dir(&module).unwrap();
    fs::write(module.join("go.mod"), "module t\n\ngo 1.19\n").unwrap();
    fs::write(module.join("main.go"), GO_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_go");
    let mut cmd = Command::new("go");
    cmd.current_dir(&module)
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .env("GOCACHE", dir.path().join("cache"))
        .env("GOPATH", dir.path().join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    build(cmd, "go build");
    let target = Target::run(&bin);
    let p = profile(&target, "2");
    let chain = [
        "runtime.goexit",
        "runtime.main",
        "main.main",
        "main.a",
        "main.b",
        "main.hot",
    ];
    assert_chain(&p, "lsw_uw_go", &chain.join(";"), |u| u == chain);
}

/// The path of the libc this test process runs with.
fn libc_path() -> PathBuf {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

/// `show-unwind` prints libc's table (sorted rows, then rows, pages and
/// bytes that agree with them) and rejects a file that is not ELF.
#[test]
fn show_unwind_subcommand() {
    let libc = libc_path();
    let out = run(&["show-unwind", s(&libc)], TIMEOUT);
    out.assert_success();
    let addresses: Vec<u64> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("0x"))
        .map(|l| {
            let hex = l.split_whitespace().next().unwrap();
            u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad row address in {l:?}"))
        })
        .collect();
    let field = |name: &str| -> u64 {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` line in the summary:\n{}", out.stdout))
    };
    let rows = field("rows: ");
    let pages = field("pages: ");
    let bytes = field("bytes: ");
    let head: String = out.stdout.lines().take(5).collect::<Vec<_>>().join("\n");
    assert!(
        rows > 1000,
        "libc has thousands of FDEs, got {rows} rows:\n{head}"
    );
    assert_eq!(
        addresses.len() as u64,
        rows,
        "one printed row per counted row:\n{head}"
    );
    assert!(
        addresses.windows(2).all(|w| w[0] < w[1]),
        "rows must be sorted by address:\n{head}"
    );
    assert!(pages >= 1 && pages <= rows, "{pages} pages for {rows} rows");
    assert!(
        bytes >= rows * 8,
        "{bytes} bytes cannot hold {rows} rows of 8 bytes"
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("unsupported rules:")),
        "no `unsupported rules:` line:\n{}",
        out.stdout
    );

    let bad = run(&["show-unwind", "/etc/hostname"], TIMEOUT);
    assert_eq!(bad.status.code(), Some(1), "{bad}");
    bad.assert_error(&["error:"]);
}

/// Recursion 2000 deep: the walk stops at 1024 user frames and the sample
/// is marked `[unwind: truncated]`, yet counted with the frames it has.
#[test]
fn truncated_beyond_limit() {
    let _serial = serial();
    let program = compile("lsw_uw_rec2000", &recursion_source(2000), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    const LIMIT: usize = 1024;
    let t = tally(&p.stacks, &program.name, |u| {
        u.len() == LIMIT + 1
            && u[0] == "[unwind: truncated]"
            && u[LIMIT] == "hot"
            && u[1..LIMIT].iter().all(|&f| f == "recurse")
    });
    assert_share(
        &p,
        &program.name,
        "[unwind: truncated] followed by the 1024 innermost frames (1023 recurse, hot)",
        0.95,
        t,
    );
    let truncated = p.unwind.get("truncated").copied().unwrap_or(0);
    assert!(
        truncated >= t.matching,
        "the summary counts {truncated} truncated walks, the profile has {}:\n{}",
        t.matching,
        p.out
    );
}
