//! Windows: which time span each sample belongs to, and when a span is over.
//!
//! A run is cut into windows of a fixed interval on CLOCK_MONOTONIC, starting
//! at the moment sampling started (`t0`): window `k` is
//! `[t0 + k·interval, t0 + (k+1)·interval)`. Each sample goes to the window
//! its BPF timestamp ([`RawSample::timestamp_ns`], the same clock) falls in,
//! so a sample is counted once, in the window it was taken in, whatever the
//! moment it is read from the ring buffer. A window is closed once the clock
//! has passed its end by [`CLOSE_SLACK_NS`] (and the caller has drained the
//! ring buffer): a record is submitted within microseconds of its timestamp,
//! so by then every sample of the window has been read. A sample that still
//! arrives for a closed window (a reader stalled for longer than the slack)
//! goes to the oldest open window and is counted in [`Windows::late`]; it is
//! never dropped. Each open window remembers its earliest sample timestamp,
//! so that [`Windows::open_since_ns`] covers such late samples too.
//!
//! When the run has a duration limit, the window containing the limit is the
//! last one and extends to the moment sampling stops; without a limit, the
//! window open at the stop ends there (a partial window). Without an
//! interval there is a single window covering the whole run.

use std::collections::BTreeMap;

use crate::process::ProcessTracker;
use crate::process::UserFrame;
use crate::profile::aggregate::Aggregator;
use crate::profile::ProcessMarkerKind;
use crate::profile::Window;
use crate::sampling::records::{ProcessEvent, RawSample, TimedEvent};

/// How long after a window's end it is closed, ns (see the module docs).
pub const CLOSE_SLACK_NS: u64 = 50_000_000;

/// A window that is over: its samples and the span it covers.
#[derive(Debug)]
pub struct ClosedWindow {
    /// Position of the window in the run (0 for the first).
    pub index: u64,
    /// The window's samples.
    pub aggregator: Aggregator,
    /// Its span: start (Unix ns), real length (ns), sampling frequency.
    pub window: Window,
}

impl ClosedWindow {
    /// Take `later`, the window closed after this one, into this one: its
    /// samples join this window's ([`Aggregator::absorb`]) and the span
    /// grows to `later`'s end. Nothing is dropped; the profile built from
    /// the result covers both spans.
    pub fn absorb(&mut self, later: ClosedWindow) {
        let end = later.window.start_unix_ns + later.window.duration_ns;
        self.window.duration_ns = end.saturating_sub(self.window.start_unix_ns);
        self.aggregator.absorb(later.aggregator);
    }
}

/// A window still collecting samples.
#[derive(Debug, Default)]
struct OpenWindow {
    aggregator: Aggregator,
    /// Timestamp of its earliest sample (CLOCK_MONOTONIC ns); below the
    /// window's start when it holds late samples.
    earliest_ns: Option<u64>,
}

/// The open windows of a run and the clocks that place them.
#[derive(Debug)]
pub struct Windows {
    t0_mono_ns: u64,
    t0_unix_ns: u64,
    interval_ns: Option<u64>,
    /// Index of the last window when the run has a duration limit.
    last_index: Option<u64>,
    sample_freq_hz: u64,
    /// Whether each window's aggregator keeps a timeline.
    timeline: bool,
    /// Whether off-CPU waits are recorded (`Window::off_cpu`).
    off_cpu: bool,
    open: BTreeMap<u64, OpenWindow>,
    /// Every window with a lower index has been closed.
    next_to_close: u64,
    late: u64,
    total: u64,
}

impl Windows {
    /// Windows of `interval_ns` (`None`: one window for the whole run)
    /// starting at `t0_mono_ns` (CLOCK_MONOTONIC), which is `t0_unix_ns` on
    /// the wall clock. `limit_ns` is the run's duration limit, if any.
    pub fn new(
        t0_mono_ns: u64,
        t0_unix_ns: u64,
        interval_ns: Option<u64>,
        limit_ns: Option<u64>,
        sample_freq_hz: u64,
    ) -> Self {
        let interval_ns = interval_ns.map(|i| i.max(1));
        let last_index = match (interval_ns, limit_ns) {
            (Some(i), Some(limit)) => Some(limit.div_ceil(i).saturating_sub(1)),
            _ => None,
        };
        Windows {
            t0_mono_ns,
            t0_unix_ns,
            interval_ns,
            last_index,
            sample_freq_hz,
            timeline: false,
            off_cpu: false,
            open: BTreeMap::new(),
            next_to_close: 0,
            late: 0,
            total: 0,
        }
    }

