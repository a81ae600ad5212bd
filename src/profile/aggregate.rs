//! Aggregation: counts exact stacks. Every distinct (process, thread, kernel
//! stack, user stack, unwind result) is its own entry; nothing is merged by hash.
//! Stacks keep the order of their first sample, so each has a stable index
//! ([`Aggregator::stacks`]); an aggregator made with
//! [`Aggregator::with_timeline`] also keeps every sample's time and stack
//! index (a timeline), for the formats that show samples over time.
//!
//! User addresses are resolved to the mapping that contains them when the
//! sample arrives (the process may be gone by the time the window ends).
//! Return addresses (every frame but the leaf) are turned into call-site
//! addresses (`return address - 1`) so that they symbolize to the calling
//! line, as perf and pprof do.
//!
//! A window holds each distinct user frame and each distinct kernel stack
//! once; a stack refers to them by 4-byte index. Issue 18: under process
//! churn a 10 s window at 997 Hz held about 10,000 stacks and 300,000 user
//! frame references but only 63,000-68,000 distinct user frames, and its
//! kernel stacks repeat across processes; stored inline (16 bytes a user
//! frame, a kernel stack per stack), they were the largest part of what a
//! window frees when it closes.

use std::collections::HashMap;
use std::sync::Arc;

use hashbrown::Equivalent;

use super::interner::Interner;
use crate::process::{ProcessTracker, UserFrame};
use crate::profile::{LostSamples, ProcessMarker, ProcessMarkerKind, TimedSample, TimedWait};
use crate::sampling::records::{RawSample, UnwindStatus, Wait};
use crate::unwind::interp::Interpreters;

/// The identity of one aggregated stack, with its names and frames as
/// indices into the aggregator's tables of distinct names, user frames and
/// kernel stacks: 40 bytes and its user indices (64 with names as
/// `Arc<str>`, stored with its hash in an `IndexMap`, before decision 0010).
#[derive(Debug, PartialEq, Eq, Hash)]
struct StackKey {
    pid: u32,
    tid: u32,
    /// Indices in [`Aggregator::comms`].
    process_comm: u32,
    thread_comm: u32,
    /// Index in [`Aggregator::kernel_stacks`].
    kernel: u32,
    user_status: UnwindStatus,
    /// Indices in [`Aggregator::user_frames`], leaf first.
    user: Box<[u32]>,
}

const _: () = assert!(std::mem::size_of::<StackKey>() == 40);

/// A sample's [`StackKey`] before it is known to be new: the same fields in
/// the same order, with the user indices borrowed, so that it hashes as the
/// key does (`&[u32]` and `Box<[u32]>` both hash as `[u32]`).
#[derive(Hash)]
struct StackQuery<'a> {
    pid: u32,
    tid: u32,
    process_comm: u32,
    thread_comm: u32,
    kernel: u32,
    user_status: UnwindStatus,
    user: &'a [u32],
}

impl Equivalent<StackKey> for StackQuery<'_> {
    fn equivalent(&self, key: &StackKey) -> bool {
        self.pid == key.pid
            && self.tid == key.tid
            && self.process_comm == key.process_comm
            && self.thread_comm == key.thread_comm
            && self.kernel == key.kernel
            && self.user_status == key.user_status
            && *self.user == *key.user
    }
}

impl StackQuery<'_> {
    fn to_key(&self) -> StackKey {
        StackKey {
            pid: self.pid,
            tid: self.tid,
            process_comm: self.process_comm,
            thread_comm: self.thread_comm,
            kernel: self.kernel,
            user_status: self.user_status,
            user: self.user.into(),
        }
    }
}

/// One aggregated stack, as [`Aggregator::stacks`] gives it.
#[derive(Debug, Clone, Copy)]
pub struct Stack<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Process name.
    pub process_comm: &'a Arc<str>,
    /// Thread name.
    pub thread_comm: &'a Arc<str>,
    /// Kernel addresses, leaf first (call sites for non-leaf frames).
    pub kernel: &'a [u64],
    /// How the user-stack walk ended.
    pub user_status: UnwindStatus,
    /// Time threads spent off their CPU with exactly this stack, ns
    /// (`--off-cpu` waits; 0 for stacks only sampled on-CPU).
    pub off_cpu_ns: u64,
    user: &'a [u32],
    frames: &'a [UserFrame],
}

