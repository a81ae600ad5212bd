//! Senders: where finished profiles go. One file per backend, all behind
//! [`Sender`]: [`disk`] (files), [`remote`] (HTTP POST of gzip'd pprof, e.g.
//! to `lightswitch collector`) and [`pyroscope`] (Grafana Pyroscope's push
//! API). The network senders hand encoded profiles to [`queue`] (bounded by
//! bytes, retries with backoff) so they never block the caller.
//! [`worker`] runs symbolization, encoding and sending of closed windows on
//! a thread of its own, off the sampling loop.

pub mod disk;
pub mod pyroscope;
pub mod queue;
pub mod remote;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::cli::{ProfileArgs, SenderKind};
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

/// Start the sender `cli` asks for (continuous mode). Errors: an invalid
/// URL or settings, or an output directory that cannot be created.
pub fn start(cli: &ProfileArgs) -> Result<Box<dyn Sender>> {
    match cli.sender {
        SenderKind::Disk => Ok(Box::new(disk::WindowFiles::new(
            cli.outputs()?,
            cli.pprof_compression,
            cli.max_profiles,
            cli.profile_mode,
        ))),
        SenderKind::Remote => {
            let url = cli
                .server_url
                .clone()
                .unwrap_or_else(|| remote::DEFAULT_URL.to_string());
            let config = remote::HttpConfig::from_cli(cli, &url)?;
            Ok(Box::new(
                remote::RemoteSender::start(config, hostname())
                    .context("starting the remote sender")?,
            ))
        }
        SenderKind::Pyroscope => {
            let base = cli
                .server_url
                .clone()
                .unwrap_or_else(|| pyroscope::DEFAULT_URL.to_string());
            let url = pyroscope::push_url(&base);
            let config = remote::HttpConfig::from_cli(cli, &url)?;
            let labels =
                pyroscope::series_labels(&cli.pyroscope_app_name, &hostname(), &cli.labels);
            Ok(Box::new(
                pyroscope::PyroscopeSender::start(config, labels, cli.pyroscope_tenant_id.clone())
                    .context("starting the Pyroscope sender")?,
            ))
        }
    }
}
