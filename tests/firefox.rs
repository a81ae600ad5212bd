//! Firefox Profiler output, end to end: a C program with a busy main thread
//! and four named threads (three spinning, one in `read(2)` from
//! `/dev/zero`) is profiled by pid at 9999 Hz for 2 s, writing
//! `--profile-format firefox,folded` from one run. The gzip'd JSON is
//! decoded with serde_json (no browser) and checked:
//!
//! - every table index (stack, frame, func, resource, lib, string, native
//!   symbol, category) is in range, and stack prefixes point backwards;
//! - the threads are there by name, in the program's process (the main
//!   thread marked and named after it), each thread's samples in time order,
//!   every sample time within the run (wall clock), and the median gap
//!   between a busy thread's samples one sampling period;
//! - every sample, turned into a folded line (process name, then frame names
//!   root to leaf, kernel ones suffixed `_[k]`), gives exactly the folded
//!   output of the same run, so each thread's total equals the folded count
//!   of its own function;
//! - the workers' functions are frames of the program's library, and the
//!   `read` thread's samples carry kernel frames in the Kernel category.
//!
//! Needs root (BPF) and gcc.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use common::*;

/// Flags for [`deep_source`]: frame pointers, and no sibling calls, so
/// the recursion stays 100 frames deep.
const DEEP_FLAGS: [&str; 6] = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fno-optimize-sibling-calls",
    "-pthread",
    "-Wall",
];

/// Sampling frequency: a sample every ~100 µs per CPU.
const FREQ: u64 = 9999;

/// Length of the run, seconds.
const SECONDS: f64 = 2.0;

/// The workers: thread name and the function only it runs.
const WORKERS: &[(&str, &str)] = &[
    ("tl-alpha", "spin_alpha"),
    ("tl-beta", "spin_beta"),
    ("tl-gamma", "spin_gamma"),
    ("tl-reader", "read_zero_loop"),
];

fn program_source() -> String {
    format!(
        r#"#define _GNU_SOURCE
{DIE_WITH_PARENT}
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>
volatile unsigned long sink;
#define SPIN(name) __attribute__((noinline)) void name(void) {{ \
    for (volatile int i = 0; i < 100000; i++) sink += i; }}
SPIN(spin_alpha)
SPIN(spin_beta)
SPIN(spin_gamma)
SPIN(spin_main)
static char buf[1 << 16];
__attribute__((noinline)) void read_zero_loop(int fd) {{
    for (int i = 0; i < 64; i++) sink += read(fd, buf, sizeof buf);
}}
static void *worker(void *arg) {{
    long which = (long)arg;
    static const char *names[] = {{"tl-alpha", "tl-beta", "tl-gamma", "tl-reader"}};
    pthread_setname_np(pthread_self(), names[which]);
    int fd = open("/dev/zero", O_RDONLY);
    for (;;) {{
        switch (which) {{
        case 0: spin_alpha(); break;
        case 1: spin_beta(); break;
        case 2: spin_gamma(); break;
        default: read_zero_loop(fd); break;
        }}
    }}
    return 0;
}}
int main(void) {{
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], 0, worker, (void *)i);
    for (;;) {{ spin_main(); usleep(2000); }}
}}
"#
    )
}

/// One decoded frame: its function's name, category name and library name.
#[derive(Debug, Clone)]
struct FxFrame {
    name: String,
    category: String,
    lib: Option<String>,
}

/// One decoded thread.
#[derive(Debug)]
struct FxThread {
    /// Its markers: name and time (ms after `meta.startTime`).
    markers: Vec<(String, f64)>,
    name: String,
    process_name: String,
    pid: String,
    tid: String,
    is_main: bool,
    /// Sample times, ms after `meta.startTime`.
    times: Vec<f64>,
    /// Each sample's stack, root first.
    stacks: Vec<Vec<FxFrame>>,
}

fn index(value: &Value, len: usize, what: &str) -> usize {
    let i = value
        .as_u64()
        .unwrap_or_else(|| panic!("{what}: {value} is not an index"));
    assert!((i as usize) < len, "{what}: index {i} out of range ({len})");
    i as usize
}

