//! `python` mode: what walking CPython frames costs (docs/python.md). One
//! CPU-bound Python process (a recursion 20 deep over a loop, the script
//! below) runs throughout; over windows of `--seconds` the harness reads
//! its progress (iterations per second, from the file it rewrites every
//! 50 ms) and, in turn:
//!
//! - no profiler;
//! - `lightswitch --pids PID` at `--python-freq` Hz with its Python walk, and the
//!   same lightswitch process with the walk taken away: slot 1 of its
//!   `walker_programs` program array (the tail call into `walk_python`,
//!   src/sampling/bpf/python.h) deleted with `bpftool`, so every sample ends
//!   after its native walk, and put back for the next round. Read: the run
//!   time and run count of its `perf_event` programs (`fdinfo`, with
//!   `kernel.bpf_stats_enabled=1`; the tail-called walkers count in the
//!   entry program's run) and its CPU time;
//! - py-spy (`record -p PID -r FREQ`), blocking (its default: it stops the
//!   process for each sample) and `--nonblocking`: its CPU time.
//!
//! BPF ns per workload sample is the programs' run time, less the runs
//! that were not its samples (ticks of other processes, dropped at the pid
//! filter, and of idle CPUs: their cost per run is read in a half window
//! with the workload stopped), over the samples lightswitch recorded
//! (`lightswitch_samples_total` of its `/metrics`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::measure::{bpf_run_stats, cpu_between, cpu_time, BpfRunStats};
use crate::profiler::{self, Kind, Tools};
use crate::report::{machine_line, median, num, table, write_block};

/// The workload: `argv[1]` is the progress file ("ITERATIONS MONOTONIC_S").
const SCRIPT: &str = "import os, sys, time
out = sys.argv[1]
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def middle(depth):
    return middle(depth - 1) if depth else leaf(2000)
n, last = 0, time.monotonic()
while True:
    middle(20)
    n += 1
    now = time.monotonic()
    if now - last >= 0.05:
        with open(out + '.tmp', 'w') as f:
            f.write(f'{n} {now}')
        os.replace(out + '.tmp', out)
        last = now
";

/// What the `python` mode runs.
pub struct PythonConfig {
    /// The interpreter.
    pub python: PathBuf,
    /// Sampling frequency of both profilers, Hz.
    pub freq: u64,
    /// Length of each window, s.
    pub seconds: f64,
    /// Rounds of (Python walk, native walk) windows.
    pub rounds: usize,
    /// Time between starting a profiler and its first window, s.
    pub warmup: f64,
    /// CPUs of the machine (for the report's first line).
    pub cpus: usize,
    /// The markdown file whose `python` block is rewritten.
    pub doc: PathBuf,
}

/// The workload's progress: (iterations, its monotonic clock, s).
fn progress(file: &Path) -> Result<(f64, f64)> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut words = text.split_whitespace().map(str::parse::<f64>);
    match (words.next(), words.next()) {
        (Some(Ok(n)), Some(Ok(t))) => Ok((n, t)),
        _ => bail!("{}: not `ITERATIONS SECONDS`: {text:?}", file.display()),
    }
}

/// `lightswitch_samples_total` of the lightswitch serving `/metrics` at `addr`.
fn samples_total(addr: &str) -> Result<u64> {
    let text = reqwest::blocking::get(format!("http://{addr}/metrics"))
        .and_then(|r| r.error_for_status()?.text())
        .with_context(|| format!("GET http://{addr}/metrics"))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("lightswitch_samples_total ")?
                .trim()
                .parse()
                .ok()
        })
        .context("no lightswitch_samples_total in /metrics")
}

/// A free local TCP port.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One window's readings.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// Workload iterations per second.
    rate: f64,
    /// Workload iterations per second of its CPU time.
    rate_cpu: f64,
    /// The profiler's CPU, s.
    profiler_cpu_s: f64,
    /// Its BPF programs' run time and runs in the window.
    bpf: BpfRunStats,
    /// Samples of the workload lightswitch recorded (`/metrics`); 0 for others.
    samples: u64,
    seconds: f64,
}

