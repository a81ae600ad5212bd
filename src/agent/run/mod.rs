//! One profiling run, start to finish: preflight checks, sampling until the
//! duration ends or a signal arrives, symbolization, encoding and writing.
//! Each step is delegated to the module that owns it (docs/architecture.md).
//!
//! The run is configured by a [`RunPlan`]: plain settings the command line
//! builds (`crate::commands::cli`), or a library user does; it never sees the
//! command line's own types.
//!
//! Continuous mode (`--profile-interval`, or a sender other than `disk`):
//! samples are cut into windows by their timestamps
//! ([`crate::profile::window`]); each closed window is handed to the
//! [`WindowWorker`], which symbolizes, encodes and sends it on its own thread
//! while sampling goes on.
//!
//! With `--listen`, an HTTP server ([`crate::agent::api`]) runs beside the loop:
//! profile requests arrive over a channel and become subscriptions that the
//! loop fills with the samples of their span. In listen-only mode (no
//! `--duration`, no `--profile-interval`, disk sender) nothing else is
//! recorded and perf events are open only while a request is in progress.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tracing::{debug, info, warn};

mod agent;
mod hints;
mod plan;
pub mod progress;
mod summary;
pub mod workload;

pub use agent::{Agent, Stopped, Workers};
pub use plan::{
    CheckedPlan, Continuous, ListenPlan, RunPlan, DEFAULT_SAMPLE_FREQ_HZ, DEFAULT_UNWIND_BUDGET_MB,
};
use progress::StopWords;
pub use summary::{ContinuousSummary, RunSummary, Totals};
pub use workload::Workload;

use crate::agent::api::metrics::Metrics;
use crate::agent::api::ondemand::OnDemandWorker;
use crate::agent::api::{Server, ServerConfig};
use crate::output::sender::disk::write_profile;
use crate::output::sender::worker::WindowWorker;
use crate::process::ProcessTracker;
use crate::profile::format::{self, Compression, ProfileFormat};
use crate::profile::window::ClosedWindow;
use crate::profile::{Profile, Provenance};
use crate::sampling::sampler::{BpfStats, Sampler};
use crate::symbolize::settings::SymbolContext;
use crate::symbolize::Symbolizer;
use crate::unwind::deferred::DeferredStats;
use crate::unwind::loader::UnwindLoader;
use crate::util::files;
use crate::util::timefmt;

fn setup_libbpf_logging(debug: bool) {
    let level = if debug {
        libbpf_rs::PrintLevel::Debug
    } else {
        libbpf_rs::PrintLevel::Warn
    };
    libbpf_rs::set_print(Some((level, |_level, msg: String| {
        eprint!("libbpf: {msg}")
    })));
}

/// Run the profiler as `plan` says and write the profile. Errors are the
/// plan's and the preflight errors (each names its cause) or failures to
/// load, attach, encode or write.
pub fn run(plan: &RunPlan) -> Result<RunSummary> {
    run_with(plan, None)
}

