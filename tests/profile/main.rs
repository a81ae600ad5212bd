//! End-to-end profiling tests: real C programs compiled here, profiled by the
//! `lightswitch` binary, with the exact call chains checked in its output.
//! Needs root (BPF), gcc and a kernel with BTF.

#[path = "../common/mod.rs"]
mod common;
mod output;

use std::fs;
use std::thread;
use std::time::Duration;

use common::*;

/// Longest any single profiler run may take before the test gives up.
const TIMEOUT: Duration = Duration::from_secs(60);

/// The profiler arguments `extra` plus folded output into `out_dir/name`.
fn folded_args(out_dir: &tempfile::TempDir, name: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
    args.extend(
        [
            "--profile-format",
            "folded",
            "--profile-path",
            s(out_dir.path()),
            "--profile-name",
            name,
        ]
        .map(String::from),
    );
    args
}

/// Samples whose user stack is exactly the chain (after libc start frames).
fn chain_samples(stacks: &[&Stack]) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| ends_with_chain(&user_frames(frames), CHAIN))
        .map(|(_, n)| n)
        .sum()
}

/// Profile the chain `main -> chain_a -> chain_b -> chain_c -> chain_hot`,
/// built with `flags` and named `name`, by pid for 2 s at 999 Hz: nearly
/// every sample has exactly that user stack, only that process appears, the
/// folded counts add up to the summary, and the sample count matches the
/// CPU time the program used.
fn assert_chain_profile(name: &str, flags: &[&str]) {
    let _serial = serial();
    let program = compile(name, &chain_forever_source(), flags);
    let workload = Workload::spawn(&program);
    let out_dir = tempdir();
    let args = folded_args(
        &out_dir,
        "f.txt",
        &[
            "--pids",
            &workload.pid_arg(),
            "--duration",
            "2",
            "--sample-freq",
            "999",
        ],
    );
    let run = profile_workload(&workload, &args, 2.0);
    let out = &run.out;
    out.assert_success();

    let summary = out.summary();
    let file = out_dir.path().join("f.txt");
    assert_eq!(summary.path, file, "{out}");
    assert_eq!(summary.processes, 1, "{out}");
    let stacks = read_folded(&file);
    let all: Vec<&Stack> = stacks.iter().collect();
    assert_eq!(
        total(&stacks),
        summary.samples,
        "folded counts must add up to the summary's sample count\n{}",
        show(&all)
    );
    assert!(
        stacks.iter().all(|(f, _)| comm(f) == program.name),
        "only the profiled pid may appear:\n{}",
        show(&all)
    );
    // About 2000 on an idle machine; fewer when the CPUs are shared.
    run.assert_plausible(summary.samples, 999.0);
    assert!(summary.samples >= 100, "too few samples:\n{out}");

    let chained = chain_samples(&all);
    assert!(
        chained as f64 >= 0.9 * summary.samples as f64,
        "only {chained} of {} samples have the user stack \
         [libc start or unwind marker;]main;chain_a;chain_b;chain_c;chain_hot:\n{}\n{out}",
        summary.samples,
        show(&all)
    );
}

/// The chain built with frame pointers.
#[test]
fn fp_chain() {
    assert_chain_profile("lsw_fpchain", FP_FLAGS);
}

/// The same chain built without frame pointers: user stacks must come from
/// the CFI (.eh_frame) unwinder, with the same exact chain.
#[test]
fn no_frame_pointer_chain() {
    assert_chain_profile(
        "lsw_nofp",
        &[
            "-O2",
            "-g",
            "-fomit-frame-pointer",
            "-fasynchronous-unwind-tables",
        ],
    );
}

const READER_SOURCE: &str = r#"
#include <fcntl.h>
#include <unistd.h>
static char buf[1 << 16];
volatile unsigned long sink;
__attribute__((noinline)) void zero_reader(int fd) {
    if (read(fd, buf, sizeof buf) != sizeof buf) _exit(1);
    sink++;
}
int main(void) {
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) return 1;
    for (;;) { zero_reader(fd); sink++; }
}
"#;

