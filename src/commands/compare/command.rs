//! The `report` and `diff` subcommands: what each does with its plan
//! ([`ReportPlan`], [`DiffPlan`], which `crate::commands::cli` builds from
//! the flags), over the comparisons in [`super::report`] and
//! [`super::diff`], which take plain profiles.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::ci::{self, Gate};
use super::diff::diff as compare;
use super::function_table;
use super::input::{read_input, read_profile, InputFormat};
use super::report::{off_cpu_of, render_threads, render_top};
use crate::profile::format::{flamegraph, Compression, ProfileFormat};

/// What `lightswitch report FILE` does.
#[derive(Debug, Clone)]
pub struct ReportPlan {
    /// The profile to read (pprof, folded stacks, Firefox or OTLP).
    pub file: PathBuf,
    /// Start of the span to report, seconds after the profile's start
    /// (`--from`; a timeline only).
    pub from: Option<f64>,
    /// End of the span, seconds after the profile's start (`--to`).
    pub to: Option<f64>,
    /// Rows of the table (0: all).
    pub top: usize,
    /// Report off-CPU time instead of samples (`--off-cpu`).
    pub off_cpu: bool,
    /// Print samples per process and thread instead (`--threads`).
    pub threads: bool,
    /// Write the profile in this format instead of printing the table.
    pub format: Option<ProfileFormat>,
    /// Where to write it (`-`: stdout; `None`: the format's default name).
    pub output: Option<PathBuf>,
    /// Compression of a written pprof profile.
    pub pprof_compression: Compression,
    /// Largest input read, MiB (decompressed).
    pub max_input_mb: u32,
}

/// How `diff` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiffOutput {
    /// A table for people.
    Text,
    /// One JSON object (serde_json) for machines.
    Json,
    /// A Markdown summary and table ([`super::ci::markdown`]).
    Markdown,
}

/// Where `diff --annotations` writes its findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Annotations {
    /// GitHub Actions workflow commands (`::error`, `::warning`) on stdout
    /// ([`super::ci::github_annotations`]).
    Github,
}

/// What `lightswitch diff BASE NEW` does.
#[derive(Debug, Clone)]
pub struct DiffPlan {
    /// The profile compared against.
    pub base: PathBuf,
    /// The profile compared.
    pub new: PathBuf,
    /// How the result is printed.
    pub output: DiffOutput,
    /// Rows printed (0: all).
    pub top: usize,
    /// Where to write the differential flame graph (SVG), if anywhere.
    pub flame_graph: Option<PathBuf>,
    /// Fail (exit status 1) when a function's inclusive share grew by more
    /// than this many percentage points.
    pub fail_above: Option<f64>,
    /// Warn of (never fail on) a function whose inclusive share grew by
    /// more than this many percentage points: annotations and the table.
    pub warn_above: Option<f64>,
    /// Also print the functions over a threshold as CI annotations.
    pub annotations: Option<Annotations>,
    /// Also write a JUnit XML report here ([`super::ci::junit`]).
    pub junit: Option<PathBuf>,
    /// Compare off-CPU time instead of samples.
    pub off_cpu: bool,
    /// Largest input read, MiB (decompressed).
    pub max_input_mb: u32,
}

/// The span `--from`/`--to` asks for, ns after the profile's start
/// (`None`: the whole profile). Errors: a bound that is not a finite number
/// of seconds, at least 0, or an empty span.
fn span(args: &ReportPlan) -> Result<Option<(i64, i64)>> {
    if args.from.is_none() && args.to.is_none() {
        return Ok(None);
    }
    let from = args.from.unwrap_or(0.0);
    let to = args.to.unwrap_or(f64::INFINITY);
    if !(from.is_finite() && from >= 0.0) || to.is_nan() || to <= from {
        bail!("--from and --to must be seconds with 0 <= --from < --to, got {from} and {to}");
    }
    let ns = |s: f64| (s * 1e9).min(i64::MAX as f64).round() as i64;
    Ok(Some((ns(from), ns(to))))
}

/// `lightswitch report`: print the table, or with `--format` write the
/// profile in that format (to `--output`, `-` for stdout, else the
/// format's default file name; written mode 0600 as profiles are); with
/// `--from`/`--to`, of that span of a timeline only. Errors name the file
/// that could not be read, encoded or written, or say that `--from`/`--to`
/// needs a timeline.
pub fn report(args: &ReportPlan) -> Result<()> {
    let span = span(args)?;
    let (mut profile, input) = read_input(&args.file, u64::from(args.max_input_mb) << 20)?;
    if let Some((from, to)) = span {
        let timed = matches!(input, InputFormat::Timeline | InputFormat::Perfetto)
            || (input == InputFormat::Otlp && !profile.timeline.is_empty());
        if !timed {
            bail!(
                "--from/--to need a timeline (a Firefox, OTLP or Perfetto profile, e.g. written \
                 with --profile-format firefox, otlp or perfetto), but {} is {}",
                args.file.display(),
                match input {
                    InputFormat::Pprof => "a pprof profile",
                    InputFormat::Otlp => "an OTLP profile without timestamps",
                    _ => "folded stacks",
                }
            );
        }
        profile = crate::profile::slice::slice(&profile, from, to);
    }
    if args.threads {
        let _ = std::io::stdout()
            .lock()
            .write_all(render_threads(&profile).as_bytes());
        return Ok(());
    }
    if args.off_cpu {
        profile = off_cpu_of(profile, &args.file)?;
    }
    let Some(format) = args.format else {
        let table = function_table(&profile, false)?;
        let text = render_top(&profile, &table, args.top);
        // A closed pipe (`| head`) is not an error worth reporting.
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        return Ok(());
    };
    let bytes = crate::profile::format::encode(&profile, format, args.pprof_compression)?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format.default_file_name()));
    if output.as_os_str() == "-" {
        let _ = std::io::stdout().lock().write_all(&bytes);
        return Ok(());
    }
    // As every profile: private, atomic, its directory made if missing.
    crate::util::files::write_atomic(&output, &bytes, crate::util::files::PROFILE_MODE)?;
    eprintln!("wrote {}", output.display());
    Ok(())
}

