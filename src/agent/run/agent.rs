//! The sampling loop as an agent with named steps: [`Agent::step`] takes
//! profile requests, goes on with the start-up scan, waits for the ring
//! buffers, [`Agent::drain`]s them (process events to the process
//! follower, samples to the follower, the unwind loader, the windows and
//! subscriptions), [`Agent::close_due`] windows
//! and requests, and now and then [`Agent::refresh_metrics`];
//! [`Agent::stop`] detaches the perf events and takes what is left.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use libbpf_rs::RingBuffer;
use tracing::{debug, info};

use super::hints::ChildrenSeen;
use super::plan::CheckedPlan;
use super::progress::Progress;
use super::Totals;
use crate::agent::api::metrics::Metrics;
use crate::agent::api::ondemand::{
    accept_requests, OnDemandWorker, ProfileRequest, Sampling, Subscriptions,
};
use crate::output::sender::worker::WindowWorker;
use crate::process::{opener, walker::ProcessFollower, ProcessTracker, UserFrame};
use crate::profile::aggregate::resolve_placed;
use crate::profile::window::{Windows, CLOSE_SLACK_NS};
use crate::sampling::records::{RawSample, TimedEvent};
use crate::sampling::sampler::off_cpu::OffCpuCounts;
use crate::sampling::sampler::variant::ProgramVariant;
use crate::sampling::sampler::{self, BpfStats, Sampler};
use crate::unwind::deferred::{self, DeferredStats, DeferredWalks, LiveView};
use crate::unwind::interp::Interpreters;
use crate::unwind::loader::UnwindLoader;
use crate::util::timefmt;

/// How often the loop checks for a stop (and drains the ring buffer) when no
/// window ends sooner.
const POLL_PERIOD: Duration = Duration::from_millis(100);
/// The loop's period while unwind tables are being built, so that each is
/// loaded within this long of being ready.
const BUILD_POLL_PERIOD: Duration = Duration::from_millis(5);
/// Longest the start-up scan of running processes runs between two drains
/// of the ring buffer.
const SCAN_SLICE: Duration = Duration::from_millis(20);
/// How often the loop refreshes the metrics it does not count per sample.
const METRICS_PERIOD: Duration = Duration::from_secs(1);
/// How often, without a duration, the loop checks whether every `--pids`
/// target has exited.
const ALIVE_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// Where closed windows and requests go: the continuous-mode worker and the
/// on-demand worker, when the run has them.
pub struct Workers {
    /// Continuous mode's window worker.
    pub windows: Option<WindowWorker>,
    /// The HTTP API's on-demand worker.
    pub on_demand: Option<OnDemandWorker>,
    /// Profile requests from the HTTP server.
    pub requests: Receiver<ProfileRequest>,
}

/// The state of a run while the perf events are attached.
pub struct Agent<'s, 'o> {
    sampler: &'s Sampler<'o>,
    ring: RingBuffer<'s>,
    samples: Rc<RefCell<Vec<RawSample>>>,
    events: Rc<RefCell<Vec<TimedEvent>>>,
    malformed: Rc<RefCell<u64>>,
    tracker: ProcessTracker,
    /// The interpreters found in processes, kept beside the tracker and
    /// passed to the follower and to [`resolve_placed`].
    interpreters: Interpreters,
    follower: ProcessFollower,
    windows: Windows,
    subscriptions: Subscriptions,
    sampling: Sampling,
    loader: UnwindLoader,
    workers: Workers,
    metrics: Arc<Metrics>,
    totals: Totals,
    served: u64,
    /// `--exclude-self`: the opener's helper processes are the profiler too.
    exclude_helpers: bool,
    listen_only: bool,
    pids: Vec<u32>,
    deadline: Option<Instant>,
    last_alive_check: Instant,
    /// The `--pids` targets' busy children seen so far (for the advice).
    children_seen: ChildrenSeen,
    last_metrics: Instant,
    /// The status line, when stderr is a terminal.
    progress: Option<Progress>,
    /// Samples whose walk waits for rows, to be finished from their stack copy.
    deferred: DeferredWalks,
    /// Samples lost (BPF counter plus malformed records) at the last check,
    /// and when that was (CLOCK_MONOTONIC ns): a timeline's lost-samples
    /// spans run from one check to the next.
    lost_seen: (u64, u64),
    /// When the ring buffers were last consumed (CLOCK_MONOTONIC ns): every
    /// sample taken before it, less [`CLOSE_SLACK_NS`], has been drained.
    consumed_ns: u64,
}

