//! Delivery between the profiler and the network: a queue bounded by bytes
//! and one sender thread that drains it with retries.
//!
//! The producer ([`Queue::push`]) never waits: when the queue is over its
//! byte budget, the oldest profiles that are not being sent right now are
//! dropped (and counted) to make room; a profile is always accepted, so the
//! queue may exceed the budget by the one profile in flight. The sender
//! thread sends the oldest profile first. Outcomes of one attempt
//! ([`Attempt`]): delivered; retryable (no response: connection refused or
//! reset, timeout; or a 5xx, 408 or 429 answer), retried after an
//! exponential backoff with jitter ([`Backoff`]), or after the server's
//! `Retry-After` when that is longer ([`Attempt::RetryAfter`]), for as long
//! as the profile stays in the queue; taken in part (OTLP's
//! `partial_success`: sent, and counted as partial); or rejected (any other 4xx, or an answer the sender
//! cannot use), logged with the server's message and not retried.
//!
//! On shutdown ([`Queue::close`]) the thread keeps sending until the queue
//! is empty or the flush deadline passes; every request's timeout is cut to
//! the time left, and what is still queued at the deadline is counted as
//! dropped, unless it is in the spool.
//!
//! With a spool ([`super::spool`], `--spool-dir`), every profile is also
//! written to disk before it is queued and removed from there once it is
//! acknowledged, refused for good or dropped; a new queue starts with what
//! an earlier run left there.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

pub use super::item::Item;
use super::spool::{Spool, SpoolSettings, SpoolStats};

/// The result of one attempt to deliver an [`Item`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The server took it.
    Delivered,
    /// The server took it but said that it dropped part of it (OTLP's
    /// `partial_success`); the message is the server's. Counted as sent and
    /// as partial, not retried.
    Partial(String),
    /// A transient failure (no response, timeout, 5xx, 408, 429): try again later.
    Retry(String),
    /// A transient failure whose answer said when to try again
    /// (`Retry-After`): wait that long (at most [`MAX_RETRY_AFTER`]) rather
    /// than the backoff's delay, if it is longer.
    RetryAfter(String, Duration),
    /// The server refused it for good (other 4xx): do not retry.
    Rejected(String),
}

/// Sends one item (an HTTP POST in practice). `timeout` bounds the whole attempt.
pub trait Transport: Send + 'static {
    /// Try to deliver `item` once, within `timeout`.
    fn send(&mut self, item: &Item, timeout: Duration) -> Attempt;
    /// Where items go (for log lines and the summary; no credentials).
    fn destination(&self) -> String;
}

/// Delivery counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryStats {
    /// Profiles handed to the queue.
    pub queued: u64,
    /// Profiles the server accepted.
    pub sent: u64,
    /// Attempts that failed transiently and were (or would have been) retried.
    pub retried: u64,
    /// Profiles dropped unsent: evicted by newer ones when the queue was
    /// full, or still queued when the flush deadline passed.
    pub dropped: u64,
    /// Profiles the server refused (4xx other than 408/429): not retried.
    pub rejected: u64,
    /// Profiles the server took only in part (OTLP `partial_success`
    /// naming rejected profiles or an error): also counted in `sent`.
    pub partial: u64,
    /// Body bytes of the profiles the server accepted.
    pub bytes: u64,
    /// The first failed attempt's error, as logged (e.g. `connection
    /// refused`, `HTTP 401 Unauthorized: ...`), for the summary.
    pub first_error: Option<String>,
    /// What the spool did (`--spool-dir`; `None` without one).
    pub spool: Option<SpoolStats>,
}

impl std::fmt::Display for DeliveryStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent={} retried={} dropped={} rejected={} partial={} bytes={}",
            self.sent, self.retried, self.dropped, self.rejected, self.partial, self.bytes
        )
    }
}

