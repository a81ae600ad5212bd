//! The window worker: symbolizes, encodes and sends closed windows on a
//! thread of its own, so the sampling loop only spends the time it takes to
//! swap aggregators and copy the few mappings a window refers to
//! ([`TrackerSnapshot`]).
//!
//! Windows wait in a channel of [`MAX_PENDING_WINDOWS`]. While windows wait,
//! each spends less time naming new objects ([`Symbolizer::set_backlog`]),
//! so that the worker catches up. If it still falls that far behind, the
//! newest closed window is held on the sampling side, and each window that
//! closes while the channel stays full is merged into it
//! ([`ClosedWindow::absorb`]): one profile then covers several intervals,
//! and no sample is lost (counted in [`WorkerReport::windows_merged`]).
//! Sampling never waits for the worker; what a held window costs is its
//! distinct stacks and 12 bytes a sample of timeline (docs/reliability.md).
//!
//! A panic while one window is processed (its snapshot on the sampling
//! thread, or its symbolization, encoding and sending on the worker) drops
//! that window only: it is counted in [`WorkerReport::windows_panicked`] and
//! logged, and both threads go on with the next window.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tracing::{debug, warn};

use super::{Sender, SenderReport};
use crate::process::ProcessTracker;
use crate::profile::window::ClosedWindow;
use crate::profile::Provenance;
use crate::symbolize::mapping_source::{ObjectCache, TrackerSnapshot};
use crate::symbolize::settings::SymbolContext;
use crate::symbolize::Symbolizer;
use crate::util::guard::contain;
use crate::util::text::plural;

/// Closed windows that may wait for symbolization before new ones are
/// merged into a held window (see the module docs).
pub const MAX_PENDING_WINDOWS: usize = 4;

/// A closed window and what symbolizing it needs.
type Job = Box<(ClosedWindow, TrackerSnapshot)>;

enum Message {
    Window(Job),
    Finish(Duration),
}

/// What the worker did over a run.
#[derive(Debug, Clone, Default)]
pub struct WorkerReport {
    /// Windows symbolized and handed to the sender.
    pub windows_sent: u64,
    /// Windows merged into an earlier held window because symbolization
    /// was behind (their samples are in that window's profile).
    pub windows_merged: u64,
    /// Windows dropped because the worker thread had stopped.
    pub windows_dropped: u64,
    /// Windows the sender failed on (encoding or writing; logged).
    pub windows_failed: u64,
    /// Windows dropped because processing them panicked (logged).
    pub windows_panicked: u64,
    /// Samples with a user frame whose mapping had been retired before the
    /// window was handed over (the frame is left unsymbolized).
    pub samples_missing_mapping: u64,
    /// The first of the failed windows' errors, as logged.
    pub first_error: Option<String>,
    /// The sender's own report.
    pub sender: SenderReport,
}

impl WorkerReport {
    /// Why the run did not deliver everything it closed, or `None` if it
    /// did: windows that failed to be written or sent (naming the first
    /// error), windows dropped because symbolization fell behind, and
    /// profiles a network sender dropped or the server refused.
    pub fn failure(&self) -> Option<String> {
        let mut lost = Vec::new();
        if self.windows_failed > 0 {
            lost.push(format!(
                "{} failed (first: {})",
                plural(self.windows_failed, "window", "windows"),
                self.first_error.as_deref().unwrap_or("unknown")
            ));
        }
        if self.windows_panicked > 0 {
            lost.push(format!(
                "{} dropped because processing {} panicked (logged)",
                plural(self.windows_panicked, "window", "windows"),
                if self.windows_panicked == 1 {
                    "it"
                } else {
                    "them"
                }
            ));
        }
        if self.windows_dropped > 0 {
            lost.push(format!(
                "{} dropped (the window worker had stopped)",
                plural(self.windows_dropped, "window", "windows")
            ));
        }
        if let Some(d) = self.sender.delivery.as_ref() {
            if d.dropped + d.rejected > 0 {
                let first = d
                    .first_error
                    .as_deref()
                    .map_or_else(String::new, |e| format!("; first error: {e}"));
                lost.push(format!(
                    "{} not delivered to {} (dropped={} rejected={}{first})",
                    plural(d.dropped + d.rejected, "profile", "profiles"),
                    self.sender.destination,
                    d.dropped,
                    d.rejected
                ));
            }
        }
        (!lost.is_empty()).then(|| lost.join("; "))
    }
}