/// Measure one window of `seconds` on `workload`, with the profiler
/// `profiler` (if any; `metrics`: the address of its `/metrics`, lightswitch's).
fn window(
    workload: u32,
    file: &Path,
    profiler: Option<u32>,
    metrics: Option<&str>,
    seconds: f64,
) -> Result<Window> {
    let s0 = metrics.map(samples_total).transpose()?;
    let (n0, t0) = progress(file)?;
    let w0 = cpu_time(workload)?;
    let p0 = profiler.map(cpu_time).transpose()?;
    let b0 = profiler.map(bpf_run_stats).transpose()?;
    thread::sleep(Duration::from_secs_f64(seconds));
    let (n1, t1) = progress(file)?;
    let w1 = cpu_time(workload)?;
    let p1 = profiler.map(cpu_time).transpose()?;
    let b1 = profiler.map(bpf_run_stats).transpose()?;
    let s1 = metrics.map(samples_total).transpose()?;
    let bpf = match (b0, b1) {
        (Some(a), Some(b)) => BpfRunStats {
            run_time_ns: b.run_time_ns - a.run_time_ns,
            run_cnt: b.run_cnt - a.run_cnt,
        },
        _ => BpfRunStats::default(),
    };
    Ok(Window {
        rate: (n1 - n0) / (t1 - t0).max(1e-9),
        rate_cpu: (n1 - n0) / (cpu_between(&w0, &w1) as f64 / 1e9).max(1e-9),
        profiler_cpu_s: match (p0, p1) {
            (Some(a), Some(b)) => cpu_between(&a, &b) as f64 / 1e9,
            _ => 0.0,
        },
        bpf,
        samples: s1.unwrap_or(0) - s0.unwrap_or(0),
        seconds,
    })
}