/// The longest wait a server's `Retry-After` is honoured with; a longer
/// one is cut to this, so that a typo on the server cannot stall delivery
/// for hours (the queue's byte budget drops what piles up meanwhile).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Exponential backoff with jitter: the n-th wait is drawn uniformly from
/// `[d/2, d]` with `d = min(initial · 2^n, max)`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First delay's upper bound.
    pub initial: Duration,
    /// Cap on the delay.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(250),
            max: Duration::from_secs(8),
        }
    }
}

impl Backoff {
    /// The wait before retry number `failures` (1 for the first retry),
    /// with `random` a uniform value in `[0, 1)`.
    pub fn delay(&self, failures: u32, random: f64) -> Duration {
        let exp = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
        let ceiling = self.initial.saturating_mul(exp).min(self.max);
        ceiling.mul_f64(0.5 + random.clamp(0.0, 1.0) * 0.5)
    }
}

/// A small xorshift generator for jitter (not for anything secret).
#[derive(Debug)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the clock and the pid.
    pub fn new() -> Self {
        let seed = crate::util::timefmt::now_unix_ns() ^ (u64::from(std::process::id()) << 32);
        Jitter(seed | 1)
    }

    /// A uniform value in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl Default for Jitter {
    fn default() -> Self {
        Self::new()
    }
}

struct Entry {
    seq: u64,
    item: Item,
    /// Its spool file, while it has one.
    spooled: Option<PathBuf>,
}

struct State {
    entries: VecDeque<Entry>,
    bytes: usize,
    next_seq: u64,
    in_flight: Option<u64>,
    closed: bool,
    deadline: Option<Instant>,
    stats: DeliveryStats,
}