/// Profile a program that reads /dev/zero in a loop; its folded stacks.
fn profile_reader() -> Vec<Stack> {
    let program = compile(
        "lsw_reader",
        &format!("{DIE_WITH_PARENT}{READER_SOURCE}"),
        FP_FLAGS,
    );
    let workload = Workload::spawn(&program);
    let out_dir = tempdir();
    let args = folded_args(
        &out_dir,
        "r.txt",
        &[
            "--pids",
            &workload.pid_arg(),
            "--duration",
            "2",
            "--sample-freq",
            "999",
        ],
    );
    let out = run(&args, TIMEOUT);
    out.assert_success();
    let stacks = read_folded(&out_dir.path().join("r.txt"));
    assert_eq!(total(&stacks), out.summary().samples, "{out}");
    assert!(total(&stacks) >= 50, "too few samples:\n{out}");
    stacks
}

fn is_syscall_entry(frame: &str) -> bool {
    frame.starts_with("entry_SYSCALL_64") || frame == "do_syscall_64"
}

fn is_read_path(frame: &str) -> bool {
    matches!(
        frame,
        "ksys_read" | "vfs_read" | "read_iter_zero" | "__do_sys_read"
    ) || frame.starts_with("read_zero")
        || frame.ends_with("_sys_read")
}

/// A program in `read(2)` most of the time: its samples carry kernel frames
/// from the syscall entry down the read path, on top of its user frames.
#[test]
fn syscall_kernel_frames() {
    let _serial = serial();
    let stacks = profile_reader();
    let all: Vec<&Stack> = stacks.iter().collect();
    let samples = total(&stacks);

    // Kernel frames always come after (on top of) the user frames.
    for (frames, _) in &stacks {
        if let Some(first_kernel) = frames.iter().position(|f| is_kernel(f)) {
            assert!(
                frames[first_kernel..].iter().all(|f| is_kernel(f)),
                "user frame above a kernel frame: {}",
                frames.join(";")
            );
        }
    }

    let with_kernel: u64 = stacks
        .iter()
        .filter(|(f, _)| !kernel_frames(f).is_empty())
        .map(|(_, n)| n)
        .sum();
    assert!(
        with_kernel * 2 >= samples,
        "only {with_kernel} of {samples} samples have kernel frames:\n{}",
        show(&all)
    );

    // user: ...main...read wrapper, then kernel: syscall entry ... read path.
    let syscall_stacks: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            let user = user_frames(frames);
            let kernel = kernel_frames(frames);
            let entry = kernel.iter().position(|f| is_syscall_entry(f));
            let read = kernel.iter().rposition(|f| is_read_path(f));
            user.contains(&"main")
                && user.last().is_some_and(|leaf| leaf.contains("read"))
                && matches!((entry, read), (Some(e), Some(r)) if e < r)
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        syscall_stacks * 2 >= samples,
        "only {syscall_stacks} of {samples} samples show main .. read() followed by the kernel's \
         syscall entry and read path:\n{}",
        show(&all)
    );
}

/// Same program: the caller of libc's `read` wrapper must be in the stack.
/// The wrapper sets up no frame of its own, so a frame-pointer walk that
/// starts in it returns straight to `main` and loses `zero_reader`; the
/// CFI (.eh_frame) unwinder gets it right.
#[test]
fn syscall_keeps_caller_of_libc_wrapper() {
    let _serial = serial();
    let stacks = profile_reader();
    let all: Vec<&Stack> = stacks.iter().collect();
    let samples = total(&stacks);
    let exact: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            let user = user_frames(frames);
            let Some(main) = user.iter().position(|f| *f == "main") else {
                return false;
            };
            user.get(main + 1) == Some(&"zero_reader")
                && user.len() > main + 2
                && user[main + 2..].iter().all(|f| f.contains("read"))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        exact as f64 >= 0.8 * samples as f64,
        "only {exact} of {samples} samples have main;zero_reader;<read wrapper>:\n{}",
        show(&all)
    );
}

