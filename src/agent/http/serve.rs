//! The accept loop both HTTP servers run (hyper's HTTP/1 connection driver
//! with axum's router as the service), in place of `axum::serve`, which
//! offers neither a connection limit nor a header timeout.
//!
//! - A failed `accept()` (out of file descriptors, `EMFILE`; out of
//!   memory) is logged and retried after a back-off of 10 ms doubling to
//!   1 s; the server keeps running. Connection errors (a client that gave
//!   up before it was accepted) are ignored.
//! - At most [`ConnectionLimits::max_connections`] connections are served
//!   at once. When all are taken, connections idle between requests (for
//!   at least a second) are closed to make room, and a new connection that
//!   finds no room within a quarter second is closed, so neither the
//!   kernel's backlog nor the process's descriptors fill up, and idle
//!   connections cannot lock out a client with a request.
//! - A client must send a request's headers within
//!   [`ConnectionLimits::header_timeout`]; the same limit closes a
//!   keep-alive connection that sits idle between requests (hyper's
//!   `header_read_timeout`, which needs the runtime's timer).
//! - When every slot is taken, a connection still sending its headers
//!   (a slow-header client, "slowloris") is closed like an idle one: only a
//!   connection whose request is being answered keeps its slot.
//!
//! The runtime must be built with `enable_time()`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
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
    /// Connections served at once (at most a quarter of the open-file
    /// limit, whatever is asked).
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

/// What every connection task shares with the accept loop.
struct Shared {
    router: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    /// One permit per connection served.
    slots: Arc<Semaphore>,
    /// One permit per connection waiting for a slot.
    waiting: Arc<Semaphore>,
    /// `true` once the server stops: connections finish their request and close.
    stop: watch::Receiver<bool>,
    /// Bumped when every slot is taken: connections idle between requests
    /// for at least [`SHED_MIN_AGE`] close, making room.
    shed: watch::Sender<u64>,
}

/// Youngest connection closed to make room when every slot is taken: a
/// client that just connected gets this long to send its request.
const SHED_MIN_AGE: Duration = Duration::from_secs(1);
/// How long a connection that found every slot taken waits for one.
const SLOT_WAIT: Duration = Duration::from_millis(250);
/// Connections that may wait for a slot at once; more are closed at once.
const MAX_WAITING: usize = 64;
/// How long a connection asked to make room, with no request being
/// answered, has to finish what it was writing before it is dropped.
const SHED_GRACE: Duration = Duration::from_millis(50);

/// One request being answered on a connection: from the call of the
/// service (its headers were read) until hyper drops the response body
/// (written). Counts in the connection's counter while alive.
struct Answering(Arc<AtomicUsize>);

impl Answering {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Answering(count.clone())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The process's soft limit on open files (`ulimit -n`), if it has one.
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Connections served at once: `configured`, but at most a quarter of the
/// open-file limit `nofile`, so that connections (with those waiting for a
/// slot, a quarter as many again) never take the descriptors the rest of
/// the process needs (BPF objects, perf events, the objects of profiled
/// processes).
fn slots_for(configured: usize, nofile: Option<u64>) -> usize {
    let cap = nofile.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
    let slots = configured.min(cap).clamp(1, Semaphore::MAX_PERMITS);
    if slots < configured {
        warn!(
            "serving at most {slots} connections at once, a quarter of the open-file limit \
             ({} descriptors)",
            nofile.unwrap_or(0)
        );
    }
    slots
}

/// Serve `router` on `listener` under `limits` until `shutdown` completes;
/// then stop accepting, let requests in progress finish, and return once
/// every connection is closed. Counts go to `stats`.
///
/// When every slot is taken, connections idle between requests or still
/// sending their headers, open for at least [`SHED_MIN_AGE`], are
/// closed, and the new connection
/// waits up to [`SLOT_WAIT`] for one of their slots (at most
/// [`MAX_WAITING`] wait; the rest are closed at once): a flood of idle
/// connections cannot keep a client that sends a request out for longer
/// than that.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()>,
) {
    let max = slots_for(limits.max_connections, open_file_limit());
    let (stop_tx, stop) = watch::channel(false);
    let shared = Arc::new(Shared {
        router,
        limits,
        stats,
        slots: Arc::new(Semaphore::new(max)),
        waiting: Arc::new(Semaphore::new((max / 4).clamp(1, MAX_WAITING))),
        stop,
        shed: watch::Sender::new(0),
    });
    let mut backoff = ACCEPT_BACKOFF_MIN;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                admit(&shared, stream);
            }
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                let errors = shared.stats.accept_errors.fetch_add(1, Ordering::Relaxed) + 1;
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
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every slot back: every connection has closed.
    let _ = shared.slots.acquire_many(max as u32).await;
}

