//! Perfetto trace output, end to end, checked by an independent decoder:
//! `check_perfetto.py` decodes each trace with the Python `perfetto`
//! package's generated classes (from PyPI; its trace processor fetches a
//! binary at run time and cannot run here), reads its interned data per
//! sequence as Perfetto's trace processor does, asserts its rules (see the
//! script) and summarizes it as folded lines, threads with their sample
//! counts and first and last times, and slices.
//!
//! - A C program whose three named threads spin in `alpha`, spin in `beta`
//!   and nap (`nanosleep`) is profiled by pid with `--off-cpu`, writing
//!   `perfetto,folded,folded-off-cpu` from one run: the trace's stacks
//!   equal the folded output line for line; each spinning thread has as
//!   many samples as the folded lines through its function; every
//!   sample's time lies within the run's span on the wall clock, and in
//!   order per thread; the napping thread's waits are `off-CPU` slices on
//!   its track whose lengths add up to the off-CPU folded output's total.
//! - `record` writes one trace, an on-demand request with `format=perfetto`
//!   answers one, and a collector answers one for a range of the windows
//!   an agent sent it (`--sender otlp`), holding exactly the range's samples.
//!
//! Needs root (BPF), gcc, and a Python with the `perfetto` package:
//! `LIGHTSWITCH_PERFETTO_PYTHON`, else the virtualenv `perfetto-venv` in the
//! cargo target directory that scripts/setup.sh makes.

#[path = "../common/mod.rs"]
mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use common::*;

/// Three named threads: `lsw-alpha` spins in `alpha`, `lsw-beta` in
/// `beta`, `lsw-nap` sleeps 5 ms at a time in `nap`; `main` joins them.
const THREADS_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <string.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void alpha(void) { for (;;) sink++; }
__attribute__((noinline)) void beta(void) { for (;;) sink += 2; }
__attribute__((noinline)) void nap(void) {
    for (;;) { struct timespec t = {0, 5 * 1000 * 1000}; nanosleep(&t, 0); sink++; }
}
static void *run(void *arg) {
    const char *name = arg;
    pthread_setname_np(pthread_self(), name);
    if (strcmp(name, "lsw-alpha") == 0) alpha();
    else if (strcmp(name, "lsw-beta") == 0) beta();
    else nap();
    return 0;
}
int main(void) {
    pthread_t t[3];
    pthread_create(&t[0], 0, run, "lsw-alpha");
    pthread_create(&t[1], 0, run, "lsw-beta");
    pthread_create(&t[2], 0, run, "lsw-nap");
    pthread_join(t[0], 0);
    return 0;
}
"#;

fn threads_program(name: &str) -> Program {
    let source = format!("{DIE_WITH_PARENT}{THREADS_SOURCE}");
    let mut flags = FP_FLAGS.to_vec();
    flags.push("-pthread");
    compile(name, &source, &flags)
}

/// The decoder of Perfetto files (see the module docs).
const DECODER: Decoder = Decoder {
    python_var: "LIGHTSWITCH_PERFETTO_PYTHON",
    venv: "perfetto-venv",
    script: "tests/perfetto/check_perfetto.py",
};

/// [`Decoder::check`] of `path`.
fn check(path: &Path) -> Value {
    DECODER.check(path)
}

/// The summary's thread named `name`: (samples, first ns, last ns).
fn thread(summary: &Value, name: &str) -> (u64, u64, u64) {
    let t = summary["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t[2] == name)
        .unwrap_or_else(|| panic!("no samples of thread {name}: {}", summary["threads"]));
    (
        t[3].as_u64().unwrap(),
        t[4].as_u64().unwrap(),
        t[5].as_u64().unwrap(),
    )
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

#[test]
fn perfetto_trace_of_named_threads_matches_folded_output() {
    let _serial = serial();
    let program = threads_program("pft_threads");
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let before = now_ns();
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            "999",
            "--duration",
            "2",
            "--off-cpu",
            "--profile-format",
            "perfetto,folded,folded-off-cpu",
            "--profile-path",
            s(dir.path()),
        ],
        Duration::from_secs(60),
    );
    let after = now_ns();
    out.assert_success();
    let summary = check(&dir.path().join("profile.perfetto-trace"));
    let folded = read_folded(&dir.path().join("folded.txt"));
    assert_eq!(
        folded_of(&summary),
        folded_lines(&folded),
        "Perfetto and folded differ"
    );
    assert_eq!(summary["samples"].as_u64(), Some(out.summary().samples));

    // Per thread: each spinning thread's samples are the folded lines
    // through its function; all in the run's span.
    for (name, function) in [("lsw-alpha", "alpha"), ("lsw-beta", "beta")] {
        let (samples, first, last) = thread(&summary, name);
        let through: u64 = folded
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(samples, through, "{name}: {summary}");
        assert!(samples >= 20, "{name}: only {samples} samples\n{out}");
        assert!(
            before <= first && first <= last && last <= after,
            "{name}'s samples from {first} to {last}, outside the run [{before}, {after}]"
        );
    }
    let pid = workload.pid();
    let threads = summary["all_threads"].as_array().unwrap();
    assert!(
        threads
            .iter()
            .any(|t| t[0] == pid && t[2] == "lsw-nap" && t[1] != pid),
        "{threads:?}"
    );
    assert_eq!(
        summary["processes"],
        serde_json::json!([[pid, program.name]])
    );

    // Off-CPU: the napping thread's waits are slices on its track, within
    // the run, their lengths adding up to the off-CPU profile's total.
    let slices = summary["slices"].as_array().unwrap();
    let napping: Vec<&Value> = slices
        .iter()
        .filter(|s| threads.iter().any(|t| t[1] == s[1] && t[2] == "lsw-nap"))
        .collect();
    assert!(napping.len() >= 10, "{} waits of lsw-nap", napping.len());
    let mut slice_ns = 0;
    for s in slices {
        assert_eq!(s[2], "off-CPU");
        let (begin, end, ns) = (
            s[3].as_u64().unwrap(),
            s[4].as_u64().unwrap(),
            s[5].as_u64().unwrap(),
        );
        assert_eq!(end - begin, ns, "{s}");
        assert!(
            before <= begin && end <= after,
            "{s} outside [{before}, {after}]"
        );
        slice_ns += ns;
    }
    let off_cpu = read_folded(&dir.path().join("folded-off-cpu.txt"));
    assert_eq!(slice_ns, total(&off_cpu));
}