fn column<'a>(table: &'a Value, name: &str) -> &'a Vec<Value> {
    let col = table[name]
        .as_array()
        .unwrap_or_else(|| panic!("column {name} missing"));
    let len = table["length"].as_u64().expect("table length") as usize;
    assert_eq!(col.len(), len, "column {name} has the wrong length");
    col
}

/// Decode a thread, checking every index it holds.
fn decode_thread(thread: &Value, categories: &[String], libs: &[String]) -> FxThread {
    let strings: Vec<&str> = thread["stringArray"]
        .as_array()
        .expect("stringArray")
        .iter()
        .map(|s| s.as_str().expect("string"))
        .collect();
    let string = |v: &Value, what| strings[index(v, strings.len(), what)].to_string();
    let resources = &thread["resourceTable"];
    let resource_lib: Vec<usize> = column(resources, "lib")
        .iter()
        .map(|l| index(l, libs.len(), "resource lib"))
        .collect();
    for name in column(resources, "name") {
        string(name, "resource name");
    }
    let funcs = &thread["funcTable"];
    let func_names: Vec<String> = column(funcs, "name")
        .iter()
        .map(|n| string(n, "func name"))
        .collect();
    let func_lib: Vec<Option<String>> = column(funcs, "resource")
        .iter()
        .map(|r| match r.as_i64() {
            Some(-1) => None,
            _ => Some(libs[resource_lib[index(r, resource_lib.len(), "func resource")]].clone()),
        })
        .collect();
    let natives = &thread["nativeSymbols"];
    for (lib, name) in column(natives, "libIndex")
        .iter()
        .zip(column(natives, "name"))
    {
        index(lib, libs.len(), "native symbol lib");
        string(name, "native symbol name");
    }
    let native_count = natives["length"].as_u64().unwrap() as usize;
    let frames_table = &thread["frameTable"];
    let frames: Vec<FxFrame> = column(frames_table, "func")
        .iter()
        .zip(column(frames_table, "category"))
        .zip(column(frames_table, "nativeSymbol"))
        .map(|((func, category), native)| {
            if !native.is_null() {
                index(native, native_count, "frame native symbol");
            }
            let func = index(func, func_names.len(), "frame func");
            FxFrame {
                name: func_names[func].clone(),
                category: categories[index(category, categories.len(), "frame category")].clone(),
                lib: func_lib[func].clone(),
            }
        })
        .collect();
    let stack_table = &thread["stackTable"];
    let mut stacks_by_index: Vec<Vec<FxFrame>> = Vec::new();
    for (i, (prefix, frame)) in column(stack_table, "prefix")
        .iter()
        .zip(column(stack_table, "frame"))
        .enumerate()
    {
        let mut stack = match prefix.as_u64() {
            Some(p) => {
                assert!(
                    (p as usize) < i,
                    "stack {i}: prefix {p} is not an earlier stack"
                );
                stacks_by_index[p as usize].clone()
            }
            None => Vec::new(),
        };
        stack.push(frames[index(frame, frames.len(), "stack frame")].clone());
        stacks_by_index.push(stack);
    }
    let samples = &thread["samples"];
    let mut time = 0.0;
    let times: Vec<f64> = column(samples, "timeDeltas")
        .iter()
        .map(|d| {
            let d = d.as_f64().expect("time delta");
            assert!(d >= 0.0, "samples out of time order (delta {d})");
            time += d;
            time
        })
        .collect();
    let stacks: Vec<Vec<FxFrame>> = column(samples, "stack")
        .iter()
        .map(|s| stacks_by_index[index(s, stacks_by_index.len(), "sample stack")].clone())
        .collect();
    assert!(column(samples, "weight")
        .iter()
        .all(|w| w.as_i64() == Some(1)));
    let marker_table = &thread["markers"];
    let markers = column(marker_table, "name")
        .iter()
        .zip(column(marker_table, "startTime"))
        .map(|(name, time)| (string(name, "marker name"), time.as_f64().unwrap_or(-1.0)))
        .collect();
    FxThread {
        markers,
        name: thread["name"].as_str().expect("name").to_string(),
        process_name: thread["processName"]
            .as_str()
            .expect("processName")
            .to_string(),
        pid: thread["pid"].as_str().expect("pid").to_string(),
        tid: thread["tid"].to_string().trim_matches('"').to_string(),
        is_main: thread["isMainThread"].as_bool().expect("isMainThread"),
        times,
        stacks,
    }
}

