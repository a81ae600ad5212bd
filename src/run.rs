//! One profiling run, start to finish: preflight checks, sampling until the
//! duration ends or a signal arrives, symbolization, encoding and writing.
//! Each step is delegated to the module that owns it (docs/architecture.md).
//!
//! Continuous mode (`--profile-interval`, or a sender other than `disk`):
//! samples are cut into windows by their timestamps
//! ([`crate::profile::window`]); each closed window is handed to the
//! [`WindowWorker`], which symbolizes, encodes and sends it on its own thread
//! while sampling goes on.
//!
//! With `--listen`, an HTTP server ([`crate::server`]) runs beside the loop:
//! profile requests arrive over a channel and become subscriptions that the
//! loop fills with the samples of their span. In listen-only mode (no
//! `--duration`, no `--profile-interval`, disk sender) nothing else is
//! recorded and perf events are open only while a request is in progress.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use tracing::{debug, info, warn};

mod summary;

pub use summary::{ContinuousSummary, RunSummary};

use crate::cli::{Cli, SenderKind};
use crate::format;
use crate::preflight;
use crate::process::ProcessTracker;
use crate::profile::window::{ClosedWindow, Windows};
use crate::sample::UnwindStatus;
use crate::sampler::{self, Sampler, SamplerConfig};
use crate::sender::disk;
use crate::sender::worker::WindowWorker;
use crate::server::metrics::Metrics;
use crate::server::ondemand::{accept_requests, OnDemandWorker, Sampling, Subscriptions};
use crate::server::{Server, ServerConfig};
use crate::symbolize::Symbolizer;
use crate::timefmt;
use crate::unwind::loader::UnwindLoader;

fn install_stop_handler() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    // With the "termination" feature this covers SIGINT, SIGTERM and SIGHUP.
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
        .context("installing the SIGINT/SIGTERM handler")?;
    Ok(stop)
}

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

