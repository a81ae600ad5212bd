//! Overhead harness (docs/performance.md): what profiling costs, for lightswitch and,
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
mod matrix;
mod measure;
mod profiler;
mod python;
mod readings;
mod report;
mod startup;
mod timeline;
mod verdict;
mod workload;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};

use matrix::{long_run, matrix, Ctx};
use profiler::{Kind, Tools};

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
    /// Timelines (decision 0012): lightswitch at `--timeline-freq` on every CPU
    /// for `--long-seconds` with `--profile-format firefox,folded`, stopped
    /// with SIGINT: samples, distinct stacks, time from the stop to each
    /// file, sizes, peak RSS, and whether the timeline kept every sample.
    Timeline,
    /// Time from start to the first complete stack and to every running
    /// process covered, with a cold and a warm unwind-table cache.
    Startup,
    /// The cost of walking CPython frames: one CPU-bound Python process,
    /// lightswitch with its Python walk and with the native walk only (the
    /// walk's tail call taken away with bpftool), and py-spy, at
    /// `--python-freq` Hz.
    Python,
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
    /// Churn: a hostile-neighbour soak (decision 0013): N unprivileged processes
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
    /// Python: the interpreter of the workload.
    #[arg(long, default_value = "/usr/bin/python3")]
    python: PathBuf,
    /// Python: sampling frequency of lightswitch and py-spy, Hz.
    #[arg(long, default_value_t = 999)]
    python_freq: u64,
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
    let churn = churn::ChurnConfig {
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
    };
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
            Mode::Python,
        ],
        m => vec![m],
    };
    for mode in modes {
        let started = Instant::now();
        match mode {
            Mode::Matrix => matrix(&ctx)?,
            Mode::Soak => long_run(&ctx, "soak", 10_000)?,
            Mode::Rss => long_run(&ctx, "rss", 999)?,
            Mode::Churn => churn::churn(&ctx.tools, &ctx.workload, &churn)?,
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
            Mode::Python => python::python(
                &ctx.tools,
                &python::PythonConfig {
                    python: args.python.clone(),
                    freq: args.python_freq,
                    seconds: args.seconds.unwrap_or(if quick { 2.0 } else { 10.0 }),
                    rounds: ctx.rounds,
                    warmup: ctx.warmup,
                    cpus: ctx.cpus,
                    doc: ctx.doc.clone(),
                },
            )?,
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