/// Read a gzip'd Firefox profile file (see [`decode_profile`]).
fn read_profile(path: &Path) -> (f64, f64, Vec<FxThread>) {
    decode_profile(&fs::read(path).expect("reading the profile"))
}

/// Decode a gzip'd Firefox profile: `meta.startTime` (ms since the Unix
/// epoch), the sampling interval (ms) and the decoded threads.
fn decode_profile(gzip: &[u8]) -> (f64, f64, Vec<FxThread>) {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(gzip)
        .read_to_end(&mut json)
        .expect("the profile is gzip'd");
    let profile: Value = serde_json::from_slice(&json).expect("the profile is JSON");
    let categories: Vec<String> = profile["meta"]["categories"]
        .as_array()
        .expect("categories")
        .iter()
        .map(|c| c["name"].as_str().expect("category name").to_string())
        .collect();
    let libs: Vec<String> = profile["libs"]
        .as_array()
        .expect("libs")
        .iter()
        .map(|l| l["name"].as_str().expect("lib name").to_string())
        .collect();
    let threads = profile["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .map(|t| decode_thread(t, &categories, &libs))
        .collect();
    let start = profile["meta"]["startTime"].as_f64().expect("startTime");
    let interval = profile["meta"]["interval"].as_f64().expect("interval");
    (start, interval, threads)
}

/// A sample as a folded line: process name, then frames root to leaf.
fn folded_line(process: &str, stack: &[FxFrame]) -> String {
    let mut names = vec![process.to_string()];
    for frame in stack {
        let name = frame.name.replace(';', ":");
        if frame.category == "Kernel" {
            names.push(format!("{name}{KERNEL_SUFFIX}"));
        } else {
            names.push(name);
        }
    }
    names.join(";")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn unix_ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1e3
}

/// The samples of a profile as folded lines with their counts.
fn as_folded(threads: &[FxThread]) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for thread in threads {
        for stack in &thread.stacks {
            *lines
                .entry(folded_line(&thread.process_name, stack))
                .or_default() += 1;
        }
    }
    lines
}

/// Folded stacks as lines with their counts (identical lines added up).
fn folded_lines(folded: &[Stack]) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, n) in folded {
        *lines.entry(frames.join(";")).or_default() += n;
    }
    lines
}