/// Run the profiler as `cli` says and write the profile. Errors are the
/// preflight errors (each names its cause) or failures to load, attach,
/// encode or write.
pub fn run(cli: &Cli) -> Result<RunSummary> {
    let outputs = cli.outputs()?;
    let continuous = cli.profile_interval.is_some() || cli.sender != SenderKind::Disk;
    let interval = continuous
        .then(|| preflight::seconds("--profile-interval", cli.profile_interval.unwrap_or(10.0)))
        .transpose()?;
    if interval.is_some_and(|i| i < Duration::from_millis(100)) {
        anyhow::bail!("--profile-interval must be at least 0.1 seconds");
    }
    if cli.sender == SenderKind::Disk && cli.server_url.is_some() {
        anyhow::bail!("--server-url is for --sender remote or --sender pyroscope");
    }
    if cli.max_profiles == Some(0) {
        anyhow::bail!("--max-profiles must be at least 1");
    }
    if cli.max_profiles.is_some() && !(continuous && cli.sender == SenderKind::Disk) {
        anyhow::bail!("--max-profiles applies to continuous mode with the disk sender (give --profile-interval)");
    }
    let duration = cli
        .duration
        .map(|s| preflight::seconds("--duration", s))
        .transpose()?;
    let max_sample_rate = preflight::max_sample_rate()?;
    preflight::check_frequency(cli.sample_freq, max_sample_rate)?;
    let pids = preflight::resolve_pids(&cli.pids)?;
    // `--listen` alone: serve requests, record nothing else, sample only on demand.
    let listen_only = cli.listen.is_some() && cli.duration.is_none() && !continuous;
    // The missing privilege is the cause to name first.
    preflight::check_btf()?;
    preflight::check_privileges()?;
    preflight::check_kernel_features(preflight::KERNEL_FEATURES)?;
    if cli.sender == SenderKind::Disk && !listen_only {
        for (_, output) in &outputs {
            preflight::check_output(&cli.profile_path, output)?;
        }
    }
    setup_libbpf_logging(cli.libbpf_debug);

    let stop = install_stop_handler()?;
    let metrics = Arc::new(Metrics::default());
    // Continuous mode: the sender (and its thread) starts before sampling,
    // so that a bad URL fails the run before anything is loaded.
    let mut worker = if continuous {
        let sender = crate::sender::start(cli.sender_config()?)?;
        if let Some(queue) = sender.delivery_queue() {
            metrics.set_delivery_queue(queue);
        }
        Some(WindowWorker::start(sender, metrics.clone())?)
    } else {
        None
    };
    let config = SamplerConfig {
        sample_freq_hz: cli.sample_freq,
        pids,
        exclude_pid: cli.exclude_self.then(std::process::id),
        libbpf_debug: cli.libbpf_debug,
        max_unwind_rows: unwind_rows_for_budget(cli.max_unwind_info_mb)?,
    };
    // The server binds before BPF is loaded, so that a bad address fails
    // the run at once; requests wait in the channel until the loop runs.
    let (request_tx, requests) = mpsc::channel();
    let server = match &cli.listen {
        Some(listen) => Some(Server::start(
            &ServerConfig {
                listen: listen.clone(),
                token: cli.listen_token.clone(),
                max_seconds: cli.listen_max_seconds,
                max_requests: cli.listen_max_requests,
                max_connections: cli.listen_max_connections,
                pids: config.pids.clone(),
                max_sample_freq_hz: max_sample_rate,
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
    let sampler = Sampler::start(&config, &mut object)?;
    let start_wall = SystemTime::now();
    let start = Instant::now();
    let start_mono = timefmt::monotonic_ns();
    let mut sampling = Sampling::new(cli.sample_freq, start_mono, listen_only);
    if listen_only {
        sampling.pause(&sampler);
    } else {
        info!(
            "sampling {} CPUs at {} Hz",
            sampler.attached_cpus(),
            cli.sample_freq
        );
    }
    metrics.set_sampling_freq(sampling.freq_hz().unwrap_or(0));
    if let Some(server) = &server {
        print_banner(server);
    }
    let mut on_demand = server
        .as_ref()
        .map(|_| OnDemandWorker::start())
        .transpose()?;
    let mut subscriptions = Subscriptions::default();
    let mut served = 0u64;

    let pending = Rc::new(RefCell::new(Vec::new()));
    let events = Rc::new(RefCell::new(Vec::new()));
    let malformed = Rc::new(RefCell::new(0u64));
    let mut tracker = ProcessTracker::new();
    let mut windows = Windows::new(
        start_mono,
        start_wall
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        interval.map(|i| i.as_nanos() as u64),
        duration.map(|d| d.as_nanos() as u64),
        cli.sample_freq,
    );
    let mut totals = Totals::default();
    let cache_dir =
        (cli.unwind_cache_dir != "none").then(|| std::path::PathBuf::from(&cli.unwind_cache_dir));
    let mut loader = UnwindLoader::new(config.max_unwind_rows, cache_dir)?;
    loader.scan_processes(&config.pids, start);
    {
        let ring = sampler.ring_buffer(pending.clone(), events.clone(), malformed.clone())?;
        let deadline = duration.map(|d| start + d);
        let drain = |tracker: &mut ProcessTracker,
                     windows: &mut Windows,
                     subscriptions: &mut Subscriptions,
                     loader: &mut UnwindLoader| {
            for event in events.borrow_mut().drain(..) {
                loader.on_event(event, tracker, &sampler);
            }
            for sample in pending.borrow_mut().drain(..) {
                let frames = crate::profile::aggregate::resolve(&sample, tracker);
                loader.on_sample(&sample, &frames, tracker, &sampler);
                metrics.sample(sample.user_status);
                subscriptions.add(&sample, &frames);
                if !listen_only {
                    windows.add_resolved(&sample, frames);
                }
            }
            loader.load_ready_tables(&sampler);
        };
        let mut last_alive_check = Instant::now();
        let mut last_metrics = Instant::now();
        loop {
            if stop.load(Ordering::SeqCst) || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            // Like perf -p: without a duration, the run ends when every target process is gone.
            if deadline.is_none()
                && !config.pids.is_empty()
                && last_alive_check.elapsed() >= Duration::from_secs(1)
            {
                last_alive_check = Instant::now();
                if !config
                    .pids
                    .iter()
                    .any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
                {
                    info!("every target process has exited: stopping");
                    break;
                }
            }
            accept_requests(&requests, &mut subscriptions, &mut sampling, &sampler);
            // The start-up scan goes on a slice at a time, between drains,
            // so that the ring buffer never waits for it.
            let scanning = loader.continue_scan(&mut tracker, &sampler, SCAN_SLICE);
            // While scanning, or while tables are being built, come back soon.
            let period = if scanning || loader.builds_pending() {
                BUILD_POLL_PERIOD
            } else {
                POLL_PERIOD
            };
            // Wake up for the next window or request end, if it comes before the usual poll period.
            let next_close = |windows: &Windows, subscriptions: &Subscriptions| {
                [windows.next_close_ns(), subscriptions.next_close_ns()]
                    .into_iter()
                    .flatten()
                    .min()
            };
            let poll = next_close(&windows, &subscriptions).map_or(period, |due| {
                Duration::from_nanos(due.saturating_sub(timefmt::monotonic_ns())).min(period)
            });
            sampler::poll(&ring, poll)?;
            drain(&mut tracker, &mut windows, &mut subscriptions, &mut loader);
            if next_close(&windows, &subscriptions)
                .is_some_and(|due| timefmt::monotonic_ns() >= due)
            {
                // Read the clock, then everything submitted before it.
                let now = timefmt::monotonic_ns();
                ring.consume()
                    .context("draining the samples ring buffers")?;
                drain(&mut tracker, &mut windows, &mut subscriptions, &mut loader);
                for closed in windows.close_due(now) {
                    totals.account(&closed);
                    if let Some(worker) = worker.as_mut() {
                        worker.submit(closed, &tracker);
                    }
                }
                for closed in subscriptions.close_due(now) {
                    served += 1;
                    if let Some(on_demand) = on_demand.as_mut() {
                        on_demand.submit(closed, &tracker);
                    }
                }
                if subscriptions.is_empty() {
                    sampling.pause(&sampler);
                }
            }
            if last_metrics.elapsed() >= METRICS_PERIOD {
                last_metrics = Instant::now();
                // Closed windows and requests took copies of what they need:
                // what no sample in an open one can refer to can go.
                let now = timefmt::monotonic_ns();
                let windows_since = if listen_only {
                    Some(now)
                } else {
                    windows.open_since_ns()
                };
                if let Some(since) = windows_since {
                    let since = subscriptions
                        .open_since_ns()
                        .map_or(since, |s| s.min(since));
                    let retired = tracker.retire_exited(since);
                    if retired > 0 {
                        debug!("retired {retired} exited processes");
                    }
                }
                let lost = sampler.stats().map_or(0, |s| s.lost) + *malformed.borrow();
                metrics.set_lost(lost);
                let tables = loader.stats();
                metrics.set_unwind_tables(
                    tables.rows_loaded * 8,
                    tables.tables_loaded,
                    tables.evictions,
                );
                metrics.set_windows(totals.windows, worker.as_ref().map_or(0, |w| w.dropped()));
                metrics.set_sampling_freq(sampling.freq_hz().unwrap_or(0));
            }
        }
        // Stop sampling, then take what is still in the ring buffers.
        sampler.detach();
        ring.consume()
            .context("draining the samples ring buffers")?;
        drain(&mut tracker, &mut windows, &mut subscriptions, &mut loader);
    }
    // Requests still in progress get 503: their span outlives the run.
    drop(subscriptions);
    drop(requests);
    if let Some(on_demand) = on_demand {
        on_demand.finish();
    }
    if let Some(server) = server {
        server.stop(Duration::from_secs(2));
    }
    let mut last = windows.finish(timefmt::monotonic_ns());
    let stats = sampler.stats()?;
    let malformed = *malformed.borrow();
    drop(sampler);
    debug!(
        "bpf stats: {stats:?}, tracker: {:?}, unwind tables: {:?}",
        tracker.stats(),
        loader.stats()
    );
    let unopenable = tracker.stats().objects_unopenable;
    if unopenable > 0 {
        warn!(
            "{unopenable} mapped objects could not be opened: their frames stay unsymbolized and \
             are unwound by frame pointers (reading another user's process needs root, or \
             CAP_SYS_ADMIN and CAP_SYS_PTRACE besides CAP_BPF and CAP_PERFMON); \
             --logging debug names them"
        );
    }
    let unsupported: BTreeMap<String, u64> = stats
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
        .collect();
    let tables = loader.stats();
    info!(
        "unwind tables: {} loaded, {} rows ({:.1} MiB), {} evicted, {} failed",
        tables.tables_loaded,
        tables.rows_loaded,
        tables.rows_loaded as f64 * 8.0 / (1024.0 * 1024.0),
        tables.evictions,
        tables.build_failures
    );

    if let Some(mut worker) = worker {
        for closed in last {
            totals.account(&closed);
            worker.submit(closed, &tracker);
        }
        let flush = preflight::seconds("--flush-timeout", cli.flush_timeout)
            .unwrap_or(Duration::from_secs(5));
        let report = worker.finish(flush);
        return Ok(RunSummary {
            outputs: report.sender.files.clone(),
            samples: windows.total(),
            processes: totals.pids.len(),
            lost: stats.lost + malformed,
            unwind: totals.status.iter().map(|(k, v)| (k.name(), *v)).collect(),
            unsupported,
            continuous: Some(ContinuousSummary {
                windows: totals.windows,
                late_samples: windows.late(),
                report,
            }),
            served: None,
        });
    }
    if listen_only {
        return Ok(RunSummary {
            outputs: Vec::new(),
            samples: metrics.samples(),
            processes: 0,
            lost: stats.lost + malformed,
            unwind: metrics.unwind_counts(),
            unsupported,
            continuous: None,
            served: Some(served),
        });
    }

    // One profile for the whole run.
    let ClosedWindow {
        aggregator, window, ..
    } = last.pop().context("a run has one window")?;
    let profile = Symbolizer::one_shot().build_profile(&aggregator, &tracker, window);
    // Encode every format before writing any: a run that cannot produce one
    // of them (a flame graph of no samples) leaves no partial set behind.
    let encoded = outputs
        .iter()
        .map(|(format, output)| {
            Ok((
                output,
                format::encode(&profile, *format, cli.pprof_compression)?,
            ))
        })
        .collect::<Result<Vec<_>>>()
        .context("no profile was written")?;
    for (output, bytes) in encoded {
        disk::write_atomic(output, &bytes, cli.profile_mode)?;
    }

    Ok(RunSummary {
        outputs: outputs.into_iter().map(|(_, path)| path).collect(),
        samples: profile.total_samples(),
        processes: aggregator.process_count(),
        lost: stats.lost + malformed,
        unwind: aggregator
            .status_counts()
            .iter()
            .map(|(k, v)| (k.name(), *v))
            .collect(),
        unsupported,
        continuous: None,
        served: None,
    })
}

/// How often the loop checks for a stop (and drains the ring buffer) when no
/// window ends sooner.
const POLL_PERIOD: Duration = Duration::from_millis(100);
/// The loop's period while unwind tables are being built, so that each is
/// loaded within this long of being ready.
const BUILD_POLL_PERIOD: Duration = Duration::from_millis(5);
/// Longest the start-up scan of running processes runs between two drains
/// of the ring buffer.
const SCAN_SLICE: Duration = Duration::from_millis(20);

/// How often the loop refreshes the metrics it does not count per sample.
const METRICS_PERIOD: Duration = Duration::from_secs(1);

/// Say where the server listens, once sampling is set up (stdout, flushed:
/// scripts wait for it).
fn print_banner(server: &Server) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening on http://{}", server.address());
    let _ = stdout.flush();
}

/// Counts over all windows of a continuous run (each window's aggregator
/// leaves the loop with it).
#[derive(Debug, Default)]
struct Totals {
    windows: u64,
    pids: HashSet<u32>,
    status: HashMap<UnwindStatus, u64>,
}

impl Totals {
    fn account(&mut self, closed: &ClosedWindow) {
        self.windows += 1;
        self.pids
            .extend(closed.aggregator.stacks().map(|(key, _)| key.pid));
        for (status, n) in closed.aggregator.status_counts() {
            *self.status.entry(*status).or_default() += n;
        }
    }
}

/// Rows of the `unwind_rows` map that fit in `mb` MiB (8 bytes a row).
fn unwind_rows_for_budget(mb: u32) -> Result<u32> {
    let rows = u64::from(mb) * 1024 * 1024 / 8;
    if rows == 0 || rows > u64::from(u32::MAX) {
        anyhow::bail!("--max-unwind-info-mb must be between 1 and 32767 MiB");
    }
    Ok(rows as u32)
}
