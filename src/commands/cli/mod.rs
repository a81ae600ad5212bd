//! Command-line interface (clap). Parsing only: validation that needs the
//! running system (privileges, kernel limits, pids) lives in [`crate::sampling::preflight`].

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::commands::compare::command::{Annotations, DiffOutput};

pub mod generate;
mod plan;
mod values;
pub use values::{parse_count, parse_interval, parse_seconds};
use values::{
    parse_header, parse_label, parse_retention, parse_storage_size, parse_unwind_budget_mb,
};

use crate::profile::format::{Compression, ProfileFormat};
use crate::unwind::identity::DEFAULT_DEBUG_ROOT;

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

/// The examples `lightswitch --help` ends with.
const EXAMPLES: &str = "Examples:
  sudo lightswitch -d 5                          whole machine for 5 s -> ./flamegraph.svg
  sudo lightswitch -p 1234 -F 999 -d 30s         one process at 999 Hz
  sudo lightswitch -d 2m --profile-format pprof  -> ./profile.pb (go tool pprof -top profile.pb)
  sudo lightswitch record -- ./bench             a command and everything it starts
  lightswitch report profile.pb                  top functions of a saved profile
  lightswitch diff --fail-above 5 a.pb b.pb      exit 1 when a function grew by over 5 points
  lightswitch completions bash > /etc/bash_completion.d/lightswitch
  lightswitch man > lightswitch.1";

/// `lightswitch`: an eBPF CPU profiler. Samples every online CPU (or only the
/// given processes), walks kernel and user stacks, and writes a symbolized
/// profile when the run ends.
#[derive(Debug, Parser)]
#[command(
    name = "lightswitch",
    version,
    about,
    long_about = None,
    args_conflicts_with_subcommands = true,
    allow_negative_numbers = true,
    after_help = EXAMPLES
)]
pub struct Cli {
    /// A tool other than profiling; without one, lightswitch profiles.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// How to profile (without a subcommand).
    #[command(flatten)]
    pub profile: ProfileArgs,
}

impl std::ops::Deref for Cli {
    type Target = ProfileArgs;

    /// The top-level profiling options.
    fn deref(&self) -> &ProfileArgs {
        &self.profile
    }
}