/// `bpftool ARGS`, JSON output parsed.
fn bpftool(args: &[&str]) -> Result<serde_json::Value> {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .context("running bpftool (scripts/setup.sh installs it)")?;
    if !out.status.success() {
        bail!(
            "bpftool {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_slice(&out.stdout).context("bpftool's JSON")
}

/// The id of the BPF object named `name` (`kind`: `map` or `prog`) that
/// process `pid` holds: the ids of its descriptors (`map_id` / `prog_id` in
/// `/proc/PID/fdinfo`), named by `bpftool KIND show id ID`.
fn object_id(kind: &str, name: &str, pid: u32) -> Result<u64> {
    let field = format!("{kind}_id:");
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let info = std::fs::read_to_string(entry?.path()).unwrap_or_default();
        if let Some(id) = info
            .lines()
            .find_map(|l| l.strip_prefix(&field)?.trim().parse::<u64>().ok())
        {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    for id in ids {
        if bpftool(&[kind, "show", "id", &id.to_string()])?["name"] == name {
            return Ok(id);
        }
    }
    bail!("no {kind} {name} held by pid {pid}")
}

/// Turn the Python walk of the lightswitch process `pid` on or off (slot 1 of walker_programs).
fn python_walk(pid: u32, on: bool) -> Result<()> {
    let map = object_id("map", "walker_programs", pid)?.to_string();
    if on {
        let prog = object_id("prog", "walk_python", pid)?.to_string();
        let key = ["key", "1", "0", "0", "0"];
        bpftool(
            &[
                &["map", "update", "id", &map][..],
                &key,
                &["value", "id", &prog],
            ]
            .concat(),
        )?;
    } else {
        bpftool(&["map", "delete", "id", &map, "key", "1", "0", "0", "0"])?;
    }
    Ok(())
}

/// Start py-spy on `pid` at `freq` Hz, blocking or not, writing under `scratch`.
fn start_spy(spy: &Path, pid: u32, freq: u64, nonblocking: bool, scratch: &Path) -> Result<Child> {
    let mut c = Command::new(spy);
    c.args(["record", "-p", &pid.to_string(), "-r", &freq.to_string()])
        .args(["-d", "3600", "-f", "raw", "-o"])
        .arg(scratch.join(format!("spy-{nonblocking}.txt")));
    if nonblocking {
        c.arg("--nonblocking");
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting py-spy")
}

/// py-spy: on the PATH, else in the target directory's `py-spy-venv` (scripts/setup.sh).
fn py_spy(tools: &Tools) -> Option<PathBuf> {
    let venv = tools
        .lightswitch
        .parent()?
        .parent()?
        .join("py-spy-venv/bin/py-spy");
    venv.exists()
        .then_some(venv)
        .or_else(|| profiler::which("py-spy"))
}

/// Median over windows of `f`.
fn med(windows: &[Window], f: impl Fn(&Window) -> f64) -> Option<f64> {
    median(windows.iter().map(f).collect())
}

/// One row of the table: what; wall-clock and CPU-time rate against no
/// profiler; profiler CPU, % and µs per sample; BPF ns per workload sample
/// (the run time less `foreign` ns for each run that was not one of its
/// samples) and per run. Samples: lightswitch's own count, or `freq` × the
/// window for py-spy.
fn row(label: &str, windows: &[Window], none: &[Window], freq: u64, foreign: f64) -> Vec<String> {
    let none_rate = med(none, |w| w.rate).unwrap_or(f64::NAN);
    let none_cpu = med(none, |w| w.rate_cpu).unwrap_or(f64::NAN);
    let samples = |w: &Window| match w.samples {
        0 => freq as f64 * w.seconds,
        n => n as f64,
    };
    let per_sample = |w: &Window| {
        let others = w.bpf.run_cnt.saturating_sub(w.samples) as f64;
        (w.bpf.run_time_ns as f64 - foreign * others) / samples(w)
    };
    let bpf = windows.iter().any(|w| w.bpf.run_cnt > 0);
    vec![
        label.to_string(),
        num(med(windows, |w| w.rate / none_rate), 3),
        num(med(windows, |w| w.rate_cpu / none_cpu), 3),
        num(med(windows, |w| 100.0 * w.profiler_cpu_s / w.seconds), 2),
        num(med(windows, |w| 1e6 * w.profiler_cpu_s / samples(w)), 2),
        num(med(windows, per_sample).filter(|_| bpf), 0),
        num(
            med(windows, |w| {
                w.bpf.run_time_ns as f64 / w.bpf.run_cnt.max(1) as f64
            })
            .filter(|_| bpf),
            0,
        ),
    ]
}

/// Run the `python` mode and write its block.
pub fn python(tools: &Tools, cfg: &PythonConfig) -> Result<()> {
    let scratch = tools.scratch.join("python");
    std::fs::create_dir_all(&scratch)?;
    let script = scratch.join("workload.py");
    std::fs::write(&script, SCRIPT)?;
    let file = scratch.join("progress");
    let mut workload = Command::new(&cfg.python)
        .arg(&script)
        .arg(&file)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", cfg.python.display()))?;
    let pid = workload.id();
    let result = measure_all(tools, cfg, pid, &file);
    let _ = workload.kill();
    let _ = workload.wait();
    let w = result?;
    // BPF ns of a run that is not a workload sample (a tick of another
    // process, dropped at the pid filter, or of an idle CPU): the runs
    // while the workload was stopped.
    let foreign = med(&w.stopped, |w| {
        w.bpf.run_time_ns as f64 / w.bpf.run_cnt.max(1) as f64
    })
    .unwrap_or(0.0);
    let mut rows = vec![
        row("none", &w.none, &w.none, cfg.freq, foreign),
        row(
            "lightswitch, Python walk",
            &w.walked,
            &w.none,
            cfg.freq,
            foreign,
        ),
        row(
            "lightswitch, native walk only",
            &w.native,
            &w.none,
            cfg.freq,
            foreign,
        ),
    ];
    if !w.blocking.is_empty() {
        let blocking = row(
            "py-spy (default: blocking)",
            &w.blocking,
            &w.none,
            cfg.freq,
            0.0,
        );
        rows.push(blocking);
        rows.push(row(
            "py-spy --nonblocking",
            &w.nonblocking,
            &w.none,
            cfg.freq,
            0.0,
        ));
    }
    let per_sample = |ws: &[Window]| {
        med(ws, |w| {
            let others = w.bpf.run_cnt.saturating_sub(w.samples) as f64;
            (w.bpf.run_time_ns as f64 - foreign * others) / w.samples.max(1) as f64
        })
    };
    let ratio = per_sample(&w.walked)
        .zip(per_sample(&w.native))
        .map(|(a, b)| a / b);
    let version = Command::new(&cfg.python)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let body = format!(
        "{}\n\n{}\nBPF time per sample, Python walk / native walk only: {}x. A run that is \
         not a workload sample: {} ns (median, the workload stopped). {version} \
         ({}), {} Hz, {} rounds of {} s windows (medians).\n\nColumns: workload iterations \
         per wall-clock second and per second of its own CPU time, against no profiler; \
         profiler CPU, % of one CPU and µs per sample (lightswitch: the samples it recorded; \
         py-spy: frequency × time); BPF run time per workload sample (less the runs that \
         were not its samples) and per program run (a run for \
         every CPU's tick).\n",
        machine_line(cfg.cpus, "one CPU-bound CPython process, profiled by pid"),
        table(
            &[
                "profiler",
                "rate (wall)",
                "rate (CPU)",
                "CPU %",
                "CPU µs/sample",
                "BPF ns/sample",
                "BPF ns/run",
            ],
            &rows
        ),
        num(ratio, 2),
        num(Some(foreign), 0),
        cfg.python.display(),
        cfg.freq,
        cfg.rounds,
        cfg.seconds,
    );
    eprintln!("{body}");
    write_block(&cfg.doc, "python", &body)
}

/// The windows of each configuration.
#[derive(Default)]
struct AllWindows {
    none: Vec<Window>,
    walked: Vec<Window>,
    native: Vec<Window>,
    /// lightswitch running, the workload stopped (SIGSTOP).
    stopped: Vec<Window>,
    blocking: Vec<Window>,
    nonblocking: Vec<Window>,
}

/// Rounds of: a window without profiler; lightswitch started, one window
/// with its Python walk, one without, a half window with the workload
/// stopped, lightswitch stopped; py-spy blocking, then non-blocking, a
/// window each.
fn measure_all(tools: &Tools, cfg: &PythonConfig, pid: u32, file: &Path) -> Result<AllWindows> {
    thread::sleep(Duration::from_secs_f64(1.0));
    let spy = py_spy(tools);
    if spy.is_none() {
        eprintln!("python: py-spy not found (scripts/setup.sh installs it): no py-spy rows");
    }
    let mut all = AllWindows::default();
    for round in 0..cfg.rounds {
        eprintln!("python: round {}/{}", round + 1, cfg.rounds);
        all.none.push(window(pid, file, None, None, cfg.seconds)?);
        let addr = format!("127.0.0.1:{}", free_port()?);
        let extra = [
            "--pids",
            &pid.to_string(),
            "--duration",
            "3600",
            "--listen",
            &addr,
        ]
        .map(String::from);
        let mut ls = profiler::start(tools, Kind::Lightswitch, cfg.freq, "python", &extra)?;
        // Sampling once its samples count up; then the warm-up.
        while samples_total(&addr).unwrap_or(0) == 0 {
            ls.check_alive()?;
            thread::sleep(Duration::from_millis(100));
        }
        thread::sleep(Duration::from_secs_f64(cfg.warmup));
        let metrics = Some(addr.as_str());
        all.walked
            .push(window(pid, file, Some(ls.pid()), metrics, cfg.seconds)?);
        python_walk(ls.pid(), false)?;
        all.native
            .push(window(pid, file, Some(ls.pid()), metrics, cfg.seconds)?);
        python_walk(ls.pid(), true)?;
        // SAFETY: kill(2) of the workload we started.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        let stopped = window(pid, file, Some(ls.pid()), metrics, cfg.seconds / 2.0);
        // SAFETY: as above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
        all.stopped.push(stopped?);
        ls.interrupt();
        let finished = ls.wait(None)?;
        eprintln!("lightswitch: {}", finished.stdout.trim());
        let Some(spy) = &spy else { continue };
        for nonblocking in [false, true] {
            let scratch = tools.scratch.join("python");
            let mut child = start_spy(spy, pid, cfg.freq, nonblocking, &scratch)?;
            thread::sleep(Duration::from_secs_f64(cfg.warmup));
            let w = window(pid, file, Some(child.id()), None, cfg.seconds)?;
            let _ = child.kill();
            let _ = child.wait();
            match nonblocking {
                false => all.blocking.push(w),
                true => all.nonblocking.push(w),
            }
        }
    }
    Ok(all)
}