    /// Make every window keep a timeline (each sample's time and stack, see
    /// [`Aggregator::with_timeline`]), for timeline formats.
    pub fn with_timeline(mut self, timeline: bool) -> Self {
        self.timeline = timeline;
        self
    }

    /// Say in every window that off-CPU waits are recorded (`--off-cpu`).
    pub fn with_off_cpu(mut self, off_cpu: bool) -> Self {
        self.off_cpu = off_cpu;
        self
    }

    /// The window a CLOCK_MONOTONIC time falls in.
    fn index_of(&self, mono_ns: u64) -> u64 {
        let Some(interval) = self.interval_ns else {
            return 0;
        };
        let index = mono_ns.saturating_sub(self.t0_mono_ns) / interval;
        self.last_index.map_or(index, |last| index.min(last))
    }

    /// End of window `index` (CLOCK_MONOTONIC ns); `None` for a window that
    /// lasts until the run stops.
    fn end_of(&self, index: u64) -> Option<u64> {
        let interval = self.interval_ns?;
        if self.last_index.is_some_and(|last| index >= last) {
            return None;
        }
        Some(self.t0_mono_ns + (index + 1) * interval)
    }

    fn start_of(&self, index: u64) -> u64 {
        self.t0_mono_ns + index * self.interval_ns.unwrap_or(0)
    }

    /// Add a sample to the window its timestamp falls in (resolving its user
    /// addresses through `tracker`).
    pub fn add(&mut self, sample: &RawSample, tracker: &mut ProcessTracker) {
        self.add_resolved(sample, &crate::profile::aggregate::resolve(sample, tracker));
    }

    /// Note a process exec or exit in the window its timestamp falls in (as
    /// for samples, a late one goes to the oldest open window), when
    /// windows keep timelines; other events and runs without a timeline
    /// format keep nothing.
    pub fn add_event(&mut self, event: &TimedEvent) {
        let (pid, kind) = match event.event {
            ProcessEvent::Exec { pid, .. } => (pid, ProcessMarkerKind::Exec),
            ProcessEvent::Exit { pid } => (pid, ProcessMarkerKind::Exit),
            ProcessEvent::UnknownMapping { .. }
            | ProcessEvent::Fork { .. }
            | ProcessEvent::Mapping { .. } => return,
        };
        if !self.timeline {
            return;
        }
        let index = self.index_of(event.timestamp_ns).max(self.next_to_close);
        self.open_window(index)
            .aggregator
            .add_marker(pid, kind, event.timestamp_ns);
    }

    /// Note that `samples` samples were lost between `start_ns` and
    /// `end_ns` (CLOCK_MONOTONIC), in the window of `end_ns` (or the oldest
    /// open one), when windows keep timelines.
    pub fn add_lost(&mut self, start_ns: u64, end_ns: u64, samples: u64) {
        if !self.timeline {
            return;
        }
        let index = self.index_of(end_ns).max(self.next_to_close);
        self.open_window(index)
            .aggregator
            .add_lost(start_ns, end_ns, samples);
    }

    /// The open window `index`, made if it has no sample yet.
    fn open_window(&mut self, index: u64) -> &mut OpenWindow {
        let (timeline, start) = (self.timeline, self.start_of(index));
        self.open.entry(index).or_insert_with(|| OpenWindow {
            aggregator: if timeline {
                Aggregator::with_timeline(start)
            } else {
                Aggregator::new()
            },
            earliest_ns: None,
        })
    }

    /// Like [`Self::add`], with the user frames already resolved
    /// ([`crate::profile::aggregate::resolve`]).
    pub fn add_resolved(&mut self, sample: &RawSample, user: &[UserFrame]) {
        let mut index = self.index_of(sample.timestamp_ns);
        if index < self.next_to_close {
            index = self.next_to_close;
            self.late += 1;
        }
        let open = self.open_window(index);
        open.aggregator.add_resolved(sample, user);
        open.earliest_ns = Some(
            open.earliest_ns
                .map_or(sample.timestamp_ns, |t| t.min(sample.timestamp_ns)),
        );
        if sample.wait.is_none() {
            self.total += 1;
        }
    }