/// [`run`], profiling `workload` (a held process, `record`) and every
/// process it starts instead of `plan.pids` or the whole machine: it is
/// let go once sampling is attached, and the run ends when it exits (or at
/// `plan.duration`); a stop request is passed on to it.
pub fn run_with(run_plan: &RunPlan, mut workload: Option<&mut dyn Workload>) -> Result<RunSummary> {
    let plan = CheckedPlan::new(run_plan.clone(), workload.as_ref().map(|w| w.pid()))?;
    setup_libbpf_logging(plan.run.libbpf_debug);
    let stop = progress::install_stop_handler(if plan.listen_only {
        // Nothing is written: requests in progress get 503.
        StopWords {
            first: "no profile is written in listen-only mode",
            again: "",
        }
    } else if workload.is_some() {
        StopWords::writing("writing the profile once the command exits")
    } else {
        StopWords::writing("writing the profile")
    })?;
    let provenance = Provenance {
        subject: subject(&plan.sampler.pids, workload.as_deref()).into(),
        host: crate::output::sender::hostname().into(),
        pids: plan.sampler.pids.as_slice().into(),
    };
    let metrics = Arc::new(Metrics::default());
    // The run's symbol sources, shared by its symbolizers; debug copies go
    // under the unwind cache directory.
    let cache_dir = plan.run.unwind_cache_dir.clone();
    let symbols = SymbolContext::new(
        &plan.run.symbols,
        cache_dir
            .as_ref()
            .map(|dir| dir.join(crate::symbolize::debug_copy::SUBDIRECTORY)),
    );
    metrics.set_debuginfod(symbols.debuginfod.clone());
    // Continuous mode: the sender (and its thread) starts before sampling,
    // so that a bad URL fails the run before anything is loaded.
    let window_worker = if let Some(continuous) = &plan.run.continuous {
        let sender = crate::output::sender::start(continuous.sender.clone())?;
        if let Some(queue) = sender.delivery_queue() {
            metrics.set_delivery_queue(queue);
        }
        Some(WindowWorker::start(
            sender,
            metrics.clone(),
            provenance.clone(),
            symbols.clone(),
        )?)
    } else {
        None
    };
    // The server binds before BPF is loaded, so that a bad address fails
    // the run at once; requests wait in the channel until the loop runs.
    let (request_tx, requests) = mpsc::channel();
    let server = match &plan.run.listen {
        Some(listen) => Some(Server::start(
            &ServerConfig {
                listen: listen.address.clone(),
                token: listen.token.clone(),
                max_seconds: listen.max_seconds,
                max_requests: listen.max_requests,
                max_connections: listen.max_connections,
                pids: plan.sampler.pids.clone(),
                max_sample_freq_hz: plan.max_sample_rate_hz,
                off_cpu: plan.sampler.off_cpu_min_ns.is_some(),
            },
            request_tx,
            metrics.clone(),
        )?),
        None => {
            drop(request_tx);
            None
        }
    };
    let mut object = MaybeUninit::uninit();
    let sampler = Sampler::start(&plan.sampler, &mut object)?;
    let workers = Workers {
        windows: window_worker,
        on_demand: server
            .as_ref()
            .map(|_| OnDemandWorker::start(symbols.clone()))
            .transpose()?,
        requests,
    };
    let mut agent = Agent::new(&sampler, &plan, cache_dir, workers, metrics.clone())?;
    // After listen-only mode has paused the perf events: scripts wait for
    // this line.
    if let Some(server) = &server {
        print_banner(server);
    }
    // Sampling is attached and its records have somewhere to go.
    if let Some(workload) = workload.as_mut() {
        agent.scan_now();
        agent.preload(&workload.images(), PRELOAD_TIMEOUT)?;
        workload.release()?;
    }
    let mut interrupted = false;
    while !workload::ends_run(&mut workload, stop.load(Ordering::SeqCst), &mut interrupted)
        && !agent.finished()
    {
        agent.step()?;
    }
    let mut stopped = agent.stop()?;
    if let Some(on_demand) = stopped.on_demand.take() {
        on_demand.finish();
    }
    if let Some(server) = server {
        server.stop(Duration::from_secs(2));
    }
    drop(sampler);
    finish(&plan, &metrics, stopped, &provenance, &symbols)
}

/// Longest a held command waits for the unwind tables of its first
/// objects ([`Agent::preload`]).
const PRELOAD_TIMEOUT: Duration = Duration::from_secs(2);

