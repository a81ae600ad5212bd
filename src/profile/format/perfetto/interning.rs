//! Interning of a trace's callstacks: each function name, mapping path
//! component, build ID, mapping, frame and callstack is written once, in the
//! `InternedData` of the first packet that refers to it, and referred to by
//! its iid (1 and up) afterwards, as Perfetto's own producers do
//! (perfetto.dev, "Interned data"). Every table has its own iid space.

use std::collections::HashMap;

use super::proto::{self, frame::KindField, InternedData, InternedString};
use crate::profile::{FrameKind, Profile};
use crate::unwind::interp::python::MAPPING_NAME as PYTHON_MAPPING;

/// Path of the mapping of frames at an address in no known mapping.
pub const UNKNOWN_MAPPING: &str = "[unknown]";

/// Path of the mapping of `[unwind: ...]` frames (they are no address).
pub const UNWIND_MAPPING: &str = "[unwind]";

/// The iids given so far, and the next of each table.
pub(super) struct Interner<'p> {
    profile: &'p Profile,
    function_names: HashMap<&'p str, u64>,
    path_parts: HashMap<&'p str, u64>,
    build_ids: u64,
    /// iid of each profile mapping, once written.
    mappings: Vec<Option<u64>>,
    /// iids of the mappings [`UNKNOWN_MAPPING`] and [`UNWIND_MAPPING`], once written.
    pseudo_mappings: [Option<u64>; 2],
    next_mapping: u64,
    /// iids of each profile frame's lines, outermost function first, once written.
    frames: Vec<Option<Box<[u64]>>>,
    next_frame: u64,
    /// iid of each distinct stack (profile frame indices, leaf first).
    callstacks: HashMap<&'p [usize], u64>,
}

impl<'p> Interner<'p> {
    pub(super) fn new(profile: &'p Profile) -> Self {
        Interner {
            profile,
            function_names: HashMap::new(),
            path_parts: HashMap::new(),
            build_ids: 0,
            mappings: vec![None; profile.mappings.len()],
            pseudo_mappings: [None; 2],
            next_mapping: 1,
            frames: vec![None; profile.frames.len()],
            next_frame: 1,
            callstacks: HashMap::new(),
        }
    }

    /// The iid of the callstack of profile sample `sample`, adding to `new`
    /// whatever it needs that no earlier packet interned. A stack of
    /// frames that are not all in the profile (a malformed profile) gets
    /// those frames left out.
    pub(super) fn callstack(&mut self, sample: usize, new: &mut InternedData) -> u64 {
        let profile = self.profile;
        let stack: &'p [usize] = &profile.samples[sample].frames;
        if let Some(&iid) = self.callstacks.get(stack) {
            return iid;
        }
        let mut frame_ids = Vec::with_capacity(stack.len());
        for &frame in stack.iter().rev() {
            if let Some(ids) = self.frame(frame, new) {
                frame_ids.extend_from_slice(&ids);
            }
        }
        let iid = self.callstacks.len() as u64 + 1;
        new.callstacks.push(proto::Callstack {
            iid: Some(iid),
            frame_ids,
        });
        self.callstacks.insert(stack, iid);
        iid
    }

    /// The iids of profile frame `index`'s lines (one Perfetto frame per
    /// function, inlined ones after the function they are inlined into,
    /// all at the frame's address), interning them first if need be.
    fn frame(&mut self, index: usize, new: &mut InternedData) -> Option<Box<[u64]>> {
        if let Some(ids) = self.frames.get(index)? {
            return Some(ids.clone());
        }
        let profile = self.profile;
        let frame = &profile.frames[index];
        let mapping = frame.mapping.filter(|&m| m < profile.mappings.len());
        let (mapping_id, rel_pc) = match (frame.kind, mapping) {
            (FrameKind::UnwindMarker, _) => (self.pseudo_mapping(1, new), 0),
            (_, Some(m)) => (
                self.mapping(m, new),
                frame.address.saturating_sub(profile.mappings[m].start),
            ),
            (_, None) => (self.pseudo_mapping(0, new), frame.address),
        };
        let kind = match frame.kind {
            FrameKind::Kernel => Some(proto::frame::Kind::Kernel),
            FrameKind::User
                if mapping.is_some_and(|m| profile.mappings[m].filename == PYTHON_MAPPING) =>
            {
                Some(proto::frame::Kind::Interpreted)
            }
            FrameKind::User => Some(proto::frame::Kind::Native),
            FrameKind::UnwindMarker => None,
        };
        let mut ids = Vec::with_capacity(frame.lines.len());
        for line in frame.lines.iter().rev() {
            let function_name_id = intern(
                &mut self.function_names,
                &line.function,
                &mut new.function_names,
            );
            let iid = self.next_frame;
            self.next_frame += 1;
            new.frames.push(proto::Frame {
                iid: Some(iid),
                function_name_id: Some(function_name_id),
                mapping_id: Some(mapping_id),
                rel_pc: Some(rel_pc),
                kind_field: kind.map(|k| KindField::Kind(k as i32)),
            });
            ids.push(iid);
        }
        let ids: Box<[u64]> = ids.into();
        self.frames[index] = Some(ids.clone());
        Some(ids)
    }

