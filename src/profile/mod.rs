//! The format-neutral profile: symbolized stacks with counts and labels for
//! one window, and (for timeline formats) every sample at its own time.
//! Every output format (folded, flame graph, pprof, firefox) is a pure
//! function of a [`Profile`], so they all agree on every count.
//! The encoders and decoders are in [`format`].

pub mod aggregate;
pub mod format;
#[cfg(test)]
mod handover_tests;
mod interner;
pub mod merge;
pub mod slice;
pub mod window;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::sampling::records::UnwindStatus;

/// The time span and settings a profile covers.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Length, ns.
    pub duration_ns: u64,
    /// Sampling frequency, Hz.
    pub sample_freq_hz: u64,
    /// Whether off-CPU waits were recorded (`--off-cpu`).
    pub off_cpu: bool,
}

/// One window's symbolized samples.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// Start of the window, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Length of the window, ns.
    pub duration_ns: u64,
    /// Sampling frequency per CPU, Hz (one sample stands for 1e9 / freq ns of CPU).
    pub sample_freq_hz: u64,
    /// What was profiled, in words: a command line (`./bench -n 3`), the
    /// pids (`pids 1234, 5678`) or `the whole machine`. Set by runs and
    /// window workers; `None` for profiles read back or merged. Flame
    /// graphs draw it in their title.
    pub subject: Option<Arc<str>>,
    /// The host the samples were taken on (`gethostname`), when known.
    pub host: Option<Arc<str>>,
    /// The processes profiled, as [`Provenance::pids`]: `record`'s command,
    /// the `--pids`, or none for every process (the whole machine). `None`
    /// when unknown (profiles read back or merged). Says which mapping
    /// pprof readers are shown as the profiled program.
    pub targets: Option<Arc<[u32]>>,
    /// The container each sampled process ran in, by pid: the 64-hex id
    /// its runtime named its cgroup after (Docker, containerd, CRI-O,
    /// Podman), read from `/proc/PID/cgroup` by the process tracker
    /// ([`crate::process::ProcessTracker::container_id`]). Pids in no
    /// container are absent. Encoders label samples with it (OTLP
    /// `container.id`, a pprof label).
    pub containers: BTreeMap<u32, Arc<str>>,
    /// Address ranges the frames belong to (objects of processes, and the kernel).
    pub mappings: Vec<ProfileMapping>,
    /// Distinct frames (locations), referenced by index from [`Sample::frames`].
    pub frames: Vec<Frame>,
    /// Distinct stacks with their counts.
    pub samples: Vec<Sample>,
    /// Every sample at its own time, in time order: filled only when a
    /// timeline format (firefox) was asked for, empty otherwise. When
    /// filled, it has exactly [`Profile::total_samples`] entries and the
    /// entries naming `samples[i]` number `samples[i].count`.
    pub timeline: Vec<TimedSample>,
    /// What [`Sample::count`] counts: cpu-clock samples, or in an off-CPU
    /// view ([`Profile::off_cpu_view`]) ns spent off the CPU.
    pub weight: Weight,
    /// Whether off-CPU waits were recorded (`--off-cpu`): the formats then
    /// carry off-CPU time ([`Sample::off_cpu_ns`]) as a second sample type
    /// or a view of its own, even when no thread waited.
    pub off_cpu: bool,
    /// Every off-CPU wait at its own time, in order of its start: kept with
    /// the timeline (empty without one). The waits naming `samples[i]` add
    /// up to `samples[i].off_cpu_ns`.
    pub waits: Vec<TimedWait>,
    /// Process execs and exits in the window, in time order: kept with the
    /// timeline (empty without one).
    pub markers: Vec<ProcessMarker>,
    /// Spans in which samples were lost (a ring buffer was full, or a record
    /// did not parse), in time order: kept with the timeline (empty without
    /// one).
    pub lost: Vec<LostSamples>,
}

