//! Start-up: how soon lightswitch gives complete stacks after it starts,
//! and how soon every process that was already running is covered by
//! unwind tables. Run twice: with an empty unwind-table cache (cold) and
//! with the cache the first run filled (warm).
//!
//! lightswitch runs in continuous mode with 0.1 s pprof windows, so the
//! profile files say when samples were taken (each window's `time_nanos`
//! and `duration_nanos`), which process they came from (`pid` label) and how
//! their walk ended (the `[unwind: ...]` frame). Its `--logging debug`
//! output says when each object's table was loaded.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use lightswitch::profile::format::pprof::proto;
use prost::Message;

use crate::profiler::Tools;
use crate::report;
use crate::workload::Workloads;

/// Window length, s (the resolution of the sample-based times).
const WINDOW_S: &str = "0.1";

/// What one start-up run showed; times are ms after lightswitch was spawned.
struct StartupResult {
    /// The `sampling N CPUs at F Hz` log line.
    sampling_ms: Option<f64>,
    /// End of the first window with any sample.
    first_sample_ms: Option<f64>,
    /// End of the first window with a complete workload stack (leaf ... f01, main).
    first_complete_ms: Option<f64>,
    /// End of the last window with a `no_table` sample of a process that
    /// was running before lightswitch started (`None`: there was none).
    last_no_table_ms: Option<f64>,
    /// Samples of already-running processes marked `no_table`, and all their samples.
    no_table: (u64, u64),
    /// Executable objects mapped by the processes running at the start, and
    /// how many of them were logged as loaded (or as having no table).
    objects: (usize, usize),
    /// When the last of those was logged.
    last_object_ms: Option<f64>,
}

fn unix_ns_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

fn pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Paths of the file-backed executable mappings of `pids` (what the
/// profiler needs unwind tables for), as `/proc/PID/maps` names them.
fn executable_objects(pids: &[u32]) -> HashSet<String> {
    let mut objects = HashSet::new();
    for pid in pids {
        let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
            continue;
        };
        for line in maps.lines() {
            let fields: Vec<&str> = line.splitn(6, char::is_whitespace).collect();
            let (Some(perms), Some(path)) = (fields.get(1), fields.get(5)) else {
                continue;
            };
            let path = path.trim();
            if perms.contains('x') && path.starts_with('/') && !path.ends_with(" (deleted)") {
                objects.insert(path.to_string());
            }
        }
    }
    objects
}

/// Unix time in ns of a tracing timestamp `2026-01-02T03:04:05.123456Z`.
fn parse_timestamp(ts: &str) -> Option<i64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    let frac_ns = format!("{frac:0<9}")[..9].parse::<i64>().ok()?;
    let days = report::days_from_civil(y, m as u32, day as u32);
    Some(((days * 24 + h) * 60 + min) * 60 * 1_000_000_000 + s * 1_000_000_000 + frac_ns)
}

/// (time, message) of each log line of `stderr` whose message contains `needle`.
fn log_lines<'a>(stderr: &'a str, needle: &'a str) -> impl Iterator<Item = (i64, &'a str)> + 'a {
    stderr
        .lines()
        .filter(move |l| l.contains(needle))
        .filter_map(|l| {
            let (ts, rest) = l.split_once(' ')?;
            Some((parse_timestamp(ts)?, rest))
        })
}

/// The object name of a loader log line (`... loader: NAME: loaded ...`).
fn loaded_object(message: &str, verb: &str) -> Option<String> {
    let after = message.split_once("lightswitch::unwind::loader: ")?.1;
    Some(after.split_once(verb)?.0.to_string())
}

/// The pprof window files in `out`, decoded, oldest first.
fn read_windows(out: &Path) -> Result<Vec<proto::Profile>> {
    let mut windows = Vec::new();
    for entry in fs::read_dir(out)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "pb") {
            let bytes = fs::read(&path)?;
            windows.push(
                proto::Profile::decode(bytes.as_slice())
                    .with_context(|| format!("decoding {}", path.display()))?,
            );
        }
    }
    windows.sort_by_key(|p| p.time_nanos);
    Ok(windows)
}

