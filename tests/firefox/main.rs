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

#[path = "../common/mod.rs"]
mod common;
mod markers;
mod timeline;

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
