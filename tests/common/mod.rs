//! Shared helpers for the integration tests: compile small C programs, run
//! them as workloads (killed on drop), run the `lightswitch` binary with a
//! timeout, and parse its summary line and folded-stack output.
//!
//! The tests need root (BPF, perf events), `gcc` and util-linux (`setpriv`,
//! `unshare`).

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

pub mod bystander;
mod decoder;
#[allow(unused_imports)] // not every test crate decodes a format
pub use decoder::*;
mod run;
#[allow(unused_imports)] // not every test crate runs the binary
pub use run::*;
mod waiter;
#[allow(unused_imports)] // not every test crate waits
pub use waiter::*;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The profiler binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_lightswitch");

/// Compiler flags for programs that keep frame pointers.
pub const FP_FLAGS: &[&str] = &["-O2", "-g", "-fno-omit-frame-pointer"];

/// Compiler flags for programs without frame pointers (optimized, no tail
/// calls, so that callers stay on the stack): only CFI unwinds them.
pub const NO_FP_FLAGS: &[&str] = &[
    "-O2",
    "-g",
    "-fomit-frame-pointer",
    "-fno-optimize-sibling-calls",
];

/// Kernel frames in folded output carry this suffix.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Frames libc puts below `main`.
pub const LIBC_START_FRAMES: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_main_alias_2",
    "__libc_start_call_main",
];

/// Makes a workload die with the test that spawned it, even if the test
/// process is killed before the guard's `Drop` runs.
pub const DIE_WITH_PARENT: &str = r#"
#include <signal.h>
#include <sys/prctl.h>
__attribute__((constructor)) static void die_with_parent(void) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}
"#;

/// The call chain `main -> chain_a -> chain_b -> chain_c -> chain_hot`, no
/// inlining, no tail calls (each caller does work after the call), and a
/// leaf that keeps its counter on the stack so GCC gives it a frame.
/// `main` is left to the including program.
pub const CHAIN_FUNCTIONS: &str = r#"
volatile unsigned long sink;
__attribute__((noinline)) void chain_hot(void) {
    for (volatile int i = 0; i < 1000000; i++) sink += i;
}
__attribute__((noinline)) void chain_c(void) { chain_hot(); sink++; }
__attribute__((noinline)) void chain_b(void) { chain_c(); sink++; }
__attribute__((noinline)) void chain_a(void) { chain_b(); sink++; }
"#;

/// The chain, root to leaf, as it must appear in folded user frames.
pub const CHAIN: &[&str] = &["main", "chain_a", "chain_b", "chain_c", "chain_hot"];

/// A program that runs the chain forever.
pub fn chain_forever_source() -> String {
    format!("{DIE_WITH_PARENT}{CHAIN_FUNCTIONS}\nint main(void) {{ for (;;) {{ chain_a(); sink++; }} }}\n")
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Tests that sample the machine hold this so that, even when the harness
/// runs tests in parallel, two profiling runs never compete for the CPUs.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A C program compiled into its own temporary directory.
pub struct Program {
    dir: tempfile::TempDir,
    /// The executable.
    pub path: PathBuf,
    /// Its file name, which is also its `comm` (if at most 15 bytes).
    pub name: String,
}

/// Compile `source` with `gcc flags` into an executable called `name`.
pub fn compile(name: &str, source: &str, flags: &[&str]) -> Program {
    assert!(name.len() <= 15, "{name} would be truncated in comm");
    let dir = tempfile::Builder::new()
        .prefix("lsw-test-")
        .tempdir()
        .expect("tempdir");
    let src = dir.path().join(format!("{name}.c"));
    fs::write(&src, source).expect("writing C source");
    let path = dir.path().join(name);
    let out = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&path)
        .arg(&src)
        .output()
        .expect("running gcc (is it installed?)");
    assert!(
        out.status.success(),
        "gcc failed for {name}:\n{}\nsource:\n{source}",
        String::from_utf8_lossy(&out.stderr)
    );
    Program {
        dir,
        path,
        name: name.to_string(),
    }
}