/// Profile the whole machine for 2 s at 199 Hz while a program called
/// `name` runs the chain; the run and its folded text.
fn profile_whole_machine(name: &str) -> (Profiled, String) {
    let program = compile(name, &chain_forever_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    let out_dir = tempdir();
    let args = folded_args(
        &out_dir,
        "w.txt",
        &["--duration", "2", "--sample-freq", "199"],
    );
    let run = profile_workload(&workload, &args, 2.0);
    run.out.assert_success();
    let text = fs::read_to_string(out_dir.path().join("w.txt")).unwrap();
    assert_eq!(
        total(&parse_folded(&text)),
        run.out.summary().samples,
        "{}",
        run.out
    );
    (run, text)
}

/// Without --pids the whole machine is sampled: a busy program shows up
/// under its own name, with its hot function, as often as it ran.
#[test]
fn whole_machine() {
    let _serial = serial();
    let name = unique_name("lsw_wm");
    let (run, text) = profile_whole_machine(&name);
    let stacks = parse_folded(&text);
    let all: Vec<&Stack> = stacks.iter().collect();
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{name};")) && l.contains(";chain_hot")),
        "no {name};...;chain_hot line:\n{}",
        show(&all)
    );
    let mine = of_process(&stacks, &name);
    let mine_total: u64 = mine.iter().map(|(_, n)| n).sum();
    // One busy thread is sampled once per tick of the CPU it runs on, never
    // once per CPU.
    run.assert_plausible(mine_total, 199.0);
}

/// Whole-machine mode: a process the profiler discovers while running
/// (built with frame pointers) gets complete stacks, also before its unwind
/// tables are loaded (frame pointers are the fallback).
#[test]
fn whole_machine_full_stacks() {
    let _serial = serial();
    let name = unique_name("lsw_wf");
    let (run, text) = profile_whole_machine(&name);
    let stacks = parse_folded(&text);
    let mine = of_process(&stacks, &name);
    let mine_total: u64 = mine.iter().map(|(_, n)| n).sum();
    let chained = chain_samples(&mine);
    assert!(
        chained as f64 >= 0.8 * mine_total as f64,
        "only {chained} of {mine_total} {name} samples have the full chain:\n{}\n{}",
        show(&mine),
        run.out
    );
}

const EXITING_SOURCE: &str = r#"
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(void) {
    char go;
    if (read(0, &go, 1) != 1) return 2;
    double wall = seconds(CLOCK_MONOTONIC), cpu = seconds(CLOCK_PROCESS_CPUTIME_ID);
    while (seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu < 0.8 && seconds(CLOCK_MONOTONIC) - wall < 1.5) {
        chain_a();
        sink++;
    }
    printf("%f\n", seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu);
    return 0;
}
"#;