    /// The earliest timestamp (CLOCK_MONOTONIC ns) a sample in an open
    /// window can have: the start of the oldest window not yet closed, or
    /// the timestamp of an earlier (late) sample one of them holds. Every
    /// sample taken before it is in a closed window. `None` in a
    /// single-window run, whose one window stays open to the end.
    pub fn open_since_ns(&self) -> Option<u64> {
        self.interval_ns?;
        let start = self.start_of(self.next_to_close);
        Some(
            self.open
                .values()
                .filter_map(|w| w.earliest_ns)
                .fold(start, u64::min),
        )
    }

    /// When (CLOCK_MONOTONIC ns) the oldest open window is due to close;
    /// `None` if it lasts until the run stops.
    pub fn next_close_ns(&self) -> Option<u64> {
        self.end_of(self.next_to_close)
            .map(|end| end + CLOSE_SLACK_NS)
    }

    /// Close every window due at `now_mono_ns` (the caller drained the ring
    /// buffer after reading the clock), oldest first. Windows without
    /// samples are returned too, so consecutive windows always meet.
    pub fn close_due(&mut self, now_mono_ns: u64) -> Vec<ClosedWindow> {
        let mut closed = Vec::new();
        while let Some(end) = self.end_of(self.next_to_close) {
            if now_mono_ns < end + CLOSE_SLACK_NS {
                break;
            }
            closed.push(self.close(self.next_to_close, end));
        }
        closed
    }

    /// Close every remaining window; the last ends at `stop_mono_ns`, when
    /// sampling stopped (after the ring buffer was drained for the last time).
    pub fn finish(&mut self, stop_mono_ns: u64) -> Vec<ClosedWindow> {
        let last = self
            .index_of(stop_mono_ns)
            .max(self.open.keys().next_back().copied().unwrap_or(0))
            .max(self.next_to_close);
        let mut closed = Vec::new();
        while self.next_to_close <= last {
            let index = self.next_to_close;
            let end = if index == last {
                stop_mono_ns.max(self.start_of(index))
            } else {
                self.end_of(index).unwrap_or(stop_mono_ns)
            };
            closed.push(self.close(index, end));
        }
        closed
    }

    fn close(&mut self, index: u64, end_mono_ns: u64) -> ClosedWindow {
        let start = self.start_of(index);
        self.next_to_close = index + 1;
        ClosedWindow {
            index,
            aggregator: self.open.remove(&index).unwrap_or_default().aggregator,
            window: Window {
                start_unix_ns: self.t0_unix_ns + (start - self.t0_mono_ns),
                duration_ns: end_mono_ns.saturating_sub(start),
                sample_freq_hz: self.sample_freq_hz,
                off_cpu: self.off_cpu,
            },
        }
    }

    /// Samples that arrived after their window had been closed (counted in
    /// the oldest open window instead).
    pub fn late(&self) -> u64 {
        self.late
    }

    /// On-CPU samples added so far, over all windows (off-CPU waits are
    /// counted by the summary's `off-CPU:` line, not here).
    pub fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn sample(ts: u64) -> RawSample {
        RawSample::for_test(u32::MAX - 3, ts, vec![])
    }

    fn counts(closed: &[ClosedWindow]) -> Vec<u64> {
        closed.iter().map(|c| c.aggregator.total()).collect()
    }