/// What a run profiles, in words, for titles: the command line of
/// `record`'s command, the pids with their names (`pid 1234 (nginx)`,
/// `pids 1, 2`), or `the whole machine`.
fn subject(pids: &[u32], workload: Option<&dyn Workload>) -> String {
    if let Some(workload) = workload {
        return workload.describe();
    }
    let named = |pid: &u32| match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(comm) => format!("{pid} ({})", comm.trim_end()),
        Err(_) => pid.to_string(),
    };
    match pids {
        [] => "the whole machine".to_string(),
        [pid] => format!("pid {}", named(pid)),
        pids => format!(
            "pids {}",
            pids.iter().map(named).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Log what a run saw: the BPF program's counters, the tracker's and the
/// unwind loader's statistics and the walks from stack copies (debug), the
/// unwind tables loaded (info), objects that could not be opened (warn).
fn log_run(
    stats: &BpfStats,
    tracker: &ProcessTracker,
    loader: &UnwindLoader,
    described: usize,
    deferred: &DeferredStats,
) {
    debug!(
        "bpf stats: {stats:?}, tracker: {:?}, unwind tables: {:?}, processes described: {described}",
        tracker.stats(),
        loader.stats()
    );
    warn_unopenable(tracker);
    let tables = loader.stats();
    info!(
        "unwind tables: {} loaded, {} rows ({:.1} MiB), {} evicted, {} failed",
        tables.tables_loaded,
        tables.rows_loaded,
        tables.rows_loaded as f64 * 8.0 / (1024.0 * 1024.0),
        tables.evictions,
        tables.build_failures
    );
    debug!(
        "walks from stack copies: {deferred:?}, {} us each on average",
        deferred.walk_ns / deferred.walks.max(1) / 1000
    );
}

/// Everything after sampling: log what the run saw, hand the last windows
/// over (continuous mode) or write the one profile, and say what happened.
fn finish(
    plan: &CheckedPlan,
    metrics: &Metrics,
    stopped: Stopped,
    provenance: &Provenance,
    symbols: &SymbolContext,
) -> Result<RunSummary> {
    let Stopped {
        tracker,
        mut windows,
        loader,
        described,
        window_worker,
        mut totals,
        served,
        stats,
        malformed,
        mut deferred,
        children_seen,
        ..
    } = stopped;
    deferred.not_sent = stats.stack_copies_skipped;
    let mut last = windows.finish(timefmt::monotonic_ns());
    log_run(&stats, &tracker, &loader, described, &deferred);
    let unsupported = unsupported_counts(&stats);
    let lost = stats.lost + malformed;
    let off_cpu = plan
        .sampler
        .off_cpu_min_ns
        .map(|_| crate::sampling::sampler::off_cpu::OffCpuCounts::from_stats(&stats));

    if let Some(mut worker) = window_worker {
        for closed in last {
            totals.account(&closed);
            worker.submit(closed, &tracker);
        }
        let flush = plan
            .run
            .continuous
            .as_ref()
            .map_or(Duration::from_secs(5), |c| c.flush_timeout);
        let report = worker.finish(flush);
        if let Some(hint) = pids_hint(plan, &totals.pids, &children_seen) {
            warn!("{hint}");
        }
        return Ok(RunSummary {
            outputs: report.sender.files.clone(),
            samples: windows.total(),
            processes: totals.pids.len(),
            lost,
            unwind: totals.status.iter().map(|(k, v)| (k.name(), *v)).collect(),
            unsupported,
            deferred,
            continuous: Some(ContinuousSummary {
                windows: totals.windows,
                late_samples: windows.late(),
                report,
            }),
            served: None,
            off_cpu,
            debuginfod: symbols.debuginfod_stats(),
        });
    }
    if plan.listen_only {
        return Ok(RunSummary {
            outputs: Vec::new(),
            samples: metrics.samples(),
            processes: 0,
            lost,
            unwind: metrics.unwind_counts(),
            unsupported,
            deferred,
            continuous: None,
            served: Some(served),
            off_cpu,
            debuginfod: symbols.debuginfod_stats(),
        });
    }

    // One profile for the whole run.
    let last = last.pop().context("a run has one window")?;
    let (samples, processes, unwind) =
        write_run_profile(plan, last, &tracker, &children_seen, provenance, symbols)?;
    Ok(RunSummary {
        outputs: plan
            .run
            .outputs
            .iter()
            .map(|(_, path)| path.clone())
            .collect(),
        samples,
        processes,
        lost,
        unwind,
        unsupported,
        deferred,
        continuous: None,
        served: None,
        off_cpu,
        debuginfod: symbols.debuginfod_stats(),
    })
}

/// The one profile of a one-shot run, from its only window `last`:
/// symbolized with what `tracker` knows, stamped with `provenance`, checked
/// for the `--pids` targets ([`check_pids_sampled`]) and written to every
/// output of the plan. Returns its samples, processes and unwind results
/// (per result name), for the summary.
fn write_run_profile(
    plan: &CheckedPlan,
    last: ClosedWindow,
    tracker: &ProcessTracker,
    children_seen: &hints::ChildrenSeen,
    provenance: &Provenance,
    symbols: &SymbolContext,
) -> Result<(u64, usize, BTreeMap<String, u64>)> {
    let ClosedWindow {
        mut aggregator,
        window,
        ..
    } = last;
    let started = Instant::now();
    let mut profile = Symbolizer::one_shot(symbols).build_profile(&aggregator, tracker, window);
    aggregator.take_timeline_into(&mut profile);
    provenance.stamp(&mut profile);
    check_pids_sampled(plan, &aggregator, &profile, children_seen)?;
    info!(
        "{} samples, {} distinct stacks, {} frames symbolized in {:?}",
        profile.total_samples(),
        profile.samples.len(),
        profile.frames.len(),
        started.elapsed()
    );
    write_outputs(
        &profile,
        &plan.run.outputs,
        plan.run.compression,
        plan.run.file_mode,
    )?;
    let unwind = aggregator
        .status_counts()
        .iter()
        .map(|(k, v)| (k.name(), *v))
        .collect();
    Ok((profile.total_samples(), aggregator.process_count(), unwind))
}

/// Write `profile` in every format of `outputs`, each file with `mode`,
/// one after the other: each is encoded straight into its file and is
/// complete (renamed into place) before the next is encoded, so that the
/// first appears as soon as it is ready and no encoded output is held in
/// memory. A run that cannot produce one of them leaves no partial set
/// behind: formats that cannot encode the profile (a flame graph of no
/// samples) are found before any file is written, and the files of this
/// call are removed again when a later one fails.
fn write_outputs(
    profile: &Profile,
    outputs: &[(ProfileFormat, PathBuf)],
    compression: Compression,
    mode: u32,
) -> Result<()> {
    let write_all = || -> Result<()> {
        for (format, _) in outputs {
            format::check_encodable(profile, *format)?;
        }
        let mut written: Vec<&Path> = Vec::new();
        for (format, output) in outputs {
            let started = Instant::now();
            let bytes = match write_profile(profile, *format, compression, output, mode) {
                Ok(bytes) => bytes,
                Err(err) => {
                    // Only files this call created: a device written into stays.
                    for path in written.iter().filter(|p| files::is_regular_file(p)) {
                        let _ = std::fs::remove_file(path);
                    }
                    return Err(err);
                }
            };
            info!(
                "{}: {bytes} bytes encoded and written to {} in {:?}",
                format.name(),
                output.display(),
                started.elapsed()
            );
            written.push(output);
        }
        Ok(())
    };
    write_all().context("no profile was written")
}

/// A `--pids` target without samples whose children ran, or that exited
/// unsampled ([`pids_hint`]): an error when the profile is empty (nothing
/// is written), a warning otherwise.
fn check_pids_sampled(
    plan: &CheckedPlan,
    aggregator: &crate::profile::aggregate::Aggregator,
    profile: &Profile,
    children_seen: &hints::ChildrenSeen,
) -> Result<()> {
    let sampled = aggregator.stacks().map(|(key, _)| key.pid).collect();
    if let Some(hint) = pids_hint(plan, &sampled, children_seen) {
        if profile.total_samples() == 0 {
            anyhow::bail!("no samples were collected, so no profile was written: {hint}");
        }
        warn!("{hint}");
    }
    Ok(())
}

/// [`hints::unsampled_parents`] for a `--pids` run (not `record`, which
/// follows children itself), with the children seen during the run.
fn pids_hint(
    plan: &CheckedPlan,
    sampled: &std::collections::HashSet<u32>,
    children_seen: &hints::ChildrenSeen,
) -> Option<String> {
    if plan.sampler.follow_children || plan.sampler.pids.is_empty() {
        return None;
    }
    hints::unsampled_parents(&plan.sampler.pids, sampled, children_seen)
}

/// Say once how many mapped objects could not be opened, and why that
/// usually is.
fn warn_unopenable(tracker: &ProcessTracker) {
    let unopenable = tracker.stats().objects_unopenable;
    if unopenable > 0 {
        warn!(
            "{unopenable} mapped objects could not be opened: their frames stay unsymbolized and \
             are unwound by frame pointers (reading another user's process needs root, or \
             CAP_SYS_ADMIN and CAP_SYS_PTRACE besides CAP_BPF and CAP_PERFMON); \
             --logging debug names them"
        );
    }
}

/// Walks stopped by an unsupported CFI rule, per rule kind name.
fn unsupported_counts(stats: &BpfStats) -> BTreeMap<String, u64> {
    stats
        .unsupported
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(kind, &n)| {
            (
                crate::unwind::unsupported_kind_name(kind as u16).to_string(),
                n,
            )
        })
        .collect()
}

/// Say where the server listens, once sampling is set up (stdout, flushed:
/// scripts wait for it).
fn print_banner(server: &Server) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening on http://{}", server.address());
    let _ = stdout.flush();
}