/// A profiled process that exits (and is reaped) in the middle of the run
/// keeps its samples, symbolized, and the profiler finishes normally.
#[test]
fn exiting_pid_keeps_samples() {
    let _serial = serial();
    let source = format!("{DIE_WITH_PARENT}{CHAIN_FUNCTIONS}{EXITING_SOURCE}");
    let program = compile("lsw_exiting", &source, FP_FLAGS);
    let mut workload = Workload::spawn(&program);
    let out_dir = tempdir();
    let args = folded_args(
        &out_dir,
        "e.txt",
        &[
            "--pids",
            &workload.pid_arg(),
            "--duration",
            "3",
            "--sample-freq",
            "999",
        ],
    );
    let mut profiler = Lightswitch::spawn(&args);
    profiler.expect_sampling();
    thread::sleep(Duration::from_millis(200));
    // Spin for 0.8 s of CPU (at most 1.5 s), then exit; reap it right away
    // so that /proc/PID is gone while the profiler still runs.
    workload.release();
    let status = workload.wait_exit(Duration::from_secs(20));
    let still_running = profiler.is_running();
    let out = profiler.wait(TIMEOUT);
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "workload did not exit normally: {status:?}"
    );
    let cpu: f64 = workload
        .stdout_text()
        .trim()
        .parse()
        .expect("workload CPU time");
    assert!(
        still_running,
        "the profiler (3 s) ended before the workload (1.5 s at most) exited; the test proves nothing:\n{out}"
    );
    out.assert_success();

    let stacks = read_folded(&out_dir.path().join("e.txt"));
    let all: Vec<&Stack> = stacks.iter().collect();
    assert_eq!(total(&stacks), out.summary().samples, "{out}");
    let mine = of_process(&stacks, "lsw_exiting");
    let mine_total: u64 = mine.iter().map(|(_, n)| n).sum();
    // 800 on an idle machine.
    let expected = cpu * 999.0;
    assert!(
        mine_total as f64 >= 0.25 * expected
            && mine_total as f64 <= 1.5 * expected + 20.0
            && mine_total >= 50,
        "{mine_total} samples of a process that spun for {cpu:.3} s of CPU at 999 Hz:\n{}",
        show(&all)
    );
    let chained = chain_samples(&mine);
    assert!(
        chained as f64 >= 0.8 * mine_total as f64,
        "only {chained} of {mine_total} samples of the exited process are symbolized as the chain:\n{}",
        show(&mine)
    );
}

/// A program whose executable was deleted after it started is still
/// symbolized (objects are opened through /proc/PID/map_files).
#[test]
fn deleted_binary_is_symbolized() {
    let _serial = serial();
    let program = compile("lsw_deleted", &chain_forever_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    fs::remove_file(&program.path).unwrap();
    let out_dir = tempdir();
    let args = folded_args(
        &out_dir,
        "d.txt",
        &[
            "--pids",
            &workload.pid_arg(),
            "--duration",
            "1",
            "--sample-freq",
            "199",
        ],
    );
    let run = profile_workload(&workload, &args, 1.0);
    let out = &run.out;
    out.assert_success();
    let stacks = read_folded(&out_dir.path().join("d.txt"));
    let all: Vec<&Stack> = stacks.iter().collect();
    let samples = total(&stacks);
    assert_eq!(samples, out.summary().samples, "{out}");
    run.assert_plausible(samples, 199.0);
    let chained = chain_samples(&all);
    assert!(
        chained as f64 >= 0.9 * samples as f64,
        "only {chained} of {samples} samples of the deleted binary are symbolized as the chain:\n{}",
        show(&all)
    );
}

/// --exclude-self keeps the profiler's own process out of a whole-machine
/// profile (while other processes are still sampled). The profiler runs
/// from a copy with its own name, so that other `lightswitch` processes on
/// the machine cannot be mistaken for it.
#[test]
fn exclude_self() {
    let _serial = serial();
    let workload_name = unique_name("lsw_xw");
    let program = compile(&workload_name, &chain_forever_source(), FP_FLAGS);
    let _workload = Workload::spawn(&program);
    let self_name = unique_name("lsw_xs");
    let (_bin_dir, bin) = copy_binary(&self_name);
    let out_dir = tempdir();
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(folded_args(
        &out_dir,
        "x.txt",
        &["--exclude-self", "--duration", "1", "--sample-freq", "999"],
    ));
    let out = run_command(cmd, TIMEOUT);
    out.assert_success();
    let text = fs::read_to_string(out_dir.path().join("x.txt")).unwrap();
    let stacks = parse_folded(&text);
    assert_eq!(total(&stacks), out.summary().samples, "{out}");
    assert!(
        !of_process(&stacks, &workload_name).is_empty(),
        "the busy workload is missing from a whole-machine profile:\n{text}"
    );
    let own: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{self_name};")))
        .collect();
    assert!(
        own.is_empty(),
        "the profiler sampled itself:\n{}",
        own.join("\n")
    );
}
