//! `lightswitch collector`: a small receiving server for profiles, so that
//! one machine (or a few) needs nothing else. It accepts what
//! `--sender=remote` posts (and raw or gzip'd pprof from any client),
//! stores each profile durably ([`storage`]), and serves listings and
//! merged views ([`server`], [`merge`]).

pub mod merge;
pub mod server;
pub mod storage;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

/// How the collector runs (from `lightswitch collector`'s flags).
#[derive(Clone)]
pub struct CollectorConfig {
    /// `HOST:PORT` to listen on (port 0 picks a free one; the address is printed).
    pub listen: String,
    /// Storage directory.
    pub storage: PathBuf,
    /// Bearer token every request must carry, if set.
    pub token: Option<String>,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
}

impl std::fmt::Debug for CollectorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectorConfig")
            .field("listen", &self.listen)
            .field("storage", &self.storage)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .finish()
    }
}

/// Run the collector until the process is stopped. Prints
/// `collector listening on http://ADDR, storing in DIR` on stdout once it
/// accepts connections. Errors: the storage directory cannot be created,
/// or the address cannot be bound.
pub fn run(config: &CollectorConfig) -> Result<()> {
    if config.max_body_bytes == 0 {
        anyhow::bail!("--max-body-bytes must be at least 1");
    }
    let storage = storage::Storage::open(&config.storage)?;
    let state = server::AppState {
        storage: Arc::new(storage),
        token: config
            .token
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(Arc::from),
        max_body_bytes: config.max_body_bytes,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lsw-collector")
        .enable_io()
        .build()
        .context("starting the collector's runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        let address = listener.local_addr().context("reading the bound address")?;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(
            stdout,
            "collector listening on http://{address}, storing in {}",
            config.storage.display()
        );
        let _ = stdout.flush();
        drop(stdout);
        axum::serve(listener, server::router(state))
            .await
            .context("serving HTTP")
    })
}
