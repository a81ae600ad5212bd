//! Firefox Profiler output: the profiler's "processed profile" JSON, built
//! with the `fxprof-processed-profile` crate and gzip'd (`profile.json.gz`;
//! open it at profiler.firefox.com with "Load a profile from file").
//!
//! Unlike the other formats it is a timeline: every sample of
//! [`Profile::timeline`] is one sample of its thread at its own time, so a
//! short stall stays visible instead of disappearing into the totals.
//!
//! - Time: `meta.startTime` is the profile's start on the wall clock
//!   ([`Profile::start_unix_ns`], moved earlier by the few µs of any sample
//!   taken before it), and each sample's time is its BPF timestamp's offset
//!   from that start (CLOCK_MONOTONIC differences), in ms.
//! - One process per pid, named after its latest sample's process name, from
//!   its first to its last sample; one thread per tid, named after its
//!   latest sample's thread name, the thread whose tid is the pid marked as
//!   the main thread (the UI shows it under the process name).
//! - Every sample weighs 1 and stands for one sampling period of CPU
//!   (`threadCPUDelta`), which draws the UI's CPU graph.
//! - Frames: kernel frames in the `Kernel` category, as addresses in the
//!   library `[kernel.kallsyms]`; user frames in the `User` category, as
//!   addresses (file offsets) in the library of their object (path, GNU
//!   build ID as code ID and debug ID), named through the library's symbol
//!   table, so the UI can group and collapse them by library. Functions
//!   inlined at an address follow it as frames of their own (labels).
//!   Addresses in no known mapping are labels named `[unknown]+0xADDR`; the
//!   `[unwind: ...]` frame of an incomplete stack is its outermost frame,
//!   in the `Unwind` category. The profile is marked symbolicated: the UI
//!   asks no symbol server.
//! - Markers: each exec and exit of a sampled process (from the BPF
//!   tracepoints, at their BPF timestamps; only processes the profiler has
//!   described to the walker send them) is an instant marker `exec` or
//!   `exit` on its main thread. Spans in which samples were lost
//!   ([`Profile::lost`]) are interval markers `lost samples` on the main
//!   thread (a track of its own, without samples) of a pseudo-process
//!   `lightswitch`, pid [`LOST_PID`], which no real process has.
//! - Off-CPU waits (`--off-cpu`, [`Profile::waits`]): interval markers
//!   `off-CPU` on their threads, each with the stack the thread waited
//!   with ([`waits`]).

use std::io::{BufWriter, Write};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use flate2::write::GzEncoder;
use fxprof_processed_profile::{
    CategoryColor, CategoryPairHandle, CpuDelta, FrameInfo, Profile as FxProfile,
    ReferenceTimestamp, SamplingInterval, StackHandle, ThreadHandle, Timestamp,
};
use rustc_hash::FxHashMap;
use tracing::debug;

use super::FormatSpec;
use crate::profile::Profile;

mod frames;
mod markers;
mod waits;
use frames::frame_infos;
use markers::{add_lost_markers, add_markers};

/// Default file name of the format.
pub const FILE_NAME: &str = "profile.json.gz";

/// The `type` of the exec and exit markers' data.
pub const PROCESS_MARKER_TYPE: &str = "LightswitchProcessEvent";

/// The `type` of the off-CPU wait markers' data.
pub const OFF_CPU_MARKER_TYPE: &str = "LightswitchOffCpu";

/// The `type` of the lost-samples markers' data.
pub const LOST_MARKER_TYPE: &str = "LightswitchLostSamples";

/// The pid of the pseudo-process that holds the lost-samples markers: above
/// the kernel's largest pid (2^22), so no real process has it.
pub const LOST_PID: u32 = u32::MAX;

/// How `meta.product` starts when the profile says what it shows: the rest
/// is [`Profile::subject`] (`lightswitch: CPU profile of pid 42 (nginx)`);
/// otherwise it is `lightswitch`.
pub const PRODUCT_SUBJECT_PREFIX: &str = "lightswitch: CPU profile of ";

/// The format's registry entry.
pub const SPEC: FormatSpec = FormatSpec {
    name: "firefox",
    aliases: &["firefox-profiler", "fxprof"],
    noun: "Firefox profile",
    help: "Firefox Profiler timeline, every sample at its own time (gzip'd JSON; open it at \
           profiler.firefox.com, \"Load a profile from file\"); default file name profile.json.gz",
    default_file_name: FILE_NAME,
    mime_type: "application/gzip",
    encodes_empty: true,
    timeline: true,
    off_cpu: false,
    encode: |profile, _, out| write(profile, out),
};

