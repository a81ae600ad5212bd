//! One profiling run, start to finish: preflight checks, sampling until the
//! duration ends or a signal arrives, symbolization, encoding and writing.
//! Each step is delegated to the module that owns it (see DESIGN.md).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use tracing::{debug, info};

use crate::cli::{Cli, Compression, ProfileFormat};
use crate::format;
use crate::preflight;
use crate::process::ProcessTracker;
use crate::profile::aggregate::Aggregator;
use crate::profile::Profile;
use crate::sampler::{self, Sampler, SamplerConfig};
use crate::sender::disk;
use crate::symbolize::{Symbolizer, Window};
use crate::unwind::loader::UnwindLoader;

/// What a run produced, for the summary line.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Where the profile was written (one file per format).
    pub outputs: Vec<std::path::PathBuf>,
    /// Samples in the profile.
    pub samples: u64,
    /// Distinct processes with samples.
    pub processes: usize,
    /// Samples lost (ring buffer full, or records that did not parse).
    pub lost: u64,
    /// Samples per unwind result (`complete`, `truncated`, ...).
    pub unwind: BTreeMap<String, u64>,
    /// Walks stopped by an unsupported CFI rule, per rule kind.
    pub unsupported: BTreeMap<String, u64>,
}

impl std::fmt::Display for RunSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "profile written to {}: {} samples, {} processes, {} samples lost",
            self.outputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            self.samples,
            self.processes,
            self.lost
        )?;
        let unwind: Vec<String> = self
            .unwind
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(f, "\nuser stacks: {}", unwind.join(" "))?;
        if !self.unsupported.is_empty() {
            let kinds: Vec<String> = self
                .unsupported
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            write!(f, "\nunsupported CFI rules: {}", kinds.join(" "))?;
        }
        Ok(())
    }
}

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
    preflight::check_frequency(cli.sample_freq, preflight::max_sample_rate()?)?;
    preflight::check_pids(&cli.pids)?;
    for (_, output) in &outputs {
        preflight::check_output(&cli.profile_path, output)?;
    }
    preflight::check_btf()?;
    preflight::check_privileges()?;
    setup_libbpf_logging(cli.libbpf_debug);

    let stop = install_stop_handler()?;
    let config = SamplerConfig {
        sample_freq_hz: cli.sample_freq,
        pids: cli.pids.iter().map(|&p| p as u32).collect(),
        exclude_pid: cli.exclude_self.then(std::process::id),
        libbpf_debug: cli.libbpf_debug,
        max_unwind_rows: unwind_rows_for_budget(cli.max_unwind_info_mb)?,
    };
    let mut object = MaybeUninit::uninit();
    let sampler = Sampler::start(&config, &mut object)?;
    let start_wall = SystemTime::now();
    let start = Instant::now();
    info!(
        "sampling {} CPUs at {} Hz",
        sampler.attached_cpus(),
        cli.sample_freq
    );

    let pending = Rc::new(RefCell::new(Vec::new()));
    let events = Rc::new(RefCell::new(Vec::new()));
    let malformed = Rc::new(RefCell::new(0u64));
    let mut tracker = ProcessTracker::new();
    let mut aggregator = Aggregator::new();
    let cache_dir =
        (cli.unwind_cache_dir != "none").then(|| std::path::PathBuf::from(&cli.unwind_cache_dir));
    let mut loader = UnwindLoader::new(config.max_unwind_rows, cache_dir)?;
    loader.scan_processes(&config.pids, &mut tracker, &sampler);
    {
        let ring = sampler.ring_buffer(pending.clone(), events.clone(), malformed.clone())?;
        let deadline = cli
            .duration
            .map(|s| start + Duration::from_secs_f64(s.max(0.0)));
        let drain = |tracker: &mut ProcessTracker,
                     aggregator: &mut Aggregator,
                     loader: &mut UnwindLoader| {
            for event in events.borrow_mut().drain(..) {
                loader.on_event(event, tracker, &sampler);
            }
            for sample in pending.borrow_mut().drain(..) {
                loader.on_sample(&sample, tracker, &sampler);
                aggregator.add(&sample, tracker);
            }
            loader.load_ready_tables(&sampler);
        };
        loop {
            if stop.load(Ordering::SeqCst) || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            sampler::poll(&ring, Duration::from_millis(100))?;
            drain(&mut tracker, &mut aggregator, &mut loader);
        }
        // Stop sampling, then take what is still in the ring buffer.
        sampler.detach();
        ring.consume().context("draining the samples ring buffer")?;
        drain(&mut tracker, &mut aggregator, &mut loader);
    }
    let duration = start.elapsed();
    let stats = sampler.stats()?;
    let malformed = *malformed.borrow();
    drop(sampler);
    debug!(
        "bpf stats: {stats:?}, tracker: {:?}, unwind tables: {:?}",
        tracker.stats(),
        loader.stats()
    );
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

    let window = Window {
        start_unix_ns: start_wall
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        duration_ns: duration.as_nanos() as u64,
        sample_freq_hz: cli.sample_freq,
    };
    let profile = Symbolizer::new().build_profile(&aggregator, &tracker, window);
    for (format, output) in &outputs {
        let bytes = encode(&profile, *format, cli.pprof_compression)?;
        disk::write_atomic(output, &bytes)?;
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
    })
}

/// Rows of the `unwind_rows` map that fit in `mb` MiB (8 bytes a row).
fn unwind_rows_for_budget(mb: u32) -> Result<u32> {
    let rows = u64::from(mb) * 1024 * 1024 / 8;
    if rows == 0 || rows > u64::from(u32::MAX) {
        anyhow::bail!("--max-unwind-info-mb must be between 1 and 32767 MiB");
    }
    Ok(rows as u32)
}

/// Encode `profile` in `format` (`compression` applies to pprof only).
pub fn encode(
    profile: &Profile,
    format: ProfileFormat,
    compression: Compression,
) -> Result<Vec<u8>> {
    match format {
        ProfileFormat::FlameGraph => {
            if profile.total_samples() == 0 {
                anyhow::bail!("no samples were collected, so there is no flame graph to draw");
            }
            format::flamegraph::encode(profile, "lightswitch CPU profile")
        }
        ProfileFormat::Folded => Ok(format::folded::encode(profile).into_bytes()),
        ProfileFormat::Pprof => format::pprof::encode(profile, compression),
    }
}