impl<'a> Stack<'a> {
    /// User frames, leaf first.
    pub fn user(&self) -> impl DoubleEndedIterator<Item = &'a UserFrame> + ExactSizeIterator {
        self.user_indexed().map(|(_, frame)| frame)
    }

    /// User frames, leaf first, each with its index among the aggregator's
    /// distinct user frames ([`Aggregator::user_frames`]): equal frames
    /// have equal indices.
    pub fn user_indexed(
        &self,
    ) -> impl DoubleEndedIterator<Item = (usize, &'a UserFrame)> + ExactSizeIterator {
        let frames = self.frames;
        self.user
            .iter()
            .map(move |&i| (i as usize, &frames[i as usize]))
    }
}

/// Counts of exact stacks over one window, in the order of their first
/// sample; optionally every sample's time too.
#[derive(Debug, Default)]
pub struct Aggregator {
    /// Distinct stacks, in the order of their first sample.
    stacks: Interner<StackKey>,
    /// Samples of each stack, by its index in `stacks`.
    counts: Vec<u64>,
    /// Off-CPU time of each stack, ns, by its index in `stacks`.
    off_cpu_ns: Vec<u64>,
    /// Off-CPU waits added so far, and their total length (ns).
    waits: u64,
    wait_ns: u64,
    /// Distinct user frames of the window's stacks.
    user_frames: Interner<UserFrame>,
    /// Distinct kernel stacks (call sites, leaf first) of the window's stacks.
    kernel_stacks: Interner<Box<[u64]>>,
    /// Reused buffers for one sample's kernel call sites and user frame indices.
    kernel_scratch: Vec<u64>,
    user_scratch: Vec<u32>,
    /// Distinct process and thread names.
    comms: Interner<Arc<str>>,
    total: u64,
    status_counts: HashMap<UnwindStatus, u64>,
    timeline: Option<Timeline>,
}

/// Every sample's time (relative to `origin_mono_ns`) and stack index.
#[derive(Debug)]
struct Timeline {
    /// CLOCK_MONOTONIC ns that offsets are taken from (the window's start).
    origin_mono_ns: u64,
    samples: Vec<TimedSample>,
    waits: Vec<TimedWait>,
    markers: Vec<ProcessMarker>,
    lost: Vec<LostSamples>,
}

fn call_sites(stack: &[u64]) -> impl Iterator<Item = u64> + '_ {
    stack
        .iter()
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
}

/// The native user frames of `sample`: call sites (every frame but the
/// leaf is a return address, so 1 is subtracted) with the mapping of the
/// process that contains each, as `tracker` knows them now. A run, which
/// follows interpreters, uses [`resolve_placed`].
pub fn resolve(sample: &RawSample, tracker: &mut ProcessTracker) -> Box<[UserFrame]> {
    let mut frames: Box<[UserFrame]> = call_sites(&sample.user_stack)
        .map(|address| UserFrame {
            mapping: None,
            address,
        })
        .collect();
    let addresses: &[UserFrame] = &frames;
    let mut mappings = vec![None; addresses.len()];
    tracker.find_mappings(
        sample.pid,
        sample.timestamp_ns,
        addresses.len(),
        |i| addresses[i].address,
        |i, m| mappings[i] = m,
    );
    for (frame, mapping) in frames.iter_mut().zip(mappings) {
        frame.mapping = mapping;
    }
    frames
}

/// [`resolve`], with the interpreted frames (Python) of a process
/// `interpreters` knows in their place among the native ones
/// ([`crate::unwind::interp::place`]).
pub fn resolve_placed(
    sample: &RawSample,
    tracker: &mut ProcessTracker,
    interpreters: &mut Interpreters,
) -> Box<[UserFrame]> {
    let frames = resolve(sample, tracker);
    if !interpreters.knows(sample.pid) {
        return frames;
    }
    let mut placed = frames.into_vec();
    crate::unwind::interp::place(sample, interpreters, tracker, &mut placed);
    placed.into_boxed_slice()
}

