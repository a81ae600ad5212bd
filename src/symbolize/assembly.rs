//! Assembly of a [`Profile`] from symbolized lines: one profile mapping per
//! distinct (range, object) and one frame per distinct location, shared by
//! every sample that passes through it.

use std::collections::HashMap;
use std::sync::Arc;

use super::lines::{file_name, unknown_line};
use super::sources::{FrameRef, Resolved};
use super::{kernel, MappingSource};
use crate::process::MappingId;
use crate::profile::aggregate::UserFrame;
use crate::profile::{Frame, FrameKind, Line, Profile, ProfileMapping};

/// The profile mapping and lines of one user frame, from what the symbol
/// sources found (`resolved`); `mapping+0xOFFSET` where none named it.
pub(super) fn user_frame_lines(
    builder: &mut ProfileAssembly,
    profile: &mut Profile,
    tracker: &dyn MappingSource,
    resolved: &Resolved<'_>,
    frame: &UserFrame,
) -> (Option<usize>, Vec<Line>, bool) {
    // No mapping contains the address, or the mapping was retired before
    // this window was symbolized (counted at hand-over).
    let (Some(m), Some(mapping)) = (
        frame.mapping,
        frame.mapping.and_then(|m| tracker.mapping(m)),
    ) else {
        return (
            None,
            vec![unknown_line(format!("[unknown]+0x{:x}", frame.address))],
            false,
        );
    };
    let Some(index) = builder.mapping(profile, tracker, m) else {
        return (
            None,
            vec![unknown_line(format!("[unknown]+0x{:x}", frame.address))],
            false,
        );
    };
    let offset = mapping.file_offset_of(frame.address);
    let lines = resolved.lines(FrameRef::User {
        address: frame.address,
        mapping,
    });
    match lines {
        Some((lines, symbolized)) => (Some(index), lines.clone(), *symbolized),
        None => (
            Some(index),
            vec![unknown_line(format!(
                "{}+0x{offset:x}",
                file_name(&mapping.name)
            ))],
            false,
        ),
    }
}

/// What makes two frames the same location: kind, profile mapping, address,
/// and (for unwind markers, which have no address) the marker's name.
type FrameKey = (FrameKind, Option<usize>, u64, Option<Arc<str>>);

/// Deduplication state while a profile is assembled.
#[derive(Default)]
pub(super) struct ProfileAssembly {
    pub(super) kernel_mapping: Option<usize>,
    mappings: HashMap<MappingId, usize>,
    distinct_mappings: HashMap<ProfileMapping, usize>,
    frames: HashMap<FrameKey, usize>,
}

impl ProfileAssembly {
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

    pub(super) fn frame(
        &mut self,
        profile: &mut Profile,
        kind: FrameKind,
        address: u64,
        mapping: Option<usize>,
        lines: Vec<Line>,
        symbolized: bool,
    ) -> usize {
        // Markers have no address; they are told apart by their name.
        let marker = (kind == FrameKind::UnwindMarker).then(|| lines[0].function.clone());
        *self
            .frames
            .entry((kind, mapping, address, marker))
            .or_insert_with(|| {
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