/// The options of a profiling run: the top-level flags, and `record`'s.
#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Only profile these processes (thread group ids). Comma-separated or
    /// repeated. Their children are not followed: `record` does that.
    #[arg(short = 'p', long, value_delimiter = ',')]
    pub pids: Vec<u32>,

    /// Sampling frequency per CPU, in Hz (1 ..= kernel.perf_event_max_sample_rate).
    #[arg(short = 'F', long, default_value_t = crate::agent::run::DEFAULT_SAMPLE_FREQ_HZ)]
    pub sample_freq: u64,

    /// Stop after this long: seconds, or with a unit (`5s`, `500ms`, `2m`).
    /// Without it, run until Ctrl-C or SIGTERM.
    #[arg(short = 'd', long, value_name = "DURATION", value_parser = parse_seconds)]
    pub duration: Option<f64>,

    /// Do not sample the profiler's own process.
    #[arg(long)]
    pub exclude_self: bool,

    /// Also record where threads wait: each time a profiled thread leaves
    /// its CPU (it blocks, or is preempted) for at least --off-cpu-min, its
    /// stacks at that moment, weighted by the time until it runs again
    /// (ns). pprof gets a second sample type, off_cpu/nanoseconds; folded
    /// and flame graph files of their own (docs/off-cpu.md).
    #[arg(long)]
    pub off_cpu: bool,

    /// Shortest wait --off-cpu records: seconds or with a unit (`50us`,
    /// `1ms`). Shorter ones are counted (summary, /metrics), not recorded.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, default_value = "50us")]
    pub off_cpu_min: f64,

    /// Output format(s): several (comma-separated or repeated) write one
    /// file each, from the same samples. Default: flame-graph, or the
    /// format the --sender sends (remote and pyroscope: pprof; otlp: otlp).
    /// A network sender sends only its own format: any other is refused.
    #[arg(long, value_enum, ignore_case = true, value_delimiter = ',')]
    pub profile_format: Vec<ProfileFormat>,

    /// Directory the profile is written to (created if missing).
    #[arg(long, default_value = ".")]
    pub profile_path: PathBuf,

    /// File name of the profile inside --profile-path (default depends on
    /// the format; only with a single format). `-` is standard output (the
    /// summary then goes to stderr).
    #[arg(long)]
    pub profile_name: Option<String>,

    /// File mode of written profiles, octal, before the umask (default 600:
    /// owner only; profiles name every process and hold kernel addresses).
    /// E.g. 640 to let the file's group read them.
    #[arg(long, value_parser = crate::util::files::parse_mode, default_value = "600")]
    pub profile_mode: u32,

    /// Compression of pprof, OTLP and Perfetto output: `none` (raw protobuf)
    /// or `gzip`.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub pprof_compression: Compression,

    /// Memory budget for unwind tables in BPF maps, MiB (8-byte rows). When
    /// full, the least recently sampled objects' tables are evicted.
    /// 1 to 32767.
    #[arg(long, value_parser = parse_unwind_budget_mb, default_value_t = crate::agent::run::DEFAULT_UNWIND_BUDGET_MB)]
    pub max_unwind_info_mb: u32,

    /// Directory where built unwind tables are cached between runs, and
    /// where debug information stored compressed is kept inflated
    /// (`decompressed-debug/`, one file per build ID, at most 4 GiB in
    /// all), so it is not inflated into memory at every use (`none`
    /// disables both).
    #[arg(long, default_value = "/var/cache/lightswitch/unwind")]
    pub unwind_cache_dir: String,

    /// Directories separate debug files are looked up in, in order
    /// (comma-separated or repeated): `DIR/.build-id/xx/yyyy.debug` by the
    /// object's build ID, then its `.gnu_debuglink` name next to it and
    /// under `DIR/<object's directory>`.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_DEBUG_ROOT)]
    pub debug_dirs: Vec<PathBuf>,

    /// debuginfod servers to fetch debug files from by build ID, for
    /// objects whose debug information is nowhere on this machine
    /// (comma-separated or repeated; tried in order). Default: the
    /// space-separated `DEBUGINFOD_URLS`; none when it is unset.
    #[arg(long = "debuginfod", value_name = "URL", value_delimiter = ',')]
    pub debuginfod_urls: Vec<String>,

    /// Directory fetched debug files are cached in (`BUILDID/debuginfo`).
    /// Default: `$DEBUGINFOD_CACHE_PATH`, else
    /// `$XDG_CACHE_HOME/debuginfod_client`, else
    /// `~/.cache/debuginfod_client` (the cache elfutils' client shares).
    #[arg(long, value_name = "DIR")]
    pub debuginfod_cache: Option<PathBuf>,

    /// Show libbpf's debug output, including the BPF verifier log.
    #[arg(long)]
    pub libbpf_debug: bool,

    /// Log level of the profiler's own messages.
    #[arg(long, value_enum, default_value_t = LogLevel::Warn)]
    pub logging: LogLevel,

    /// Continuous mode: emit one profile per window of this length (seconds,
    /// or with a unit: `30s`, `1m`; default 10 s when continuous). Given
    /// explicitly, or with a sender other than `disk`, the run is
    /// continuous; otherwise one profile covers the run.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval, allow_negative_numbers = true)]
    pub profile_interval: Option<f64>,

    /// Continuous mode with the disk sender: keep only the newest N window
    /// files per format in --profile-path (older ones are deleted).
    #[arg(long, value_parser = parse_count::<usize>)]
    pub max_profiles: Option<usize>,

    /// Where profiles go: `disk` (files in --profile-path), `remote` (HTTP
    /// POST of gzip'd pprof to --server-url, e.g. a `lightswitch collector`),
    /// `pyroscope` (Grafana Pyroscope's push API at --server-url) or `otlp`
    /// (OTLP/HTTP profiles, every sample's time kept, to
    /// --server-url/v1development/profiles).
    #[arg(long, value_enum, default_value_t = SenderKind::Disk)]
    pub sender: SenderKind,

    /// Server URL. `remote`: the endpoint profiles are POSTed to (default
    /// http://127.0.0.1:4567/v1/profiles). `pyroscope`: the server's base URL
    /// (default http://127.0.0.1:4040; `/push.v1.PusherService/Push` is
    /// appended). `otlp`: the receiver's base URL (`/v1development/profiles`
    /// is appended; default `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` as it is,
    /// else `OTEL_EXPORTER_OTLP_ENDPOINT`, else http://localhost:4318).
    /// `user:password@` in it is sent as basic auth.
    #[arg(long)]
    pub server_url: Option<String>,

    /// OTLP sender: an extra request header `KEY=VALUE` (repeatable), e.g.
    /// for authentication; added to those of `OTEL_EXPORTER_OTLP_HEADERS`
    /// and `OTEL_EXPORTER_OTLP_PROFILES_HEADERS`, replacing theirs of the
    /// same name.
    #[arg(long = "otlp-header", value_name = "KEY=VALUE", value_parser = parse_header)]
    pub otlp_headers: Vec<(String, String)>,

    /// Bearer token for the server (`Authorization: Bearer`). Prefer the
    /// environment variable: a command-line argument is visible to every
    /// user in the process list.
    #[arg(long, env = "LIGHTSWITCH_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Pyroscope: the `service_name` label of the pushed profiles.
    #[arg(long, default_value = "lightswitch")]
    pub pyroscope_app_name: String,

    /// Pyroscope: tenant id, sent as the `X-Scope-OrgID` header (multi-tenant servers).
    #[arg(long)]
    pub pyroscope_tenant_id: Option<String>,

    /// Pyroscope: an extra label `KEY=VALUE` on every pushed profile
    /// (repeatable). Keys are `[a-zA-Z_][a-zA-Z0-9_]*`.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,

    /// Remote senders: budget of the send queue, bytes of encoded profiles.
    /// When full, the oldest queued profile is dropped (and counted).
    #[arg(long, value_parser = parse_count::<usize>, default_value_t = 64 * 1024 * 1024)]
    pub send_queue_bytes: usize,

    /// Remote senders: timeout of one HTTP request (seconds, or with a unit).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, default_value = "10")]
    pub send_timeout: f64,

    /// Remote senders: at shutdown, how long pending profiles may still be
    /// sent (seconds, or with a unit; what is left after that is dropped
    /// and counted).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, default_value = "5")]
    pub flush_timeout: f64,

    /// Remote senders: keep every profile not yet delivered in this
    /// directory (created 0700), written atomically and removed once the
    /// server acknowledged it, so that a restarted agent sends what an
    /// earlier run could not, first and with its original times (the
    /// collector counts a window it already has once). Files of another
    /// host or damaged ones are skipped, counted and moved to DIR/skipped/.
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,

    /// --spool-dir: most bytes of spooled profiles; beyond it the oldest
    /// files are removed (their profiles may still be sent from memory).
    #[arg(long, value_parser = parse_count::<u64>, default_value_t = 256 * 1024 * 1024)]
    pub spool_max_bytes: u64,

    /// --spool-dir: spooled profiles older than this are removed (seconds,
    /// or with a unit).
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds, default_value = "24h")]
    pub spool_max_age: f64,

    /// Serve on-demand CPU profiles, the profiler's own heap profile and
    /// metrics over HTTP at this address (`HOST:PORT`; `:PORT` or `PORT`
    /// binds 127.0.0.1; port 0 picks a free one). The bound address is
    /// printed on stdout. Without --duration, --profile-interval or a
    /// network sender, the profiler only serves requests and samples only
    /// while one is in progress.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,

    /// Require `Authorization: Bearer TOKEN` on every --listen endpoint
    /// except `/healthz` (401 otherwise). Set but empty is an error at
    /// start. Prefer the environment variable: a command-line argument is
    /// visible in the process list.
    #[arg(long, env = "LIGHTSWITCH_LISTEN_TOKEN", hide_env_values = true)]
    pub listen_token: Option<String>,

    /// Longest on-demand profile, seconds (`/debug/pprof/profile?seconds=N`).
    #[arg(long, value_parser = parse_count::<u64>, default_value_t = 300)]
    pub listen_max_seconds: u64,

    /// On-demand profile requests in progress at once; more get 429.
    #[arg(long, value_parser = parse_count::<usize>, default_value_t = 4)]
    pub listen_max_requests: usize,

    /// Connections the --listen server serves at once (at most a quarter
    /// of the open-file limit, `ulimit -n`). When all are taken,
    /// connections idle for over 1 s are closed to make room, and a new one
    /// that finds none within 0.25 s is closed. A client has 10 s to send a
    /// request's headers; an idle connection is closed after 10 s. A failed
    /// accept() (out of file descriptors) is logged and retried.
    #[arg(long, value_parser = parse_count::<usize>, default_value_t = crate::agent::http::serve::DEFAULT_MAX_CONNECTIONS)]
    pub listen_max_connections: usize,
}