    /// The iid of profile mapping `index`, interning it first if need be.
    fn mapping(&mut self, index: usize, new: &mut InternedData) -> u64 {
        if let Some(iid) = self.mappings[index] {
            return iid;
        }
        let profile = self.profile;
        let m = &profile.mappings[index];
        let build_id = m.build_id.as_deref().filter(|b| !b.is_empty()).map(|b| {
            self.build_ids += 1;
            new.build_ids.push(InternedString {
                iid: Some(self.build_ids),
                str: Some(build_id_bytes(b)),
            });
            self.build_ids
        });
        let path_string_ids = self.path(&m.filename, new);
        let iid = self.next_mapping;
        self.next_mapping += 1;
        new.mappings.push(proto::Mapping {
            iid: Some(iid),
            build_id,
            start: Some(m.start),
            end: Some(m.limit),
            exact_offset: Some(m.file_offset),
            path_string_ids,
            ..Default::default()
        });
        self.mappings[index] = Some(iid);
        iid
    }

    /// The iid of pseudo-mapping `which` (0: [`UNKNOWN_MAPPING`], 1:
    /// [`UNWIND_MAPPING`]): Perfetto's readers want every frame in a mapping.
    fn pseudo_mapping(&mut self, which: usize, new: &mut InternedData) -> u64 {
        if let Some(iid) = self.pseudo_mappings[which] {
            return iid;
        }
        let path = [UNKNOWN_MAPPING, UNWIND_MAPPING][which];
        let path_string_ids = self.path(path, new);
        let iid = self.next_mapping;
        self.next_mapping += 1;
        new.mappings.push(proto::Mapping {
            iid: Some(iid),
            path_string_ids,
            ..Default::default()
        });
        self.pseudo_mappings[which] = Some(iid);
        iid
    }

    /// The iids of `path`'s components (split at `/`, empty ones left
    /// out), which Perfetto's readers join with `/` before each.
    fn path(&mut self, path: &'p str, new: &mut InternedData) -> Vec<u64> {
        path.split('/')
            .filter(|part| !part.is_empty())
            .map(|part| intern(&mut self.path_parts, part, &mut new.mapping_paths))
            .collect()
    }
}

/// The iid of `value` in `table`, appending it to `new` when it is new.
fn intern<'p>(
    table: &mut HashMap<&'p str, u64>,
    value: &'p str,
    new: &mut Vec<InternedString>,
) -> u64 {
    let next = table.len() as u64 + 1;
    *table.entry(value).or_insert_with(|| {
        new.push(InternedString {
            iid: Some(next),
            str: Some(value.as_bytes().to_vec()),
        });
        next
    })
}

/// A GNU build ID as Perfetto stores it: its bytes (the hex digits
/// decoded); a value that is not an even number of hex digits as its text.
fn build_id_bytes(hex: &str) -> Vec<u8> {
    let digits: Option<Vec<u8>> = hex
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            if pair.len() != 2 {
                return None;
            }
            u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()
        })
        .collect();
    digits.unwrap_or_else(|| hex.as_bytes().to_vec())
}

/// Whether `data` interns nothing (a packet then carries no `interned_data`).
pub(super) fn is_empty(data: &InternedData) -> bool {
    data.function_names.is_empty()
        && data.frames.is_empty()
        && data.callstacks.is_empty()
        && data.build_ids.is_empty()
        && data.mapping_paths.is_empty()
        && data.mappings.is_empty()
}

#[cfg(test)]
mod tests {
    use super::build_id_bytes;

    #[test]
    fn build_ids_are_bytes_and_bad_hex_is_kept_as_text() {
        assert_eq!(build_id_bytes("0aff"), vec![0x0a, 0xff]);
        assert_eq!(build_id_bytes("abc"), b"abc".to_vec());
        assert_eq!(build_id_bytes("zz"), b"zz".to_vec());
    }
}