/// Handle to the worker thread.
pub struct WindowWorker {
    tx: SyncSender<Message>,
    thread: JoinHandle<WorkerReport>,
    objects: ObjectCache,
    /// Windows submitted and not yet taken by the worker.
    waiting: Arc<AtomicUsize>,
    /// The window held back while the channel is full, with the windows
    /// closed since merged into it.
    held: Option<Job>,
    merged: u64,
    dropped: u64,
    panicked: u64,
    missing: u64,
    metrics: Arc<dyn WindowCounters>,
}

/// Where the worker counts what became of each window; the agent's
/// `/metrics` implements it (`crate::agent::api::metrics::Metrics`).
pub trait WindowCounters: Send + Sync {
    /// A window closed and is being handed over; counted first, so that
    /// no count of what became of windows exceeds it.
    fn window_closed(&self);
    /// A closed window was merged into an earlier held one because
    /// symbolization was behind.
    fn window_merged(&self);
    /// A closed window was dropped because the worker thread had stopped.
    fn window_dropped(&self);
    /// A window's profile was handed to the sender (written, for the disk sender).
    fn window_written(&self);
    /// The sender failed on a window (encoding or writing).
    fn window_failed(&self);
    /// A window was dropped because processing it panicked.
    fn window_panicked(&self);
    /// `n` more samples had a user frame whose mapping was retired before
    /// their window was handed over.
    fn add_samples_missing_mapping(&self, n: u64);
}

impl WindowWorker {
    /// Start the worker thread, which symbolizes every window with the
    /// run's `symbols`, sends its profile (stamped with `provenance`: what
    /// was profiled, the host) to `sender` and counts what happened to each
    /// window in `metrics`.
    pub fn start(
        sender: Box<dyn Sender>,
        metrics: Arc<dyn WindowCounters>,
        provenance: Provenance,
        symbols: SymbolContext,
    ) -> Result<Self> {
        let (tx, rx) = sync_channel(MAX_PENDING_WINDOWS);
        let worker_metrics = metrics.clone();
        let waiting = Arc::new(AtomicUsize::new(0));
        let worker_waiting = waiting.clone();
        let thread = std::thread::Builder::new()
            .name("lsw-windows".into())
            .spawn(move || {
                run(
                    rx,
                    sender,
                    &worker_metrics,
                    &worker_waiting,
                    &provenance,
                    &symbols,
                )
            })
            .context("starting the window worker thread")?;
        Ok(WindowWorker {
            tx,
            thread,
            objects: ObjectCache::new(),
            waiting,
            held: None,
            merged: 0,
            dropped: 0,
            panicked: 0,
            missing: 0,
            metrics,
        })
    }

    /// Hand a closed window over (with what symbolizing it needs from
    /// `tracker`). Never waits for the worker.
    pub fn submit(&mut self, closed: ClosedWindow, tracker: &ProcessTracker) {
        let started = Instant::now();
        self.metrics.window_closed();
        let index = closed.index;
        let objects = &mut self.objects;
        let Some(snapshot) = contain(
            || format!("window {index} (tracker snapshot)"),
            || TrackerSnapshot::capture(&closed.aggregator, tracker, objects),
        ) else {
            // The object cache may be half updated: start it afresh.
            self.objects = ObjectCache::new();
            self.panicked += 1;
            self.metrics.window_panicked();
            return;
        };
        self.missing += snapshot.missing_samples();
        self.metrics
            .add_samples_missing_mapping(snapshot.missing_samples());
        if let Some(held) = self.held.take() {
            if let Err(mut held) = self.try_hand_over(held) {
                // Still full: the new window joins the held one.
                held.0.absorb(closed);
                held.1.absorb(snapshot);
                self.merged += 1;
                self.metrics.window_merged();
                debug!("window {index}: merged into held window {}", held.0.index);
                self.held = Some(held);
                return;
            }
        }
        let Err(job) = self.try_hand_over(Box::new((closed, snapshot))) else {
            debug!(
                "window {index}: handed to the worker in {:?}",
                started.elapsed()
            );
            return;
        };
        warn!(
            "symbolization is {MAX_PENDING_WINDOWS} windows behind: window {index} held, \
             and windows closing until the worker catches up merged into it"
        );
        self.held = Some(job);
    }