#[test]
fn timeline_of_named_threads_matches_folded_output() {
    let _serial = serial();
    let program = compile("tl-threads", &program_source(), &["-O2", "-g", "-pthread"]);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let before = SystemTime::now();
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            &FREQ.to_string(),
            "--duration",
            &SECONDS.to_string(),
            "--profile-format",
            "firefox,folded",
            "--profile-path",
            s(dir.path()),
        ],
        Duration::from_secs(60),
    );
    let after = SystemTime::now();
    out.assert_success();
    let folded = read_folded(&dir.path().join("folded.txt"));
    let (start_ms, interval_ms, threads) = read_profile(&dir.path().join("profile.json.gz"));
    assert!(
        (interval_ms - 1e3 / FREQ as f64).abs() < 1e-3,
        "{interval_ms}"
    );

    // One run, two formats: the same samples and stacks.
    let mut from_firefox: BTreeMap<String, u64> = BTreeMap::new();
    for thread in &threads {
        for stack in &thread.stacks {
            *from_firefox
                .entry(folded_line(&thread.process_name, stack))
                .or_default() += 1;
        }
    }
    let mut from_folded: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, n) in &folded {
        *from_folded.entry(frames.join(";")).or_default() += n;
    }
    assert_eq!(
        from_firefox, from_folded,
        "firefox and folded stacks differ"
    );
    let samples = total(&folded);
    assert_eq!(samples, out.summary().samples, "{out}");
    assert!(samples >= 1000, "too few samples ({samples}):\n{out}");

    // Times: each thread's in order (checked while decoding) and within the run.
    let (lo, hi) = (unix_ms(before), unix_ms(after));
    for thread in &threads {
        for &t in &thread.times {
            let wall = start_ms + t;
            assert!(
                (lo..=hi).contains(&wall),
                "thread {}: a sample at {wall:.3} ms is outside the run [{lo:.3}, {hi:.3}]",
                thread.name
            );
            assert!(
                t <= SECONDS * 1e3 + 1e3,
                "sample at {t} ms of a {SECONDS} s run"
            );
        }
    }

    let pid = workload.pid().to_string();
    for thread in &threads {
        assert_eq!(thread.pid, pid);
        assert_eq!(thread.process_name, program.name);
        assert_eq!(thread.is_main, thread.tid == pid, "{}", thread.name);
    }
    let main = threads.iter().find(|t| t.is_main).expect("the main thread");
    assert_eq!(main.name, program.name);

    let period_ms = 1e3 / FREQ as f64;
    for (name, function) in WORKERS {
        let thread = threads
            .iter()
            .find(|t| t.name == *name)
            .unwrap_or_else(|| panic!("no thread named {name}"));
        let with_function = |stack: &Vec<FxFrame>| stack.iter().any(|f| f.name == *function);
        let own = thread.stacks.iter().filter(|s| with_function(s)).count() as u64;
        let folded_own: u64 = folded
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(own, folded_own, "{name}: samples in {function}");
        assert!(
            own * 10 >= thread.stacks.len() as u64 * 9 && own >= 100,
            "{name}: only {own} of {} samples in {function}",
            thread.stacks.len()
        );
        // The function is a frame of the program's own library.
        let frame = thread
            .stacks
            .iter()
            .flatten()
            .find(|f| f.name == *function)
            .expect("the function's frame");
        assert_eq!(
            frame.lib.as_deref(),
            Some(program.name.as_str()),
            "{frame:?}"
        );
        assert_eq!(frame.category, "User");
        // A busy thread is sampled once a period while it runs: most gaps
        // between its samples are one period, whatever its share of a CPU.
        let mut gaps: Vec<f64> = thread.times.windows(2).map(|w| w[1] - w[0]).collect();
        let gap = median(&mut gaps);
        assert!(
            gap >= 0.8 * period_ms && gap <= 1.5 * period_ms,
            "{name}: median gap {gap:.4} ms, sampling period {period_ms:.4} ms"
        );
    }

    // The reader is mostly in read(2): kernel frames, in the Kernel category,
    // of the kernel's library, on top of its user frames.
    let reader = threads.iter().find(|t| t.name == "tl-reader").unwrap();
    let in_kernel = reader
        .stacks
        .iter()
        .filter(|stack| {
            let first = stack.iter().position(|f| f.category == "Kernel");
            first.is_some_and(|k| {
                stack[k..].iter().all(|f| {
                    f.category == "Kernel" && f.lib.as_deref() == Some("[kernel.kallsyms]")
                }) && stack[..k].iter().any(|f| f.name == "read_zero_loop")
                    && stack[k..].iter().any(|f| f.name.contains("read"))
            })
        })
        .count();
    assert!(
        in_kernel * 2 >= reader.stacks.len(),
        "only {in_kernel} of {} reader samples show the kernel's read path",
        reader.stacks.len()
    );
}

