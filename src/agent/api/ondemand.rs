//! On-demand CPU profiles (`GET /debug/pprof/profile?seconds=N`): the
//! requests the HTTP server hands to the sampling loop, the loop's open
//! [`Subscriptions`], and the [`OnDemandWorker`] that symbolizes, encodes and
//! answers each finished one off the loop.
//!
//! A subscription covers `[start, start + seconds)` on CLOCK_MONOTONIC, the
//! clock of the BPF timestamps. Every sample the loop drains is added to
//! every open subscription whose span contains its timestamp and whose pid
//! filter (if any) contains its process, so overlapping requests share the
//! same perf events and each gets exactly the samples of its own span and
//! processes. A subscription is closed once the clock has passed its end by
//! [`CLOSE_SLACK_NS`] and the loop has drained the ring buffer after
//! reading the clock (as windows are, see [`crate::profile::window`]).

use std::collections::HashSet;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::oneshot;
use tracing::debug;

use crate::process::ProcessTracker;
use crate::process::UserFrame;
use crate::profile::aggregate::Aggregator;
use crate::profile::format::{self, Compression, EmptyProfile, ProfileFormat};
use crate::profile::window::CLOSE_SLACK_NS;
use crate::profile::{ProcessMarkerKind, Profile, Provenance, Window};
use crate::sampling::records::{ProcessEvent, RawSample, TimedEvent};
use crate::sampling::sampler::Sampler;
use crate::symbolize::mapping_source::{ObjectCache, TrackerSnapshot};
use crate::symbolize::settings::SymbolContext;
use crate::symbolize::Symbolizer;
use crate::util::guard::contain;
use crate::util::timefmt;

/// Why a request got no profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// Sampling already runs at another frequency than the one asked for (409).
    Conflict(String),
    /// Nothing was sampled, so the format has nothing to show (404).
    NoSamples(String),
    /// Starting the perf events, symbolizing or encoding failed (500).
    Failed(String),
}

/// A request's profile: encoded, or (for a request without a format) the
/// symbolized [`Profile`] itself, with every sample's time.
#[derive(Debug)]
pub enum Answer {
    /// The profile in the format asked for.
    Encoded(Vec<u8>),
    /// The profile with its timeline (the web view's recordings).
    Profile(Box<Profile>),
}

/// The answer to a request: the profile, or why there is none.
pub type Reply = std::result::Result<Answer, RequestError>;

/// A profile request, from the HTTP server to the sampling loop.
#[derive(Debug)]
pub struct ProfileRequest {
    /// Length of the profile, ns.
    pub duration_ns: u64,
    /// Only these processes (thread group ids); empty: every sampled process.
    pub pids: Vec<u32>,
    /// Sampling frequency asked for, Hz; `None`: whatever runs (or the
    /// `--sample-freq` default when sampling is idle).
    pub sample_freq_hz: Option<u64>,
    /// Output format (pprof is gzip'd); `None`: the [`Profile`] itself,
    /// timeline kept ([`Answer::Profile`]).
    pub format: Option<ProfileFormat>,
    /// Whether the profile has off-CPU waits too (`offcpu=true`; the agent
    /// must run with `--off-cpu`).
    pub off_cpu: bool,
    /// When the request arrived, CLOCK_MONOTONIC ns: its span starts there
    /// (or when sampling starts, if it was idle).
    pub arrived_mono_ns: u64,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Reply>,
}

/// One request being served.
#[derive(Debug)]
struct Subscription {
    start_mono_ns: u64,
    end_mono_ns: u64,
    pids: HashSet<u32>,
    sample_freq_hz: u64,
    off_cpu: bool,
    format: Option<ProfileFormat>,
    aggregator: Aggregator,
    reply: oneshot::Sender<Reply>,
}