/// gzip level (1-9). On the 115 MB of JSON of a 60 s whole-machine run at
/// 10 kHz, level 1 made 33.5 MB in 0.8 s, level 2 23.9 MB in 1.2 s and
/// level 6 20.6 MB in 3.8 s (docs/decisions/0012-timeline-formats.md).
const GZIP_LEVEL: u32 = 2;

/// Encode `profile` as gzip'd Firefox Profiler JSON. Errors: the profile has
/// samples but no timeline of them (it was aggregated without one: a bug
/// of the caller), or the JSON could not be written.
pub fn encode(profile: &Profile) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    write(profile, &mut bytes)?;
    Ok(bytes)
}

/// Write `profile` as gzip'd Firefox Profiler JSON into `out`, as it is
/// serialized (the JSON is never held whole). Errors as [`encode`]'s, and
/// `out`'s write errors.
pub fn write(profile: &Profile, out: &mut dyn Write) -> Result<()> {
    let started = Instant::now();
    let fx = build(profile)?;
    debug!("firefox: profile built in {:?}", started.elapsed());
    let mut gzip = GzEncoder::new(out, flate2::Compression::new(GZIP_LEVEL));
    {
        let mut writer = BufWriter::with_capacity(1 << 16, &mut gzip);
        serde_json::to_writer(&mut writer, &fx).context("writing the Firefox profile JSON")?;
        writer.flush().context("compressing the Firefox profile")?;
    }
    gzip.finish().context("compressing the Firefox profile")?;
    Ok(())
}

/// The category pairs frames are put in.
struct Categories {
    user: CategoryPairHandle,
    kernel: CategoryPairHandle,
    unwind: CategoryPairHandle,
}

/// Where the threads of the profile stand: one entry per (pid, tid).
struct ThreadSlot {
    pid: u32,
    tid: u32,
    first_ns: u64,
    last_ns: u64,
    /// The profile sample (stack) of its latest sample: its names are the thread's.
    latest: u32,
    handle: Option<ThreadHandle>,
}

/// Build the Firefox profile of `profile` (see the module docs).
fn build(profile: &Profile) -> Result<FxProfile> {
    if profile.timeline.len() as u64 != profile.total_samples() {
        bail!(
            "the Firefox format needs every sample's time, but this profile has {} samples and \
             {} timed ones",
            profile.total_samples(),
            profile.timeline.len()
        );
    }
    if let Some(bad) = profile
        .timeline
        .iter()
        .find(|t| t.sample as usize >= profile.samples.len())
    {
        bail!(
            "a timed sample names stack {} of a profile with {}",
            bad.sample,
            profile.samples.len()
        );
    }
    // Offsets below zero (samples taken just before the recorded start)
    // move the reference earlier, so that every time is >= 0.
    let first_sample = profile.timeline.first().map(|t| t.offset_ns);
    let first_marker = profile.markers.first().map(|m| m.offset_ns);
    let first_lost = profile.lost.iter().map(|l| l.start_offset_ns).min();
    let first_wait = profile.waits.iter().map(|w| w.start_offset_ns).min();
    let shift = [first_sample, first_marker, first_lost, first_wait]
        .into_iter()
        .flatten()
        .fold(0, i64::min);
    let reference_ns = profile.start_unix_ns as f64 + shift as f64;
    let mut fx = FxProfile::new(
        "lightswitch",
        ReferenceTimestamp::from_millis_since_unix_epoch(reference_ns / 1e6),
        SamplingInterval::from_nanos(profile.period_ns()),
    );
    if let Some(subject) = &profile.subject {
        // The profiler UI's name for the profile; `report` reads it back.
        fx.set_product(&format!("{PRODUCT_SUBJECT_PREFIX}{subject}"));
    }
    fx.set_os_name("Linux");
    fx.set_symbolicated(true);
    let categories = Categories {
        user: fx.add_category("User", CategoryColor::Yellow).into(),
        kernel: fx.add_category("Kernel", CategoryColor::Orange).into(),
        unwind: fx.add_category("Unwind", CategoryColor::Gray).into(),
    };
    let frames = frame_infos(&mut fx, profile, &categories);
    let time = |offset_ns: i64| offset_ns.saturating_sub(shift).max(0) as u64;

    let (mut slots, slot_of_sample) = thread_slots(profile, time);
    add_processes_and_threads(&mut fx, profile, &mut slots);

    add_markers(&mut fx, profile, &slots, time);
    add_lost_markers(&mut fx, profile, time);
    let stacks = intern_stacks(&mut fx, profile, &frames, &slots, &slot_of_sample);
    waits::add_waits(&mut fx, profile, &slots, &slot_of_sample, &stacks, time);
    let cpu_delta = CpuDelta::from_nanos(profile.period_ns());
    for timed in &profile.timeline {
        let index = timed.sample as usize;
        let thread = slots[slot_of_sample[index]]
            .handle
            .context("every sampled thread has a handle")?;
        fx.add_sample(
            thread,
            Timestamp::from_nanos_since_reference(time(timed.offset_ns)),
            stacks[index],
            cpu_delta,
            1,
        );
    }
    Ok(fx)
}

