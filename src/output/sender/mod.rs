//! Senders: where finished profiles go. One file per backend, all behind
//! [`Sender`]: [`disk`] (files), [`remote`] (HTTP POST of gzip'd pprof, e.g.
//! to `lightswitch collector`), [`pyroscope`] (Grafana Pyroscope's push
//! API) and [`otlp`] (OTLP/HTTP profiles, every sample's time kept). Each
//! sends the formats [`formats_of`] names, never a substitute. The network
//! senders are each a [`network::NetworkSender`] with a request of their
//! own: it hands encoded profiles to [`queue`] (bounded by
//! bytes, retries with backoff) so they never block the caller, and with
//! `--spool-dir` to [`spool`] (kept on disk until acknowledged, across
//! restarts).
//! [`worker`] runs symbolization, encoding and sending of closed windows on
//! a thread of its own, off the sampling loop.

pub mod disk;
pub mod item;
pub mod network;
pub mod otlp;
pub mod pyroscope;
pub mod queue;
pub mod remote;
pub mod spool;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::profile::format::{Compression, ProfileFormat};
use crate::profile::Profile;
use queue::{DeliveryStats, Queue};

/// Takes each window's profile. Implementations must not block on the
/// network: encode, queue, return.
pub trait Sender: Send {
    /// Hand over one window's profile. Errors (encoding, writing a file) are
    /// about this profile only; the caller logs them and goes on.
    fn send(&mut self, profile: &Profile) -> Result<()>;

    /// No more profiles: flush what is pending, giving the network until
    /// `deadline`, and report.
    fn finish(self: Box<Self>, deadline: Instant) -> SenderReport;

    /// The delivery queue of a network sender, whose counters can be read
    /// while it runs (for metrics); `None` for senders without one.
    fn delivery_queue(&self) -> Option<Arc<Queue>> {
        None
    }
}

/// What a sender did over a run.
#[derive(Debug, Clone, Default)]
pub struct SenderReport {
    /// Where profiles went: a directory, or a URL without credentials.
    pub destination: String,
    /// Files written (disk sender; only the last few when pruned).
    pub files: Vec<PathBuf>,
    /// Network delivery counters (remote and Pyroscope senders).
    pub delivery: Option<DeliveryStats>,
    /// Windows of which nothing was written because none of the formats
    /// can encode a window without samples (a flame graph; disk sender).
    pub windows_empty: u64,
}

/// The machine's host name (`gethostname`), or `unknown`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // or truncates within it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_string();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..len]).trim().to_string();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name
    }
}

/// Which sender continuous mode uses and its settings (built from the
/// command line's flags by `crate::commands::cli`, or in code).
#[derive(Debug, Clone)]
pub enum SenderConfig {
    /// Window files in a directory.
    Disk {
        /// Each format with its base path (the window's start is added to the name).
        outputs: Vec<(ProfileFormat, PathBuf)>,
        /// pprof compression.
        compression: Compression,
        /// Keep only the newest N windows per format (`--max-profiles`).
        max_profiles: Option<usize>,
        /// File mode of written profiles (`--profile-mode`, e.g. 0o600).
        mode: u32,
    },
    /// HTTP POST of gzip'd pprof to a collector at `url`.
    Remote {
        /// The collector's endpoint (`--server-url`), default [`remote::DEFAULT_URL`].
        url: Option<String>,
        /// Token, timeout, queue budget.
        http: remote::HttpSettings,
    },
    /// Grafana Pyroscope's push API.
    Pyroscope {
        /// The server's base URL (`--server-url`), default [`pyroscope::DEFAULT_URL`].
        url: Option<String>,
        /// Token, timeout, queue budget.
        http: remote::HttpSettings,
        /// `service_name` label (`--pyroscope-app-name`).
        app_name: String,
        /// Extra `KEY=VALUE` series labels (`--label`).
        labels: Vec<(String, String)>,
        /// `X-Scope-OrgID` (`--pyroscope-tenant-id`).
        tenant_id: Option<String>,
    },
    /// OTLP/HTTP profiles export requests.
    Otlp {
        /// Base URL and extra headers as given.
        otlp: otlp::OtlpSettings,
        /// Token, timeout, queue budget.
        http: remote::HttpSettings,
    },
}

impl SenderConfig {
    /// Which kind of sender this configures.
    pub fn kind(&self) -> SenderKind {
        match self {
            SenderConfig::Disk { .. } => SenderKind::Disk,
            SenderConfig::Remote { .. } => SenderKind::Remote,
            SenderConfig::Pyroscope { .. } => SenderKind::Pyroscope,
            SenderConfig::Otlp { .. } => SenderKind::Otlp,
        }
    }
}

/// Which sender: the kinds [`SenderConfig`] configures, for the formats
/// each takes ([`formats_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderKind {
    /// Files in a directory.
    Disk,
    /// `lightswitch collector` or any pprof receiver.
    Remote,
    /// Grafana Pyroscope's push API.
    Pyroscope,
    /// An OTLP/HTTP profiles receiver.
    Otlp,
}

impl SenderKind {
    /// The `--sender` value naming this kind.
    pub fn name(self) -> &'static str {
        match self {
            SenderKind::Disk => "disk",
            SenderKind::Remote => "remote",
            SenderKind::Pyroscope => "pyroscope",
            SenderKind::Otlp => "otlp",
        }
    }
}

/// The formats a sender sends (`None`: any format, as files), the first
/// being its default when `--profile-format` is not given.
pub fn formats_of(kind: SenderKind) -> Option<&'static [ProfileFormat]> {
    match kind {
        SenderKind::Disk => None,
        SenderKind::Remote | SenderKind::Pyroscope => Some(&[ProfileFormat::Pprof]),
        SenderKind::Otlp => Some(&[ProfileFormat::Otlp]),
    }
}

/// Start the sender `config` describes (continuous mode). Errors: an
/// invalid URL or settings, or an output directory that cannot be created.
pub fn start(config: SenderConfig) -> Result<Box<dyn Sender>> {
    match config {
        SenderConfig::Disk {
            outputs,
            compression,
            max_profiles,
            mode,
        } => Ok(Box::new(disk::WindowFiles::new(
            outputs,
            compression,
            max_profiles,
            mode,
        ))),
        SenderConfig::Remote { url, http } => {
            let url = url.unwrap_or_else(|| remote::DEFAULT_URL.to_string());
            let config = remote::HttpConfig::new(&url, &http)?;
            Ok(Box::new(
                remote::RemoteSender::start(config, hostname())
                    .context("starting the remote sender")?,
            ))
        }
        SenderConfig::Pyroscope {
            url,
            http,
            app_name,
            labels,
            tenant_id,
        } => {
            let base = url.unwrap_or_else(|| pyroscope::DEFAULT_URL.to_string());
            let url = pyroscope::push_url(&base);
            let config = remote::HttpConfig::new(&url, &http)?;
            let labels = pyroscope::series_labels(&app_name, &hostname(), &labels);
            Ok(Box::new(
                pyroscope::PyroscopeSender::start(config, labels, tenant_id)
                    .context("starting the Pyroscope sender")?,
            ))
        }
        SenderConfig::Otlp {
            otlp: settings,
            http,
        } => {
            let env = |name: &str| std::env::var(name).ok();
            let url = otlp::endpoint(settings.base_url.as_deref(), &env);
            let headers = otlp::headers(&settings.headers, &env)?;
            let config = remote::HttpConfig::new(&url, &http)?;
            Ok(Box::new(
                otlp::OtlpSender::start(config, headers).context("starting the OTLP sender")?,
            ))
        }
    }
}