/// What the run leaves when the perf events are detached.
pub struct Stopped {
    /// Every process seen, with its mappings.
    pub tracker: ProcessTracker,
    /// The windows still open (continuous mode) or the run's one window.
    pub windows: Windows,
    /// The unwind loader (its table statistics).
    pub loader: UnwindLoader,
    /// Processes described to the walker at the stop.
    pub described: usize,
    /// Continuous mode's window worker.
    pub window_worker: Option<WindowWorker>,
    /// The on-demand worker, still finishing its last answers.
    pub on_demand: Option<OnDemandWorker>,
    /// Windows closed so far.
    pub totals: Totals,
    /// On-demand profiles answered.
    pub served: u64,
    /// The BPF program's counters at the stop.
    pub stats: BpfStats,
    /// Records that did not parse.
    pub malformed: u64,
    /// How the walks held for their stack copies went.
    pub deferred: DeferredStats,
    /// The `--pids` targets' busy children seen during the run.
    pub children_seen: ChildrenSeen,
}

impl<'s, 'o> Agent<'s, 'o> {
    /// Set up the loop over `sampler` (attached just now) for `plan`:
    /// windows start now, the start-up scan of running processes begins,
    /// and with `--listen` alone the perf events are paused until a request.
    /// Errors: the ring buffers or the unwind cache cannot be set up.
    pub fn new(
        sampler: &'s Sampler<'o>,
        plan: &CheckedPlan,
        cache_dir: Option<std::path::PathBuf>,
        workers: Workers,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let start = Instant::now();
        let start_mono = timefmt::monotonic_ns();
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let freq = plan.sampler.sample_freq_hz;
        let mut sampling = Sampling::new(freq, start_mono, plan.listen_only);
        if plan.listen_only {
            sampling.pause(sampler);
        } else {
            info!("sampling {} CPUs at {freq} Hz", sampler.attached_cpus());
        }
        metrics.set_sampling_freq(sampling.freq_hz().unwrap_or(0));
        metrics.set_bpf_variant(sampler.variant().name());
        let windows = Windows::new(
            start_mono,
            start_unix_ns,
            plan.interval.map(|i| i.as_nanos() as u64),
            plan.duration.map(|d| d.as_nanos() as u64),
            freq,
        )
        .with_timeline(plan.timeline)
        .with_off_cpu(plan.sampler.off_cpu_min_ns.is_some());
        let loader = UnwindLoader::new(
            plan.sampler.max_unwind_rows,
            cache_dir,
            &plan.run.symbols.debug_dirs,
        )?;
        let mut follower = ProcessFollower::new();
        follower.scan_processes(&plan.sampler.pids, start);
        let samples = Rc::new(RefCell::new(Vec::new()));
        let events = Rc::new(RefCell::new(Vec::new()));
        let malformed = Rc::new(RefCell::new(0u64));
        let ring = sampler.ring_buffer(samples.clone(), events.clone(), malformed.clone())?;
        let interpreters = Interpreters::for_run(sampler.variant() == ProgramVariant::BpfLoop);
        let mut tracker = ProcessTracker::new();
        tracker.start_opener();
        tracker.set_exec_clock(crate::process::ExecClock::new(sampler.exec_clock()?));
        Ok(Agent {
            sampler,
            ring,
            samples,
            events,
            malformed,
            tracker,
            interpreters,
            follower,
            windows,
            subscriptions: Subscriptions::default(),
            sampling,
            loader,
            workers,
            metrics,
            totals: Totals::default(),
            served: 0,
            exclude_helpers: plan.sampler.exclude_pid.is_some(),
            listen_only: plan.listen_only,
            // A followed command (`record`) ends the run itself when it exits.
            pids: if plan.sampler.follow_children {
                Vec::new()
            } else {
                plan.sampler.pids.clone()
            },
            deadline: plan.duration.map(|d| start + d),
            last_alive_check: start,
            children_seen: ChildrenSeen::default(),
            last_metrics: start,
            progress: Progress::on_terminal(start),
            lost_seen: (0, start_mono),
            consumed_ns: 0,
            deferred: DeferredWalks::default(),
        })
    }

    /// Finish the start-up scan now. For `record`'s held command: described
    /// before it execs, the walker knows the pid, so its exec is reported
    /// and its new image read at once; scanned later, the scan could read
    /// its maps in the middle of the exec and describe the old image.
    pub fn scan_now(&mut self) {
        while self.scan_slice() {}
    }

