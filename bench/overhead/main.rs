//! Overhead harness (issue 7): what profiling costs, for lightswitch and,
//! in the same run, `perf record -a -g` and `perf record -a --call-graph dwarf`.
//!
//! Run it with `sudo bash bench/overhead/run.sh [MODE] [OPTIONS]` (the
//! script builds the workload and lightswitch, then runs this example as
//! root). Every mode rewrites its block of `docs/performance.md`.
//!
//! Protocol of one measured run: start one workload process per CPU
//! (`workload.c`: a hot loop 30 frames deep, no frame pointers), start the
//! profiler on the whole machine, wait the warm-up (start-up excluded), then
//! read at t0 and t1 = t0 + `--seconds`: the workload counters (throughput),
//! the profiler's CPU time (`/proc/PID/task/*/schedstat`), the run time of
//! its `perf_event` BPF programs (`/proc/PID/fdinfo`, with
//! `kernel.bpf_stats_enabled=1`), and its `VmHWM`; then stop it with SIGINT
//! and take its peak RSS from `wait4` and its sample and loss counts from its
//! own report. Throttling is read around each run from `/dev/kmsg` and
//! `kernel.perf_event_max_sample_rate` (restored after each run).

mod churn;
mod hostile;
mod measure;
mod profiler;
mod readings;
mod report;
mod startup;
mod timeline;
mod verdict;
mod workload;

use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};

use measure::{BpfRunStats, Throttling};
use profiler::{Finished, Kind, Tools};
use report::{median, num};
use workload::Workloads;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// lightswitch, perf -g and perf dwarf at 100, 1000 and 10000 Hz, each
    /// run paired with a run without profiler.
    Matrix,
    /// lightswitch at 10 kHz on every CPU for 60 s: losses and throttling.
    Soak,
    /// lightswitch at 999 Hz for 60 s: peak RSS.
    Rss,
    /// Churn soak: lightswitch in continuous mode (one agent per
    /// `--windows` length, all at once) for `--churn-seconds` while shell
    /// loops start short-lived programs: memory, CPU, samples, lost, windows
    /// written and crashes over time. Fails if an agent crashed, did not
    /// exit 0, or dropped a window to a panic.
    Churn,
    /// Timelines (issue 14): lightswitch at `--timeline-freq` on every CPU
    /// for `--long-seconds` with `--profile-format firefox,folded`, stopped
    /// with SIGINT: samples, distinct stacks, time from the stop to each
    /// file, sizes, peak RSS, and whether the timeline kept every sample.
    Timeline,
    /// Time from start to the first complete stack and to every running
    /// process covered, with a cold and a warm unwind-table cache.
    Startup,
    /// Every mode above, in that order (timeline before start-up).
    All,
}

/// Overhead harness: run as root through `bench/overhead/run.sh`.
#[derive(Debug, Parser)]
struct Args {
    /// What to measure.
    #[arg(value_enum, default_value_t = Mode::Matrix)]
    mode: Mode,
    /// Short runs (smoke test): 1 round of 2 s, 1 s warm-up, 5 s soak and
    /// RSS runs, 20 s churn.
    #[arg(long)]
    quick: bool,
    /// Matrix: rounds of (no profiler, profiler) pairs per configuration.
    #[arg(long)]
    rounds: Option<usize>,
    /// Matrix: length of each measurement window, s.
    #[arg(long)]
    seconds: Option<f64>,
    /// Matrix: sampling frequencies, Hz.
    #[arg(long, value_delimiter = ',', default_values_t = [100, 1000, 10000])]
    freqs: Vec<u64>,
    /// Matrix: profilers to measure (default: lightswitch, and perf when
    /// installed).
    #[arg(long, value_enum, value_delimiter = ',')]
    profilers: Vec<Kind>,
    /// Time between starting a profiler and the start of the window, s.
    #[arg(long)]
    warmup: Option<f64>,
    /// Soak, RSS and timeline runs: length of the window, s (default 60).
    #[arg(long)]
    long_seconds: Option<f64>,
    /// Timeline: sampling frequency, Hz.
    #[arg(long, default_value_t = 10_000)]
    timeline_freq: u64,
    /// Timeline: the format that keeps every sample's time (`firefox`, or
    /// `otlp`, whose results go to the `timeline-otlp` block).
    #[arg(long, value_enum, default_value_t = timeline::TimelineFormat::Firefox)]
    timeline_format: timeline::TimelineFormat,
    /// Churn run length, s (default 600; 20 with --quick).
    #[arg(long)]
    churn_seconds: Option<f64>,
    /// Churn: window lengths, s, one agent each (all run at once).
    #[arg(long, value_delimiter = ',', default_value = "10")]
    windows: Vec<f64>,
    /// Churn: sampling frequency, Hz.
    #[arg(long, default_value_t = 997)]
    churn_freq: u64,
    /// Churn: what the churn loops start.
    #[arg(long, value_enum, default_value_t = churn::ChurnLoad::Mixed)]
    churn_load: churn::ChurnLoad,
    /// Churn: copies of the churn loop.
    #[arg(long, default_value_t = 1)]
    churn_loops: usize,
    /// Churn: time between two readings, s (default: the run / 60).
    #[arg(long)]
    churn_every: Option<f64>,
    /// Churn: append one tab-separated line per agent and reading to this file
    /// (window s, t s, peak VmRSS since the previous reading KiB, VmRSS KiB, RssAnon KiB, CPU %, samples, lost, windows
    /// written, windows panicked, samples missing a mapping).
    #[arg(long)]
    churn_log: Option<PathBuf>,
    /// Churn: a hostile-neighbour soak (issue 40): N unprivileged processes
    /// of each `--hostile-kinds` beside the churn, and a root bystander. Fails
    /// unless every agent hands over every window (none dropped), stays under
    /// 128 MiB of VmRSS, gives the bystander at least 90% of its CPU time x
    /// the frequency in samples, and exits 0 within 60 s of SIGINT.
    /// 0: the bystander alone.
    #[arg(long, value_name = "N")]
    hostile: Option<usize>,
    /// Churn with --hostile: the kinds of neighbour (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    hostile_kinds: Vec<hostile::HostileKind>,
    /// The hostile neighbours' program (built by run.sh from hostile.c).
    #[arg(long)]
    hostile_program: Option<PathBuf>,
    /// The workload binary (built by run.sh from workload.c).
    #[arg(long)]
    workload: PathBuf,
    /// The lightswitch binary.
    #[arg(long, default_value = "target/release/lightswitch")]
    lightswitch: PathBuf,
    /// The markdown file to (re)write.
    #[arg(long, default_value = "docs/performance.md")]
    doc: PathBuf,
}

