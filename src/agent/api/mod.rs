//! The agent's HTTP API (`--listen ADDR`): on-demand CPU profiles, the
//! profiler's own heap profile, metrics and a health check, served by axum
//! on a small tokio runtime of its own while the sampling loop keeps the
//! main thread.
//!
//! - [`routes`]: the endpoints, authentication and query validation.
//! - [`ondemand`]: profile requests, the loop's subscriptions, and the
//!   worker that symbolizes and answers them.
//! - [`metrics`]: the counters behind `GET /metrics`.
//! - [`recordings`]: what the web view at `/` shows: on-demand recordings
//!   kept with every sample's time.

pub mod metrics;
pub mod ondemand;
pub mod recordings;
pub mod request;
pub mod routes;

use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::oneshot;
use tracing::warn;

use crate::agent::http::serve::{serve, ConnectionLimits};
use crate::agent::http::server_token;
use metrics::Metrics;
use ondemand::ProfileRequest;

/// Default length of an on-demand profile, seconds (as Go's `net/http/pprof`).
pub const DEFAULT_SECONDS: f64 = 30.0;

/// What the server needs to know.
#[derive(Clone)]
pub struct ServerConfig {
    /// `HOST:PORT`, `:PORT` or `PORT` (the last two bind 127.0.0.1).
    pub listen: String,
    /// Bearer token required on every endpoint but `/healthz`, if set
    /// (`--listen-token` / `LIGHTSWITCH_LISTEN_TOKEN`; set but empty is an
    /// error at start).
    pub token: Option<String>,
    /// Connections served at once (at most a quarter of the open-file
    /// limit; see [`crate::agent::http::serve`]).
    pub max_connections: usize,
    /// Longest on-demand profile, seconds.
    pub max_seconds: u64,
    /// On-demand profile requests in progress at once (429 beyond).
    pub max_requests: usize,
    /// The processes the agent samples (`--pids`); empty: every process.
    /// A request may only narrow within them.
    pub pids: Vec<u32>,
    /// Highest sampling frequency a request may ask for, Hz
    /// (`kernel.perf_event_max_sample_rate`).
    pub max_sample_freq_hz: u64,
    /// Whether the agent records off-CPU waits (`--off-cpu`): only then may
    /// a request ask for them (`offcpu=true`).
    pub off_cpu: bool,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("max_seconds", &self.max_seconds)
            .field("max_requests", &self.max_requests)
            .field("max_connections", &self.max_connections)
            .field("pids", &self.pids)
            .field("max_sample_freq_hz", &self.max_sample_freq_hz)
            .field("off_cpu", &self.off_cpu)
            .finish()
    }
}

/// The address to bind for `--listen`: a bare port (`4000`, `:4000`) means
/// 127.0.0.1, anything else is taken as `HOST:PORT`.
pub fn bind_address(listen: &str) -> String {
    let port = listen.strip_prefix(':').unwrap_or(listen);
    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{port}")
    } else {
        listen.to_string()
    }
}

/// The running server.
pub struct Server {
    address: SocketAddr,
    shutdown: oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

impl Server {
    /// Bind `config.listen` and serve on a thread of its own
    /// ([`crate::agent::http::serve`]: accept errors survived, connections and
    /// header time limited). Profile requests are sent to the sampling loop
    /// over `requests`. Errors: the address cannot be bound, a bad limit,
    /// or a token that is set but empty.
    pub fn start(
        config: &ServerConfig,
        requests: Sender<ProfileRequest>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        crate::sampling::preflight::count("--listen-max-seconds", config.max_seconds)?;
        crate::sampling::preflight::count("--listen-max-requests", config.max_requests as u64)?;
        crate::sampling::preflight::count(
            "--listen-max-connections",
            config.max_connections as u64,
        )?;
        let address = bind_address(&config.listen);
        let listener =
            TcpListener::bind(&address).with_context(|| format!("cannot listen on {address}"))?;
        listener
            .set_nonblocking(true)
            .context("making the listening socket non-blocking")?;
        let bound = listener.local_addr().context("reading the bound address")?;
        let token = server_token(
            config.token.as_deref(),
            "--listen-token / LIGHTSWITCH_LISTEN_TOKEN",
            bound,
        )?;
        let limits = ConnectionLimits {
            max_connections: config.max_connections,
            ..ConnectionLimits::default()
        };
        let stats = metrics.connections();
        let state = routes::AppState::new(config, token, requests, metrics);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("lsw-http")
            .enable_io()
            .enable_time()
            .build()
            .context("starting the HTTP server's runtime")?;
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lsw-http-main".into())
            .spawn(move || {
                let served = runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    let stopped = async move {
                        let _ = stopped.await;
                    };
                    serve(listener, routes::router(state), limits, stats, stopped).await;
                    std::io::Result::Ok(())
                });
                if let Err(err) = served {
                    warn!("the HTTP server stopped: {err}");
                }
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .context("starting the HTTP server thread")?;
        Ok(Server {
            address: bound,
            shutdown,
            thread,
        })
    }

    /// The address the server listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stop accepting requests and let those in progress finish, waiting at
    /// most `timeout` (a connection still open then is left behind).
    pub fn stop(self, timeout: Duration) {
        let _ = self.shutdown.send(());
        let give_up = Instant::now() + timeout;
        while !self.thread.is_finished() && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.thread.is_finished() {
            let _ = self.thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_binds_loopback() {
        assert_eq!(bind_address("4000"), "127.0.0.1:4000");
        assert_eq!(bind_address(":4000"), "127.0.0.1:4000");
        assert_eq!(bind_address("0.0.0.0:4000"), "0.0.0.0:4000");
        assert_eq!(bind_address("[::1]:0"), "[::1]:0");
        assert_eq!(bind_address("localhost:80"), "localhost:80");
    }
}