    /// Have the tables of `files` (a held command's executable and ld.so,
    /// [`super::Workload::images`]) and of everything the scan found
    /// loaded before the command runs: step the run until no table is
    /// being built, for at most `timeout` (a cold build of a large object
    /// can take longer; the command then starts without it, and the
    /// samples it costs are counted as `no_table`).
    pub fn preload(&mut self, files: &[std::path::PathBuf], timeout: Duration) -> Result<()> {
        for file in files {
            self.follower
                .preload_file(file, &mut self.tracker, self.sampler, &mut self.loader);
        }
        let started = Instant::now();
        while self.loader.builds_pending() {
            if started.elapsed() >= timeout {
                debug!("starting the command with unwind tables still being built");
                break;
            }
            self.step()?;
        }
        Ok(())
    }

    /// Go on with the start-up scan for one [`SCAN_SLICE`]; whether
    /// processes remain to be scanned.
    fn scan_slice(&mut self) -> bool {
        self.follower.continue_scan(
            &mut self.tracker,
            self.sampler,
            &mut self.loader,
            &mut self.interpreters,
            SCAN_SLICE,
        )
    }

    /// Whether the run is over: the duration has passed or, without one,
    /// every `--pids` target has exited (like `perf record -p`).
    /// Once a [`ALIVE_CHECK_PERIOD`], the targets' busy children are noted
    /// for the advice about targets that take no samples.
    pub fn finished(&mut self) -> bool {
        let check = !self.pids.is_empty() && self.last_alive_check.elapsed() >= ALIVE_CHECK_PERIOD;
        if check {
            self.last_alive_check = Instant::now();
            self.children_seen.look(&self.pids);
        }
        if let Some(deadline) = self.deadline {
            return Instant::now() >= deadline;
        }
        if !check {
            return false;
        }
        let gone = !self
            .pids
            .iter()
            .any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if gone {
            info!("every target process has exited: stopping");
        }
        gone
    }

    /// One turn of the loop: take new requests, scan a slice of the running
    /// processes, wait for samples (at most until the next window or
    /// request closes), drain them, close what is due, refresh metrics.
    pub fn step(&mut self) -> Result<()> {
        accept_requests(
            &self.workers.requests,
            &mut self.subscriptions,
            &mut self.sampling,
            self.sampler,
        );
        // The start-up scan goes on a slice at a time, between drains, so
        // that the ring buffer never waits for it.
        let scanning = self.scan_slice();
        // While scanning, or while tables are being built, come back soon.
        let period = if scanning || self.loader.builds_pending() {
            BUILD_POLL_PERIOD
        } else {
            POLL_PERIOD
        };
        let poll = self.next_close_ns().map_or(period, |due| {
            Duration::from_nanos(due.saturating_sub(timefmt::monotonic_ns())).min(period)
        });
        self.consumed_ns = sampler::poll(&self.ring, poll)?;
        self.drain();
        if self
            .next_close_ns()
            .is_some_and(|due| timefmt::monotonic_ns() >= due)
        {
            self.close_due()?;
        }
        if self.last_metrics.elapsed() >= METRICS_PERIOD {
            self.last_metrics = Instant::now();
            self.refresh_metrics();
        }
        if let Some(progress) = self.progress.as_mut() {
            let (sampler, malformed) = (self.sampler, &self.malformed);
            progress.tick(|| sampler.stats().map_or(0, |s| s.lost) + *malformed.borrow());
        }
        Ok(())
    }