impl Aggregator {
    /// An empty aggregator.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty aggregator that also keeps a timeline: each sample's
    /// timestamp as an offset from `origin_mono_ns` (CLOCK_MONOTONIC ns, the
    /// start of the window) and the index of its stack. 12 bytes a sample.
    pub fn with_timeline(origin_mono_ns: u64) -> Self {
        Aggregator {
            timeline: Some(Timeline {
                origin_mono_ns,
                samples: Vec::new(),
                waits: Vec::new(),
                markers: Vec::new(),
                lost: Vec::new(),
            }),
            ..Self::default()
        }
    }

    /// Take the timeline out (leaving it empty), sorted by time: one entry
    /// per sample added, naming the stack's index in [`Self::stacks`]. Empty
    /// for an aggregator made with [`Self::new`].
    pub fn take_timeline(&mut self) -> Vec<TimedSample> {
        let Some(timeline) = self.timeline.as_mut() else {
            return Vec::new();
        };
        let mut samples = std::mem::take(&mut timeline.samples);
        samples.sort_unstable();
        samples
    }

    /// Note that `kind` happened to process `pid` at `timestamp_ns`
    /// (CLOCK_MONOTONIC); kept only by an aggregator with a timeline.
    pub fn add_marker(&mut self, pid: u32, kind: ProcessMarkerKind, timestamp_ns: u64) {
        if let Some(timeline) = self.timeline.as_mut() {
            timeline.markers.push(ProcessMarker {
                offset_ns: timestamp_ns.wrapping_sub(timeline.origin_mono_ns) as i64,
                pid,
                kind,
            });
        }
    }

    /// Note that `samples` samples were lost between `start_ns` and
    /// `end_ns` (CLOCK_MONOTONIC); kept only by an aggregator with a timeline.
    /// A span that began before the origin (the counter was last read in
    /// the previous window) is cut to start at the origin: the losses are
    /// counted here, and the profile's time reference stays its start.
    pub fn add_lost(&mut self, start_ns: u64, end_ns: u64, samples: u64) {
        if let Some(timeline) = self.timeline.as_mut() {
            let origin = timeline.origin_mono_ns;
            let start = start_ns.max(origin);
            timeline.lost.push(LostSamples {
                start_offset_ns: start.wrapping_sub(origin) as i64,
                end_offset_ns: end_ns.max(start).wrapping_sub(origin) as i64,
                samples,
            });
        }
    }

    /// Take the lost-sample spans out (leaving none), in time order.
    pub fn take_lost(&mut self) -> Vec<LostSamples> {
        self.take_sorted(|t| &mut t.lost, |l| l.start_offset_ns)
    }

    /// Take the off-CPU waits out (leaving none), in order of their start.
    pub fn take_waits(&mut self) -> Vec<TimedWait> {
        self.take_sorted(|t| &mut t.waits, |w| w.start_offset_ns)
    }

    /// Take the markers out (leaving none), in time order.
    pub fn take_markers(&mut self) -> Vec<ProcessMarker> {
        self.take_sorted(|t| &mut t.markers, |m| m.offset_ns)
    }

    /// Take one of the timeline's lists out (leaving it empty), sorted by
    /// `key` (ns offsets); empty when no timeline is kept.
    fn take_sorted<T>(
        &mut self,
        list: impl FnOnce(&mut Timeline) -> &mut Vec<T>,
        key: impl FnMut(&T) -> i64,
    ) -> Vec<T> {
        let Some(timeline) = self.timeline.as_mut() else {
            return Vec::new();
        };
        let mut items = std::mem::take(list(timeline));
        items.sort_by_key(key);
        items
    }