/// A subscription whose span is over, ready to be symbolized.
#[derive(Debug)]
pub struct ClosedSubscription {
    aggregator: Aggregator,
    window: Window,
    /// The request's pids (empty: every process the agent samples).
    pids: HashSet<u32>,
    format: Option<ProfileFormat>,
    reply: oneshot::Sender<Reply>,
}

/// The open on-demand subscriptions of the sampling loop.
#[derive(Debug, Default)]
pub struct Subscriptions {
    open: Vec<Subscription>,
}

impl Subscriptions {
    /// Start serving `request` from `start_mono_ns` (CLOCK_MONOTONIC) with
    /// samples taken at `sample_freq_hz`.
    pub fn open(&mut self, request: ProfileRequest, start_mono_ns: u64, sample_freq_hz: u64) {
        self.open.push(Subscription {
            start_mono_ns,
            end_mono_ns: start_mono_ns.saturating_add(request.duration_ns),
            pids: request.pids.into_iter().collect(),
            sample_freq_hz,
            off_cpu: request.off_cpu,
            format: request.format,
            aggregator: if request.format.is_none_or(ProfileFormat::is_timeline) {
                Aggregator::with_timeline(start_mono_ns)
            } else {
                Aggregator::new()
            },
            reply: request.reply,
        });
    }

    /// Whether no subscription is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Add `sample`, whose user frames `frames` are resolved
    /// ([`crate::profile::aggregate::resolve`]), to every subscription it
    /// belongs to (its span and pid filter).
    pub fn add(&mut self, sample: &RawSample, frames: &[UserFrame]) {
        for s in &mut self.open {
            if (s.start_mono_ns..s.end_mono_ns).contains(&sample.timestamp_ns)
                && (s.pids.is_empty() || s.pids.contains(&sample.pid))
                && (s.off_cpu || sample.wait.is_none())
            {
                s.aggregator.add_resolved(sample, frames);
            }
        }
    }

    /// Note a process exec or exit in every timeline subscription whose
    /// span contains it and whose pid filter (if any) has the process.
    pub fn add_event(&mut self, event: &TimedEvent) {
        let (pid, kind) = match event.event {
            ProcessEvent::Exec { pid, .. } => (pid, ProcessMarkerKind::Exec),
            ProcessEvent::Exit { pid } => (pid, ProcessMarkerKind::Exit),
            _ => return,
        };
        for s in &mut self.open {
            if (s.start_mono_ns..s.end_mono_ns).contains(&event.timestamp_ns)
                && (s.pids.is_empty() || s.pids.contains(&pid))
            {
                s.aggregator.add_marker(pid, kind, event.timestamp_ns);
            }
        }
    }

    /// Note `samples` samples lost between `start_ns` and `end_ns`
    /// (CLOCK_MONOTONIC) in every timeline subscription whose span meets
    /// that one. The BPF program counts losses for all sampled processes
    /// together, so a subscription with a pid filter gets them all too.
    pub fn add_lost(&mut self, start_ns: u64, end_ns: u64, samples: u64) {
        for s in &mut self.open {
            if start_ns < s.end_mono_ns && end_ns >= s.start_mono_ns {
                s.aggregator.add_lost(start_ns, end_ns, samples);
            }
        }
    }

    /// Start (CLOCK_MONOTONIC ns) of the oldest open subscription: no
    /// subscription holds a sample taken before it.
    pub fn open_since_ns(&self) -> Option<u64> {
        self.open.iter().map(|s| s.start_mono_ns).min()
    }

    /// When (CLOCK_MONOTONIC ns) the next subscription is due to close.
    pub fn next_close_ns(&self) -> Option<u64> {
        self.open
            .iter()
            .map(|s| s.end_mono_ns + CLOSE_SLACK_NS)
            .min()
    }