/// Continuous mode: one Firefox file per window beside the folded file of
/// the same window, with the same stacks; windows follow each other in time.
#[test]
fn continuous_windows_write_one_timeline_each() {
    let _serial = serial();
    let program = compile("tl-windows", &program_source(), &["-O2", "-g", "-pthread"]);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            "999",
            "--duration",
            "2.5",
            "--profile-interval",
            "1",
            "--profile-format",
            "firefox,folded",
            "--profile-path",
            s(dir.path()),
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let timelines: Vec<&String> = names.iter().filter(|n| n.ends_with(".json.gz")).collect();
    assert_eq!(timelines.len(), 3, "{names:?}\n{out}");
    let mut previous_end = 0.0f64;
    let mut samples = 0;
    for name in timelines {
        let stamp = name
            .strip_prefix("profile-")
            .and_then(|n| n.strip_suffix(".json.gz"))
            .unwrap_or_else(|| panic!("window file name {name}"));
        let (start, _, threads) = read_profile(&dir.path().join(name));
        let folded = read_folded(&dir.path().join(format!("folded-{stamp}.txt")));
        assert_eq!(as_folded(&threads), folded_lines(&folded), "window {stamp}");
        samples += total(&folded);
        let times = threads
            .iter()
            .flat_map(|t| t.times.iter().map(|x| start + x));
        let (first, last) = times.fold((f64::MAX, 0.0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
        // A sample read after its window closed (a stalled reader, counted
        // in `late_samples`) goes to the next window: allow for one.
        assert!(
            first >= previous_end - 100.0,
            "window {stamp} starts before the last one ended"
        );
        assert!(
            last - first <= 1_000.0 + 60.0,
            "window {stamp} spans {} ms",
            last - first
        );
        previous_end = last;
    }
    assert!(samples > 100, "{samples} samples\n{out}");
}

/// On demand: `format=firefox` answers a gzip'd timeline of the request's
/// span with the program's named threads.
/// Start `lightswitch --listen 127.0.0.1:0 --pids PIDS`; returns the
/// process and the URL its banner gives.
fn listen(pids: &str) -> (std::process::Child, String) {
    let mut agent = std::process::Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--pids", pids])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawning lightswitch");
    let mut banner = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(agent.stdout.take().unwrap()),
        &mut banner,
    )
    .expect("reading the banner");
    let url = banner
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected banner {banner:?}"))
        .to_string();
    (agent, url)
}

#[test]
fn on_demand_request_answers_a_timeline() {
    let _serial = serial();
    let program = compile("tl-http", &program_source(), &["-O2", "-g", "-pthread"]);
    let workload = Workload::spawn(&program);
    let (mut agent, url) = listen(&workload.pid_arg());
    let before = unix_ms(SystemTime::now());
    let response = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
        .get(format!(
            "{url}/debug/pprof/profile?seconds=1&format=firefox&sample_freq=999"
        ))
        .send()
        .expect("GET profile");
    let after = unix_ms(SystemTime::now());
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/gzip"
    );
    let (start, _, threads) = decode_profile(&response.bytes().unwrap());
    for name in ["tl-alpha", "tl-beta", "tl-gamma", "tl-reader"] {
        let thread = threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no thread {name}"));
        assert!(
            thread.stacks.len() >= 10,
            "{name}: {} samples",
            thread.stacks.len()
        );
        for t in &thread.times {
            assert!(
                (before..=after).contains(&(start + t)),
                "{name}: sample outside the request"
            );
        }
    }
}

/// A process that exits while it is profiled (released once sampling runs,
/// it spins 2 s of a 4 s run; the test reaps it only at its end, so the
/// run is given a duration): an `exit` marker on its main thread, after its
/// last sample, within the run.
#[test]
fn exit_is_a_marker_on_the_main_thread() {
    let _serial = serial();
    let source = format!(
        r#"{DIE_WITH_PARENT}
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double now(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}}
int main(void) {{
    char c;
    if (read(0, &c, 1) != 1) return 1;
    double end = now() + 2;
    while (now() < end) sink++;
    return 0;
}}
"#
    );
    let program = compile("tl-exits", &source, &["-O2", "-g"]);
    let mut workload = Workload::spawn(&program);
    let dir = tempdir();
    let before = unix_ms(SystemTime::now());
    let mut agent = Lightswitch::spawn(&[
        "--pids",
        &workload.pid_arg(),
        "--sample-freq",
        "999",
        "--duration",
        "4",
        "--profile-format",
        "firefox",
        "--profile-path",
        s(dir.path()),
    ]);
    // A slow start on a loaded machine must not miss the workload's run.
    agent.expect_sampling();
    std::thread::sleep(Duration::from_millis(300));
    workload.release();
    let out = agent.wait(Duration::from_secs(60));
    let after = unix_ms(SystemTime::now());
    out.assert_success();
    let (start, _, threads) = read_profile(&dir.path().join("profile.json.gz"));
    let main = threads
        .iter()
        .find(|t| t.is_main)
        .unwrap_or_else(|| panic!("no main thread\n{out}"));
    let exits: Vec<f64> = main
        .markers
        .iter()
        .filter(|(name, _)| name == "exit")
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(exits.len(), 1, "{:?}\n{out}", main.markers);
    let last_sample = main.times.last().copied().unwrap_or(0.0);
    // The exit event is stamped at the sched_process_exit tracepoint; the
    // rest of do_exit (releasing files, the cgroup) can still be sampled,
    // for well under a few ms.
    assert!(
        exits[0] + 5.0 >= last_sample,
        "exit at {} ms, last sample at {last_sample} ms",
        exits[0]
    );
    assert!((before..=after).contains(&(start + exits[0])));
}