/// The bounded queue shared by the producer and the sender thread.
pub struct Queue {
    state: Mutex<State>,
    wake: Condvar,
    max_bytes: usize,
    spool: Option<Mutex<Spool>>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent counters behind.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn spool(&self) -> Option<MutexGuard<'_, Spool>> {
        (self.spool.as_ref()).map(|s| s.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Remove the spool files of `paths` (acknowledged, refused or dropped).
    fn unspool(&self, paths: impl IntoIterator<Item = PathBuf>) {
        if let Some(mut spool) = self.spool() {
            for path in paths {
                spool.remove(&path);
            }
        }
    }

    /// Add `item`, dropping the oldest queued profiles (not the one being
    /// sent) while the queue would exceed its byte budget. Never blocks for
    /// longer than it takes to take the lock and, with a spool, to write
    /// the profile's spool file.
    pub fn push(&self, item: Item) {
        let (spooled, unspooled) = match self.spool() {
            Some(mut spool) => spool.keep(&item),
            None => (None, Vec::new()),
        };
        let mut dropped_files = Vec::new();
        let mut state = self.lock();
        for entry in state.entries.iter_mut() {
            if entry
                .spooled
                .as_ref()
                .is_some_and(|p| unspooled.contains(p))
            {
                entry.spooled = None;
            }
        }
        let size = item.body.len();
        while state.bytes + size > self.max_bytes {
            let in_flight = state.in_flight;
            let Some(pos) = state.entries.iter().position(|e| Some(e.seq) != in_flight) else {
                break;
            };
            let Some(old) = state.entries.remove(pos) else {
                break;
            };
            state.bytes -= old.item.body.len();
            state.stats.dropped += 1;
            dropped_files.extend(old.spooled);
            warn!(
                "send queue full ({} bytes): dropped the profile of {}",
                self.max_bytes, old.item.description
            );
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.bytes += size;
        state.stats.queued += 1;
        state.entries.push_back(Entry { seq, item, spooled });
        drop(state);
        self.wake.notify_all();
        self.unspool(dropped_files);
    }

    /// The counters so far.
    pub fn stats(&self) -> DeliveryStats {
        let mut stats = self.lock().stats.clone();
        stats.spool = self.spool().map(|s| s.stats.clone());
        stats
    }

    /// Profiles waiting (including one being sent).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stop accepting work after what is queued: the sender thread flushes
    /// until the queue is empty or `deadline` passes.
    pub fn close(&self, deadline: Instant) {
        let mut state = self.lock();
        state.closed = true;
        state.deadline = Some(deadline);
        drop(state);
        self.wake.notify_all();
    }
}

/// The queue plus the thread that drains it.
pub struct Delivery {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
    destination: String,
}

impl Delivery {
    /// Start a sender thread that delivers through `transport`, with a
    /// queue of at most `max_bytes` body bytes and per-attempt `timeout`.
    ///
    /// With `spool`, the queue starts with the profiles an earlier run left
    /// in it. Errors: the spool directory cannot be created or listed, the
    /// thread cannot be started.
    pub fn start<T: Transport>(
        mut transport: T,
        max_bytes: usize,
        timeout: Duration,
        backoff: Backoff,
        spool: Option<SpoolSettings>,
    ) -> anyhow::Result<Self> {
        let (spool, found) = match spool {
            Some(settings) => {
                let (spool, found) = Spool::open(settings)?;
                (Some(Mutex::new(spool)), found)
            }
            None => (None, Vec::new()),
        };
        let bytes = found.iter().map(|(_, i)| i.body.len()).sum();
        let entries: VecDeque<Entry> = (found.into_iter().enumerate())
            .map(|(seq, (path, item))| Entry {
                seq: seq as u64,
                item,
                spooled: Some(path),
            })
            .collect();
        let queue = Arc::new(Queue {
            state: Mutex::new(State {
                next_seq: entries.len() as u64,
                stats: DeliveryStats {
                    queued: entries.len() as u64,
                    ..Default::default()
                },
                entries,
                bytes,
                in_flight: None,
                closed: false,
                deadline: None,
            }),
            wake: Condvar::new(),
            max_bytes,
            spool,
        });
        let destination = transport.destination();
        let shared = queue.clone();
        let thread = std::thread::Builder::new()
            .name("lsw-sender".into())
            .spawn(move || worker(&shared, &mut transport, timeout, backoff))?;
        Ok(Delivery {
            queue,
            thread: Some(thread),
            destination,
        })
    }

    /// The queue (to push profiles into).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The queue, shared (its counters stay readable while profiles are sent).
    pub fn shared_queue(&self) -> Arc<Queue> {
        self.queue.clone()
    }

    /// Where profiles go.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// [`Delivery::finish`], reported as a network sender's summary.
    pub fn finish_report(self, deadline: Instant) -> crate::output::sender::SenderReport {
        let destination = self.destination.clone();
        crate::output::sender::SenderReport {
            destination,
            files: Vec::new(),
            delivery: Some(self.finish(deadline)),
            ..Default::default()
        }
    }

    /// Flush until the queue is empty or `deadline`, stop the thread and
    /// return the final counters. Waits at most until shortly after
    /// `deadline` (a thread stuck past it is left behind).
    pub fn finish(mut self, deadline: Instant) -> DeliveryStats {
        self.queue.close(deadline);
        if let Some(thread) = self.thread.take() {
            let give_up = deadline + Duration::from_secs(2);
            while !thread.is_finished() && Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(10));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                warn!("the sender thread did not stop by the flush deadline");
            }
        }
        let mut state = self.queue.lock();
        // Whatever is left was not delivered in time: kept for the next
        // start if it is in the spool, else dropped.
        let kept = state.entries.iter().filter(|e| e.spooled.is_some()).count() as u64;
        let left = state.entries.len() as u64 - kept;
        if left > 0 {
            warn!(
                "{left} profile(s) not delivered to {} before the flush deadline",
                self.destination
            );
        }
        if kept > 0 {
            warn!(
                "{kept} profile(s) not delivered to {} before the flush deadline are kept \
                 in the spool for the next start",
                self.destination
            );
        }
        state.stats.dropped += left;
        state.entries.clear();
        state.bytes = 0;
        drop(state);
        if let Some(mut spool) = self.queue.spool() {
            spool.stats.left += kept;
        }
        self.queue.stats()
    }
}