    /// Close every subscription due at `now_mono_ns` (the caller drained
    /// the ring buffer after reading the clock). Subscriptions whose client
    /// has gone away are dropped here too.
    pub fn close_due(&mut self, now_mono_ns: u64) -> Vec<ClosedSubscription> {
        let now_unix_ns = timefmt::now_unix_ns();
        let (due, open): (Vec<Subscription>, Vec<Subscription>) = std::mem::take(&mut self.open)
            .into_iter()
            .filter(|s| !s.reply.is_closed())
            .partition(|s| now_mono_ns >= s.end_mono_ns + CLOSE_SLACK_NS);
        self.open = open;
        due.into_iter()
            .map(|s| ClosedSubscription {
                window: Window {
                    start_unix_ns: now_unix_ns
                        .saturating_sub(now_mono_ns.saturating_sub(s.start_mono_ns)),
                    duration_ns: s.end_mono_ns - s.start_mono_ns,
                    sample_freq_hz: s.sample_freq_hz,
                    off_cpu: s.off_cpu,
                },
                aggregator: s.aggregator,
                pids: s.pids,
                format: s.format,
                reply: s.reply,
            })
            .collect()
    }
}

/// Whether the perf events run, and at which frequency: in listen-only
/// mode they are opened for the first request and closed after the last.
pub struct Sampling {
    /// The frequency they sample at, Hz; `None` while paused.
    freq_hz: Option<u64>,
    /// When they were (re)opened, CLOCK_MONOTONIC ns.
    since_mono_ns: u64,
    /// `--sample-freq`: the frequency of a request that names none.
    default_freq_hz: u64,
    /// Listen-only mode: sample only while a request is in progress.
    on_demand_only: bool,
}

impl Sampling {
    /// Sampling that runs at `freq_hz` since `since_mono_ns`
    /// (CLOCK_MONOTONIC); with `on_demand_only`, [`Sampling::pause`] may stop it.
    pub fn new(freq_hz: u64, since_mono_ns: u64, on_demand_only: bool) -> Self {
        Sampling {
            freq_hz: Some(freq_hz),
            since_mono_ns,
            default_freq_hz: freq_hz,
            on_demand_only,
        }
    }

    /// The frequency the perf events sample at, Hz; `None` while paused.
    pub fn freq_hz(&self) -> Option<u64> {
        self.freq_hz
    }

    /// Close the perf events if nothing but requests needs them (listen-only mode).
    pub fn pause(&mut self, sampler: &Sampler<'_>) {
        if self.on_demand_only && self.freq_hz.is_some() {
            sampler.pause();
            self.freq_hz = None;
            debug!("no profile request in progress: sampling paused");
        }
    }

    /// Make sure the perf events run, at `freq_hz` if they are paused.
    /// Errors (the 409 or 500 answer): they run at another frequency, or
    /// cannot be opened.
    fn ensure(&mut self, sampler: &Sampler<'_>, freq_hz: Option<u64>) -> Result<u64, RequestError> {
        match (self.freq_hz, freq_hz) {
            (Some(running), Some(asked)) if running != asked => Err(RequestError::Conflict(format!(
                "sampling runs at {running} Hz already: ask for sample_freq={running} or leave it out"
            ))),
            (Some(running), _) => Ok(running),
            (None, asked) => {
                let freq = asked.unwrap_or(self.default_freq_hz);
                sampler
                    .resume(freq)
                    .map_err(|e| RequestError::Failed(format!("{e:#}")))?;
                self.freq_hz = Some(freq);
                self.since_mono_ns = timefmt::monotonic_ns();
                debug!("profile request: sampling at {freq} Hz");
                Ok(freq)
            }
        }
    }
}

/// Turn the profile requests waiting in `requests` into subscriptions
/// (starting the perf events if they are paused); a request that cannot be
/// served is answered at once.
pub fn accept_requests(
    requests: &Receiver<ProfileRequest>,
    subscriptions: &mut Subscriptions,
    sampling: &mut Sampling,
    sampler: &Sampler<'_>,
) {
    for request in requests.try_iter() {
        match sampling.ensure(sampler, request.sample_freq_hz) {
            Ok(freq) => {
                let start = request.arrived_mono_ns.max(sampling.since_mono_ns);
                subscriptions.open(request, start, freq);
            }
            Err(err) => {
                let _ = request.reply.send(Err(err));
            }
        }
    }
}