/// Settings of this harness run.
struct Ctx {
    tools: Tools,
    workload: PathBuf,
    cpus: usize,
    rounds: usize,
    seconds: f64,
    freqs: Vec<u64>,
    profilers: Vec<Kind>,
    warmup: f64,
    long_seconds: f64,
    churn: churn::ChurnConfig,
    doc: PathBuf,
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

fn matrix(ctx: &Ctx) -> Result<()> {
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
fn long_run(ctx: &Ctx, mode: &str, freq: u64) -> Result<()> {
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

fn shell_quote(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

fn run(args: &Args) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the overhead harness must run as root (it loads BPF programs, profiles the whole machine and sets kernel.bpf_stats_enabled): sudo bash bench/overhead/run.sh");
    }
    for (what, path) in [
        ("workload", &args.workload),
        ("lightswitch", &args.lightswitch),
    ] {
        if !path.is_file() {
            bail!(
                "{what} binary {} not found (bench/overhead/run.sh builds it)",
                path.display()
            );
        }
    }
    let perf = profiler::which("perf");
    let scratch = tempfile::Builder::new()
        .prefix("lightswitch-overhead-")
        .tempdir()
        .context("creating a scratch directory")?;
    let unwind_cache = scratch.path().join("unwind-cache");
    let quick = args.quick;
    let churn_seconds = args
        .churn_seconds
        .unwrap_or(if quick { 20.0 } else { 600.0 });
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ctx = Ctx {
        tools: Tools {
            lightswitch: std::fs::canonicalize(&args.lightswitch)?,
            perf,
            scratch: scratch.path().to_path_buf(),
            unwind_cache,
        },
        workload: std::fs::canonicalize(&args.workload)?,
        cpus,
        rounds: args.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1),
        seconds: args.seconds.unwrap_or(if quick { 2.0 } else { 10.0 }),
        freqs: args.freqs.clone(),
        profilers: args.profilers.clone(),
        warmup: args.warmup.unwrap_or(if quick { 1.0 } else { 3.0 }),
        long_seconds: args.long_seconds.unwrap_or(if quick { 5.0 } else { 60.0 }),
        churn: churn::ChurnConfig {
            seconds: churn_seconds,
            windows_s: args.windows.clone(),
            freq: args.churn_freq,
            load: args.churn_load,
            loops: args.churn_loops,
            every_s: args.churn_every.unwrap_or(churn_seconds / 60.0),
            log: args.churn_log.clone(),
            doc: args.doc.clone(),
            cpus,
            hostile: hostile::config(
                args.hostile,
                &args.hostile_kinds,
                args.hostile_program.as_deref(),
            )?,
        },
        doc: args.doc.clone(),
    };
    measure::set_sysctl_for_run("kernel.bpf_stats_enabled", "1")?;
    let modes = match args.mode {
        Mode::All => vec![
            Mode::Matrix,
            Mode::Soak,
            Mode::Rss,
            Mode::Churn,
            Mode::Timeline,
            Mode::Startup,
        ],
        m => vec![m],
    };
    for mode in modes {
        let started = Instant::now();
        match mode {
            Mode::Matrix => matrix(&ctx)?,
            Mode::Soak => long_run(&ctx, "soak", 10_000)?,
            Mode::Rss => long_run(&ctx, "rss", 999)?,
            Mode::Churn => churn::churn(&ctx.tools, &ctx.workload, &ctx.churn)?,
            Mode::Timeline => timeline::timeline(
                &ctx.tools,
                &timeline::TimelineConfig {
                    workload: ctx.workload.clone(),
                    freq: args.timeline_freq,
                    seconds: ctx.long_seconds,
                    cpus: ctx.cpus,
                    doc: ctx.doc.clone(),
                    format: args.timeline_format,
                },
            )?,
            Mode::Startup => {
                startup::startup(&ctx.tools, &ctx.workload, ctx.cpus, quick, &ctx.doc)?
            }
            Mode::All => unreachable!("expanded above"),
        }
        eprintln!(
            "overhead: {mode:?} took {:.0} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    // Ctrl-C: put the sysctls back before leaving (the children get the signal too).
    let _ = ctrlc::set_handler(|| {
        hostile::cleanup();
        measure::restore_sysctls();
        std::process::exit(130);
    });
    let result = run(&args);
    hostile::cleanup();
    measure::restore_sysctls();
    if let Err(err) = result {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}