    /// Hand `job` to the worker if the channel has room; give it back if
    /// the channel is full. A stopped worker drops it (counted and logged).
    fn try_hand_over(&mut self, job: Job) -> Result<(), Job> {
        let index = job.0.index;
        // Counted before it can be taken, so that the worker never sees
        // fewer windows waiting than there are.
        self.waiting.fetch_add(1, Ordering::Relaxed);
        match self.tx.try_send(Message::Window(job)) {
            Ok(()) => Ok(()),
            Err(err) => {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                match err {
                    TrySendError::Full(Message::Window(job)) => Err(job),
                    _ => {
                        self.dropped += 1;
                        self.metrics.window_dropped();
                        warn!("the window worker has stopped: window {index} dropped");
                        Ok(())
                    }
                }
            }
        }
    }

    /// Wait until every submitted window has been handled, then let the
    /// sender flush for at most `flush` and return the report.
    pub fn finish(mut self, flush: Duration) -> WorkerReport {
        // Blocking sends: the worker is draining the channel.
        if let Some(held) = self.held.take() {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            if self.tx.send(Message::Window(held)).is_err() {
                self.dropped += 1;
                self.metrics.window_dropped();
                warn!("the window worker has stopped: the held window is dropped");
            }
        }
        let _ = self.tx.send(Message::Finish(flush));
        drop(self.tx);
        let mut report = match self.thread.join() {
            Ok(report) => report,
            Err(_) => {
                warn!("the window worker panicked");
                WorkerReport::default()
            }
        };
        report.windows_merged += self.merged;
        report.windows_dropped += self.dropped;
        report.windows_panicked += self.panicked;
        report.samples_missing_mapping = self.missing;
        report
    }
}

/// The worker thread: symbolizes and sends each window from `rx`; `waiting`
/// counts the windows submitted and not yet taken, which sets how much
/// time each window may spend naming new objects
/// ([`Symbolizer::set_backlog`]); `provenance` stamps each profile.
fn run(
    rx: Receiver<Message>,
    mut sender: Box<dyn Sender>,
    metrics: &Arc<dyn WindowCounters>,
    waiting: &AtomicUsize,
    provenance: &Provenance,
    symbols: &SymbolContext,
) -> WorkerReport {
    let mut symbolizer = Symbolizer::with_context(symbols);
    let mut report = WorkerReport::default();
    let mut flush = Duration::from_secs(5);
    for message in rx {
        match message {
            Message::Window(job) => {
                let (closed, snapshot) = *job;
                let index = closed.index;
                let behind = waiting.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                symbolizer.set_backlog(behind);
                if behind > 0 {
                    debug!("window {index}: {behind} more windows waiting: less time on objects");
                }
                let sent = contain(
                    || format!("window {index}"),
                    || send_window(&symbolizer, sender.as_mut(), (closed, snapshot), provenance),
                );
                match sent {
                    Some(Ok(())) => {
                        report.windows_sent += 1;
                        metrics.window_written();
                    }
                    Some(Err(err)) => {
                        report.windows_failed += 1;
                        metrics.window_failed();
                        let message = format!("window {index}: {err:#}");
                        warn!("{message}");
                        report.first_error.get_or_insert(message);
                    }
                    None => {
                        // Its caches may be half updated: start afresh.
                        symbolizer = Symbolizer::with_context(symbols);
                        report.windows_panicked += 1;
                        metrics.window_panicked();
                    }
                }
            }
            Message::Finish(d) => {
                flush = d;
                break;
            }
        }
    }
    report.sender = sender.finish(Instant::now() + flush);
    report
}

/// Symbolize one window and hand its profile to the sender.
fn send_window(
    symbolizer: &Symbolizer,
    sender: &mut dyn Sender,
    (closed, snapshot): (ClosedWindow, TrackerSnapshot),
    provenance: &Provenance,
) -> Result<()> {
    let started = Instant::now();
    let ClosedWindow {
        index,
        mut aggregator,
        window,
    } = closed;
    let mut profile = symbolizer.build_profile(&aggregator, &snapshot, window);
    aggregator.take_timeline_into(&mut profile);
    // Everything the profile was built from (the window's stacks and
    // frames, its copy of the mappings) and the assembly's tables are gone:
    // their pages go back now, not after the profile is encoded
    // (alloc::release_freed). Issue 18: at a 10 s window's close under
    // churn the aggregator held 4-6 MiB while the profile was encoded.
    drop((aggregator, snapshot));
    crate::util::alloc::release_freed();
    provenance.stamp(&mut profile);
    debug!(
        "window {}: {} samples symbolized in {:?}",
        index,
        profile.total_samples(),
        started.elapsed()
    );
    let sent = sender.send(&profile);
    drop(profile);
    crate::util::alloc::release_freed();
    sent
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