/// Two threads spinning 100 calls deep (records of about 900 bytes, so a
/// ring buffer fills within a second when nobody reads it). With an
/// argument: wait for a byte on stdin, spin 0.5 s, exec itself with `again`
/// (same pid, new program), spin 3.5 s in two threads, exit. Without one:
/// spin forever.
fn deep_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double until;
static double now(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}}
__attribute__((noinline)) void deep(int n) {{
    if (n == 0) {{ while (until == 0 || now() < until) sink++; return; }}
    deep(n - 1);
    sink++;
}}
static void *worker(void *arg) {{ deep(100); return arg; }}
static void spin_threads(void) {{
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    deep(100);
    pthread_join(t, 0);
}}
int main(int argc, char **argv) {{
    if (argc == 1) {{ spin_threads(); return 0; }}
    if (strcmp(argv[1], "again") == 0) {{ until = now() + 3.5; spin_threads(); return 0; }}
    char c;
    if (read(0, &c, 1) != 1) return 1;
    until = now() + 0.5;
    deep(10);
    execl(argv[0], argv[0], "again", (char *)0);
    return 2;
}}
"#
    )
}

/// Decode a gzip'd Firefox profile as JSON.
fn json_of(gzip: &[u8]) -> Value {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(gzip)
        .read_to_end(&mut json)
        .expect("the profile is gzip'd");
    serde_json::from_slice(&json).expect("the profile is JSON")
}