impl Program {
    /// The directory holding the program (removed when `self` drops).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A running workload; killed and reaped on drop.
pub struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<ChildStdout>,
    name: String,
    exited: Option<ExitStatus>,
}

impl Workload {
    /// Start `program` with pipes on stdin and stdout, and wait until it
    /// has exec'd.
    pub fn spawn(program: &Program) -> Self {
        Self::spawn_with_args::<&str>(program, &[])
    }

    /// [`Workload::spawn`] with command-line arguments.
    pub fn spawn_with_args<S: AsRef<std::ffi::OsStr>>(program: &Program, args: &[S]) -> Self {
        let mut child = Command::new(&program.path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", program.path.display()));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let workload = Workload {
            child,
            stdin,
            stdout,
            name: program.name.clone(),
            exited: None,
        };
        workload.wait_for_exec();
        workload
    }

    /// The workload's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The pid as a command-line argument.
    pub fn pid_arg(&self) -> String {
        self.pid().to_string()
    }

    /// Wait until `/proc/PID/comm` shows the program's name, so that no
    /// sample is taken between fork and exec (with the test's own comm).
    fn wait_for_exec(&self) {
        let path = format!("/proc/{}/comm", self.pid());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if fs::read_to_string(&path).is_ok_and(|c| c.trim_end() == self.name) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exec within 10 s",
                self.name
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Write one byte to the workload's stdin (programs that wait for a
    /// start signal read it).
    pub fn release(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        stdin
            .write_all(b"g")
            .expect("writing to the workload's stdin");
        stdin.flush().expect("flushing the workload's stdin");
    }

    /// User plus system CPU time the workload has used so far.
    pub fn cpu_time(&self) -> Duration {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .expect("reading /proc/PID/stat");
        // Fields after "(comm) ": state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').expect("comm in stat") + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_secs_f64(ticks as f64 / hz as f64)
    }

    /// Everything the workload wrote to stdout (blocks until it closes it:
    /// call after the workload exited).
    pub fn stdout_text(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut stdout) = self.stdout.take() {
            stdout
                .read_to_string(&mut text)
                .expect("reading the workload's stdout");
        }
        text
    }

    /// Wait (reaping it) until the workload exits, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the workload") {
                self.exited = Some(status);
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What a finished `lightswitch` run printed.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// Panic unless the run exited 0.
    pub fn assert_success(&self) -> &Self {
        assert_eq!(self.status.code(), Some(0), "lightswitch failed:\n{self}");
        self
    }

    /// Panic unless the run exited with a non-zero code (not by a signal)
    /// and its stderr contains every one of `needles`.
    pub fn assert_error(&self, needles: &[&str]) -> &Self {
        let code = self.status.code();
        assert!(
            code.is_some_and(|c| c != 0),
            "expected lightswitch to fail with an error, got {:?}:\n{self}",
            self.status
        );
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "stderr does not mention {needle:?}:\n{self}"
            );
        }
        self
    }

    /// The parsed summary line (panics if missing).
    pub fn summary(&self) -> Summary {
        Summary::parse(&self.stdout).unwrap_or_else(|| panic!("no summary line in stdout:\n{self}"))
    }
}

impl std::fmt::Display for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// The line `profile written to PATH: N samples, P processes, L samples lost`
/// (each noun singular for 1: `1 sample, 1 process, 1 sample lost`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub path: PathBuf,
    pub samples: u64,
    pub processes: u64,
    pub lost: u64,
}