    /// Move the timeline, markers and lost-sample spans
    /// ([`Self::take_timeline`], [`Self::take_markers`], [`Self::take_lost`])
    /// into `profile`, built from this aggregator's stacks.
    pub fn take_timeline_into(&mut self, profile: &mut crate::profile::Profile) {
        profile.timeline = self.take_timeline();
        profile.waits = self.take_waits();
        profile.markers = self.take_markers();
        profile.lost = self.take_lost();
    }

    fn intern(&mut self, comm: &str) -> u32 {
        self.comms.insert_as(comm, |c| Arc::from(c))
    }

    /// Add one sample, resolving its user addresses to mappings through `tracker`.
    pub fn add(&mut self, sample: &RawSample, tracker: &mut ProcessTracker) {
        let user = resolve(sample, tracker);
        self.add_resolved(sample, &user);
    }

    /// Add one sample whose user frames [`resolve`] gave.
    pub fn add_resolved(&mut self, sample: &RawSample, user: &[UserFrame]) {
        let mut kernel = std::mem::take(&mut self.kernel_scratch);
        kernel.clear();
        kernel.extend(call_sites(&sample.kernel_stack));
        let kernel_index = self.kernel_stacks.insert_as(&kernel[..], |k| k.into());
        self.kernel_scratch = kernel;
        let mut user_indices = std::mem::take(&mut self.user_scratch);
        user_indices.clear();
        user_indices.extend(
            user.iter()
                .map(|&frame| self.user_frames.insert_as(&frame, |f| *f)),
        );
        let query = StackQuery {
            pid: sample.pid,
            tid: sample.tid,
            process_comm: self.intern(&sample.process_comm),
            thread_comm: self.intern(&sample.thread_comm),
            kernel: kernel_index,
            user_status: sample.user_status,
            user: &user_indices,
        };
        let index = self.stacks.insert_as(&query, StackQuery::to_key);
        self.user_scratch = user_indices;
        if index as usize == self.counts.len() {
            self.counts.push(0);
            self.off_cpu_ns.push(0);
        }
        if let Some(wait) = sample.wait {
            self.add_wait(index, sample.timestamp_ns, wait);
            return;
        }
        self.counts[index as usize] += 1;
        if let Some(timeline) = self.timeline.as_mut() {
            timeline.samples.push(TimedSample {
                offset_ns: sample.timestamp_ns.wrapping_sub(timeline.origin_mono_ns) as i64,
                sample: index,
            });
        }
        *self.status_counts.entry(sample.user_status).or_default() += 1;
        self.total += 1;
    }

    /// Count an off-CPU wait of stack `index` that ended at `end_ns`
    /// (CLOCK_MONOTONIC).
    fn add_wait(&mut self, index: u32, end_ns: u64, wait: Wait) {
        self.off_cpu_ns[index as usize] += wait.ns;
        self.waits += 1;
        self.wait_ns += wait.ns;
        if let Some(timeline) = self.timeline.as_mut() {
            let start = end_ns.saturating_sub(wait.ns);
            timeline.waits.push(TimedWait {
                start_offset_ns: start.wrapping_sub(timeline.origin_mono_ns) as i64,
                duration_ns: wait.ns,
                sample: index,
            });
        }
    }

    /// Off-CPU waits added so far (`--off-cpu`), and their total length, ns.
    pub fn waits(&self) -> (u64, u64) {
        (self.waits, self.wait_ns)
    }

    /// Samples added so far (cpu-clock samples; waits are [`Self::waits`]).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Samples per unwind result.
    pub fn status_counts(&self) -> &HashMap<UnwindStatus, u64> {
        &self.status_counts
    }

    /// The distinct stacks and their sample counts, in the order of their
    /// first sample (the n-th item is the stack of index n).
    pub fn stacks(&self) -> impl Iterator<Item = (Stack<'_>, u64)> {
        let keys = self.stacks.as_slice().iter();
        keys.zip(&self.counts)
            .zip(&self.off_cpu_ns)
            .map(|((k, &count), &off_cpu_ns)| {
                let stack = Stack {
                    pid: k.pid,
                    tid: k.tid,
                    process_comm: &self.comms[k.process_comm],
                    thread_comm: &self.comms[k.thread_comm],
                    kernel: &self.kernel_stacks[k.kernel],
                    user_status: k.user_status,
                    off_cpu_ns,
                    user: &k.user,
                    frames: self.user_frames.as_slice(),
                };
                (stack, count)
            })
    }