    /// When the next window or request closes, CLOCK_MONOTONIC ns.
    fn next_close_ns(&self) -> Option<u64> {
        [
            self.windows.next_close_ns(),
            self.subscriptions.next_close_ns(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Hand what the ring buffers delivered to its owners: process events to
    /// the process follower, each sample (resolved against the tracker's
    /// mappings) to the follower (its process described at its first
    /// sample), the unwind loader, the metrics, the subscriptions and the
    /// windows; then load the tables that finished building.
    pub fn drain(&mut self) {
        for event in self.events.borrow_mut().drain(..) {
            self.windows.add_event(&event);
            self.subscriptions.add_event(&event);
            self.follower.on_event(
                event.event,
                &mut self.tracker,
                self.sampler,
                &mut self.loader,
                &mut self.interpreters,
            );
        }
        let now = timefmt::monotonic_ns();
        // Taken out (and put back, keeping its capacity) so that each
        // sample can be delivered through &mut self.
        let mut samples = std::mem::take(&mut *self.samples.borrow_mut());
        for sample in samples.drain(..) {
            if self.exclude_helpers && opener::is_helper(sample.pid) {
                continue;
            }
            let frames = resolve_placed(&sample, &mut self.tracker, &mut self.interpreters);
            self.follower.on_sample(
                &sample,
                &mut self.tracker,
                self.sampler,
                &mut self.loader,
                &mut self.interpreters,
            );
            self.loader.on_sample(&sample, &frames, &self.tracker);
            if let Some(sample) = self.deferred.hold(sample, now) {
                self.deliver(sample, frames);
            }
        }
        *self.samples.borrow_mut() = samples;
        self.loader.load_ready_tables(self.sampler);
        self.release_deferred(now, 0);
        self.note_lost();
    }

    /// Walk on the held samples the loader may now have rows for, and
    /// deliver those that are done; those taken before `due_before_ns`
    /// (CLOCK_MONOTONIC) go now in any case ([`DeferredWalks::release`]).
    fn release_deferred(&mut self, now: u64, due_before_ns: u64) {
        if self.deferred.is_empty() {
            return;
        }
        let (tracker, sampler) = (&mut self.tracker, self.sampler);
        let mut rows = deferred::RowMemo::default();
        let row_writes = self.loader.stats().row_writes;
        let done = self.deferred.release(
            now,
            due_before_ns,
            row_writes,
            |object, vaddr| sampler.has_rows(object, vaddr),
            |sample, copy| {
                let mut view = LiveView {
                    tracker: &mut *tracker,
                    sampler,
                    pid: sample.pid,
                    timestamp_ns: sample.timestamp_ns,
                    rows: &mut rows,
                };
                deferred::walk_on(copy, &mut view)
            },
        );
        for sample in done {
            let frames = resolve_placed(&sample, &mut self.tracker, &mut self.interpreters);
            // Objects only the finished walk reached get their tables too.
            self.loader.on_sample(&sample, &frames, &self.tracker);
            self.deliver(sample, frames);
        }
    }

    /// Count one sample whose walk is as final as it gets (an on-CPU one:
    /// off-CPU waits have their own counters), and hand it to the
    /// subscriptions and the windows.
    fn deliver(&mut self, sample: RawSample, frames: Box<[UserFrame]>) {
        if sample.wait.is_none() {
            self.metrics.sample(sample.user_status);
            if let Some(progress) = self.progress.as_mut() {
                progress.sample(sample.pid, sample.user_status);
            }
        }
        self.subscriptions.add(&sample, &frames);
        if !self.listen_only {
            self.windows.add_resolved(&sample, &frames);
        }
    }

    /// Read the lost-samples counter (one map lookup) and hand any new
    /// losses, as a span from the previous check to now, to the windows and
    /// subscriptions, which keep them when they keep a timeline.
    fn note_lost(&mut self) {
        let Ok(lost) = self.sampler.lost() else {
            return;
        };
        let lost = lost + *self.malformed.borrow();
        let now = timefmt::monotonic_ns();
        let (seen, since) = self.lost_seen;
        if lost > seen {
            self.windows.add_lost(since, now, lost - seen);
            self.subscriptions.add_lost(since, now, lost - seen);
        }
        self.lost_seen = (lost.max(seen), now);
    }

    /// Close the windows and requests whose end has passed: read the clock,
    /// then everything submitted before it, then hand each closed one to its
    /// worker. Pauses sampling when no request is left (listen-only mode).
    pub fn close_due(&mut self) -> Result<()> {
        let now = timefmt::monotonic_ns();
        self.ring
            .consume()
            .context("draining the samples ring buffers")?;
        self.consumed_ns = now;
        self.drain();
        // What windows closing now hold: samples taken before their end.
        self.release_deferred(now, now.saturating_sub(CLOSE_SLACK_NS));
        for closed in self.windows.close_due(now) {
            self.totals.account(&closed);
            if let Some(worker) = self.workers.windows.as_mut() {
                worker.submit(closed, &self.tracker);
            }
        }
        for closed in self.subscriptions.close_due(now) {
            self.served += 1;
            if let Some(on_demand) = self.workers.on_demand.as_mut() {
                on_demand.submit(closed, &self.tracker);
            }
        }
        if self.subscriptions.is_empty() {
            self.sampling.pause(self.sampler);
        }
        Ok(())
    }

    /// Retire processes no open window or request can refer to, and update
    /// the metrics that are not counted per sample (lost samples, unwind
    /// tables, sampling frequency).
    pub fn refresh_metrics(&mut self) {
        // Closed windows and requests took copies of what they need: what
        // no sample in an open one can refer to can go.
        let now = timefmt::monotonic_ns();
        let windows_since = if self.listen_only {
            Some(now)
        } else {
            self.windows.open_since_ns()
        };
        if let Some(since) = windows_since {
            let since = [
                self.subscriptions.open_since_ns(),
                self.deferred.earliest_ns(),
            ]
            .into_iter()
            .flatten()
            .fold(since, u64::min);
            self.retire_gone(now, since);
        }
        let bpf = self.sampler.stats().unwrap_or_default();
        let lost = bpf.lost + *self.malformed.borrow();
        self.metrics.set_lost(lost);
        let tables = self.loader.stats();
        self.metrics.set_unwind_tables(
            tables.rows_loaded * 8,
            tables.tables_loaded,
            tables.evictions,
        );
        self.metrics
            .set_sampling_freq(self.sampling.freq_hz().unwrap_or(0));
        let mut deferred = self.deferred.stats();
        deferred.not_sent = bpf.stack_copies_skipped;
        self.metrics.set_deferred(deferred);
        if self.sampler.records_off_cpu() {
            self.metrics.set_off_cpu(OffCpuCounts::from_stats(&bpf));
        }
    }

    /// Retire what the tracker knows of processes gone before `since` (the
    /// earliest sample an open window or request can hold): also those that
    /// left `/proc` (at `now`) without an exit event; the walker forgets
    /// them and the files of the objects retired with them.
    fn retire_gone(&mut self, now: u64, since: u64) {
        let vanished = self.tracker.notice_vanished(now);
        if !vanished.is_empty() {
            debug!("{} processes left /proc unnoticed", vanished.len());
        }
        self.follower
            .processes_vanished(&vanished, self.sampler, &mut self.loader);
        let swept = self.follower.sweep_descriptions(self.sampler);
        if swept > 0 {
            debug!("removed {swept} descriptions of processes gone from /proc");
        }
        // Every sample taken before this has been drained and resolved.
        let drained_before = self
            .deferred
            .earliest_ns()
            .into_iter()
            .fold(self.consumed_ns.saturating_sub(CLOSE_SLACK_NS), u64::min);
        let trimmed = self.tracker.trim_departed(drained_before);
        if trimmed > 0 {
            debug!("kept only the sampled mappings of {trimmed} exited processes");
        }
        let retired = self.tracker.retire_exited(since);
        if retired > 0 {
            debug!("retired {retired} exited processes");
        }
        for pid in self.tracker.take_retired_pids() {
            self.interpreters.forget(pid);
        }
        let objects = self.tracker.take_retired_objects();
        if !objects.is_empty() {
            debug!("retired {} objects no process maps", objects.len());
        }
        self.follower.objects_retired(objects, self.sampler);
        self.metrics.set_tracker(
            self.tracker.process_count() as u64,
            self.tracker.mapping_count() as u64,
            self.tracker.object_count() as u64,
        );
    }

    /// Detach the perf events, take what is still in the ring buffers, and
    /// hand over the state the summary and the last windows need. Requests
    /// still in progress are answered 503 (their span outlives the run).
    pub fn stop(mut self) -> Result<Stopped> {
        self.sampler.detach();
        if let Some(progress) = self.progress.as_mut() {
            progress.clear();
        }
        self.ring
            .consume()
            .context("draining the samples ring buffers")?;
        self.drain();
        self.release_deferred(timefmt::monotonic_ns(), u64::MAX);
        drop(self.subscriptions);
        drop(self.workers.requests);
        let stats = self.sampler.stats()?;
        let malformed = *self.malformed.borrow();
        Ok(Stopped {
            tracker: self.tracker,
            windows: self.windows,
            loader: self.loader,
            described: self.follower.described(),
            window_worker: self.workers.windows,
            on_demand: self.workers.on_demand,
            totals: self.totals,
            served: self.served,
            stats,
            malformed,
            deferred: self.deferred.stats(),
            children_seen: self.children_seen,
        })
    }
}
