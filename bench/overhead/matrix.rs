//! The matrix and long-run modes: paired runs of each profiler at each
//! frequency against runs of the workload alone, measured over a window
//! after a warm-up (the protocol is in `main.rs`'s header), and the table
//! they write.

use std::path::PathBuf;
use std::thread::sleep;
use std::time::Duration;

use anyhow::{bail, Result};

use crate::measure::{self, BpfRunStats, Throttling};
use crate::profiler::{self, Finished, Kind, Tools};
use crate::report::{self, median, num};
use crate::workload::{self, Workloads};

/// Settings of the matrix and long-run modes (and what the other modes
/// share: the tools, the workload, the CPUs, the document written).
pub struct Ctx {
    /// The profilers' binaries and scratch space.
    pub tools: Tools,
    /// The workload binary (`workload.c`), one process per CPU.
    pub workload: PathBuf,
    /// CPUs of the machine.
    pub cpus: usize,
    /// Rounds of the matrix (one paired run per row each).
    pub rounds: usize,
    /// Length of a matrix window, s.
    pub seconds: f64,
    /// Sampling frequencies of the matrix, Hz.
    pub freqs: Vec<u64>,
    /// Profilers of the matrix; empty: lightswitch and both perf modes.
    pub profilers: Vec<Kind>,
    /// Warm-up before a window, s.
    pub warmup: f64,
    /// Length of the long-run (soak, rss) window, s.
    pub long_seconds: f64,
    /// The document whose blocks are rewritten.
    pub doc: PathBuf,
}

/// What one run measured.
#[derive(Debug, Clone)]
struct RunResult {
    /// Workload blocks of work per second over the window, all copies.
    throughput: f64,
    /// Profiler CPU (user + system) over the window, ns.
    cpu_ns: Option<u64>,
    /// BPF run-time counters over the window (lightswitch only).
    bpf: Option<BpfRunStats>,
    /// Samples taken during the window (lightswitch: BPF run count;
    /// perf: its mean sample rate times the window).
    window_samples: Option<f64>,
    /// Length of the window, s.
    window_s: f64,
    /// `VmHWM` at the end of the window, KiB.
    hwm_kib: Option<u64>,
    /// `RssAnon` at the end of the window (heap and other private memory;
    /// `VmRSS` also counts mapped files and shared mappings such as BPF maps), KiB.
    anon_kib: Option<u64>,
    /// The profiler's own report.
    finished: Option<Finished>,
    /// Kernel throttling around the run.
    throttling: Throttling,
}

impl RunResult {
    fn bpf_ns_per_sample(&self) -> Option<f64> {
        self.bpf
            .filter(|b| b.run_cnt > 0)
            .map(|b| b.run_time_ns as f64 / b.run_cnt as f64)
    }

    /// Samples per second per CPU over the window.
    fn achieved_hz(&self, cpus: usize) -> Option<f64> {
        Some(self.window_samples? / self.window_s.max(1e-9) / cpus as f64)
    }

