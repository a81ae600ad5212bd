//! Off-CPU waits in the Firefox profile (`--off-cpu`): each wait of
//! [`Profile::waits`] is an interval marker `off-CPU` on its thread, from
//! when the thread left its CPU to when it ran again, with the stack it
//! waited with (shown in the marker's tooltip and the marker table's
//! sidebar). Wait markers show in the thread's timeline track.

use fxprof_processed_profile::{
    CategoryHandle, MarkerFieldFlags, MarkerFieldFormat, MarkerTiming, Profile as FxProfile,
    StackHandle, StaticSchemaMarker, StaticSchemaMarkerField, StringHandle, ThreadHandle,
    Timestamp,
};

use super::{ThreadSlot, OFF_CPU_MARKER_TYPE};
use crate::profile::Profile;

/// One wait, as an interval Firefox marker.
struct OffCpuMarker {
    ns: u64,
}

impl StaticSchemaMarker for OffCpuMarker {
    const UNIQUE_MARKER_TYPE_NAME: &'static str = OFF_CPU_MARKER_TYPE;
    const DESCRIPTION: Option<&'static str> = Some(
        "The thread was off its CPU: blocked, or runnable and waiting for a CPU \
         (BPF sched_switch); the stack is where it waited",
    );
    const CHART_LABEL: Option<&'static str> = Some("off-CPU");
    const TABLE_LABEL: Option<&'static str> = Some("off-CPU {marker.data.ns} ns");
    const FIELDS: &'static [StaticSchemaMarkerField] = &[StaticSchemaMarkerField {
        key: "ns",
        label: "Off-CPU (ns)",
        format: MarkerFieldFormat::Integer,
        flags: MarkerFieldFlags::SEARCHABLE,
    }];

    fn name(&self, profile: &mut FxProfile) -> StringHandle {
        profile.intern_string("off-CPU")
    }

    fn category(&self, _profile: &mut FxProfile) -> CategoryHandle {
        CategoryHandle::OTHER
    }

    fn string_field_value(&self, _field_index: u32) -> StringHandle {
        unreachable!("the schema has no string field")
    }

    fn number_field_value(&self, _field_index: u32) -> f64 {
        self.ns as f64
    }
}

/// The profile's waits as interval markers with their stacks on their
/// threads (`stacks`: the Firefox stack of each profile sample; `slot_of_sample`:
/// its thread's slot).
pub(super) fn add_waits(
    fx: &mut FxProfile,
    profile: &Profile,
    slots: &[ThreadSlot],
    slot_of_sample: &[usize],
    stacks: &[Option<StackHandle>],
    time: impl Fn(i64) -> u64,
) {
    let mut marked: Vec<Option<ThreadHandle>> = vec![None; slots.len()];
    for wait in &profile.waits {
        let index = wait.sample as usize;
        let (Some(&slot), Some(&stack)) = (slot_of_sample.get(index), stacks.get(index)) else {
            continue;
        };
        let Some(thread) = slots[slot].handle else {
            continue;
        };
        if marked[slot].is_none() {
            fx.set_thread_show_markers_in_timeline(thread, true);
            marked[slot] = Some(thread);
        }
        let from = time(wait.start_offset_ns);
        let to = from.saturating_add(wait.duration_ns);
        let marker = fx.add_marker(
            thread,
            MarkerTiming::Interval(
                Timestamp::from_nanos_since_reference(from),
                Timestamp::from_nanos_since_reference(to),
            ),
            OffCpuMarker {
                ns: wait.duration_ns,
            },
        );
        fx.set_marker_stack(thread, marker, stack);
    }
}
