//! What a run does ([`RunPlan`]): plain settings, built once from the
//! command line (`crate::commands::cli`) or in code by a library user. The run checks
//! them against each other ([`RunPlan::check`]) and then against the
//! running system ([`CheckedPlan::new`]: privileges, BTF, kernel features,
//! the kernel's sample-rate limit, the pids, output paths) before anything
//! is loaded.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::output::sender::SenderConfig;
use crate::profile::format::{Compression, ProfileFormat};
use crate::sampling::preflight;
use crate::sampling::sampler::SamplerConfig;
use crate::symbolize::settings::SymbolSettings;

/// Default sampling frequency per CPU, Hz (`--sample-freq`).
pub const DEFAULT_SAMPLE_FREQ_HZ: u64 = 99;

/// Default unwind-table budget in BPF maps, MiB (`--max-unwind-info-mb`).
pub const DEFAULT_UNWIND_BUDGET_MB: u32 = 64;

/// What a run does: what it samples, for how long, and where the profile
/// goes. [`RunPlan::new`] gives the command line's defaults for one profile
/// of the whole machine; set fields to change them.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// Samples per second per CPU, Hz (1 ..= `kernel.perf_event_max_sample_rate`).
    pub sample_freq_hz: u64,
    /// Only these processes (thread group ids; a thread id stands for its
    /// process); empty: every process. Their children are not followed
    /// (`record` does that, and replaces these).
    pub pids: Vec<u32>,
    /// Do not sample the profiler's own process.
    pub exclude_self: bool,
    /// Also record off-CPU waits of at least this long (`--off-cpu`,
    /// `--off-cpu-min`); `None`: cpu-clock samples only.
    pub off_cpu_min: Option<Duration>,
    /// Memory budget for unwind tables in BPF maps, MiB (8-byte rows).
    pub max_unwind_info_mb: u32,
    /// Print libbpf's debug output, including the verifier log.
    pub libbpf_debug: bool,
    /// Stop after this long; `None` runs until a signal (or until every
    /// `pids` target, or `record`'s command, has exited).
    pub duration: Option<Duration>,
    /// Each output format with the file it is written to (one profile of
    /// the run); in continuous mode, the formats the sender sends.
    pub outputs: Vec<(ProfileFormat, PathBuf)>,
    /// The directory the outputs are written to (`--profile-path`), created
    /// if missing.
    pub output_dir: PathBuf,
    /// Compression of pprof and OTLP files.
    pub compression: Compression,
    /// File mode of written profiles before the umask (e.g. `0o600`).
    pub file_mode: u32,
    /// Continuous mode: one profile per window, handed to a sender as each
    /// closes; `None`: one profile of the whole run.
    pub continuous: Option<Continuous>,
    /// Serve on-demand profiles and metrics over HTTP (`--listen`).
    pub listen: Option<ListenPlan>,
    /// Where built unwind tables and inflated debug information are cached
    /// between runs; `None`: no cache.
    pub unwind_cache_dir: Option<PathBuf>,
    /// Where separate debug files come from (`--debug-dirs`, debuginfod),
    /// for unwind tables and symbols.
    pub symbols: SymbolSettings,
}

/// Continuous mode's settings.
#[derive(Debug, Clone)]
pub struct Continuous {
    /// Length of a window (at least 0.1 s).
    pub interval: Duration,
    /// Where windows go; a network sender sends only its own formats.
    pub sender: SenderConfig,
    /// At the end, how long pending profiles may still be sent.
    pub flush_timeout: Duration,
}

/// The HTTP server's settings (`--listen` and its limits).
#[derive(Clone)]
pub struct ListenPlan {
    /// `HOST:PORT`, `:PORT` or `PORT` (the last two bind 127.0.0.1).
    pub address: String,
    /// Bearer token required on every endpoint but `/healthz`; set but
    /// empty is an error at start.
    pub token: Option<String>,
    /// Longest on-demand profile, seconds.
    pub max_seconds: u64,
    /// On-demand profile requests in progress at once (429 beyond).
    pub max_requests: usize,
    /// Connections served at once.
    pub max_connections: usize,
}