/// Sleep until `until` unless the queue is closed with a deadline before
/// it; returns false if the deadline passed.
fn wait_until(queue: &Queue, until: Instant) -> bool {
    let mut state = queue.lock();
    loop {
        let now = Instant::now();
        if let Some(deadline) = state.deadline {
            if now >= deadline {
                return false;
            }
        }
        if now >= until {
            return true;
        }
        let limit = state.deadline.map_or(until, |d| d.min(until));
        let (s, _) = queue
            .wake
            .wait_timeout(state, limit.saturating_duration_since(now))
            .unwrap_or_else(|p| p.into_inner());
        state = s;
    }
}

fn worker<T: Transport>(queue: &Queue, transport: &mut T, timeout: Duration, backoff: Backoff) {
    let mut jitter = Jitter::new();
    let mut failures: u32 = 0;
    loop {
        // Take (a copy of) the oldest item, or stop.
        let (seq, item, attempt_timeout) = {
            let mut state = queue.lock();
            loop {
                let past_deadline = state.deadline.is_some_and(|d| Instant::now() >= d);
                if past_deadline || (state.closed && state.entries.is_empty()) {
                    return;
                }
                if let Some(front) = state.entries.front() {
                    let seq = front.seq;
                    let item = front.item.clone();
                    state.in_flight = Some(seq);
                    let left = state
                        .deadline
                        .map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
                    break (seq, item, timeout.min(left).max(Duration::from_millis(1)));
                }
                let (s, _) = queue
                    .wake
                    .wait_timeout(state, Duration::from_millis(200))
                    .unwrap_or_else(|p| p.into_inner());
                state = s;
            }
        };
        let outcome = transport.send(&item, attempt_timeout);
        let mut state = queue.lock();
        state.in_flight = None;
        let retry = match &outcome {
            Attempt::Delivered | Attempt::Partial(_) => {
                state.stats.sent += 1;
                state.stats.bytes += item.body.len() as u64;
                if let Attempt::Partial(message) = &outcome {
                    state.stats.partial += 1;
                    warn!(
                        "{} took the profile of {} only in part: {message}",
                        transport.destination(),
                        item.description
                    );
                } else {
                    debug!("delivered the profile of {}", item.description);
                }
                None
            }
            Attempt::Rejected(message) => {
                state.stats.rejected += 1;
                state
                    .stats
                    .first_error
                    .get_or_insert_with(|| message.clone());
                warn!(
                    "{} rejected the profile of {} (not retried): {message}",
                    transport.destination(),
                    item.description
                );
                None
            }
            Attempt::Retry(message) | Attempt::RetryAfter(message, _) => {
                state.stats.retried += 1;
                state
                    .stats
                    .first_error
                    .get_or_insert_with(|| message.clone());
                failures += 1;
                warn!(
                    "sending the profile of {} to {} failed (attempt {failures}), will retry: {message}",
                    item.description,
                    transport.destination()
                );
                let asked = match &outcome {
                    Attempt::RetryAfter(_, after) => (*after).min(MAX_RETRY_AFTER),
                    _ => Duration::ZERO,
                };
                Some(asked)
            }
        };
        let Some(asked) = retry else {
            failures = 0;
            // The in-flight entry is never evicted, so it is still the front.
            if state.entries.front().is_some_and(|e| e.seq == seq) {
                if let Some(done) = state.entries.pop_front() {
                    state.bytes -= done.item.body.len();
                    drop(state);
                    queue.unspool(done.spooled);
                }
            }
            continue;
        };
        drop(state);
        let delay = backoff.delay(failures, jitter.next_f64()).max(asked);
        if !wait_until(queue, Instant::now() + delay) {
            return;
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
