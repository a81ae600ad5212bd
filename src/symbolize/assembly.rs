//! Assembly of a [`Profile`] from symbolized lines: one profile mapping per
//! distinct (range, object) and one frame per distinct location, shared by
//! every sample that passes through it.

use std::collections::HashMap;
use std::sync::Arc;

use indexmap::IndexSet;
use rustc_hash::FxBuildHasher;

use super::lines::{file_name, unknown_line, SharedLines};
use super::symbol_source::{FrameRef, Resolved};
use super::{kernel, MappingSource};
use crate::process::UserFrame;
use crate::process::{GivenUp, MappingId};
use crate::profile::{Frame, FrameKind, Profile, ProfileMapping};
use crate::sampling::records::UnwindStatus;

/// The index in `profile.frames` of one user frame, the aggregator's
/// distinct frame `index` ([`crate::profile::aggregate::Stack::user_indexed`]):
/// its profile mapping and the lines the symbol sources found
/// (`resolved`); `mapping+0xOFFSET` where none named it. Lines are copied
/// only for a location the profile does not have yet.
pub(super) fn user_frame(
    builder: &mut ProfileAssembly,
    profile: &mut Profile,
    tracker: &dyn MappingSource,
    resolved: &Resolved<'_>,
    (index, frame): (usize, &UserFrame),
) -> usize {
    if let Some(location) = builder.user_location(index) {
        return location;
    }
    if let Some(name) = crate::unwind::interp::frame_name(frame.address) {
        let location = interpreted_frame(builder, profile, frame.address, &name);
        builder.set_user_location(index, location);
        return location;
    }
    // No mapping contains the address, or the mapping was retired before
    // this window was symbolized (counted at hand-over).
    let known = frame
        .mapping
        .and_then(|m| Some((tracker.mapping(m)?, builder.mapping(tracker, m)?)));
    let location = match known {
        None => {
            let unknown = || {
                let name = format!("[unknown]+0x{:x}", frame.address);
                (vec![unknown_line(name)].into(), false)
            };
            let key = (FrameKind::User, None, frame.address);
            builder.frame(profile, key, None, unknown)
        }
        Some((mapping, mapping_index)) => {
            let lines = || {
                let found = resolved.lines(FrameRef::User {
                    address: frame.address,
                    mapping,
                });
                match found {
                    Some((lines, symbolized)) => (lines.clone(), *symbolized),
                    None => {
                        let offset = mapping.file_offset_of(frame.address);
                        let file = file_name(&mapping.name);
                        // Given up by the opener (process/opener/).
                        let name = match mapping.object_given_up {
                            Some(GivenUp::TimedOut) => {
                                format!("[read timed out: {file}]+0x{offset:x}")
                            }
                            Some(GivenUp::TooLarge) => {
                                format!("[too large to copy: {file}]+0x{offset:x}")
                            }
                            None => format!("{file}+0x{offset:x}"),
                        };
                        (vec![unknown_line(name)].into(), false)
                    }
                }
            };
            let key = (FrameKind::User, Some(mapping_index), frame.address);
            if builder.is_shared(mapping_index) {
                builder.frame(profile, key, None, lines)
            } else {
                // The only tracker mapping of its profile mapping: no other
                // aggregator frame has this location.
                push_frame(profile, key, lines)
            }
        }
    };
    builder.set_user_location(index, location);
    location
}

/// The index in `profile.frames` of the interpreted frame at tagged
/// address `address` ([`crate::unwind::interp`]): a user frame in the pseudo
/// mapping its interpreter names (`[python]`), which spans every tagged
/// address, so that formats tell it from native code. Its line has the
/// interpreter's name for the function and no system name.
fn interpreted_frame(
    builder: &mut ProfileAssembly,
    profile: &mut Profile,
    address: u64,
    name: &crate::unwind::interp::FrameName,
) -> usize {
    let mapping = builder.add_mapping(ProfileMapping {
        start: crate::unwind::interp::INTERPRETED_TAG,
        limit: crate::unwind::interp::INTERPRETED_TAG | u64::from(u32::MAX),
        file_offset: 0,
        filename: name.mapping.to_string(),
        build_id: None,
    });
    let key = (FrameKind::User, Some(mapping), address);
    builder.frame(profile, key, None, || {
        // No system name: an interpreted function has no symbol, and a
        // `system_name` equal to the name has pprof readers take it for an
        // already demangled C++ name and cut its `<...>` and `(...)`
        // (`<module>` shown empty: google/pprof's symbolizer,
        // `demangleSingleFunction`); with none, the name is shown as is.
        let line = crate::profile::Line {
            function: name.function.clone(),
            system_name: Arc::from(""),
            file: name.file.clone(),
            line: name.line,
        };
        (vec![line].into(), !name.function.starts_with('['))
    })
}