    #[test]
    fn samples_go_to_their_window_and_windows_meet() {
        let mut tracker = ProcessTracker::new();
        let t0 = 100 * S;
        let mut w = Windows::new(t0, 5_000 * S, Some(S), None, 99);
        for ts in [t0 - 5, t0, t0 + S - 1, t0 + S, t0 + 2 * S + 7] {
            w.add(&sample(ts), &mut tracker);
        }
        assert_eq!(w.next_close_ns(), Some(t0 + S + CLOSE_SLACK_NS));
        assert!(w.close_due(t0 + S + CLOSE_SLACK_NS - 1).is_empty());
        let first = w.close_due(t0 + 2 * S + CLOSE_SLACK_NS);
        assert_eq!(counts(&first), vec![3, 1]);
        // A straggler for a closed window is counted once, in the next one.
        w.add(&sample(t0 + 10), &mut tracker);
        assert_eq!(w.late(), 1);
        // The open windows now hold a sample from before their start.
        assert_eq!(w.open_since_ns(), Some(t0 + 10));
        let rest = w.finish(t0 + 2 * S + S / 2);
        assert_eq!(counts(&rest), vec![2]);
        let all: Vec<&ClosedWindow> = first.iter().chain(&rest).collect();
        for pair in all.windows(2) {
            let (a, b) = (&pair[0].window, &pair[1].window);
            assert_eq!(a.start_unix_ns + a.duration_ns, b.start_unix_ns);
        }
        assert_eq!(all[0].window.start_unix_ns, 5_000 * S);
        assert_eq!(all[2].window.duration_ns, S / 2);
        assert_eq!(w.total(), 6);
    }

    /// The run's sample count (the summary's "N samples") is of on-CPU
    /// samples; an off-CPU wait goes into its window but is counted on the
    /// summary's `off-CPU:` line. Before, a continuous `--off-cpu` run
    /// said 926 samples where 360 were on-CPU and 566 were waits.
    #[test]
    fn waits_are_not_counted_as_samples() {
        let mut tracker = ProcessTracker::new();
        let mut w = Windows::new(0, 0, Some(S), None, 99);
        w.add(&sample(5), &mut tracker);
        let mut wait = sample(6);
        wait.wait = Some(crate::sampling::records::Wait {
            ns: 1_000_000,
            runnable: false,
        });
        w.add(&wait, &mut tracker);
        assert_eq!(w.total(), 1);
        assert_eq!(w.finish(S / 2).len(), 1);
    }

    #[test]
    fn duration_limit_makes_the_last_window_run_to_the_stop() {
        let mut tracker = ProcessTracker::new();
        let mut w = Windows::new(0, 0, Some(S), Some(3 * S), 99);
        w.add(&sample(3 * S + 5), &mut tracker); // after the limit, before the stop
        assert_eq!(counts(&w.close_due(2 * S + CLOSE_SLACK_NS)), vec![0, 0]);
        assert_eq!(w.next_close_ns(), None);
        let last = w.finish(3 * S + 20);
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].index, 2);
        assert_eq!(last[0].aggregator.total(), 1);
        assert_eq!(last[0].window.duration_ns, S + 20);
    }

    #[test]
    fn without_interval_one_window_covers_the_run() {
        let mut tracker = ProcessTracker::new();
        let mut w = Windows::new(10, 1_000, None, Some(5 * S), 49);
        w.add(&sample(11), &mut tracker);
        w.add(&sample(10 + 4 * S), &mut tracker);
        assert_eq!(w.next_close_ns(), None);
        let all = w.finish(10 + 5 * S);
        assert_eq!(counts(&all), vec![2]);
        assert_eq!(all[0].window.start_unix_ns, 1_000);
        assert_eq!(all[0].window.duration_ns, 5 * S);
        assert_eq!(all[0].window.sample_freq_hz, 49);
    }

    #[test]
    fn windows_with_timeline_time_samples_from_their_own_start() {
        let mut tracker = ProcessTracker::new();
        let t0 = 100 * S;
        let mut w = Windows::new(t0, 0, Some(S), None, 99).with_timeline(true);
        for ts in [t0 + 5, t0 + S + 7, t0 - 3] {
            w.add(&sample(ts), &mut tracker);
        }
        let mut closed = w.finish(t0 + 2 * S);
        let offsets = |c: &mut ClosedWindow| -> Vec<i64> {
            c.aggregator
                .take_timeline()
                .iter()
                .map(|t| t.offset_ns)
                .collect()
        };
        assert_eq!(offsets(&mut closed[0]), vec![-3, 5]);
        assert_eq!(offsets(&mut closed[1]), vec![7]);
        // Without a timeline format nothing is kept.
        let mut plain = Windows::new(t0, 0, None, None, 99);
        plain.add(&sample(t0), &mut tracker);
        assert!(plain.finish(t0 + S)[0]
            .aggregator
            .take_timeline()
            .is_empty());
    }
}
