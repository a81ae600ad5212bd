//! `--off-cpu`: where threads wait. Real programs compiled here, run under
//! `lightswitch record --off-cpu`: a sleeper, a contended pthread mutex, a
//! pipe ping-pong; their off-CPU time is under the functions that waited,
//! in the kernel's waiting functions, with the length they waited; on-CPU
//! plus off-CPU time adds up to the program's wall time.
//! Needs root and gcc (`go tool pprof` for the pprof check).

#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Two threads: `holder` takes a mutex 10 times and keeps it for 50 ms
/// each (sleeping), releasing it for 1 ms between; `contended`, in a thread
/// of its own, wants it 10 times and blocks in the kernel's futex wait.
fn mutex_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <pthread.h>
#include <time.h>
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int holding;
static void sleep_ms(long ms) {{
    struct timespec t = {{0, ms * 1000 * 1000}};
    nanosleep(&t, 0);
}}
__attribute__((noinline)) void holder(void) {{
    for (int i = 0; i < 10; i++) {{
        pthread_mutex_lock(&lock);
        holding = 1;
        sleep_ms(50);
        pthread_mutex_unlock(&lock);
        sleep_ms(1);
    }}
    holding = 2;
}}
__attribute__((noinline)) void contended(void) {{
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
}}
static void *wanting(void *arg) {{
    while (holding == 0) ;
    while (holding != 2) {{
        contended();
        sleep_ms(1);
    }}
    return arg;
}}
int main(void) {{
    pthread_t t;
    pthread_create(&t, 0, wanting, 0);
    holder();
    pthread_join(t, 0);
    return 0;
}}
"#
    )
}

/// A parent and its child pass a byte back and forth through two pipes
/// 100 times; each side computes for 2 ms before it answers, so the other
/// waits about that long in `read`, in `ping` (parent) or `pong` (child).
fn ping_pong_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <time.h>
#include <unistd.h>
static double now_ms(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}}
volatile unsigned long spin;
static void work(void) {{ double until = now_ms() + 2; while (now_ms() < until) spin++; }}
__attribute__((noinline)) void ping(int in, int out) {{
    char c = 0;
    for (int i = 0; i < 100; i++) {{ work(); write(out, &c, 1); read(in, &c, 1); }}
}}
__attribute__((noinline)) void pong(int in, int out) {{
    char c;
    for (int i = 0; i < 100; i++) {{ read(in, &c, 1); work(); write(out, &c, 1); }}
}}
int main(void) {{
    int there[2], back[2];
    pipe(there);
    pipe(back);
    if (fork() == 0) {{ pong(there[0], back[1]); return 0; }}
    ping(back[0], there[1]);
    return 0;
}}
"#
    )
}

/// `lightswitch record --off-cpu` at `freq` Hz with `formats` into `dir`,
/// and `options` besides.
fn record_off_cpu(
    dir: &Path,
    freq: &str,
    formats: &str,
    options: &[&str],
    command: &[&str],
) -> Output {
    let mut args: Vec<String> = [
        "record",
        "--off-cpu",
        "--sample-freq",
        freq,
        "--profile-format",
        formats,
        "--profile-path",
        s(dir),
    ]
    .map(String::from)
    .to_vec();
    args.extend(options.iter().map(|a| a.to_string()));
    args.push("--".to_string());
    args.extend(command.iter().map(|a| a.to_string()));
    let out = run(&args, TIMEOUT);
    out.assert_success();
    out
}

/// The counts (samples, or ns off-CPU) of the stacks of process `name`
/// whose frames contain all of `frames` (by substring).
fn ns_with(stacks: &[Stack], name: &str, frames: &[&str]) -> u64 {
    of_process(stacks, name)
        .into_iter()
        .filter(|(f, _)| frames.iter().all(|want| f.iter().any(|g| g.contains(want))))
        .map(|(_, n)| n)
        .sum()
}