/// `lightswitch diff`: print the comparison, write the flame graph when
/// asked, and return the exit status: 1 when the gate fails a function
/// ([`ci::Gate::failed`]: growth above `--fail-above`), else 0. Errors (exit status [`super::diff::BAD_INPUT_EXIT_STATUS`]) name the input
/// that could not be read, or the flame graph that could not be written
/// (mode 0600, as profiles are), or an input without samples.
pub fn diff(args: &DiffPlan) -> Result<i32> {
    for (flag, points) in [
        ("--fail-above", args.fail_above),
        ("--warn-above", args.warn_above),
    ] {
        if let Some(points) = points {
            if !points.is_finite() || points < 0.0 {
                bail!("{flag} must be a number of percentage points, at least 0, got {points}");
            }
        }
    }
    let gate = Gate {
        fail_above: args.fail_above,
        warn_above: args.warn_above,
    };
    if args.annotations.is_some() {
        if !gate.is_set() {
            bail!("--annotations needs a threshold: --fail-above or --warn-above");
        }
        if args.output == DiffOutput::Json {
            bail!("--annotations writes to stdout, which --output json keeps for one JSON object");
        }
    }
    let max_bytes = u64::from(args.max_input_mb) << 20;
    let mut base = read_profile(&args.base, max_bytes)?;
    let mut new = read_profile(&args.new, max_bytes)?;
    // A gate must not pass on a run that was never sampled (a benchmark
    // that broke, or ended before its first sample).
    for (profile, path) in [(&base, &args.base), (&new, &args.new)] {
        if profile.total_samples() == 0 {
            bail!(
                "{} holds no samples: nothing to compare (did the profiled run end before                  its first sample?)",
                path.display()
            );
        }
    }
    if args.off_cpu {
        base = off_cpu_of(base, &args.base)?;
        new = off_cpu_of(new, &args.new)?;
    }
    let diff = compare(&base, &new)?;
    if let Some(hint) = diff.renamed_hint() {
        eprintln!("{hint}");
    }
    if let Some(path) = &args.flame_graph {
        let svg = flamegraph::differential(
            &base,
            &new,
            &args.base.display().to_string(),
            &args.new.display().to_string(),
        )?;
        // As every profile: private, atomic, its directory made if missing.
        crate::util::files::write_atomic(path, &svg, crate::util::files::PROFILE_MODE)
            .context("writing the differential flame graph")?;
    }
    let grown = gate.failed(&diff);
    let mut stdout = std::io::stdout().lock();
    match args.output {
        DiffOutput::Json => {
            let value = serde_json::json!({
                "base": { "path": args.base, "samples": diff.base_samples },
                "new": { "path": args.new, "samples": diff.new_samples },
                "functions": diff.functions.iter().take(if args.top == 0 { usize::MAX } else { args.top }).collect::<Vec<_>>(),
                "fail_above": args.fail_above,
                "grown_above_threshold": grown,
            });
            let _ = writeln!(stdout, "{value:#}");
        }
        DiffOutput::Markdown => {
            let _ = write!(
                stdout,
                "{}",
                ci::markdown(&diff, &args.base, &args.new, &gate, args.top)
            );
        }
        DiffOutput::Text => {
            let _ = write!(
                stdout,
                "{}",
                diff.render_text(&args.base, &args.new, args.top)
            );
            if let Some(points) = args.fail_above {
                for c in &grown {
                    let _ = writeln!(
                        stdout,
                        "FAIL: {} grew by {:+.2} points (inclusive {:.2}% -> {:.2}%), above {points}",
                        c.label(),
                        c.inclusive_change,
                        c.base.inclusive,
                        c.new.inclusive
                    );
                }
            }
        }
    }
    if args.annotations == Some(Annotations::Github) {
        let _ = write!(stdout, "{}", ci::github_annotations(&diff, &gate));
    }
    if let Some(path) = &args.junit {
        let xml = ci::junit(&diff, &gate, args.top)?;
        crate::util::files::write_atomic(path, &xml, REPORT_MODE)
            .with_context(|| format!("writing the JUnit report {}", path.display()))?;
    }
    Ok(if grown.is_empty() { 0 } else { 1 })
}

/// File mode of `diff --junit`'s report: a CI artifact that other users
/// (the CI's uploader) read, unlike profiles.
const REPORT_MODE: u32 = 0o644;
