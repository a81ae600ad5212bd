//! Command-line interface (clap). Parsing only: validation that needs the
//! running system (privileges, kernel limits, pids) lives in [`crate::preflight`].

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

pub use crate::format::pprof::Compression;

/// Output format of the written profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileFormat {
    /// SVG flame graph (inferno). Default file name `flamegraph.svg`.
    FlameGraph,
    /// Folded stacks, `comm;root;..;leaf count` per line. Default file name `folded.txt`.
    Folded,
    /// pprof protobuf (`go tool pprof`). Default file name `profile.pb`.
    Pprof,
}

impl ProfileFormat {
    /// The file name used when `--profile-name` is not given.
    pub fn default_file_name(self) -> &'static str {
        match self {
            ProfileFormat::FlameGraph => "flamegraph.svg",
            ProfileFormat::Folded => "folded.txt",
            ProfileFormat::Pprof => "profile.pb",
        }
    }
}

/// Verbosity of the profiler's own log (stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Warnings and errors (default).
    Warn,
    /// Progress information.
    Info,
    /// Per-object and per-process detail.
    Debug,
}

/// `lightswitch`: an eBPF CPU profiler. Samples every online CPU (or only the
/// given processes), walks kernel and user stacks, and writes a symbolized
/// profile when the run ends.
#[derive(Debug, Parser)]
#[command(name = "lightswitch", version, about, long_about = None, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// A tool other than profiling; without one, lightswitch profiles.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Only profile these processes (thread group ids). Comma-separated or repeated.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub pids: Vec<i32>,

    /// Sampling frequency per CPU, in Hz (1 ..= kernel.perf_event_max_sample_rate).
    #[arg(long, default_value_t = 99)]
    pub sample_freq: u64,

    /// Stop after this many seconds. Without it, run until Ctrl-C or SIGTERM.
    #[arg(long)]
    pub duration: Option<f64>,

    /// Do not sample the profiler's own process.
    #[arg(long)]
    pub exclude_self: bool,

    /// Output format(s): several (comma-separated or repeated) write one
    /// file each, from the same samples.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1.., default_values_t = [ProfileFormat::FlameGraph])]
    pub profile_format: Vec<ProfileFormat>,

    /// Directory the profile is written to (created if missing).
    #[arg(long, default_value = ".")]
    pub profile_path: PathBuf,

    /// File name of the profile inside --profile-path (default depends on
    /// the format; only with a single format).
    #[arg(long)]
    pub profile_name: Option<String>,

    /// Compression of pprof output: `none` (raw protobuf) or `gzip`.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub pprof_compression: Compression,

    /// Memory budget for unwind tables in BPF maps, MiB (8-byte rows). When
    /// full, the least recently sampled objects' tables are evicted.
    #[arg(long, default_value_t = 64)]
    pub max_unwind_info_mb: u32,

    /// Directory where built unwind tables are cached between runs
    /// (`none` disables the cache).
    #[arg(long, default_value = "/var/cache/lightswitch/unwind")]
    pub unwind_cache_dir: String,

    /// Show libbpf's debug output, including the BPF verifier log.
    #[arg(long)]
    pub libbpf_debug: bool,

    /// Log level of the profiler's own messages.
    #[arg(long, value_enum, default_value_t = LogLevel::Warn)]
    pub logging: LogLevel,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the unwind table lightswitch builds for an object file (its rows
    /// and a summary: rows, pages, bytes, unsupported rules by kind).
    ShowUnwind {
        /// Path of an ELF executable or shared library.
        path: PathBuf,
    },
}

impl Cli {
    /// Each output format (duplicates removed, in the given order) with the
    /// file it is written to: `--profile-path` joined with `--profile-name`
    /// or the format's default file name. Errors when `--profile-name` is
    /// given with several formats.
    pub fn outputs(&self) -> anyhow::Result<Vec<(ProfileFormat, PathBuf)>> {
        let mut formats: Vec<ProfileFormat> = Vec::new();
        for format in &self.profile_format {
            if !formats.contains(format) {
                formats.push(*format);
            }
        }
        if formats.len() > 1 && self.profile_name.is_some() {
            anyhow::bail!("--profile-name names one file: with several --profile-format values each gets its default name");
        }
        Ok(formats
            .into_iter()
            .map(|f| {
                let name = self
                    .profile_name
                    .clone()
                    .unwrap_or_else(|| f.default_file_name().to_string());
                (f, self.profile_path.join(name))
            })
            .collect())
    }
}
