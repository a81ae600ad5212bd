//! The accept loop both HTTP servers run (hyper's HTTP/1 connection driver
//! with axum's router as the service), in place of `axum::serve`, which
//! offers neither a connection limit nor a header timeout.
//!
//! - A failed `accept()` (out of file descriptors, `EMFILE`; out of
//!   memory) is logged and retried after a back-off of 10 ms doubling to
//!   1 s; the server keeps running. Connection errors (a client that gave
//!   up before it was accepted) are ignored.
//! - At most [`ConnectionLimits::max_connections`] connections are served
//!   at once. A connection beyond that is accepted and closed at once, so
//!   neither the kernel's backlog nor the process's descriptors fill up.
//! - A client must send a request's headers within
//!   [`ConnectionLimits::header_timeout`]; the same limit closes a
//!   keep-alive connection that sits idle between requests (hyper's
//!   `header_read_timeout`, which needs the runtime's timer).
//!
//! The runtime must be built with `enable_time()`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, warn};

/// Connections served at once by default (`--listen-max-connections`,
/// the collector's `--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Default time a client has to send a request's headers, and the longest
/// an idle keep-alive connection stays open, seconds.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// First wait after `accept()` fails for lack of resources.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest wait between two failed `accept()` calls.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What a server allows each client.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more are closed as soon as accepted.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, and the longest an
    /// idle keep-alive connection stays open.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// Counters of the accept loop, readable while it runs.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections accepted and served.
    pub accepted: AtomicU64,
    /// Connections closed at once because `max_connections` were open.
    pub refused: AtomicU64,
    /// `accept()` calls that failed (other than aborted connections).
    pub accept_errors: AtomicU64,
}

/// Whether an `accept()` error is about one connection only (the client
/// went away), not about the server's resources.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// Serve `router` on `listener` under `limits` until `shutdown` completes;
/// then stop accepting, let requests in progress finish, and return once
/// every connection is closed. Counts go to `stats`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()>,
) {
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut backoff = ACCEPT_BACKOFF_MIN;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                stream
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                let errors = stats.accept_errors.fetch_add(1, Ordering::Relaxed) + 1;
                if backoff == ACCEPT_BACKOFF_MIN {
                    warn!(
                        "accepting a connection failed ({e}; {errors} failures so far): retrying"
                    );
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let refused = stats.refused.fetch_add(1, Ordering::Relaxed) + 1;
            if refused.is_power_of_two() {
                warn!("{max} connections are open: closing new ones ({refused} so far)");
            }
            drop(stream);
            continue;
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let served = tokio::select! {
                served = connection.as_mut() => served,
                _ = stop.changed() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = served {
                debug!("connection closed: {e}");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every slot back: every connection has closed.
    let _ = slots.acquire_many(max as u32).await;
}
