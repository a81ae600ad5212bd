//! The users' case (issue 37): one hour at 10 kHz sent to a real
//! collector process over HTTP, with a 200 µs critical section every 5 s
//! in a busy process (`bash bench/collector/hour.sh` records it and runs
//! this with `LIGHTSWITCH_BENCH_COLLECTOR_URL` and `_PID` set).
//!
//! Prints the storage size, the collector's CPU (utime + stime from
//! `/proc/PID/stat`) and peak RSS (`VmHWM`), and the wall time of two
//! `GET /v1/profiles/merged` queries: one burst's range (folded, which must
//! hold the critical section) and the whole hour's flame graph.

use std::time::{Duration, Instant};

use lightswitch::profile::Profile;

use super::{requests, shifted, S};

/// The function the burst program runs for 200 µs every 5 s.
const CRITICAL: &str = "critical_section";

/// ns after the recording's start of each sample in `CRITICAL`, sorted.
fn critical_offsets(p: &Profile) -> Vec<u64> {
    let hit: Vec<bool> = p
        .samples
        .iter()
        .map(|s| {
            s.frames
                .iter()
                .any(|&f| p.frames[f].lines.iter().any(|l| &*l.function == CRITICAL))
        })
        .collect();
    let mut offsets: Vec<u64> = p
        .timeline
        .iter()
        .filter(|t| hit[t.sample as usize])
        .map(|t| { t.offset_ns }.max(0) as u64)
        .collect();
    offsets.sort_unstable();
    offsets
}

/// The collector's CPU time so far (user + system, s) and its peak RSS, MiB.
fn collector_usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("collector's stat");
    let after_comm = &stat[stat.rfind(')').expect("stat's comm") + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let hwm_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    // USER_HZ is 100 on every Linux this runs on.
    (ticks as f64 / 100.0, hwm_kib / 1024.0)
}

/// `GET url`: its wall time, status and body.
fn timed_get(client: &reqwest::blocking::Client, url: &str) -> (Duration, u16, Vec<u8>) {
    let started = Instant::now();
    let response = client.get(url).send().expect("query");
    let status = response.status().as_u16();
    let body = response.bytes().expect("answer").to_vec();
    (started.elapsed(), status, body)
}

/// Replay one hour of `p` (10 s windows, gzip'd OTLP, shifted copies) into
/// the collector at `url` (process `pid`), then query it; prints results.
pub fn run(p: &Profile, url: &str, pid: u32) {
    let offsets = critical_offsets(p);
    assert!(
        !offsets.is_empty(),
        "the recording holds no sample in {CRITICAL}: was the burst program running?"
    );
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .expect("client");
    let windows = requests(p, 10 * S);
    let copies = (3600 * S).div_ceil(p.duration_ns);
    let (cpu_before, _) = collector_usage(pid);
    let started = Instant::now();
    let mut samples = 0u64;
    for c in 0..copies {
        for (raw, n) in &windows {
            let response = client
                .post(format!("{url}/v1development/profiles"))
                .header("content-type", "application/x-protobuf")
                .header("content-encoding", "gzip")
                .body(shifted(raw, c * p.duration_ns))
                .send()
                .expect("posting a window");
            assert!(response.status().is_success(), "{}", response.status());
            samples += n;
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let (cpu_after, hwm) = collector_usage(pid);
    let cpu = cpu_after - cpu_before;
    // One burst of the middle copy: its samples' span, 200 µs either side.
    let middle = copies / 2 * p.duration_ns;
    let first = offsets[0];
    let last = *offsets
        .iter()
        .take_while(|&&o| o < first + S)
        .last()
        .unwrap();
    let from = p.start_unix_ns + middle + first - 200_000;
    let to = p.start_unix_ns + middle + last + 200_000;
    let (burst_time, status, body) = timed_get(
        &client,
        &format!("{url}/v1/profiles/merged?from={from}&to={to}&format=folded"),
    );
    let burst = String::from_utf8_lossy(&body);
    assert_eq!(status, 200, "{burst}");
    assert!(
        burst.contains(CRITICAL),
        "the burst's range lacks {CRITICAL}:\n{burst}"
    );
    let hour_end = p.start_unix_ns + copies * p.duration_ns;
    let (hour_time, status, svg) = timed_get(
        &client,
        &format!(
            "{url}/v1/profiles/merged?from={}&to={hour_end}&format=flame-graph",
            p.start_unix_ns
        ),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&svg));
    let (_, hwm_after) = collector_usage(pid);
    println!(
        "users' case: {samples} samples in one hour ({copies} copies of a {:.1} s recording, \
         {} critical-section samples per copy), sent in {wall:.1} s; collector CPU {cpu:.1} s \
         ({:.0} samples per CPU-second), VmHWM {hwm:.1} MiB after ingest, {hwm_after:.1} MiB \
         after the queries; one burst's range ({:.0} µs) answered in {:.1} ms with {} folded \
         lines; the hour's flame graph in {:.2} s ({} bytes)",
        p.duration_ns as f64 / 1e9,
        offsets.len(),
        samples as f64 / cpu,
        (to - from) as f64 / 1e3,
        burst_time.as_secs_f64() * 1e3,
        burst.lines().count(),
        hour_time.as_secs_f64(),
        svg.len(),
    );
}