/// Serve `stream` in a task of its own if a slot is free or frees up
/// soon (see [`serve`]); otherwise close it and count it refused.
fn admit(shared: &Arc<Shared>, stream: TcpStream) {
    if let Ok(slot) = shared.slots.clone().try_acquire_owned() {
        tokio::spawn(serve_connection(shared.clone(), stream, slot));
        return;
    }
    shared
        .shed
        .send_modify(|generation| *generation = generation.wrapping_add(1));
    let Ok(waiting) = shared.waiting.clone().try_acquire_owned() else {
        refuse(&shared.stats, shared.slots.available_permits());
        return;
    };
    let shared = shared.clone();
    tokio::spawn(async move {
        let slot = tokio::time::timeout(SLOT_WAIT, shared.slots.clone().acquire_owned()).await;
        drop(waiting);
        match slot {
            Ok(Ok(slot)) => serve_connection(shared, stream, slot).await,
            _ => refuse(&shared.stats, 0),
        }
    });
}

/// Count (and now and then log) a connection closed for want of a slot.
fn refuse(stats: &ConnectionStats, free: usize) {
    let refused = stats.refused.fetch_add(1, Ordering::Relaxed) + 1;
    if refused.is_power_of_two() {
        warn!("every connection slot is taken ({free} free): closing new connections ({refused} so far)");
    }
}

/// Serve HTTP/1 on `stream` until the client or the server closes it.
async fn serve_connection(shared: Arc<Shared>, stream: TcpStream, slot: OwnedSemaphorePermit) {
    let _slot = slot;
    shared.stats.accepted.fetch_add(1, Ordering::Relaxed);
    let accepted = Instant::now();
    let mut stop = shared.stop.clone();
    let mut shed = shared.shed.subscribe();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(shared.limits.header_timeout);
    let answering = Arc::new(AtomicUsize::new(0));
    let router = TowerToHyperService::new(shared.router.clone());
    let service = hyper::service::service_fn({
        let answering = answering.clone();
        move |request| {
            let answer = Answering::new(&answering);
            let response = hyper::service::Service::call(&router, request);
            async move {
                let response = response.await?;
                // The guard lives as long as the body: until it is written.
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(body.map_err(move |e| {
                        let _answering = &answer;
                        e
                    }))
                }))
            }
        }
    });
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let served = loop {
        tokio::select! {
            served = connection.as_mut() => break served,
            _ = stop.changed() => {
                connection.as_mut().graceful_shutdown();
                break connection.await;
            }
            _ = shed.changed() => {
                if accepted.elapsed() < SHED_MIN_AGE {
                    continue;
                }
                // Closes the connection if it is between requests; one in
                // progress is answered first.
                connection.as_mut().graceful_shutdown();
                if answering.load(Ordering::Relaxed) > 0 {
                    break connection.await;
                }
                // Idle, or still sending headers (hyper waits for those
                // until the header timeout): closed after a moment to
                // flush what it was writing.
                match tokio::time::timeout(SHED_GRACE, connection.as_mut()).await {
                    Ok(served) => break served,
                    Err(_) => {
                        debug!("closed a connection still sending its request headers to make room");
                        return;
                    }
                }
            }
        }
    };
    if let Err(e) = served {
        debug!("connection closed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_take_at_most_a_quarter_of_the_descriptors() {
        assert_eq!(slots_for(256, Some(1024)), 256);
        assert_eq!(slots_for(256, Some(128)), 32);
        assert_eq!(slots_for(256, None), 256);
        assert_eq!(slots_for(10, Some(1 << 20)), 10);
        assert_eq!(slots_for(256, Some(2)), 1);
    }
}
