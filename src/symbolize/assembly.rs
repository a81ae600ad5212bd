//! Assembly of a [`Profile`] from symbolized lines: one profile mapping per
//! distinct (range, object) and one frame per distinct location, shared by
//! every sample that passes through it.

use std::collections::HashMap;

use super::lines::{file_name, unknown_line, SharedLines};
use super::sources::{FrameRef, Resolved};
use super::{kernel, MappingSource};
use crate::process::MappingId;
use crate::profile::aggregate::UserFrame;
use crate::profile::{Frame, FrameKind, Profile, ProfileMapping};
use crate::sample::UnwindStatus;

/// The index in `profile.frames` of one user frame: its profile mapping
/// and the lines the symbol sources found (`resolved`); `mapping+0xOFFSET`
/// where none named it. Lines are copied only for a location the profile
/// does not have yet.
pub(super) fn user_frame(
    builder: &mut ProfileAssembly,
    profile: &mut Profile,
    tracker: &dyn MappingSource,
    resolved: &Resolved<'_>,
    frame: &UserFrame,
) -> usize {
    // No mapping contains the address, or the mapping was retired before
    // this window was symbolized (counted at hand-over).
    let known = frame
        .mapping
        .and_then(|m| Some((tracker.mapping(m)?, builder.mapping(profile, tracker, m)?)));
    let Some((mapping, index)) = known else {
        let unknown = || {
            let name = format!("[unknown]+0x{:x}", frame.address);
            (vec![unknown_line(name)].into(), false)
        };
        return builder.frame(
            profile,
            (FrameKind::User, None, frame.address),
            None,
            unknown,
        );
    };
    let lines = || {
        let found = resolved.lines(FrameRef::User {
            address: frame.address,
            mapping,
        });
        match found {
            Some((lines, symbolized)) => (lines.clone(), *symbolized),
            None => {
                let offset = mapping.file_offset_of(frame.address);
                let name = format!("{}+0x{offset:x}", file_name(&mapping.name));
                (vec![unknown_line(name)].into(), false)
            }
        }
    };
    let key = (FrameKind::User, Some(index), frame.address);
    builder.frame(profile, key, None, lines)
}

/// What makes two frames the same location: address, profile mapping
/// (`u32::MAX` for none), kind, and (for unwind markers, which have no
/// address) how the walk ended. 16 bytes: a 10 s window under process churn
/// has 60,000-70,000 locations (each process maps its objects at addresses
/// of its own), and this map's table was the largest of the transient
/// allocations while a profile was assembled (issue 18).
type FrameKey = (u64, u32, FrameKind, Option<UnwindStatus>);

/// Deduplication state while a profile is assembled.
#[derive(Default)]
pub(super) struct ProfileAssembly {
    pub(super) kernel_mapping: Option<usize>,
    mappings: HashMap<MappingId, usize>,
    distinct_mappings: HashMap<ProfileMapping, usize>,
    frames: HashMap<FrameKey, usize>,
}

impl ProfileAssembly {
    /// Tables sized for `locations` distinct frames (the previous window's
    /// count): under process churn a 10 s window has 60,000-70,000, and
    /// tables grown by doubling to that size held the old and the new
    /// table at once, for a transient larger than what they end up holding
    /// (issue 18). The profile's own `frames` is sized by the caller.
    pub(super) fn with_capacity(locations: usize) -> Self {
        ProfileAssembly {
            frames: HashMap::with_capacity(locations),
            ..Default::default()
        }
    }

    /// The profile mapping for tracker mapping `id` (`None` if `tracker`
    /// does not know it). Processes that map the same object at the same
    /// range share one profile mapping.
    pub(super) fn mapping(
        &mut self,
        profile: &mut Profile,
        tracker: &dyn MappingSource,
        id: MappingId,
    ) -> Option<usize> {
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
        let index = *self
            .distinct_mappings
            .entry(mapping.clone())
            .or_insert_with(|| {
                profile.mappings.push(mapping);
                profile.mappings.len() - 1
            });
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
        (kind, mapping, address): (FrameKind, Option<usize>, u64),
        marker: Option<UnwindStatus>,
        lines: impl FnOnce() -> SharedLines,
    ) -> usize {
        let mapping_key = mapping.map_or(u32::MAX, |m| u32::try_from(m).unwrap_or(u32::MAX - 1));
        *self
            .frames
            .entry((address, mapping_key, kind, marker))
            .or_insert_with(|| {
                let (lines, symbolized) = lines();
                profile.frames.push(Frame {
                    kind,
                    address,
                    mapping,
                    lines,
                    symbolized,
                });
                profile.frames.len() - 1
            })
    }
}
