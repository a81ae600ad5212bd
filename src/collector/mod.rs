//! `lightswitch collector`: a small receiving server for profiles, so that
//! one machine (or a few) needs nothing else. It accepts OTLP profiles
//! (`--sender otlp`, any OTLP exporter) and pprof (`--sender remote`, any
//! client), keeps every sample with its own time in the sample store
//! ([`sample_store`]; pprof bodies are also archived as received, [`archive`]),
//! and answers any time range at sample resolution ([`server`],
//! [`queries`]; docs/collector.md).

pub mod archive;
pub mod diff;
pub mod ingest;
pub mod metrics;
pub mod queries;
pub mod sample_store;
pub mod server;
pub mod state;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::agent::http::serve::{serve, ConnectionLimits, ConnectionStats};
use crate::agent::http::server_token;

/// How the collector runs (from `lightswitch collector`'s flags).
#[derive(Clone)]
pub struct CollectorPlan {
    /// `HOST:PORT` to listen on (port 0 picks a free one; the address is printed).
    pub listen: String,
    /// Storage directory.
    pub storage: PathBuf,
    /// Mode of stored profiles before the umask (default
    /// [`crate::util::files::PROFILE_MODE`]); directories get the matching
    /// search bits.
    pub profile_mode: u32,
    /// Bearer token every request must carry, if set (`--token` /
    /// `LIGHTSWITCH_COLLECTOR_TOKEN`; set but empty is an error at start).
    pub token: Option<String>,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// Largest size a body may decompress to, bytes.
    pub max_decoded_bytes: usize,
    /// Request bodies read and decoded at once (the rest wait).
    pub max_concurrent_ingests: usize,
    /// Most stored profiles one merge request may cover.
    pub max_merge_profiles: usize,
    /// Connections served at once (at most a quarter of the open-file
    /// limit; see [`crate::agent::http::serve`]).
    pub max_connections: usize,
    /// Most samples a merged answer in a timeline format (firefox, otlp)
    /// may hold.
    pub max_timeline_samples: u64,
    /// What retention keeps (`--retention`, `--max-storage`).
    pub retention: sample_store::retention::Retention,
}

impl std::fmt::Debug for CollectorPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectorPlan")
            .field("listen", &self.listen)
            .field("storage", &self.storage)
            .field("profile_mode", &format_args!("{:o}", self.profile_mode))
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_decoded_bytes", &self.max_decoded_bytes)
            .field("max_concurrent_ingests", &self.max_concurrent_ingests)
            .field("max_merge_profiles", &self.max_merge_profiles)
            .field("max_connections", &self.max_connections)
            .field("max_timeline_samples", &self.max_timeline_samples)
            .field("retention", &self.retention)
            .finish()
    }
}

impl CollectorPlan {
    fn check(&self) -> Result<()> {
        for (flag, value) in [
            ("--max-body-bytes", self.max_body_bytes),
            ("--max-decoded-bytes", self.max_decoded_bytes),
            ("--max-concurrent-ingests", self.max_concurrent_ingests),
            ("--max-merge-profiles", self.max_merge_profiles),
            ("--max-connections", self.max_connections),
            ("--max-timeline-samples", self.max_timeline_samples as usize),
        ] {
            crate::sampling::preflight::count(flag, value as u64)?;
        }
        if self.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            // Before anything is created; server_token says it again after binding.
            server_token(
                self.token.as_deref(),
                TOKEN_NAMES,
                ([127, 0, 0, 1], 0).into(),
            )?;
        }
        Ok(())
    }
}

/// The collector token's flag and variable, for messages.
const TOKEN_NAMES: &str = "--token / LIGHTSWITCH_COLLECTOR_TOKEN";

/// Run the collector until SIGINT or SIGTERM. Prints `collector listening
/// on http://ADDR, storing in DIR` on stdout once it accepts connections,
/// and `collector stopped` when a signal has stopped it (after requests in
/// progress finished). Errors: a bad limit or an empty token, the storage
/// directory cannot be created, or the address cannot be bound.
pub fn run(config: &CollectorPlan) -> Result<()> {
    config.check()?;
    let stop = Arc::new(tokio::sync::Notify::new());
    let notify = stop.clone();
    // Installed over an inherited SIG_IGN (a background job's SIGINT).
    ctrlc::set_handler(move || notify.notify_one()).context("installing signal handlers")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lsw-collector")
        .enable_io()
        .enable_time()
        .build()
        .context("starting the collector's runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let address = listener.local_addr().context("reading the bound address")?;
        let archive = Arc::new(archive::Storage::open(
            &config.storage,
            config.profile_mode,
        )?);
        let samples = Arc::new(sample_store::SampleStore::open(
            &config.storage,
            config.profile_mode,
        )?);
        sample_store::retention::spawn(samples.clone(), archive.clone(), config.retention);
        let state = state::AppState {
            token: server_token(config.token.as_deref(), TOKEN_NAMES, address)?,
            storage: archive,
            max_body_bytes: config.max_body_bytes,
            max_decoded_bytes: config.max_decoded_bytes,
            ingests: Arc::new(tokio::sync::Semaphore::new(config.max_concurrent_ingests)),
            max_merge_profiles: config.max_merge_profiles,
            store: samples,
            max_timeline_samples: config.max_timeline_samples,
        };
        say(&format!(
            "collector listening on http://{address}, storing in {}",
            config.storage.display()
        ));
        let limits = ConnectionLimits {
            max_connections: config.max_connections,
            ..ConnectionLimits::default()
        };
        let stats = Arc::new(ConnectionStats::default());
        serve(
            listener,
            server::router(state),
            limits,
            stats,
            stop.notified(),
        )
        .await;
        say("collector stopped");
        Ok(())
    })
}

/// A line on stdout, flushed (scripts wait for it).
fn say(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}
