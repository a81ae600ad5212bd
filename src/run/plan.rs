//! A run's settings, validated: the flags that decide the run's shape
//! (one-shot, continuous, listen-only), checked against each other and
//! against the running system (privileges, BTF, kernel features, the
//! kernel's sample-rate limit, output paths) before anything is loaded.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::cli::{ProfileArgs, SenderKind};
use crate::format::ProfileFormat;
use crate::preflight;
use crate::sampler::SamplerConfig;

/// What a run will do, from [`RunPlan::from_cli`].
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// Each output format with the file it goes to (one-shot and disk sender).
    pub outputs: Vec<(ProfileFormat, PathBuf)>,
    /// Continuous mode: the window length (`--profile-interval`, default
    /// 10 s with a network sender); `None` for one profile of the whole run.
    pub interval: Option<Duration>,
    /// `--duration`; `None` runs until a signal (or until every `--pids`
    /// target has exited).
    pub duration: Option<Duration>,
    /// `--listen` alone: record nothing but on-demand requests, and sample
    /// only while one is in progress.
    pub listen_only: bool,
    /// The kernel's `perf_event_max_sample_rate`, Hz.
    pub max_sample_rate_hz: u64,
    /// The sampler's settings (frequency, pids, unwind-table budget).
    pub sampler: SamplerConfig,
    /// Whether windows keep every sample's time and the processes' execs
    /// and exits: a timeline format (firefox, otlp) is written to files or
    /// sent (the OTLP sender).
    pub timeline: bool,
}

impl RunPlan {
    /// Check `cli`'s flags against each other and the system. Errors name
    /// the flag, privilege or kernel feature at fault; the missing privilege
    /// is named before anything that needs it.
    ///
    /// `workload`: the pid of `record`'s held command, which replaces
    /// `--pids` (an error with it) and is followed into its children.
    pub fn from_cli(cli: &ProfileArgs, workload: Option<u32>) -> Result<RunPlan> {
        check_flags(cli, workload.is_some())?;
        let outputs = cli.outputs()?;
        let continuous = is_continuous(cli);
        // In range: checked by check_flags.
        let interval =
            continuous.then(|| Duration::from_secs_f64(cli.profile_interval.unwrap_or(10.0)));
        let duration = cli
            .duration
            .map(|s| preflight::seconds("--duration", s))
            .transpose()?;
        let max_sample_rate_hz = preflight::max_sample_rate()?;
        preflight::check_frequency(cli.sample_freq, max_sample_rate_hz)?;
        let pids = match workload {
            Some(pid) => vec![pid],
            None => preflight::resolve_pids(&cli.pids)?,
        };
        let listen_only =
            cli.listen.is_some() && cli.duration.is_none() && !continuous && workload.is_none();
        preflight::check_btf()?;
        preflight::check_privileges()?;
        preflight::check_kernel_features(preflight::KERNEL_FEATURES)?;
        if cli.sender == SenderKind::Disk && !listen_only {
            for (_, output) in &outputs {
                preflight::check_output(&cli.profile_path, output)?;
            }
        }
        // The formats a network sender sends are its outputs too: the OTLP
        // sender needs every sample's time.
        let timeline = outputs.iter().any(|(f, _)| f.is_timeline());
        Ok(RunPlan {
            timeline,
            outputs,
            interval,
            duration,
            listen_only,
            max_sample_rate_hz,
            sampler: SamplerConfig {
                sample_freq_hz: cli.sample_freq,
                pids,
                exclude_pid: cli.exclude_self.then(std::process::id),
                libbpf_debug: cli.libbpf_debug,
                max_unwind_rows: unwind_rows_for_budget(cli.max_unwind_info_mb),
                follow_children: workload.is_some(),
                // Samples taken inside the profiler's own BPF programs are
                // named after the programs are unloaded (one-shot profiles
                // are symbolized then).
                after_load: Some(crate::symbolize::kallsyms::remember_bpf_programs),
            },
        })
    }

    /// Continuous mode: windows go to a sender as they close.
    pub fn continuous(&self) -> bool {
        self.interval.is_some()
    }
}

/// Windows are sent as they close: `--profile-interval` or a network sender.
fn is_continuous(cli: &ProfileArgs) -> bool {
    cli.profile_interval.is_some() || cli.sender != SenderKind::Disk
}

/// Check the flags against each other, without looking at the system:
/// the command line's own conflicts, which `main` reports as usage errors
/// (exit status 2) and [`RunPlan::from_cli`] checks again for options set by
/// code. `record`: the flags are `lightswitch record`'s, which has no
/// `--pids`. Errors name the flags at fault.
pub fn check_flags(cli: &ProfileArgs, record: bool) -> Result<()> {
    if record && !cli.pids.is_empty() {
        anyhow::bail!("record profiles its command and what it starts: --pids does not apply");
    }
    if cli
        .profile_name
        .as_deref()
        .is_some_and(|n| n.trim().is_empty())
    {
        anyhow::bail!("--profile-name is empty: give a file name, or - for standard output");
    }
    cli.outputs()?;
    if is_continuous(cli) {
        let interval = cli.profile_interval.unwrap_or(10.0);
        preflight::check_interval(interval)
            .map_err(|err| anyhow::anyhow!("--profile-interval {err}"))?;
    }
    if cli.sender == SenderKind::Disk && cli.server_url.is_some() {
        anyhow::bail!("--server-url is for --sender remote, pyroscope or otlp");
    }
    if cli.sender != SenderKind::Otlp && !cli.otlp_headers.is_empty() {
        anyhow::bail!("--otlp-header is for --sender otlp");
    }
    check_sender_formats(cli)?;
    if let Some(max) = cli.max_profiles {
        preflight::count("--max-profiles", max as u64)?;
    }
    if cli.max_profiles.is_some() && !(is_continuous(cli) && cli.sender == SenderKind::Disk) {
        anyhow::bail!("--max-profiles applies to continuous mode with the disk sender (give --profile-interval)");
    }
    Ok(())
}

/// A network sender sends only its own format: refuse any other rather
/// than send a substitute. The error names the sender, the format and what
/// the sender takes.
fn check_sender_formats(cli: &ProfileArgs) -> Result<()> {
    let kind = crate::sender::SenderKind::from(cli.sender);
    let Some(takes) = crate::sender::formats_of(kind) else {
        return Ok(());
    };
    let sender = kind.name();
    let names: Vec<&str> = takes.iter().map(|f| f.name()).collect();
    for format in cli.formats() {
        if !takes.contains(&format) {
            anyhow::bail!(
                "--sender {sender} sends only {}: it cannot send --profile-format {} \
                 (--sender otlp sends otlp, with every sample's time; --sender disk writes \
                 any format)",
                names.join(", "),
                format.name()
            );
        }
    }
    Ok(())
}

/// Rows of the `unwind_rows` map that fit in `mb` MiB (8 bytes a row). The
/// flag's parser (`cli/values.rs`) holds `mb` to 1..=32767, whose rows fit
/// in a u32; a larger value would be held to `u32::MAX` rows.
fn unwind_rows_for_budget(mb: u32) -> u32 {
    u32::try_from(u64::from(mb) * 1024 * 1024 / 8).unwrap_or(u32::MAX)
}