impl Summary {
    /// Find and parse the summary line in `stdout`: a one-shot run's
    /// `profile written to PATH: ...`, or a continuous run's `N windows
    /// written to DIR: ...`.
    pub fn parse(stdout: &str) -> Option<Summary> {
        let line = stdout.lines().find_map(|l| {
            l.strip_prefix("profile written to ").or_else(|| {
                let (windows, rest) = l.split_once(" written to ")?;
                let (n, noun) = windows.split_once(' ')?;
                (n.parse::<u64>().is_ok() && noun.starts_with("window")).then_some(rest)
            })
        })?;
        let (path, counts) = line.rsplit_once(": ")?;
        // A continuous run may add `(N more windows had no samples, ...)`.
        let counts = counts.split(" (").next()?;
        let mut numbers = counts.split(", ").map(|part| {
            let (n, what) = part.split_once(' ')?;
            Some((n.parse::<u64>().ok()?, what))
        });
        let (samples, w1) = numbers.next()??;
        let (processes, w2) = numbers.next()??;
        let (lost, w3) = numbers.next()??;
        let nouns_fit = |count: u64, word: &str, one: &str, many: &str| {
            word == if count == 1 { one } else { many }
        };
        if !(nouns_fit(samples, w1, "sample", "samples")
            && nouns_fit(processes, w2, "process", "processes")
            && nouns_fit(lost, w3, "sample lost", "samples lost"))
        {
            return None;
        }
        Some(Summary {
            path: PathBuf::from(path),
            samples,
            processes,
            lost,
        })
    }
}

/// One folded line: frames (the first is the process name) and its count.
pub type Stack = (Vec<String>, u64);

/// Parse folded-stack text; panics on a malformed line.
pub fn parse_folded(text: &str) -> Vec<Stack> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (stack, count) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("folded line without a count: {line:?}"));
            let count = count
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("bad count in folded line: {line:?}"));
            let frames: Vec<String> = stack.split(';').map(str::to_string).collect();
            assert!(
                frames.iter().all(|f| !f.is_empty()),
                "empty frame in folded line: {line:?}"
            );
            (frames, count)
        })
        .collect()
}

/// Read and parse a folded profile.
pub fn read_folded(path: &Path) -> Vec<Stack> {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    parse_folded(&text)
}

/// Whether a folded frame is a kernel frame.
pub fn is_kernel(frame: &str) -> bool {
    frame.ends_with(KERNEL_SUFFIX)
}

/// The process name (first frame) of a folded stack.
pub fn comm(frames: &[String]) -> &str {
    &frames[0]
}

/// The user frames of a folded stack, root to leaf: the process name and
/// kernel frames removed.
pub fn user_frames(frames: &[String]) -> Vec<&str> {
    frames[1..]
        .iter()
        .map(String::as_str)
        .filter(|f| !is_kernel(f))
        .collect()
}

/// The kernel frames of a folded stack, root to leaf, suffix removed.
pub fn kernel_frames(frames: &[String]) -> Vec<&str> {
    frames[1..]
        .iter()
        .filter_map(|f| f.strip_suffix(KERNEL_SUFFIX))
        .collect()
}

/// Sum of the counts.
pub fn total(stacks: &[Stack]) -> u64 {
    stacks.iter().map(|(_, n)| n).sum()
}

/// The stacks whose process name is `name`.
pub fn of_process<'a>(stacks: &'a [Stack], name: &str) -> Vec<&'a Stack> {
    stacks.iter().filter(|(f, _)| comm(f) == name).collect()
}

/// Whether `user` (root to leaf) ends with `chain` and has nothing before
/// it but libc start-up frames or an unwind marker (`[unwind: no_table]`
/// when a frame-pointer walk, which cannot see below `main`, stood in for a
/// table that was not loaded yet).
pub fn ends_with_chain(user: &[&str], chain: &[&str]) -> bool {
    user.len() >= chain.len()
        && user[user.len() - chain.len()..] == *chain
        && user[..user.len() - chain.len()]
            .iter()
            .all(|f| LIBC_START_FRAMES.contains(f) || f.starts_with("[unwind: "))
}