/// The lost-samples markers of a profile: start and end (ms after
/// `meta.startTime`) and samples lost, with the names of the thread and
/// process they are on (the Firefox Profiler names a main thread after its
/// process).
fn lost_markers(profile: &Value) -> Vec<(f64, f64, u64, String, String)> {
    let mut out = Vec::new();
    for thread in profile["threads"].as_array().expect("threads") {
        let markers = &thread["markers"];
        let data = column(markers, "data");
        for (i, d) in data.iter().enumerate() {
            if d["type"] != "LightswitchLostSamples" {
                continue;
            }
            out.push((
                column(markers, "startTime")[i].as_f64().expect("startTime"),
                column(markers, "endTime")[i].as_f64().expect("endTime"),
                d["samples"].as_f64().expect("samples") as u64,
                thread["name"].as_str().unwrap_or_default().to_string(),
                thread["processName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
    }
    out
}

/// Stop `pid` with SIGSTOP for `pause`, then continue it; returns the wall
/// clock (ms) at the stop and at the continue.
fn pause_process(pid: u32, pause: Duration) -> (f64, f64) {
    let stopped = unix_ms(SystemTime::now());
    // SAFETY: kill(2) on a child of this test.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    std::thread::sleep(pause);
    let continued = unix_ms(SystemTime::now());
    // SAFETY: as above.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
    (stopped, continued)
}

/// A profiler stopped (SIGSTOP) for 2 s while its target fills the ring
/// buffers with deep stacks loses samples: the timeline has them as
/// markers on the main thread of a `lightswitch` pseudo-process, as
/// many as the summary counts, in a span that covers the stop.
#[test]
fn lost_samples_are_markers_spanning_the_stop() {
    let _serial = serial();
    let program = compile("tl-deep", &deep_source(), &DEEP_FLAGS);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let mut agent = Lightswitch::spawn(&[
        "--pids",
        &workload.pid_arg(),
        "--sample-freq",
        "999",
        "--duration",
        "6",
        "--profile-format",
        "firefox",
        "--profile-path",
        s(dir.path()),
    ]);
    agent.expect_sampling();
    std::thread::sleep(Duration::from_millis(700));
    let (stopped, continued) = pause_process(agent.pid(), Duration::from_secs(2));
    let out = agent.wait(Duration::from_secs(60));
    out.assert_success();
    let text = format!("{}{}", out.stdout, out.stderr);
    let summary = Summary::parse(&text).unwrap_or_else(|| panic!("no summary: {text}"));
    assert!(summary.lost > 0, "nothing lost: {text}");
    let profile = json_of(&fs::read(dir.path().join("profile.json.gz")).unwrap());
    let start = profile["meta"]["startTime"].as_f64().unwrap();
    let lost = lost_markers(&profile);
    let sum: u64 = lost.iter().map(|l| l.2).sum();
    assert_eq!(sum, summary.lost, "{lost:?}\n{text}");
    for (_, _, _, thread, process) in &lost {
        assert_eq!(
            (thread.as_str(), process.as_str()),
            ("lightswitch", "lightswitch")
        );
    }
    // The counter was read last before the stop and next after it: the
    // span that holds the losses covers the stop.
    assert!(
        lost.iter()
            .any(|l| start + l.0 <= stopped + 50.0 && start + l.1 >= continued - 50.0),
        "stopped at {stopped}, continued at {continued}, spans {lost:?} from {start}"
    );
}

/// On-demand `format=firefox` answers carry markers too: a process that
/// execs (same pid) and exits during the request has `exec` and `exit`
/// markers on its main thread, in order; the agent stopped for 2 s during
/// the request has its lost samples as markers.
#[test]
fn on_demand_timeline_has_exec_exit_and_lost_markers() {
    let _serial = serial();
    let program = compile("tl-reexec", &deep_source(), &DEEP_FLAGS);
    let mut workload = {
        let mut child = std::process::Command::new(&program.path)
            .arg("wait")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawning the workload");
        let stdin = child.stdin.take().unwrap();
        (child, stdin)
    };
    let pid = workload.0.id().to_string();
    let (mut agent, url) = listen(&pid);
    let request = std::thread::spawn(move || {
        reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
            .get(format!(
                "{url}/debug/pprof/profile?seconds=5&format=firefox&sample_freq=999"
            ))
            .send()
            .expect("GET profile")
    });
    std::thread::sleep(Duration::from_millis(300));
    std::io::Write::write_all(&mut workload.1, b"g").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    pause_process(agent.id(), Duration::from_secs(2));
    let response = request.join().unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = workload.0.wait();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let profile = json_of(&response.bytes().unwrap());
    let main = profile["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["isMainThread"] == true && t["pid"] == pid.as_str())
        .unwrap_or_else(|| panic!("no main thread of {pid}"));
    let strings = main["stringArray"].as_array().unwrap();
    let markers: Vec<(&str, f64)> = column(&main["markers"], "name")
        .iter()
        .zip(column(&main["markers"], "startTime"))
        .map(|(n, t)| {
            (
                strings[n.as_u64().unwrap() as usize].as_str().unwrap(),
                t.as_f64().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = markers.iter().map(|m| m.0).collect();
    assert_eq!(names, ["exec", "exit"], "{markers:?}");
    // exec 0.5 s after the release, exit 3.5 s after that.
    let gap = markers[1].1 - markers[0].1;
    assert!((3400.0..4500.0).contains(&gap), "{markers:?}");
    let lost = lost_markers(&profile);
    assert!(lost.iter().map(|l| l.2).sum::<u64>() > 0, "{lost:?}");
}