impl std::fmt::Debug for ListenPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenPlan")
            .field("address", &self.address)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("max_seconds", &self.max_seconds)
            .field("max_requests", &self.max_requests)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl RunPlan {
    /// The directories that do not exist yet on the way to the plan's profiles
    /// (`--profile-path`, and the directories in a `--profile-name`),
    /// outermost first: those the run will create, to be given away with what
    /// it writes. Call it before the run.
    pub fn directories_to_create(&self) -> Vec<PathBuf> {
        let parents = self.outputs.iter().filter_map(|(_, path)| path.parent());
        let mut missing = Vec::new();
        for path in std::iter::once(self.output_dir.as_path()).chain(parents) {
            let mut dir = Some(path);
            while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
                missing.push(d.to_path_buf());
                dir = d.parent();
            }
        }
        missing.sort();
        missing.dedup();
        missing
    }

    /// One profile of the whole machine in `format`, written to the
    /// format's default file name in `output_dir`, until a signal: the
    /// command line's defaults (99 Hz, 64 MiB of unwind tables, mode 600,
    /// debug files under `/usr/lib/debug`), without an unwind cache.
    pub fn new(output_dir: impl Into<PathBuf>, format: ProfileFormat) -> RunPlan {
        let output_dir = output_dir.into();
        RunPlan {
            sample_freq_hz: DEFAULT_SAMPLE_FREQ_HZ,
            pids: Vec::new(),
            exclude_self: false,
            off_cpu_min: None,
            max_unwind_info_mb: DEFAULT_UNWIND_BUDGET_MB,
            libbpf_debug: false,
            duration: None,
            outputs: vec![(format, output_dir.join(format.default_file_name()))],
            output_dir,
            compression: Compression::None,
            file_mode: 0o600,
            continuous: None,
            listen: None,
            unwind_cache_dir: None,
            symbols: SymbolSettings::default(),
        }
    }

    /// Check the settings against each other, without looking at the
    /// system. Errors name the flag at fault: a time out of range, a
    /// continuous sender given a format it does not send, a count of 0.
    pub fn check(&self) -> Result<()> {
        if self.outputs.is_empty() {
            anyhow::bail!("a run needs at least one output format (--profile-format)");
        }
        if let Some(duration) = self.duration {
            preflight::seconds("--duration", duration.as_secs_f64())?;
        }
        let Some(continuous) = &self.continuous else {
            return Ok(());
        };
        preflight::check_interval(continuous.interval.as_secs_f64())
            .map_err(|err| anyhow::anyhow!("--profile-interval {err}"))?;
        preflight::seconds("--flush-timeout", continuous.flush_timeout.as_secs_f64())?;
        if let SenderConfig::Disk {
            max_profiles: Some(max),
            ..
        } = &continuous.sender
        {
            preflight::count("--max-profiles", *max as u64)?;
        }
        self.check_sender_formats(&continuous.sender)
    }

    /// A network sender sends only its own format: refuse any other rather
    /// than send a substitute. The error names the sender, the format and
    /// what the sender takes.
    fn check_sender_formats(&self, sender: &SenderConfig) -> Result<()> {
        let kind = sender.kind();
        let Some(takes) = crate::output::sender::formats_of(kind) else {
            return Ok(());
        };
        let names: Vec<&str> = takes.iter().map(|f| f.name()).collect();
        for (format, _) in &self.outputs {
            if !takes.contains(format) {
                anyhow::bail!(
                    "--sender {} sends only {}: it cannot send --profile-format {} \
                     (--sender otlp sends otlp, with every sample's time; --sender disk writes \
                     any format)",
                    kind.name(),
                    names.join(", "),
                    format.name()
                );
            }
        }
        Ok(())
    }

    /// `--listen` alone: no `duration`, no continuous mode and no `record`
    /// command; nothing is recorded but on-demand requests.
    fn listen_only(&self, workload: bool) -> bool {
        self.listen.is_some() && self.duration.is_none() && self.continuous.is_none() && !workload
    }
}