/// Where profiles are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SenderKind {
    /// Files in --profile-path.
    Disk,
    /// HTTP POST of gzip'd pprof (e.g. to `lightswitch collector`).
    Remote,
    /// Grafana Pyroscope's push API.
    Pyroscope,
    /// OTLP/HTTP profiles (OpenTelemetry Collector, Pyroscope, Parca,
    /// `lightswitch collector`).
    Otlp,
}

impl From<SenderKind> for crate::output::sender::SenderKind {
    fn from(kind: SenderKind) -> Self {
        match kind {
            SenderKind::Disk => Self::Disk,
            SenderKind::Remote => Self::Remote,
            SenderKind::Pyroscope => Self::Pyroscope,
            SenderKind::Otlp => Self::Otlp,
        }
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing buys nothing
pub enum Command {
    /// Run a command and profile it and every process it starts, from its
    /// first instruction, until it exits; exits with the command's status.
    #[command(after_help = "Examples:\n  \
        sudo lightswitch record -- ./bench --iterations 10\n  \
        sudo lightswitch record --profile-format pprof -- make -j2\n  \
        sudo lightswitch record -d 5s --as-root -- ./server")]
    // `--pids` is shared with the profiling run but rejected by `record`.
    #[command(mut_arg("pids", |a| a.hide(true)))]
    Record(RecordArgs),
    /// Compare two saved profiles (pprof, raw or gzip'd, or folded stacks):
    /// the functions whose share of samples changed most, in percentage points.
    #[command(after_help = "Examples:\n  \
        lightswitch diff base.pb new.pb\n  \
        lightswitch diff --fail-above 5 base.pb new.pb   # CI: exit 1 on a regression\n  \
        lightswitch diff --output json --flame-graph diff.svg base.txt new.txt")]
    Diff(DiffArgs),
    /// Print the top functions of a saved profile (flat and cumulative, like
    /// `go tool pprof -top`), or re-encode it into another format.
    #[command(after_help = "Examples:\n  \
        lightswitch report profile.pb\n  \
        lightswitch report --format flame-graph --output cpu.svg profile.pb")]
    Report(ReportArgs),
    /// Print a shell completion script for lightswitch to stdout.
    #[command(after_help = "Examples:\n  \
        lightswitch completions bash > /usr/share/bash-completion/completions/lightswitch\n  \
        lightswitch completions zsh > /usr/share/zsh/vendor-completions/_lightswitch\n  \
        lightswitch completions fish > /usr/share/fish/vendor_completions.d/lightswitch.fish")]
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print lightswitch's man page (roff, section 1) to stdout, or the page
    /// of one subcommand (lightswitch-record(1), ...).
    #[command(after_help = "Examples:\n  \
        lightswitch man > /usr/share/man/man1/lightswitch.1\n  \
        lightswitch man record > /usr/share/man/man1/lightswitch-record.1\n  \
        lightswitch man | man -l -")]
    Man {
        /// The subcommand whose page to print; none: lightswitch(1).
        #[arg(value_parser = ["record", "diff", "report", "completions", "man", "show-unwind", "collector", "help"])]
        subcommand: Option<String>,
    },
    /// Print the unwind table lightswitch builds for an object file (its rows
    /// and a summary: rows, pages, bytes, unsupported rules by kind).
    ShowUnwind {
        /// Path of an ELF executable or shared library.
        path: PathBuf,
        /// Directories its separate debug file (for `.debug_frame`) is
        /// looked up in, as for profiling.
        #[arg(long, value_delimiter = ',', default_value = DEFAULT_DEBUG_ROOT)]
        debug_dirs: Vec<PathBuf>,
    },
    /// Receive profiles over HTTP (OTLP from `--sender otlp` at
    /// `/v1development/profiles`, pprof from `--sender remote` or any client
    /// at `/v1/profiles`), keep every sample with its time under --storage,
    /// and serve any time range back: `GET /v1/profiles/merged` (every
    /// format), `GET /v1/timeline` (density per host, process, thread),
    /// `GET /v1/hosts`, `GET /metrics` (docs/collector.md).
    Collector {
        /// Address to listen on (`HOST:PORT`).
        #[arg(long, default_value = "127.0.0.1:4567")]
        listen: String,
        /// Directory profiles are stored in (created if missing): samples
        /// under `.samples/`, pprof bodies as received as
        /// `HOST/DAY/START-END-ID.pb.gz`.
        #[arg(long)]
        storage: PathBuf,
        /// Require `Authorization: Bearer TOKEN` on every request (401
        /// otherwise). Set but empty is an error at start. Prefer the
        /// environment variable: a command-line argument is visible in the
        /// process list.
        #[arg(long, env = "LIGHTSWITCH_COLLECTOR_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// File mode of stored profiles, octal, before the umask (default
        /// 600). Directories get the matching search bits (600 -> 700,
        /// 640 -> 750).
        #[arg(long, value_parser = crate::util::files::parse_mode, default_value = "600")]
        profile_mode: u32,
        /// Largest accepted request body, bytes (413 above it).
        #[arg(long, value_parser = parse_count::<usize>, default_value_t = 32 * 1024 * 1024)]
        max_body_bytes: usize,
        /// Largest size a gzip'd body may decompress to, bytes (413 above
        /// it; decompression stops there, so a bomb costs at most this).
        #[arg(long, value_parser = parse_count::<usize>, default_value_t = values::DEFAULT_MAX_DECODED_BYTES)]
        max_decoded_bytes: usize,
        /// Request bodies read and decoded at once; more wait their turn
        /// (408 after 60 s).
        #[arg(long, value_parser = parse_count::<usize>, default_value_t = 2)]
        max_concurrent_ingests: usize,
        /// Most stored profiles one `GET /v1/profiles/merged` may cover
        /// (413 beyond, naming how many matched). Profiles are merged one at
        /// a time, so memory does not grow with their number.
        #[arg(long, value_parser = parse_count::<usize>, default_value_t = values::DEFAULT_MAX_MERGE_PROFILES)]
        max_merge_profiles: usize,
        /// Connections served at once (at most a quarter of `ulimit -n`).
        /// When all are taken, connections idle
        /// for over 1 s are closed to make room, and a new one that finds
        /// none within 0.25 s is closed. A client has 10 s to send a
        /// request's headers; an idle connection is closed after 10 s.
        #[arg(long, value_parser = parse_count::<usize>, default_value_t = crate::agent::http::serve::DEFAULT_MAX_CONNECTIONS)]
        max_connections: usize,
        /// Most samples a merged answer in a format that keeps every
        /// sample's time (firefox, otlp) may hold (413 beyond, saying so;
        /// 12 bytes each while it is built). Aggregated formats are not limited.
        #[arg(long, value_parser = parse_count::<u64>, default_value_t = values::DEFAULT_MAX_TIMELINE_SAMPLES)]
        max_timeline_samples: u64,
        /// Delete stored data older than this (`7d`, `36h`, `90m`; humantime
        /// units), checked every 10 s while running. Default: keep forever.
        #[arg(long, value_name = "DURATION", value_parser = parse_retention)]
        retention: Option<u64>,
        /// Delete the oldest stored data while the storage (samples, stack
        /// table, archived pprof files) is larger than this (`20GiB`,
        /// `500MB`, bytes without a unit), checked every 10 s. Default: no limit.
        #[arg(long, value_name = "BYTES", value_parser = parse_storage_size)]
        max_storage: Option<u64>,
        /// Log level of the collector's own messages (stderr).
        #[arg(long, value_enum, default_value_t = LogLevel::Warn)]
        logging: LogLevel,
    },
}

/// `lightswitch record [OPTIONS] [--] CMD [ARGS...]`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// How to profile (every option of a profiling run but `--pids`).
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// Run the command as root even when lightswitch was started through
    /// sudo (by default it runs as the invoking user, SUDO_UID/SUDO_GID).
    #[arg(long)]
    pub as_root: bool,
    /// The command and its arguments: everything from the first argument
    /// that is not one of record's options (`record -F 999 make -j2`), or
    /// after `--`.
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `lightswitch diff BASE NEW`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The baseline profile (pprof raw or gzip'd, folded stacks, or a
    /// Firefox Profiler timeline).
    pub base: PathBuf,
    /// The profile compared against it.
    pub new: PathBuf,
    /// `text` (default), `json`, or `markdown` (a table for
    /// `$GITHUB_STEP_SUMMARY`); `--format` is the same flag.
    #[arg(long, alias = "format", value_enum, default_value_t = DiffOutput::Text)]
    pub output: DiffOutput,
    /// How many functions to list (those whose share changed most); 0 lists all.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Also write a differential flame graph (inferno: NEW's stacks, grown
    /// in red, shrunk in blue; BASE normalized to NEW's total) to this file.
    #[arg(long, value_name = "FILE")]
    pub flame_graph: Option<PathBuf>,
    /// Exit 1 when any function's inclusive share grew by more than this
    /// many percentage points (exit 0 otherwise; 2 on bad input).
    #[arg(long, value_name = "PCT")]
    pub fail_above: Option<f64>,
    /// Warn of any function whose inclusive share grew by more than this
    /// many percentage points (a `::warning` annotation, a mark in the
    /// Markdown table); never changes the exit status.
    #[arg(long, value_name = "PCT")]
    pub warn_above: Option<f64>,
    /// Also print each function over --fail-above (`::error`) or
    /// --warn-above (`::warning`) as a CI annotation on stdout: `github`
    /// (GitHub Actions workflow commands).
    #[arg(long, value_name = "KIND", value_enum)]
    pub annotations: Option<Annotations>,
    /// Also write a JUnit XML report to this file: one test case per listed
    /// function (--top, and every one over a threshold), failed when over
    /// --fail-above (GitLab, Jenkins and most CI systems read it).
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Compare the profiles' off-CPU time (recorded with --off-cpu: pprof,
    /// OTLP) instead of their on-CPU samples; shares are of the ns waited.
    #[arg(long)]
    pub off_cpu: bool,
    /// Largest size of each input once decoded (decompressed, when gzip'd),
    /// MiB. Reading stops there and the input is refused (exit 2), so a
    /// larger file or a gzip bomb costs at most about this much memory.
    #[arg(long, value_name = "MIB", value_parser = parse_count::<u32>, default_value_t = crate::commands::compare::input::DEFAULT_MAX_INPUT_MB)]
    pub max_input_mb: u32,
}

/// `lightswitch report FILE`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A saved profile (pprof raw or gzip'd, folded stacks, or a timeline:
    /// Firefox Profiler JSON, gzip'd or not).
    pub file: PathBuf,
    /// For a timeline: only the samples taken at least this many seconds
    /// after the profile's start (the times the Firefox Profiler shows).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub from: Option<f64>,
    /// For a timeline: only the samples taken less than this many seconds
    /// after the profile's start.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub to: Option<f64>,
    /// How many functions to list; 0 lists all.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// The profile's off-CPU time (recorded with --off-cpu: pprof, OTLP, a
    /// timeline) instead of its on-CPU samples: functions by the time
    /// threads waited under them, or with --format its off-CPU profile.
    #[arg(long, conflicts_with = "threads")]
    pub off_cpu: bool,
    /// Per thread, on-CPU time (samples times the period) and off-CPU time
    /// side by side, and their sum: the thread's wall time for a
    /// `record --off-cpu` profile.
    #[arg(long, conflicts_with = "format")]
    pub threads: bool,
    /// Instead of the table, re-encode the profile into this format.
    #[arg(long, value_enum, ignore_case = true)]
    pub format: Option<ProfileFormat>,
    /// With --format: the file to write (default: the format's default
    /// file name in the current directory; `-` writes to stdout).
    #[arg(long, short = 'o', requires = "format")]
    pub output: Option<PathBuf>,
    /// With --format pprof, otlp or perfetto: `none` (raw protobuf) or `gzip`.
    #[arg(long, value_enum, default_value_t = Compression::None)]
    pub pprof_compression: Compression,
    /// Largest size of the input once decoded (decompressed, when gzip'd),
    /// MiB. Reading stops there and the input is refused (exit 2), so a
    /// larger file or a gzip bomb costs at most about this much memory.
    #[arg(long, value_name = "MIB", value_parser = parse_count::<u32>, default_value_t = crate::commands::compare::input::DEFAULT_MAX_INPUT_MB)]
    pub max_input_mb: u32,
}

impl Cli {
    /// The log level: `record`'s or `collector`'s `--logging`, else the
    /// top-level one.
    pub fn log_level(&self) -> LogLevel {
        match &self.command {
            Some(Command::Record(record)) => record.profile.logging,
            Some(Command::Collector { logging, .. }) => *logging,
            _ => self.profile.logging,
        }
    }
}

#[cfg(test)]
mod tests;
