//! The Firefox profile's markers: execs and exits of processes (instant
//! markers on their main thread) and spans with lost samples (interval
//! markers on the main thread of the pseudo-process `lightswitch`).

use fxprof_processed_profile::{
    CategoryHandle, MarkerFieldFlags, MarkerFieldFormat, MarkerTiming, Profile as FxProfile,
    StaticSchemaMarker, StaticSchemaMarkerField, StringHandle, ThreadHandle, Timestamp,
};
use rustc_hash::FxHashMap;

use super::{ThreadSlot, LOST_MARKER_TYPE, LOST_PID, PROCESS_MARKER_TYPE};
use crate::profile::{ProcessMarkerKind, Profile};

/// An exec or exit of a process, as an instant Firefox marker.
struct ProcessEventMarker {
    name: &'static str,
    pid: u32,
}

impl StaticSchemaMarker for ProcessEventMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = PROCESS_MARKER_TYPE;
    const DESCRIPTION: Option<&'static str> =
        Some("A process called exec or exited (BPF sched_process_exec/exit tracepoints)");
    const CHART_LABEL: Option<&'static str> = Some("{marker.name}");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.name} (pid {marker.data.pid})");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[StaticSchemaMarkerField {
        key: "pid",
        label: "Process",
        format: MarkerFieldFormat::Integer,
        flags: MarkerFieldFlags::SEARCHABLE,
    }];

    fn name(&self, profile: &mut FxProfile) -> StringHandle {
        profile.intern_string(self.name)
    }

    fn category(&self, _profile: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _field_index: u32) -> StringHandle {
        unreachable!("the schema has no string field")
    }

    fn number_field_value(&self, _field_index: u32) -> f64 {
        f64::from(self.pid)
    }
}

/// Samples lost during a span, as an interval Firefox marker.
struct LostSamplesMarker {
    samples: u64,
}

impl StaticSchemaMarker for LostSamplesMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = LOST_MARKER_TYPE;
    const DESCRIPTION: Option<&'static str> = Some(
        "Samples lost in this span: a ring buffer was full, or a record did not parse \
         (the BPF program counts them; the span is between two reads of the counter)",
    );
    const CHART_LABEL: Option<&'static str> = Some("{marker.data.samples} lost");
    const TABLE_LABEL: Option<&'static str> = Some("{marker.data.samples} samples lost");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[StaticSchemaMarkerField {
        key: "samples",
        label: "Samples lost",
        format: MarkerFieldFormat::Integer,
        flags: MarkerFieldFlags::SEARCHABLE,
    }];

    fn name(&self, profile: &mut FxProfile) -> StringHandle {
        profile.intern_string("lost samples")
    }

    fn category(&self, _profile: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _field_index: u32) -> StringHandle {
        unreachable!("the schema has no string field")
    }

    fn number_field_value(&self, _field_index: u32) -> f64 {
        self.samples as f64
    }
}

/// The profile's lost-sample spans as interval markers on the main thread
/// of the pseudo-process `lightswitch` (added only when samples were lost).
pub(super) fn add_lost_markers(fx: &mut FxProfile, profile: &Profile, time: impl Fn(i64) -> u64) {
    let (Some(first), Some(last)) = (
        profile.lost.iter().map(|l| l.start_offset_ns).min(),
        profile.lost.iter().map(|l| l.end_offset_ns).max(),
    ) else {
        return;
    };
    let start = Timestamp::from_nanos_since_reference(time(first));
    let end = Timestamp::from_nanos_since_reference(time(last));
    let process = fx.add_process("lightswitch", LOST_PID, start);
    fx.set_process_end_time(process, end);
    let thread = fx.add_thread(process, LOST_PID, start, true);
    fx.set_thread_end_time(thread, end);
    fx.set_thread_show_markers_in_timeline(thread, true);
    for lost in &profile.lost {
        let from = time(lost.start_offset_ns);
        let to = time(lost.end_offset_ns).max(from);
        fx.add_marker(
            thread,
            MarkerTiming::Interval(
                Timestamp::from_nanos_since_reference(from),
                Timestamp::from_nanos_since_reference(to),
            ),
            LostSamplesMarker {
                samples: lost.samples,
            },
        );
    }
}

/// The profile's execs and exits as markers on their process's main thread
/// (or its first sampled thread); those of processes without samples in
/// the profile have no thread to go on and are left out.
pub(super) fn add_markers(
    fx: &mut FxProfile,
    profile: &Profile,
    slots: &[ThreadSlot],
    time: impl Fn(i64) -> u64,
) {
    let mut thread_of_pid: FxHashMap<u32, (bool, ThreadHandle)> = FxHashMap::default();
    for slot in slots {
        if let Some(handle) = slot.handle {
            let main = slot.tid == slot.pid;
            let entry = thread_of_pid.entry(slot.pid).or_insert((main, handle));
            if main && !entry.0 {
                *entry = (true, handle);
            }
        }
    }
    for marker in &profile.markers {
        let Some(&(_, thread)) = thread_of_pid.get(&marker.pid) else {
            continue;
        };
        let name = match marker.kind {
            ProcessMarkerKind::Exec => "exec",
            ProcessMarkerKind::Exit => "exit",
        };
        let at = Timestamp::from_nanos_since_reference(time(marker.offset_ns));
        fx.add_marker(
            thread,
            MarkerTiming::Instant(at),
            ProcessEventMarker {
                name,
                pid: marker.pid,
            },
        );
    }
}