/// The Firefox stack of every profile sample (`None` for a sample without
/// frames or samples). Each thread's stacks are interned in the order of
/// their frames, root first, so that consecutive stacks share their
/// common prefix and only the frames after it are interned: deep stacks
/// (a compiler's 60-frame stacks, most of them distinct) cost what their
/// differing leaves cost.
fn intern_stacks(
    fx: &mut FxProfile,
    profile: &Profile,
    frames: &[Vec<FrameInfo>],
    slots: &[ThreadSlot],
    slot_of_sample: &[usize],
) -> Vec<Option<StackHandle>> {
    let mut stacks = vec![None; profile.samples.len()];
    let mut by_slot: Vec<Vec<usize>> = vec![Vec::new(); slots.len()];
    for (index, sample) in profile.samples.iter().enumerate() {
        if sample.count > 0 || sample.off_cpu_ns > 0 {
            by_slot[slot_of_sample[index]].push(index);
        }
    }
    let root_first = |index: usize| profile.samples[index].frames.iter().rev();
    for (slot, mut indices) in slots.iter().zip(by_slot) {
        let Some(thread) = slot.handle else {
            continue;
        };
        indices.sort_unstable_by(|&a, &b| root_first(a).cmp(root_first(b)));
        // The frames of the previous stack, root first, with the stack
        // handle that ends at each.
        let mut path: Vec<(usize, Option<StackHandle>)> = Vec::new();
        for index in indices {
            let common = path
                .iter()
                .zip(root_first(index))
                .take_while(|((done, _), &frame)| *done == frame)
                .count();
            path.truncate(common);
            for &frame in root_first(index).skip(common) {
                let mut stack = path.last().and_then(|(_, s)| *s);
                for info in &frames[frame] {
                    let handle = fx.intern_frame(thread, info.clone());
                    stack = Some(fx.intern_stack(thread, stack, handle));
                }
                path.push((frame, stack));
            }
            stacks[index] = path.last().and_then(|(_, s)| *s);
        }
    }
    stacks
}

/// The (pid, tid) of every profile sample as a slot index, and the slots
/// with the first and last time (ns after the reference) and latest stack
/// of each thread.
fn thread_slots(profile: &Profile, time: impl Fn(i64) -> u64) -> (Vec<ThreadSlot>, Vec<usize>) {
    let mut slots: Vec<ThreadSlot> = Vec::new();
    let mut by_id: FxHashMap<(u32, u32), usize> = FxHashMap::default();
    let slot_of_sample: Vec<usize> = profile
        .samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            *by_id.entry((s.pid, s.tid)).or_insert_with(|| {
                slots.push(ThreadSlot {
                    pid: s.pid,
                    tid: s.tid,
                    first_ns: u64::MAX,
                    last_ns: 0,
                    latest: i as u32,
                    handle: None,
                });
                slots.len() - 1
            })
        })
        .collect();
    for timed in &profile.timeline {
        let slot = &mut slots[slot_of_sample[timed.sample as usize]];
        let t = time(timed.offset_ns);
        slot.first_ns = slot.first_ns.min(t);
        if t >= slot.last_ns {
            slot.last_ns = t;
            slot.latest = timed.sample;
        }
    }
    // A thread's waits are part of its life too (a thread may only wait).
    for wait in &profile.waits {
        let Some(&index) = slot_of_sample.get(wait.sample as usize) else {
            continue;
        };
        let slot = &mut slots[index];
        let start = time(wait.start_offset_ns);
        let end = start.saturating_add(wait.duration_ns);
        slot.first_ns = slot.first_ns.min(start);
        if end >= slot.last_ns {
            slot.last_ns = end;
            slot.latest = wait.sample;
        }
    }
    (slots, slot_of_sample)
}