    /// Number of distinct stacks.
    pub fn stack_count(&self) -> usize {
        self.counts.len()
    }

    /// The distinct user frames of all stacks, each once.
    pub fn user_frames(&self) -> impl ExactSizeIterator<Item = &UserFrame> {
        self.user_frames.as_slice().iter()
    }

    /// The distinct kernel stacks of all stacks (call sites, leaf first), each once.
    pub fn kernel_stacks(&self) -> impl ExactSizeIterator<Item = &[u64]> {
        self.kernel_stacks.as_slice().iter().map(|k| &k[..])
    }

    /// Number of distinct processes with samples.
    pub fn process_count(&self) -> usize {
        let mut pids: Vec<u32> = self.stacks.as_slice().iter().map(|k| k.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.len()
    }

    /// Add everything `later` holds (a later window's aggregator of the same
    /// run) as if its samples had been added here: stacks are interned
    /// anew, their sample counts and off-CPU time summed, the unwind-status
    /// counts and wait totals added, and the timeline's entries moved to
    /// this aggregator's origin (offsets in ns). Nothing of `later` is lost;
    /// a held-back window takes its successors in this way when the window
    /// worker is behind ([`crate::output::sender::worker`]).
    pub fn absorb(&mut self, later: Aggregator) {
        let mut moved = Vec::with_capacity(later.counts.len());
        let stacks = later.stacks.as_slice().iter();
        for ((key, &count), &off_cpu_ns) in stacks.zip(&later.counts).zip(&later.off_cpu_ns) {
            let kernel = &later.kernel_stacks[key.kernel][..];
            let kernel = self.kernel_stacks.insert_as(kernel, |k| k.into());
            let user: Vec<u32> = key
                .user
                .iter()
                .map(|&i| self.user_frames.insert_as(&later.user_frames[i], |f| *f))
                .collect();
            let query = StackQuery {
                pid: key.pid,
                tid: key.tid,
                process_comm: self.intern(&later.comms[key.process_comm]),
                thread_comm: self.intern(&later.comms[key.thread_comm]),
                kernel,
                user_status: key.user_status,
                user: &user,
            };
            let index = self.stacks.insert_as(&query, StackQuery::to_key);
            if index as usize == self.counts.len() {
                self.counts.push(0);
                self.off_cpu_ns.push(0);
            }
            self.counts[index as usize] += count;
            self.off_cpu_ns[index as usize] += off_cpu_ns;
            moved.push(index);
        }
        self.total += later.total;
        self.waits += later.waits;
        self.wait_ns += later.wait_ns;
        for (status, n) in later.status_counts {
            *self.status_counts.entry(status).or_default() += n;
        }
        if let (Some(mine), Some(theirs)) = (self.timeline.as_mut(), later.timeline) {
            let shift = theirs.origin_mono_ns.wrapping_sub(mine.origin_mono_ns) as i64;
            let stack = |i: u32| moved[i as usize];
            mine.samples
                .extend(theirs.samples.into_iter().map(|s| TimedSample {
                    offset_ns: s.offset_ns + shift,
                    sample: stack(s.sample),
                }));
            mine.waits
                .extend(theirs.waits.into_iter().map(|w| TimedWait {
                    start_offset_ns: w.start_offset_ns + shift,
                    sample: stack(w.sample),
                    ..w
                }));
            mine.markers
                .extend(theirs.markers.into_iter().map(|m| ProcessMarker {
                    offset_ns: m.offset_ns + shift,
                    ..m
                }));
            mine.lost
                .extend(theirs.lost.into_iter().map(|l| LostSamples {
                    start_offset_ns: l.start_offset_ns + shift,
                    end_offset_ns: l.end_offset_ns + shift,
                    ..l
                }));
        }
    }
}

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;