/// What makes two frames the same location: address, profile mapping
/// (`u32::MAX` for none), kind, and (for unwind markers, which have no
/// address) how the walk ended. 16 bytes.
type FrameKey = (u64, u32, FrameKind, Option<UnwindStatus>);

/// Deduplication state while a profile is assembled.
///
/// Issue 18: under process churn a 10 s window has 60,000-70,000 locations
/// (each process maps its objects at addresses of its own), and a table of
/// every location's key, with a copy of every profile mapping as the key
/// of another, were the largest transient allocations of a window's close.
/// User frames come distinct from the aggregator, so a user location is
/// found by the aggregator frame's index (4 bytes a frame); only frames of
/// a profile mapping that several tracker mappings share (processes that
/// map an object at the same range), kernel frames and unwind markers are
/// deduplicated by key.
#[derive(Default)]
pub(super) struct ProfileAssembly {
    pub(super) kernel_mapping: Option<usize>,
    /// Profile mapping of each tracker mapping met.
    mappings: HashMap<MappingId, usize>,
    /// The profile's mappings, each once; moved into it by [`Self::finish`].
    distinct_mappings: IndexSet<ProfileMapping, FxBuildHasher>,
    /// Tracker mappings met per profile mapping (by index).
    sharers: Vec<u32>,
    frames: HashMap<FrameKey, usize>,
    /// Location of each aggregator user frame (by its index); `u32::MAX`
    /// until made.
    user_locations: Vec<u32>,
}

/// Add the location `(kind, profile mapping, address)` with the lines
/// `lines` gives; returns its index in `profile.frames`.
fn push_frame(
    profile: &mut Profile,
    (kind, mapping, address): (FrameKind, Option<usize>, u64),
    lines: impl FnOnce() -> SharedLines,
) -> usize {
    let (lines, symbolized) = lines();
    profile.frames.push(Frame {
        kind,
        address,
        mapping,
        lines,
        symbolized,
    });
    profile.frames.len() - 1
}

impl ProfileAssembly {
    /// An assembly for an aggregator of `user_frames` distinct user frames.
    pub(super) fn new(user_frames: usize) -> Self {
        ProfileAssembly {
            user_locations: vec![u32::MAX; user_frames],
            ..Default::default()
        }
    }

    fn user_location(&self, index: usize) -> Option<usize> {
        let location = *self.user_locations.get(index)?;
        (location != u32::MAX).then_some(location as usize)
    }

    fn set_user_location(&mut self, index: usize, location: usize) {
        if let (Some(slot), Ok(location)) =
            (self.user_locations.get_mut(index), u32::try_from(location))
        {
            *slot = location;
        }
    }

    /// Whether more than one tracker mapping has profile mapping `index`
    /// (as far as met so far: [`crate::symbolize::Symbolizer::build_profile`]
    /// meets every stack's mappings before it makes any frame).
    fn is_shared(&self, index: usize) -> bool {
        self.sharers.get(index).is_some_and(|&n| n > 1)
    }

    /// Add profile mapping `mapping` (if the profile does not have it yet)
    /// and return its index.
    pub(super) fn add_mapping(&mut self, mapping: ProfileMapping) -> usize {
        let (index, _) = self.distinct_mappings.insert_full(mapping);
        if index == self.sharers.len() {
            self.sharers.push(0);
        }
        index
    }

    /// The profile mapping for tracker mapping `id` (`None` if `tracker`
    /// does not know it). Processes that map the same object at the same
    /// range share one profile mapping.
    pub(super) fn mapping(&mut self, tracker: &dyn MappingSource, id: MappingId) -> Option<usize> {
        if let Some(&index) = self.mappings.get(&id) {
            return Some(index);
        }
        let m = tracker.mapping(id)?;
        let mapping = ProfileMapping {
            start: m.start,
            limit: m.end,
            file_offset: m.file_offset,
            filename: m.name.clone(),
            build_id: m
                .object
                .and_then(|o| tracker.object_build_id(o).map(kernel::hex)),
        };
        let index = self.add_mapping(mapping);
        self.sharers[index] += 1;
        self.mappings.insert(id, index);
        Some(index)
    }