/// One process per pid (named after its latest sample, spanning its
/// threads' samples) and one thread per slot with samples.
fn add_processes_and_threads(fx: &mut FxProfile, profile: &Profile, slots: &mut [ThreadSlot]) {
    let mut by_pid: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    for (i, slot) in slots.iter().enumerate() {
        if slot.first_ns != u64::MAX {
            by_pid.entry(slot.pid).or_default().push(i);
        }
    }
    let mut pids: Vec<u32> = by_pid.keys().copied().collect();
    pids.sort_unstable();
    for pid in pids {
        let members = &by_pid[&pid];
        let first = members.iter().map(|&i| slots[i].first_ns).min();
        let latest = members.iter().map(|&i| &slots[i]).max_by_key(|s| s.last_ns);
        let (Some(first), Some(latest)) = (first, latest) else {
            continue;
        };
        let last = latest.last_ns;
        let name = &profile.samples[latest.latest as usize].process_comm;
        let process = fx.add_process(name, pid, Timestamp::from_nanos_since_reference(first));
        fx.set_process_end_time(process, Timestamp::from_nanos_since_reference(last));
        for &i in members {
            let slot = &mut slots[i];
            let thread = fx.add_thread(
                process,
                slot.tid,
                Timestamp::from_nanos_since_reference(slot.first_ns),
                slot.tid == slot.pid,
            );
            let sample = &profile.samples[slot.latest as usize];
            fx.set_thread_name(thread, &sample.thread_comm);
            fx.set_thread_end_time(thread, Timestamp::from_nanos_since_reference(slot.last_ns));
            slot.handle = Some(thread);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read;

    use serde_json::Value;

    use super::*;
    use crate::profile::format::folded::tests::sample_profile;
    use crate::profile::{
        FrameKind, ProcessMarker, ProcessMarkerKind, ProfileMapping, TimedSample,
    };

    /// The folded tests' profile (threads 7 and 8 of `app`, inlined and
    /// kernel frames, a truncated stack) with its frames at 0x1000 and
    /// 0x2000 in `/bin/app`, and a timeline whose first sample is 2 µs
    /// before the start.
    pub(crate) fn timed_profile() -> Profile {
        let mut profile = sample_profile();
        profile.mappings.push(ProfileMapping {
            start: 0x1000,
            limit: 0x3000,
            file_offset: 0x100,
            filename: "/bin/app".into(),
            build_id: Some("0aa70dc66dec077a9140a391cc1a092737b75148".into()),
        });
        for frame in &mut profile.frames {
            if frame.kind == FrameKind::User {
                frame.mapping = Some(0);
            }
        }
        let mut offset = -2_000;
        for (index, sample) in profile.samples.iter().enumerate() {
            for _ in 0..sample.count {
                profile.timeline.push(TimedSample {
                    offset_ns: offset,
                    sample: index as u32,
                });
                offset += 10_000;
            }
        }
        profile.timeline.sort_unstable();
        profile
    }

    fn decode(bytes: &[u8]) -> Value {
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut json)
            .expect("gzip");
        serde_json::from_slice(&json).expect("JSON")
    }

    /// The names of a thread's sample's stack, root first, with the
    /// category names.
    fn stack_of(profile: &Value, thread: &Value, sample: usize) -> Vec<(String, String)> {
        let strings = thread["stringArray"].as_array().unwrap();
        let mut out = Vec::new();
        let mut stack = thread["samples"]["stack"][sample].as_u64();
        while let Some(s) = stack {
            let s = s as usize;
            let frame = thread["stackTable"]["frame"][s].as_u64().unwrap() as usize;
            let func = thread["frameTable"]["func"][frame].as_u64().unwrap() as usize;
            let name = thread["funcTable"]["name"][func].as_u64().unwrap() as usize;
            let category = thread["frameTable"]["category"][frame].as_u64().unwrap() as usize;
            out.push((
                strings[name].as_str().unwrap().to_string(),
                profile["meta"]["categories"][category]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            ));
            stack = thread["stackTable"]["prefix"][s].as_u64();
        }
        out.reverse();
        out
    }

    #[test]
    fn threads_times_frames_and_libraries() {
        let profile = timed_profile();
        let json = decode(&encode(&profile).unwrap());
        // The reference is 2 µs before the start: every time is >= 0.
        let start = json["meta"]["startTime"].as_f64().unwrap();
        assert!((start - (profile.start_unix_ns as f64 - 2_000.0) / 1e6).abs() < 1e-3);
        assert_eq!(json["meta"]["interval"].as_f64(), Some(10.0));
        let threads = json["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 2);
        let main = &threads[0];
        assert_eq!(main["isMainThread"], true);
        assert_eq!(main["tid"], "7");
        assert_eq!(
            main["name"], "app",
            "the main thread shows the process name"
        );
        assert_eq!(threads[1]["name"], "worker;1");
        assert_eq!(main["samples"]["length"], 5);
        assert_eq!(threads[1]["samples"]["length"], 3);
        assert_eq!(main["samples"]["timeDeltas"][0].as_f64(), Some(0.0));
        assert_eq!(main["samples"]["timeDeltas"][1].as_f64(), Some(0.01));
        assert_eq!(main["samples"]["threadCPUDelta"][0], 10_000);
        let expected: Vec<(String, String)> = [
            ("main", "User"),
            ("c", "User"),
            ("inner_inlined", "User"),
            ("do_syscall_64", "Kernel"),
            ("vfs_read", "Kernel"),
        ]
        .iter()
        .map(|(n, c)| (n.to_string(), c.to_string()))
        .collect();
        assert_eq!(stack_of(&json, main, 0), expected);
        // The truncated stack: the marker outermost, then c and its inlinee.
        let truncated = (0..3)
            .map(|i| stack_of(&json, &threads[1], i))
            .find(|s| s.len() == 3)
            .unwrap();
        assert_eq!(
            truncated[0],
            ("[unwind: truncated]".into(), "Unwind".into())
        );
        // User frames are addresses (file offsets) in /bin/app's library.
        let libs = json["libs"].as_array().unwrap();
        assert_eq!(libs.len(), 1);
        assert_eq!(libs[0]["name"], "app");
        assert_eq!(
            libs[0]["codeId"],
            "0aa70dc66dec077a9140a391cc1a092737b75148"
        );
        let addresses: Vec<i64> = main["frameTable"]["address"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_i64().unwrap())
            .filter(|&a| a >= 0)
            .collect();
        assert_eq!(addresses, vec![0x1100, 0x100]);
        assert_eq!(json["meta"]["symbolicated"], true);
    }

    #[test]
    fn execs_and_exits_are_markers_on_the_main_thread() {
        let mut profile = timed_profile();
        profile.markers = vec![
            ProcessMarker {
                offset_ns: -5_000,
                pid: 7,
                kind: ProcessMarkerKind::Exec,
            },
            ProcessMarker {
                offset_ns: 70_000,
                pid: 7,
                kind: ProcessMarkerKind::Exit,
            },
            // No samples of pid 99: no thread to put it on.
            ProcessMarker {
                offset_ns: 1_000,
                pid: 99,
                kind: ProcessMarkerKind::Exit,
            },
        ];
        let json = decode(&encode(&profile).unwrap());
        let threads = json["threads"].as_array().unwrap();
        let main = &threads[0];
        let markers = &main["markers"];
        assert_eq!(markers["length"], 2);
        let strings = main["stringArray"].as_array().unwrap();
        let names: Vec<&str> = markers["name"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| strings[n.as_u64().unwrap() as usize].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["exec", "exit"]);
        // The exec, 5 µs before the start, is the reference now.
        let times: Vec<f64> = markers["startTime"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_f64().unwrap())
            .collect();
        assert_eq!(times, vec![0.0, 0.075]);
        assert_eq!(markers["data"][1]["pid"].as_f64(), Some(7.0));
        assert_eq!(threads[1]["markers"]["length"], 0);
    }

    #[test]
    fn a_profile_without_its_timeline_is_refused_and_an_empty_one_is_valid() {
        let mut profile = sample_profile();
        let err = encode(&profile).unwrap_err().to_string();
        assert!(err.contains("8 samples and 0 timed"), "{err}");
        profile.samples.clear();
        let json = decode(&encode(&profile).unwrap());
        assert_eq!(json["threads"].as_array().map(Vec::len), Some(0));
    }
}