/// Samples lost during a span of the run (timeline formats). The BPF
/// program only counts losses, so the span is the time between two reads
/// of that counter by the sampling loop (at most about 100 ms apart):
/// the losses happened somewhere in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostSamples {
    /// Start of the span, ns after [`Profile::start_unix_ns`] (as
    /// [`TimedSample::offset_ns`]).
    pub start_offset_ns: i64,
    /// End of the span, ns after [`Profile::start_unix_ns`].
    pub end_offset_ns: i64,
    /// Samples lost in it.
    pub samples: u64,
}

/// What a run profiles and on which host: stamped on every profile it
/// builds ([`Profile::subject`], [`Profile::host`]).
#[derive(Debug, Clone)]
pub struct Provenance {
    /// What was profiled, in words (see [`Profile::subject`]).
    pub subject: Arc<str>,
    /// The host name.
    pub host: Arc<str>,
    /// The processes profiled: `record`'s command (its first pid), the
    /// `--pids`, those of an on-demand request; empty for every process.
    pub pids: Arc<[u32]>,
}

impl Provenance {
    /// Set `profile`'s subject, host and targets to these.
    pub fn stamp(&self, profile: &mut Profile) {
        profile.subject = Some(self.subject.clone());
        profile.host = Some(self.host.clone());
        profile.targets = Some(self.pids.clone());
    }
}

/// Something that happened to a process, at its time (timeline formats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMarker {
    /// When, ns after [`Profile::start_unix_ns`] (as [`TimedSample::offset_ns`]).
    pub offset_ns: i64,
    /// The process.
    pub pid: u32,
    /// What happened.
    pub kind: ProcessMarkerKind,
}

/// What a [`ProcessMarker`] marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessMarkerKind {
    /// The process called exec: a new program from here on.
    Exec,
    /// The process exited (its last thread).
    Exit,
}

/// One sample of a timeline: when it was taken and which stack it has
/// (12 bytes: packed to 4-byte alignment, so that the `u32` does not pad it
/// to 16; a 60 s run at 10 kHz on 2 CPUs, 1.2 M samples, keeps its timeline
/// in about 14 MB). Read its fields by value (`{ t.offset_ns }`): a packed
/// field cannot be borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(C, packed(4))]
pub struct TimedSample {
    /// When the sample was taken, ns after [`Profile::start_unix_ns`] (the
    /// BPF timestamp, CLOCK_MONOTONIC, minus the window's start on the same
    /// clock). Negative for the few samples taken between attaching the perf
    /// events and reading the start time, and for late samples counted in
    /// the window after their own.
    pub offset_ns: i64,
    /// Index into [`Profile::samples`] (which also gives pid and tid).
    pub sample: u32,
}

/// What a profile's [`Sample::count`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Weight {
    /// cpu-clock samples (on-CPU).
    #[default]
    Samples,
    /// ns threads spent off their CPU (an off-CPU view).
    OffCpuNs,
}

/// One off-CPU wait of a timeline: when the thread left its CPU, for how
/// long, and the stack it left with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedWait {
    /// When the thread left the CPU, ns after [`Profile::start_unix_ns`]
    /// (as [`TimedSample::offset_ns`]).
    pub start_offset_ns: i64,
    /// How long until it ran again, ns.
    pub duration_ns: u64,
    /// Index into [`Profile::samples`].
    pub sample: u32,
}

/// An address range backed by an object file (or the kernel image).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProfileMapping {
    /// First address (inclusive).
    pub start: u64,
    /// End address (exclusive).
    pub limit: u64,
    /// File offset of `start`, bytes.
    pub file_offset: u64,
    /// Path as the process saw it, or `[kernel.kallsyms]`, `[vdso]`, `[anon]`.
    pub filename: String,
    /// GNU build ID in lower-case hex, when known.
    pub build_id: Option<String>,
}

/// Where a frame comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A kernel address.
    Kernel,
    /// A user-space address.
    User,
    /// Not an address: marks a stack whose user-space walk stopped early, and why.
    UnwindMarker,
}

/// A source line a frame resolves to (one per inlining level).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Line {
    /// Demangled function name, or `object+0xOFFSET` when unknown.
    pub function: Arc<str>,
    /// Function name as in the symbol table (mangled); empty for an
    /// interpreted (Python) frame, which has no symbol.
    pub system_name: Arc<str>,
    /// Source file, when debug info has it.
    pub file: Option<Arc<str>>,
    /// Line in `file`, when known.
    pub line: Option<u32>,
}