/// The sleeper's 10 × 100 ms are 1.0 s (±10%) off-CPU under `waiter` in
/// `clock_nanosleep`, in folded stacks and in pprof's off_cpu sample type;
/// its computing is on-CPU under `burner`; and its on-CPU samples times
/// the period plus its off-CPU time are its wall time within 5%.
#[test]
fn a_sleeper_waits_a_second_under_waiter_and_burns_under_burner() {
    let _serial = serial();
    let program = compile("offcpu_sleeper", &waiter_burner_source(), FP_FLAGS);
    let dir = tempdir();
    let wall_file = dir.path().join("wall_ms");
    let freq = 999;
    let out = record_off_cpu(
        dir.path(),
        &freq.to_string(),
        "folded,pprof",
        &[],
        &[s(&program.path), s(&wall_file)],
    );
    assert!(out.stderr.contains("off-CPU: "), "{out}");
    let off = read_folded(&dir.path().join("folded-off-cpu.txt"));
    let on = read_folded(&dir.path().join("folded.txt"));
    let slept = ns_with(&off, &program.name, &["waiter", "clock_nanosleep"]);
    assert!(
        (0.9e9..=1.1e9).contains(&(slept as f64)),
        "{slept} ns off-CPU under waiter in clock_nanosleep, not 1.0 s ±10%:\n{}",
        show(&of_process(&off, &program.name))
    );
    let burned = ns_with(&on, &program.name, &["burner"]);
    assert!(
        burned > 0,
        "no on-CPU sample under burner:\n{}",
        show(&of_process(&on, &program.name))
    );

    // Wall clock: everything the one thread did, on and off its CPU.
    let wall_ns = std::fs::read_to_string(&wall_file)
        .unwrap()
        .trim()
        .parse::<f64>()
        .unwrap()
        * 1e6;
    let on_ns = ns_with(&on, &program.name, &[]) as f64 * 1e9 / freq as f64;
    let off_ns = ns_with(&off, &program.name, &[]) as f64;
    let sum = on_ns + off_ns;
    assert!(
        (sum - wall_ns).abs() <= 0.05 * wall_ns,
        "on-CPU {:.1} ms + off-CPU {:.1} ms = {:.1} ms, wall time {:.1} ms: not within 5%",
        on_ns / 1e6,
        off_ns / 1e6,
        sum / 1e6,
        wall_ns / 1e6
    );

    let top = go_pprof(&[
        "-top",
        "-sample_index=off_cpu",
        "-unit=ms",
        s(&dir.path().join("profile.pb")),
    ]);
    let waiter_line = top
        .lines()
        .find(|l| l.trim_end().ends_with(" waiter"))
        .unwrap_or_else(|| panic!("no waiter in pprof's off_cpu top:\n{top}"));
    let cum_ms: f64 = waiter_line
        .split_whitespace()
        .nth(3)
        .and_then(|c| c.trim_end_matches("ms").parse().ok())
        .unwrap_or_else(|| panic!("no cumulative ms in {waiter_line:?}:\n{top}"));
    assert!(
        (900.0..=1100.0).contains(&cum_ms),
        "pprof off_cpu: {cum_ms} ms under waiter:\n{top}"
    );
}

/// The thread that wants a mutex held 50 ms at a time waits under
/// `contended`, in the kernel's futex wait.
#[test]
fn a_contended_mutex_is_waited_for_under_contended_in_futex() {
    let _serial = serial();
    let program = compile("offcpu_mutex", &mutex_source(), &["-O2", "-g", "-pthread"]);
    let dir = tempdir();
    record_off_cpu(dir.path(), "99", "folded", &[], &[s(&program.path)]);
    let off = read_folded(&dir.path().join("folded-off-cpu.txt"));
    let waited = ns_with(&off, &program.name, &["contended", "futex"]);
    // 10 holds of 50 ms; the wanting thread waits most of each.
    assert!(
        waited as f64 >= 0.25e9,
        "{waited} ns under contended in futex:\n{}",
        show(&of_process(&off, &program.name))
    );
}

/// Each side of a pipe ping-pong waits in `read`, under its own function.
#[test]
fn each_side_of_a_pipe_ping_pong_waits_in_read() {
    let _serial = serial();
    let program = compile("offcpu_pingpong", &ping_pong_source(), FP_FLAGS);
    let dir = tempdir();
    record_off_cpu(dir.path(), "99", "folded", &[], &[s(&program.path)]);
    let off = read_folded(&dir.path().join("folded-off-cpu.txt"));
    for side in ["ping", "pong"] {
        let waited = ns_with(&off, &program.name, &[side, "ksys_read"]);
        // 100 answers, each about 2 ms of the other side's work.
        assert!(
            waited as f64 >= 0.1e9,
            "{side}: {waited} ns in read:\n{}",
            show(&of_process(&off, &program.name))
        );
    }
}

/// A continuous run's summary counts on-CPU samples as samples and waits
/// on their own line: with `--profile-interval`, the headline's "N
/// samples" is the sum of the `user stacks:` line (on-CPU walks), and the
/// waits are on the `off-CPU:` line. Before, the headline added every
/// recorded wait to the samples (926 "samples": 360 on-CPU and 566 waits).
#[test]
fn a_continuous_run_counts_waits_apart_from_samples() {
    let _serial = serial();
    let program = compile("offcpu_windows", &waiter_burner_source(), FP_FLAGS);
    let dir = tempdir();
    let wall_file = dir.path().join("wall_ms");
    let out = record_off_cpu(
        dir.path(),
        "999",
        "folded",
        &["--profile-interval", "0.5"],
        &[s(&program.path), s(&wall_file)],
    );
    let samples = Summary::parse(&out.stderr)
        .unwrap_or_else(|| panic!("no summary:\n{out}"))
        .samples;
    let walks: u64 = unwind_counts(&out.stderr)
        .unwrap_or_else(|| panic!("no user stacks line:\n{out}"))
        .values()
        .sum();
    let waits: u64 = out
        .stderr
        .split("off-CPU: ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no off-CPU line:\n{out}"));
    assert!(waits >= 10, "{waits} waits recorded:\n{out}");
    assert_eq!(samples, walks, "{out}");
}