type Job = Box<(ClosedSubscription, TrackerSnapshot)>;

/// Symbolizes, encodes and answers closed subscriptions on a thread of
/// its own, so that the sampling loop only copies the mappings they refer to.
pub struct OnDemandWorker {
    tx: Sender<Job>,
    thread: JoinHandle<()>,
    objects: ObjectCache,
}

impl OnDemandWorker {
    /// Start the worker thread, which symbolizes with the run's `symbols`.
    pub fn start(symbols: SymbolContext) -> Result<Self> {
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name("lsw-on-demand".into())
            .spawn(move || run(rx, &symbols))
            .context("starting the on-demand profile worker thread")?;
        Ok(OnDemandWorker {
            tx,
            thread,
            objects: ObjectCache::new(),
        })
    }

    /// Hand a closed subscription over, with what symbolizing it needs from
    /// `tracker`. Never waits for the worker.
    pub fn submit(&mut self, closed: ClosedSubscription, tracker: &ProcessTracker) {
        let objects = &mut self.objects;
        let Some(snapshot) = contain(
            || "on-demand profile (tracker snapshot)".into(),
            || TrackerSnapshot::capture(&closed.aggregator, tracker, objects),
        ) else {
            self.objects = ObjectCache::new();
            let _ = closed.reply.send(Err(RequestError::Failed(
                "processing the profile failed (a bug: see the agent's log)".into(),
            )));
            return;
        };
        if let Err(job) = self.tx.send(Box::new((closed, snapshot))) {
            let (closed, _) = *job.0;
            let _ = closed.reply.send(Err(RequestError::Failed(
                "the on-demand profile worker has stopped".into(),
            )));
        }
    }