/// One location: an address and the function(s) it resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Kernel, user, or an unwind marker.
    pub kind: FrameKind,
    /// Absolute address (call site for return addresses); 0 for markers.
    pub address: u64,
    /// Index into [`Profile::mappings`].
    pub mapping: Option<usize>,
    /// Innermost first: the inlined functions, then the function that contains them.
    /// Never empty.
    pub lines: Arc<[Line]>,
    /// Whether `lines` came from a symbol table (false: the name is `object+0xOFFSET`).
    pub symbolized: bool,
}

/// One distinct stack and how many times it was sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Process name.
    pub process_comm: Arc<str>,
    /// Thread name.
    pub thread_comm: Arc<str>,
    /// Indices into [`Profile::frames`], leaf first: kernel frames, user frames,
    /// then (for an incomplete stack) its unwind marker.
    pub frames: Vec<usize>,
    /// How the user-stack walk ended.
    pub unwind_status: UnwindStatus,
    /// Number of samples with exactly this stack.
    pub count: u64,
    /// Time threads spent off their CPU with exactly this stack, ns
    /// (`--off-cpu`; 0 for a stack only sampled on-CPU).
    pub off_cpu_ns: u64,
}

impl Profile {
    /// Total samples.
    pub fn total_samples(&self) -> u64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    /// Total off-CPU time, ns.
    pub fn total_off_cpu_ns(&self) -> u64 {
        self.samples.iter().map(|s| s.off_cpu_ns).sum()
    }

    /// The off-CPU time of this profile as a profile of its own, for the
    /// formats with one value per stack (folded, flame graph, `report`):
    /// each stack that waited, its [`Sample::count`] the ns it waited
    /// ([`Weight::OffCpuNs`]); stacks only seen running are left out, and
    /// so are the timeline, waits and markers.
    pub fn off_cpu_view(&self) -> Profile {
        let samples = self
            .samples
            .iter()
            .filter(|s| s.off_cpu_ns > 0)
            .map(|s| Sample {
                count: s.off_cpu_ns,
                off_cpu_ns: 0,
                frames: s.frames.clone(),
                ..s.clone()
            })
            .collect();
        Profile {
            start_unix_ns: self.start_unix_ns,
            duration_ns: self.duration_ns,
            sample_freq_hz: self.sample_freq_hz,
            subject: self.subject.clone(),
            host: self.host.clone(),
            targets: self.targets.clone(),
            mappings: self.mappings.clone(),
            frames: self.frames.clone(),
            samples,
            weight: Weight::OffCpuNs,
            ..Profile::default()
        }
    }

    /// CPU time one sample stands for, ns (1e9 / sampling frequency).
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / self.sample_freq_hz.max(1)
    }
}

/// Name of the mapping kernel frames belong to (as perf and pprof call it).
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

/// The frame name that marks a stack whose user walk ended with `status`.
pub fn unwind_marker_name(status: UnwindStatus) -> String {
    format!("[unwind: {}]", status.name())
}

/// The status an unwind marker's frame name (`[unwind: NAME]`, from
/// [`unwind_marker_name`]) names; `None` for any other name.
pub fn marked_status(frame_name: &str) -> Option<UnwindStatus> {
    let name = frame_name.strip_prefix("[unwind: ")?.strip_suffix(']')?;
    UnwindStatus::from_name(name)
}

/// The unwind result the outermost frame of `stack` (indices into
/// `frames`, leaf first) names when it is an unwind marker; else
/// [`UnwindStatus::Complete`].
pub fn stack_unwind_status(stack: &[usize], frames: &[Frame]) -> UnwindStatus {
    stack
        .last()
        .and_then(|&f| frames.get(f))
        .filter(|f| f.kind == FrameKind::UnwindMarker)
        .and_then(|f| marked_status(&f.lines.first()?.function))
        .unwrap_or(UnwindStatus::Complete)
}