#[test]
fn record_on_demand_and_collector_ranges_write_perfetto() {
    let _serial = serial();
    let program = threads_program("pft_where");
    let workload = Workload::spawn(&program);
    let dir = tempdir();

    // `record`: one trace of the command.
    let out = run(
        &[
            "record",
            "--sample-freq",
            "499",
            "--profile-format",
            "perfetto",
            "--profile-path",
            s(dir.path()),
            "--",
            "timeout",
            "1",
            s(&program.path),
        ],
        Duration::from_secs(60),
    );
    assert!(out.status.code().is_some(), "{out}");
    let summary = check(&dir.path().join("profile.perfetto-trace"));
    for function in ["alpha", "beta"] {
        assert!(
            folded_of(&summary)
                .keys()
                .any(|l| l.split(';').any(|f| f == function)),
            "{summary}"
        );
    }

    // On demand: `format=perfetto`.
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", "127.0.0.1:0", "--pids", &workload.pid_arg()]);
    let (mut agent, url, _lines) = spawn_listening(cmd, Duration::from_secs(30));
    let response = http()
        .get(format!(
            "{url}/debug/pprof/profile?seconds=1&format=perfetto&sample_freq=499"
        ))
        .send()
        .expect("GET profile");
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-protobuf");
    let answered = dir.path().join("answered.perfetto-trace");
    fs::write(&answered, response.bytes().unwrap()).unwrap();
    let summary = check(&answered);
    assert!(summary["samples"].as_u64().unwrap() >= 100, "{summary}");

    // A collector's range of an agent's windows.
    let mut cmd = Command::new(BIN);
    cmd.args(["collector", "--listen", "127.0.0.1:0", "--storage"])
        .arg(dir.path().join("store"));
    let (collector, collector_url, _lines) = spawn_listening(cmd, Duration::from_secs(30));
    let _collector = KillOnDrop(collector);
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            "499",
            "--duration",
            "2",
            "--profile-interval",
            "1",
            "--sender",
            "otlp",
            "--server-url",
            &collector_url,
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let merged = |query: &str| -> (Value, u64) {
        let response = http()
            .get(format!(
                "{collector_url}/v1/profiles/merged?format=perfetto{query}"
            ))
            .send()
            .expect("GET merged");
        assert_eq!(response.status(), reqwest::StatusCode::OK);
        let samples: u64 = response.headers()["X-Lightswitch-Samples"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let path = dir.path().join("merged.perfetto-trace");
        fs::write(&path, response.bytes().unwrap()).unwrap();
        (check(&path), samples)
    };
    let (all, samples) = merged("");
    assert_eq!(samples, queued_samples(&out.stdout), "{out}");
    assert_eq!(all["samples"].as_u64(), Some(samples));
    let (_, first, last) = thread(&all, "lsw-alpha");
    let (from, to) = (first + (last - first) / 3, first + 2 * (last - first) / 3);
    let (cut, in_range) = merged(&format!("&from={from}&to={to}"));
    assert_eq!(cut["samples"].as_u64(), Some(in_range));
    assert!(
        in_range > 0 && in_range < samples,
        "{in_range} of {samples}"
    );
    for t in cut["threads"].as_array().unwrap() {
        let (a, b) = (t[4].as_u64().unwrap(), t[5].as_u64().unwrap());
        assert!(from <= a && b < to, "{t} outside [{from}, {to})");
    }
}

/// A child process killed and reaped when this drops, also when a test
/// fails before its end.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The samples of a sender's summary line (`2 windows queued for URL: 240
/// samples, ...`; `1 window` for one).
fn queued_samples(stdout: &str) -> u64 {
    stdout
        .lines()
        .find(|l| l.contains(" queued for "))
        .and_then(|l| l.rsplit_once(": "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no windows queued line in:\n{stdout}"))
}