    /// The index in `profile.frames` of the location `(kind, profile
    /// mapping, address)` (for an unwind marker, which has no address, also
    /// how its walk ended, `marker`), added with the lines `lines` gives (and whether a
    /// source named it) the first time it is met.
    pub(super) fn frame(
        &mut self,
        profile: &mut Profile,
        location: (FrameKind, Option<usize>, u64),
        marker: Option<UnwindStatus>,
        lines: impl FnOnce() -> SharedLines,
    ) -> usize {
        let (kind, mapping, address) = location;
        let mapping_key = mapping.map_or(u32::MAX, |m| u32::try_from(m).unwrap_or(u32::MAX - 1));
        *self
            .frames
            .entry((address, mapping_key, kind, marker))
            .or_insert_with(|| push_frame(profile, location, lines))
    }

    /// Move the profile mappings made into `profile` (the indices frames
    /// hold are theirs).
    pub(super) fn finish(self, profile: &mut Profile) {
        profile.mappings = self.distinct_mappings.into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::process::{Mapping, ObjectId};
    use crate::profile::aggregate::Aggregator;
    use crate::profile::Window;
    use crate::sampling::records::RawSample;
    use crate::symbolize::Symbolizer;

    /// Mappings by id, without objects (their frames stay `name+0xOFFSET`).
    struct Maps(HashMap<MappingId, Mapping>);

    impl MappingSource for Maps {
        fn mapping(&self, id: MappingId) -> Option<&Mapping> {
            self.0.get(&id)
        }
        fn object_path(&self, _: ObjectId) -> Option<&str> {
            None
        }
        fn object_open_path(&self, _: ObjectId) -> Option<&Path> {
            None
        }
        fn object_build_id(&self, _: ObjectId) -> Option<&[u8]> {
            None
        }
        fn perf_map(&self, _: u32) -> Option<&crate::process::jit::JitFile> {
            None
        }
        fn jitdump(&self, _: u32) -> Option<&crate::process::jit::JitFile> {
            None
        }
        fn container_id(&self, _: u32) -> Option<&std::sync::Arc<str>> {
            None
        }
    }

    #[test]
    fn a_location_is_shared_by_processes_mapping_an_object_at_the_same_range() {
        let mapping = |pid, start| Mapping {
            pid,
            start,
            end: start + 0x1000,
            file_offset: 0,
            name: "/x/libx.so".to_string(),
            object: None,
            object_given_up: None,
        };
        let maps = Maps(HashMap::from([
            (MappingId(1), mapping(10, 0x1000)),
            (MappingId(2), mapping(11, 0x1000)),
            (MappingId(3), mapping(12, 0x5000)),
        ]));
        let mut aggregator = Aggregator::new();
        let frame = |id, address| UserFrame {
            mapping: Some(MappingId(id)),
            address,
        };
        let stacks = [
            (10, 10, frame(1, 0x1010)),
            (11, 11, frame(2, 0x1010)),
            (12, 12, frame(3, 0x5010)),
            (10, 2, frame(1, 0x1010)),
        ];
        for (pid, tid, user) in stacks {
            let mut sample = RawSample::for_test(pid, 0, vec![user.address]);
            sample.tid = tid;
            aggregator.add_resolved(&sample, &[user]);
        }
        let window = Window {
            start_unix_ns: 0,
            duration_ns: 1_000_000_000,
            sample_freq_hz: 99,
            off_cpu: false,
        };
        let profile =
            Symbolizer::one_shot(&Default::default()).build_profile(&aggregator, &maps, window);
        let user_location = |i: usize| *profile.samples[i].frames.last().unwrap();
        let (a, b, c, d) = (
            user_location(0),
            user_location(1),
            user_location(2),
            user_location(3),
        );
        assert_eq!(
            (a, b, d),
            (a, a, a),
            "one range of the object: one location"
        );
        assert_ne!(a, c, "another range: a location of its own");
        let mappings: Vec<(u64, &str)> = profile
            .mappings
            .iter()
            .map(|m| (m.start, m.filename.as_str()))
            .collect();
        assert_eq!(
            mappings,
            vec![
                (0x1000, "/x/libx.so"),
                (0x5000, "/x/libx.so"),
                (0xffff_ffff_8100_0010, crate::profile::KERNEL_MAPPING_NAME)
            ]
        );
        for (location, mapping) in [(a, 0), (c, 1)] {
            let frame = &profile.frames[location];
            assert_eq!(frame.mapping, Some(mapping));
            assert_eq!(&*frame.lines[0].function, "libx.so+0x10");
        }
        let user = profile.frames.iter().filter(|f| f.kind == FrameKind::User);
        assert_eq!(user.count(), 2);
    }
}