/// The stacks as text, most frequent first, for assertion messages.
pub fn show(stacks: &[&Stack]) -> String {
    let mut sorted: Vec<&&Stack> = stacks.iter().collect();
    sorted.sort_by_key(|stack| std::cmp::Reverse(stack.1));
    let mut text = String::new();
    for (frames, count) in sorted.iter().take(25) {
        let mut line = frames.join(";");
        if line.len() > 400 {
            let cut = (0..=200)
                .rev()
                .find(|&i| line.is_char_boundary(i))
                .unwrap_or(0);
            let tail = (line.len() - 200..line.len())
                .find(|&i| line.is_char_boundary(i))
                .unwrap();
            line = format!("{} ... {}", &line[..cut], &line[tail..]);
        }
        text.push_str(&format!("{line} {count}\n"));
    }
    if sorted.len() > 25 {
        text.push_str(&format!("... and {} more lines\n", sorted.len() - 25));
    }
    text
}

/// Make `path` accessible to everyone (`mode` e.g. 0o755 or 0o777).
pub fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

/// A copy of the profiler binary called `name` (so its processes have
/// their own `comm`), readable and executable by every user; the directory
/// is removed when the returned guard drops.
pub fn copy_binary(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempdir();
    chmod(dir.path(), 0o755);
    let bin = dir.path().join(name);
    fs::copy(BIN, &bin).unwrap_or_else(|e| panic!("copying {BIN}: {e}"));
    chmod(&bin, 0o755);
    (dir, bin)
}

/// `prefix` plus this test process's pid: a process name (at most 15
/// bytes) that no concurrent run of the same tests on the machine uses, for
/// tests that pick processes out of a whole-machine profile by name.
pub fn unique_name(prefix: &str) -> String {
    let name = format!("{prefix}{}", std::process::id());
    assert!(name.len() <= 15, "{name} is longer than a comm");
    name
}

/// A fresh temporary directory.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("lsw-test-")
        .tempdir()
        .expect("tempdir")
}

/// `path` as a `&str` (test paths are UTF-8).
pub fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// The per-result counts of the summary line
/// `user stacks: complete=N no_table=M ...`; `None` if it is missing or malformed.
pub fn unwind_counts(stdout: &str) -> Option<BTreeMap<String, u64>> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("user stacks:"))?;
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Run `go tool pprof ARGS` offline (its own HOME and caches; no proxy
/// for the local agent's URLs) and return its stdout; panics if it fails.
pub fn go_pprof(args: &[&str]) -> String {
    let home = tempdir();
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("HOME", home.path())
        .env("GOCACHE", home.path().join("cache"))
        .env("GOPATH", home.path().join("gopath"))
        .env("PPROF_TMPDIR", home.path())
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("NO_PROXY", "127.0.0.1")
        .env("no_proxy", "127.0.0.1")
        .output()
        .unwrap_or_else(|e| {
            panic!("running `go tool pprof` (scripts/setup.sh installs golang-go): {e}")
        });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `main -> alpha -> beta -> burn`, and `mix` inlined into `burn`.
pub fn chain_source() -> String {
    format!(
        "{DIE_WITH_PARENT}
volatile unsigned long sink;
static inline __attribute__((always_inline)) void mix(unsigned long n) {{
    for (unsigned long i = 0; i < n; i++) sink += i * 2654435761u;
}}
__attribute__((noinline)) void burn(unsigned long n) {{ mix(n); sink++; }}
__attribute__((noinline)) void beta(unsigned long n) {{ burn(n); sink++; }}
__attribute__((noinline)) void alpha(unsigned long n) {{ beta(n); sink++; }}
int main(void) {{ for (;;) {{ alpha(200000); sink++; }} }}
"
    )
}

/// Run `program` with `args`, panicking with its output if it fails.
pub fn tool(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program} (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The GNU build ID of the ELF file at `path`, in hex (`readelf -n`).
pub fn build_id(path: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("running readelf");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap_or_else(|| panic!("{} has no build ID", path.display()))
}