fn run_once(
    tools: &Tools,
    workload_pids: &HashSet<u32>,
    seconds: f64,
    out: &Path,
) -> Result<StartupResult> {
    fs::create_dir_all(out)?;
    let running: Vec<u32> = pids();
    let expected = executable_objects(&running);
    let running: HashSet<u32> = running.into_iter().collect();
    let spawned = unix_ns_now();
    let output = Command::new(&tools.lightswitch)
        .args([
            "--sample-freq",
            "999",
            "--profile-format",
            "pprof",
            "--logging",
            "debug",
        ])
        .args([
            "--profile-interval",
            WINDOW_S,
            "--duration",
            &seconds.to_string(),
        ])
        .arg("--profile-path")
        .arg(out)
        .arg("--unwind-cache-dir")
        .arg(&tools.unwind_cache)
        .output()
        .context("running lightswitch")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        anyhow::bail!("lightswitch failed ({}): {}", output.status, stderr.trim());
    }
    let ms = |t: i64| (t - spawned) as f64 / 1e6;

    let windows = read_windows(out)?;
    let mut result = StartupResult {
        sampling_ms: log_lines(&stderr, "sampling ").next().map(|(t, _)| ms(t)),
        first_sample_ms: None,
        first_complete_ms: None,
        last_no_table_ms: None,
        no_table: (0, 0),
        objects: (expected.len(), 0),
        last_object_ms: None,
    };
    for p in &windows {
        let end = ms(p.time_nanos + p.duration_nanos);
        let s = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
        let functions: HashMap<u64, &str> = p.function.iter().map(|f| (f.id, s(f.name))).collect();
        let locations: HashMap<u64, Vec<&str>> = p
            .location
            .iter()
            .map(|l| {
                (
                    l.id,
                    l.line
                        .iter()
                        .filter_map(|x| functions.get(&x.function_id).copied())
                        .collect(),
                )
            })
            .collect();
        for sample in &p.sample {
            let count = sample.value.first().copied().unwrap_or(0).max(0) as u64;
            if count == 0 {
                continue;
            }
            result.first_sample_ms.get_or_insert(end);
            let pid = sample
                .label
                .iter()
                .find(|l| s(l.key) == "pid")
                .map(|l| l.num as u32);
            let names: Vec<&str> = sample
                .location_id
                .iter()
                .flat_map(|id| locations.get(id).into_iter().flatten().copied())
                .collect();
            let has = |n: &str| names.contains(&n);
            if pid.is_some_and(|p| workload_pids.contains(&p))
                && has("leaf")
                && has("f01")
                && has("main")
                && !names.iter().any(|n| n.starts_with("[unwind:"))
            {
                result.first_complete_ms.get_or_insert(end);
            }
            if pid.is_some_and(|p| running.contains(&p)) {
                result.no_table.1 += count;
                if has("[unwind: no_table]") {
                    result.no_table.0 += count;
                    result.last_no_table_ms = Some(end);
                }
            }
        }
    }
    let mut covered = HashSet::new();
    for verb in [": loaded ", ": no unwind table"] {
        for (t, message) in log_lines(&stderr, verb) {
            if let Some(name) = loaded_object(message, verb).filter(|n| expected.contains(n)) {
                if covered.insert(name) {
                    result.last_object_ms =
                        Some(result.last_object_ms.map_or(ms(t), |m| m.max(ms(t))));
                }
            }
        }
    }
    result.objects.1 = covered.len();
    Ok(result)
}

/// The `startup` mode: one cold and one warm run of `seconds` with one
/// workload process per CPU already running.
pub fn startup(tools: &Tools, workload: &Path, cpus: usize, quick: bool, doc: &Path) -> Result<()> {
    let seconds = if quick { 3.0 } else { 10.0 };
    let workloads = Workloads::start(workload, cpus)?;
    let workload_pids: HashSet<u32> = workloads.pids().into_iter().collect();
    // Let the workload get going (and show up in /proc/PID/maps) first.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = fs::remove_dir_all(&tools.unwind_cache);
    let mut rows = Vec::new();
    for cache in ["cold", "warm"] {
        eprintln!("overhead: start-up, {cache} unwind-table cache");
        let out: PathBuf = tools.scratch.join(format!("startup-{cache}"));
        let r = run_once(tools, &workload_pids, seconds, &out)?;
        let ms = |v: Option<f64>| report::num(v, 0);
        rows.push(vec![
            cache.to_string(),
            ms(r.sampling_ms),
            ms(r.first_sample_ms),
            ms(r.first_complete_ms),
            r.last_no_table_ms
                .map_or("none".into(), |v| format!("{v:.0}")),
            format!("{} / {}", r.no_table.0, r.no_table.1),
            format!("{} / {}", r.objects.1, r.objects.0),
            ms(r.last_object_ms),
        ]);
    }
    drop(workloads);
    let conditions = format!(
        "lightswitch at 999 Hz for {seconds} s in continuous mode with {WINDOW_S} s pprof windows, \
         one workload process per CPU already running; times in ms after lightswitch was spawned"
    );
    let body = format!(
        "{}\n\n{}\n\
         sampling: the `sampling N CPUs` log line. first sample / first complete stack: end of the \
         first window holding one (a complete stack: the workload's `leaf` ... `f01`, `main`, no \
         unwind marker). last no_table: end of the last window holding a `no_table` sample of a \
         process that was running before the start. objects: executable objects mapped by the \
         processes running at the start whose table lightswitch logged as loaded (or as absent: no \
         CFI), and when the last of them was; objects never sampled may load later than the run lasts.\n",
        report::machine_line(cpus, &conditions),
        report::table(
            &[
                "unwind cache",
                "sampling",
                "first sample",
                "first complete stack",
                "last no_table",
                "no_table samples / all (already running)",
                "objects covered",
                "last object",
            ],
            &rows
        )
    );
    println!("{body}");
    report::write_block(doc, "startup", &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_timestamps_parse() {
        assert_eq!(
            parse_timestamp("1970-01-01T00:00:01.5Z"),
            Some(1_500_000_000)
        );
        assert_eq!(
            parse_timestamp("2024-02-29T12:00:00.000001Z"),
            Some(1_709_208_000_000_001_000)
        );
    }

    #[test]
    fn loader_lines_name_their_object() {
        let line = "DEBUG lightswitch::unwind::loader: /usr/lib/libc.so.6: loaded 10 rows in 1 pages at row 0";
        assert_eq!(
            loaded_object(line, ": loaded ").as_deref(),
            Some("/usr/lib/libc.so.6")
        );
    }
}