    /// Answer what was submitted, then stop the thread.
    pub fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

/// How long the worker keeps its symbolizer (and the debug information it
/// has cached) after the last request, so that an idle agent gives the
/// memory back while a series of requests reuses it.
const SYMBOLIZER_IDLE: Duration = Duration::from_secs(30);

fn run(rx: Receiver<Job>, symbols: &SymbolContext) {
    let mut cached: Option<Symbolizer> = None;
    loop {
        let job = if cached.is_some() {
            match rx.recv_timeout(SYMBOLIZER_IDLE) {
                Ok(job) => job,
                Err(RecvTimeoutError::Timeout) => {
                    debug!("no profile request for {SYMBOLIZER_IDLE:?}: symbolizer caches dropped");
                    cached = None;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(job) => job,
                Err(_) => break,
            }
        };
        let symbolizer = cached.get_or_insert_with(|| Symbolizer::with_context(symbols));
        let (mut closed, snapshot) = *job;
        if closed.reply.is_closed() {
            continue;
        }
        let reply = contain(
            || "on-demand profile".into(),
            || answer(symbolizer, &mut closed, &snapshot),
        )
        .unwrap_or_else(|| {
            // Its caches may be half updated: start afresh.
            cached = None;
            Err(RequestError::Failed(
                "processing the profile failed (a bug: see the agent's log)".into(),
            ))
        });
        let _ = closed.reply.send(reply);
    }
}

/// What an on-demand profile shows (`pids 12, 34 (on demand)`, or every
/// process the agent samples), for flame graph titles, its pids and this host.
fn on_demand_provenance(pids: &HashSet<u32>) -> Provenance {
    let mut pids: Vec<u32> = pids.iter().copied().collect();
    pids.sort_unstable();
    let subject = match pids.as_slice() {
        [] => "the agent's processes (on demand)".to_string(),
        [pid] => format!("pid {pid} (on demand)"),
        pids => format!(
            "pids {} (on demand)",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Provenance {
        subject: subject.into(),
        host: crate::output::sender::hostname().into(),
        pids: pids.into(),
    }
}

/// Symbolize and encode one closed subscription.
fn answer(
    symbolizer: &Symbolizer,
    closed: &mut ClosedSubscription,
    snapshot: &TrackerSnapshot,
) -> Reply {
    let started = std::time::Instant::now();
    let mut profile = symbolizer.build_profile(&closed.aggregator, snapshot, closed.window);
    closed.aggregator.take_timeline_into(&mut profile);
    on_demand_provenance(&closed.pids).stamp(&mut profile);
    let samples = profile.total_samples();
    let reply = match closed.format {
        Some(format) => format::encode(&profile, format, Compression::Gzip)
            .map(Answer::Encoded)
            .map_err(|e| match e.downcast_ref::<EmptyProfile>() {
                Some(empty) => RequestError::NoSamples(empty.to_string()),
                None => RequestError::Failed(format!("{e:#}")),
            }),
        None if samples == 0 && profile.waits.is_empty() => Err(RequestError::NoSamples(
            "no samples were taken and no off-CPU wait recorded in the recording".into(),
        )),
        None => Ok(Answer::Profile(Box::new(profile))),
    };
    debug!(
        "on-demand profile: {samples} samples symbolized and encoded in {:?}",
        started.elapsed()
    );
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn sample(pid: u32, ts: u64) -> RawSample {
        RawSample::for_test(pid, ts, vec![])
    }

    fn request(duration_ns: u64, pids: Vec<u32>) -> (ProfileRequest, oneshot::Receiver<Reply>) {
        let (reply, rx) = oneshot::channel();
        let request = ProfileRequest {
            duration_ns,
            pids,
            sample_freq_hz: None,
            format: Some(ProfileFormat::Folded),
            off_cpu: false,
            arrived_mono_ns: 0,
            reply,
        };
        (request, rx)
    }

    #[test]
    fn overlapping_subscriptions_get_their_own_span_and_pids() {
        let mut tracker = ProcessTracker::new();
        let mut subs = Subscriptions::default();
        let (a, _rx_a) = request(2 * S, vec![]);
        let (b, _rx_b) = request(2 * S, vec![u32::MAX - 7]);
        subs.open(a, 10 * S, 99);
        subs.open(b, 11 * S, 99);
        for (pid, ts) in [
            (u32::MAX - 7, 10 * S - 1), // before both
            (u32::MAX - 7, 10 * S),     // a
            (u32::MAX - 8, 11 * S),     // a (b filters it out)
            (u32::MAX - 7, 11 * S + 5), // a and b
            (u32::MAX - 7, 12 * S),     // b (a has ended)
            (u32::MAX - 7, 13 * S),     // after both
        ] {
            let sample = sample(pid, ts);
            let frames = crate::profile::aggregate::resolve(&sample, &mut tracker);
            subs.add(&sample, &frames);
        }
        assert_eq!(subs.open_since_ns(), Some(10 * S));
        assert_eq!(subs.next_close_ns(), Some(12 * S + CLOSE_SLACK_NS));
        assert!(subs.close_due(12 * S + CLOSE_SLACK_NS - 1).is_empty());
        let first = subs.close_due(12 * S + CLOSE_SLACK_NS);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].aggregator.total(), 3);
        assert_eq!(first[0].window.duration_ns, 2 * S);
        let second = subs.close_due(13 * S + CLOSE_SLACK_NS);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].aggregator.total(), 2);
        assert!(subs.is_empty());
    }

    #[test]
    fn a_client_that_went_away_is_dropped() {
        let mut subs = Subscriptions::default();
        let (a, rx) = request(S, vec![]);
        subs.open(a, 0, 99);
        drop(rx);
        assert!(subs.close_due(0).is_empty());
        assert!(subs.is_empty());
    }
}