    fn cpu_us_per_sample(&self) -> Option<f64> {
        let samples = self.window_samples.filter(|s| *s > 0.0)?;
        Some(self.cpu_ns? as f64 / samples / 1e3)
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

/// One measured run: `kind` at `freq` Hz (none: the workload alone), a
/// warm-up of `warmup` s and a window of `seconds` s.
fn measure_run(
    ctx: &Ctx,
    kind: Option<Kind>,
    freq: u64,
    warmup: f64,
    seconds: f64,
) -> Result<RunResult> {
    let watch = measure::ThrottleWatch::start()?;
    let mut workloads = Workloads::start(&ctx.workload, ctx.cpus)?;
    let name = format!(
        "{}-{freq}",
        kind.map_or("none", |k| k.label()).replace(' ', "-")
    );
    let mut running = kind
        .map(|k| profiler::start(&ctx.tools, k, freq, &name, &[]))
        .transpose()?;
    sleep(secs(warmup));
    if let Some(r) = running.as_mut() {
        r.check_alive()?;
    }
    let pid = running.as_ref().map(|r| r.pid());
    let read_bpf = |pid| (kind == Some(Kind::Lightswitch)).then(|| measure::bpf_run_stats(pid));
    let bpf0 = pid.and_then(read_bpf).transpose()?;
    let cpu0 = pid.map(measure::cpu_time).transpose()?;
    let c0 = workloads.counts()?;
    sleep(secs(seconds));
    let c1 = workloads.counts()?;
    let cpu1 = pid.map(measure::cpu_time).transpose()?;
    let bpf1 = pid.and_then(read_bpf).transpose()?;
    let hwm_kib = pid.and_then(|p| measure::status_kib(p, "VmHWM"));
    let anon_kib = pid.and_then(|p| measure::status_kib(p, "RssAnon"));
    let window = c1.0.duration_since(c0.0).as_secs_f64();
    let finished = running
        .map(|r| r.stop(ctx.tools.perf.as_deref()))
        .transpose()?;
    drop(workloads);
    let throttling = watch.finish()?;
    let bpf = bpf0.zip(bpf1).map(|(a, b)| BpfRunStats {
        run_time_ns: b.run_time_ns.saturating_sub(a.run_time_ns),
        run_cnt: b.run_cnt.saturating_sub(a.run_cnt),
    });
    let window_samples = match &bpf {
        Some(b) => Some(b.run_cnt as f64),
        None => finished
            .as_ref()
            .and_then(|f| f.sample_rate)
            .map(|r| r * window),
    };
    Ok(RunResult {
        throughput: workload::throughput(&c0, &c1),
        cpu_ns: cpu0.zip(cpu1).map(|(a, b)| measure::cpu_between(&a, &b)),
        bpf,
        window_samples,
        window_s: window,
        hwm_kib,
        anon_kib,
        finished,
        throttling,
    })
}

/// One table row: a configuration's runs (one per round) and the matching
/// baselines' throughputs.
struct Row {
    kind: Kind,
    freq: u64,
    runs: Vec<RunResult>,
    ratios: Vec<f64>,
    /// Runs that failed (the profiler could not start, or exited early).
    failures: Vec<String>,
}

const ROW_HEADER: [&str; 14] = [
    "profiler",
    "Hz",
    "Hz per CPU achieved",
    "BPF ns/sample",
    "CPU µs/sample",
    "VmHWM MiB (steady)",
    "RssAnon MiB",
    "peak RSS MiB",
    "samples",
    "lost",
    "complete stacks",
    "throughput vs none",
    "throttled",
    "rounds",
];

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

impl Row {
    fn cells(&self, cpus: usize) -> Vec<String> {
        let med = |f: &dyn Fn(&RunResult) -> Option<f64>, digits| {
            num(median(self.runs.iter().filter_map(f).collect()), digits)
        };
        let finished: Vec<&Finished> = self
            .runs
            .iter()
            .filter_map(|r| r.finished.as_ref())
            .collect();
        let complete = median(
            finished
                .iter()
                .filter(|f| !f.unwind.is_empty())
                .map(|f| {
                    let total: u64 = f.unwind.values().sum();
                    100.0 * *f.unwind.get("complete").unwrap_or(&0) as f64 / total.max(1) as f64
                })
                .collect(),
        );
        let throttled: Vec<&Throttling> = self
            .runs
            .iter()
            .map(|r| &r.throttling)
            .filter(|t| t.throttled())
            .collect();
        let throttled = match throttled.first() {
            None => "no".to_string(),
            Some(t) => format!(
                "yes in {}/{} ({} messages, max rate {} → {})",
                throttled.len(),
                self.runs.len(),
                throttled.iter().map(|t| t.messages).sum::<usize>(),
                t.rate_before,
                t.rate_after
            ),
        };
        vec![
            self.kind.label().to_string(),
            self.freq.to_string(),
            med(&|r| r.achieved_hz(cpus), 0),
            med(&|r| r.bpf_ns_per_sample(), 0),
            med(&|r| r.cpu_us_per_sample(), 2),
            med(&|r| r.hwm_kib.map(mib), 1),
            med(&|r| r.anon_kib.map(mib), 1),
            med(&|r| r.finished.as_ref().map(|f| mib(f.max_rss_kib)), 1),
            med(&|r| r.finished.as_ref().map(|f| f.samples as f64), 0),
            finished
                .iter()
                .map(|f| f.lost)
                .max()
                .map_or("—".into(), |l| l.to_string()),
            complete.map_or("—".into(), |c| format!("{c:.1}%")),
            num(median(self.ratios.clone()), 3),
            throttled,
            match self.failures.first() {
                None => self.runs.len().to_string(),
                Some(f) => format!("{} ({} failed: {f})", self.runs.len(), self.failures.len()),
            },
        ]
    }
}

/// A run without profiler then one with `kind`: the pair gives one throughput
/// ratio. A failed pair is recorded in the row (and the harness goes on).
fn paired_run(ctx: &Ctx, row: &mut Row, seconds: f64, baseline_seconds: f64) {
    if let Err(err) = try_paired_run(ctx, row, seconds, baseline_seconds) {
        eprintln!(
            "overhead: {} at {} Hz failed: {err:#}",
            row.kind.label(),
            row.freq
        );
        row.failures
            .push(format!("{err:#}").replace('|', "/").replace('\n', " "));
    }
}

fn try_paired_run(ctx: &Ctx, row: &mut Row, seconds: f64, baseline_seconds: f64) -> Result<()> {
    eprintln!(
        "overhead: {} at {} Hz, {seconds} s (after {baseline_seconds} s without profiler)",
        row.kind.label(),
        row.freq
    );
    let base = measure_run(ctx, None, 0, ctx.warmup.min(1.0), baseline_seconds)?;
    let run = measure_run(ctx, Some(row.kind), row.freq, ctx.warmup, seconds)?;
    row.ratios.push(run.throughput / base.throughput);
    row.runs.push(run);
    Ok(())
}

const NOTES: &str = "Hz per CPU achieved: samples taken in the window / window / CPUs. \
BPF ns/sample: run_time_ns / run_cnt of lightswitch's `perf_event` programs \
over the window (tail-called walker programs count in the entry program); perf has no BPF. \
CPU µs/sample: the profiler's user + system CPU over the window (start-up excluded) per sample \
taken in it (lightswitch: BPF run count; perf: its mean sample rate × window; perf's \
post-processing after the stop is not counted). VmHWM: peak RSS at the end of the window; RssAnon: its private (heap) part then, \
without mapped files and shared mappings such as BPF maps; peak RSS: over the whole process life, including writing the profile (ru_maxrss). samples, lost: \
the profiler's own counts for the run (perf: SAMPLE events, and the lost samples its report counts under LOST_SAMPLES). \
complete stacks: lightswitch's share of user stacks unwound to the outermost frame. \
throughput: the workload's rate with the profiler / without, runs alternating, median over rounds. \
throttled: `perf: interrupt took too long` in the kernel log or a lowered \
`kernel.perf_event_max_sample_rate` (restored after each run).";

/// The matrix mode: every profiler at every frequency, paired with runs
/// without profiler, over `ctx.rounds` rounds; writes its table.
pub fn matrix(ctx: &Ctx) -> Result<()> {
    let mut kinds = ctx.profilers.clone();
    if kinds.is_empty() {
        kinds.push(Kind::Lightswitch);
        if ctx.tools.perf.is_some() {
            kinds.extend([Kind::PerfFp, Kind::PerfDwarf]);
        } else {
            eprintln!("overhead: perf not found: the matrix has lightswitch only (bash scripts/setup.sh installs linux-perf)");
        }
    } else if kinds.iter().any(|k| *k != Kind::Lightswitch) && ctx.tools.perf.is_none() {
        bail!("perf not found (bash scripts/setup.sh installs linux-perf)");
    }
    let mut rows: Vec<Row> = kinds
        .iter()
        .flat_map(|&kind| {
            ctx.freqs.iter().map(move |&freq| Row {
                kind,
                freq,
                runs: Vec::new(),
                ratios: Vec::new(),
                failures: Vec::new(),
            })
        })
        .collect();
    for round in 0..ctx.rounds {
        eprintln!("overhead: matrix round {}/{}", round + 1, ctx.rounds);
        for row in rows.iter_mut() {
            paired_run(ctx, row, ctx.seconds, ctx.seconds);
        }
    }
    let conditions = format!(
        "{} round(s) × {} s windows after {} s warm-up, one workload process per CPU",
        ctx.rounds, ctx.seconds, ctx.warmup
    );
    write_rows(ctx, "matrix", &rows, &conditions)
}

fn write_rows(ctx: &Ctx, mode: &str, rows: &[Row], conditions: &str) -> Result<()> {
    let cells: Vec<Vec<String>> = rows.iter().map(|r| r.cells(ctx.cpus)).collect();
    let body = format!(
        "{}\n\n{}\n{NOTES}\n",
        report::machine_line(ctx.cpus, conditions),
        report::table(&ROW_HEADER, &cells)
    );
    println!("{body}");
    report::write_block(&ctx.doc, mode, &body)
}

/// One long lightswitch run at `freq` (soak: 10 kHz; rss: 999 Hz).
pub fn long_run(ctx: &Ctx, mode: &str, freq: u64) -> Result<()> {
    let mut row = Row {
        kind: Kind::Lightswitch,
        freq,
        runs: Vec::new(),
        ratios: Vec::new(),
        failures: Vec::new(),
    };
    paired_run(ctx, &mut row, ctx.long_seconds, ctx.long_seconds.min(10.0));
    let conditions = format!(
        "one {} s window after {} s warm-up, one workload process per CPU; throughput against a {} s run without profiler",
        ctx.long_seconds,
        ctx.warmup,
        ctx.long_seconds.min(10.0)
    );
    write_rows(ctx, mode, &[row], &conditions)
}