/// A [`RunPlan`] checked against the running system when the run starts,
/// with what that check found: the sampler's settings (pids resolved to
/// their processes), the run's shape and the kernel's limit. It owns the
/// plan it checked, so a run carries one plan.
#[derive(Debug, Clone)]
pub struct CheckedPlan {
    /// The plan as given (outputs, senders, server, caches).
    pub run: RunPlan,
    /// Continuous mode: the window length; `None` for one profile of the run.
    pub interval: Option<Duration>,
    /// How long the run lasts; `None`: until a signal or the targets exit.
    pub duration: Option<Duration>,
    /// `--listen` alone: record nothing but on-demand requests, and sample
    /// only while one is in progress.
    pub listen_only: bool,
    /// The kernel's `perf_event_max_sample_rate`, Hz.
    pub max_sample_rate_hz: u64,
    /// The sampler's settings (frequency, pids, unwind-table budget).
    pub sampler: SamplerConfig,
    /// Whether windows keep every sample's time and the processes' execs
    /// and exits: a timeline format (firefox, otlp) is written or sent.
    pub timeline: bool,
}

impl CheckedPlan {
    /// Check `plan` ([`RunPlan::check`]) and then the system. Errors name
    /// the flag, privilege or kernel feature at fault; the missing
    /// privilege is named before anything that needs it.
    ///
    /// `workload`: the pid of `record`'s held command, which replaces
    /// `plan.pids` and is followed into its children.
    pub fn new(plan: RunPlan, workload: Option<u32>) -> Result<CheckedPlan> {
        plan.check()?;
        let max_sample_rate_hz = preflight::max_sample_rate()?;
        preflight::check_frequency(plan.sample_freq_hz, max_sample_rate_hz)?;
        let pids = match workload {
            Some(pid) => vec![pid],
            None => preflight::resolve_pids(&plan.pids)?,
        };
        let listen_only = plan.listen_only(workload.is_some());
        preflight::check_btf()?;
        preflight::check_privileges()?;
        preflight::check_kernel_features(preflight::KERNEL_FEATURES)?;
        let to_disk = plan
            .continuous
            .as_ref()
            .is_none_or(|c| matches!(c.sender, SenderConfig::Disk { .. }));
        if to_disk && !listen_only {
            for (_, output) in &plan.outputs {
                preflight::check_output(&plan.output_dir, output)?;
            }
        }
        Ok(CheckedPlan {
            interval: plan.continuous.as_ref().map(|c| c.interval),
            duration: plan.duration,
            listen_only,
            max_sample_rate_hz,
            timeline: plan.outputs.iter().any(|(f, _)| f.is_timeline()),
            sampler: SamplerConfig {
                sample_freq_hz: plan.sample_freq_hz,
                pids,
                exclude_pid: plan.exclude_self.then(std::process::id),
                libbpf_debug: plan.libbpf_debug,
                max_unwind_rows: unwind_rows_for_budget(plan.max_unwind_info_mb),
                follow_children: workload.is_some(),
                off_cpu_min_ns: plan.off_cpu_min.map(|d| d.as_nanos() as u64),
                // Samples taken inside the profiler's own BPF programs are
                // named after the programs are unloaded (one-shot profiles
                // are symbolized then).
                after_load: Some(crate::symbolize::kallsyms::remember_bpf_programs),
            },
            run: plan,
        })
    }
}

/// Rows of the `unwind_rows` map that fit in `mb` MiB (8 bytes a row). The
/// flag's parser (`cli/values.rs`) holds `mb` to 1..=32767, whose rows fit
/// in a u32; a larger value would be held to `u32::MAX` rows.
fn unwind_rows_for_budget(mb: u32) -> u32 {
    u32::try_from(u64::from(mb) * 1024 * 1024 / 8).unwrap_or(u32::MAX)
}
