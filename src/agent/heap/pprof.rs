//! The heap profile's pprof form, with mappings pprof readers can trust.
//!
//! `jemalloc_pprof` symbolizes the heap profile in this process and writes
//! each location's address relative to its object (the runtime address less
//! the object's load bias: the ELF virtual address). It writes one pprof
//! Mapping per loaded segment of each object, but every one of them over the
//! whole address space (start 0, limit 2^64 - 1, file offset 0), and sets
//! `has_functions` only on the mapping a function was first seen in.
//! `go tool pprof` merges mappings by (size, file offset, build ID): the
//! segments of one object then collapse into its first, which has no
//! `has_functions`, so pprof symbolizes their locations again from the
//! binary on disk, with a base off by the segment's virtual address less its
//! file offset (0x1000 for lightswitch's text), and lightswitch's frames lose
//! their names (`[lightswitch]`) or take wrong ones.
//!
//! [`repair`] gives each mapping its segment's range as loaded at address 0
//! (`p_vaddr` up to `p_vaddr + p_memsz`, file offset `p_offset`), the space
//! the locations' addresses are in, and sets each mapping's `has_*` flags
//! from its own locations, and names the allocator's frames in
//! `drop_frames` so that readers charge the bytes to the function that
//! allocated.

use std::collections::HashMap;
use std::io::{Read, Write};

use anyhow::{ensure, Context, Result};
use flate2::{read::GzDecoder, write::GzEncoder};
use jemalloc_pprof::Mapping;
use prost::Message;

use crate::profile::format::pprof::proto;

/// The profile's `drop_frames` (a regular expression pprof readers match
/// against whole function names, dropping the first match from the root
/// and every frame it called): the allocator's own frames, jemalloc's
/// (`_rjem_*`, `prof_backtrace_impl`, which take the sample; `do_rallocx`,
/// where `rallocx` is inlined) and Rust's
/// global-allocator shims. Without it every sample's flat bytes went to
/// `prof_backtrace_impl` (`go tool pprof -top`: 100%), where Go's own heap
/// profiles name the function that allocated.
const ALLOCATOR_FRAMES: &str =
    "_rjem_.*|prof_backtrace_impl|do_rallocx|__rust_(alloc|alloc_zeroed|realloc|dealloc)|__rg_.*|__rdl_.*";

/// `gzip`, the gzip'd pprof profile `jemalloc_pprof` encoded from a profile
/// whose mappings are `segments` (`StackProfile::mappings`: one per loaded
/// segment, in the order it wrote them), with each mapping's range, file
/// offset and `has_*` flags set as the module documentation says; gzip'd.
pub fn repair(gzip: &[u8], segments: &[Mapping]) -> Result<Vec<u8>> {
    let mut raw = Vec::new();
    GzDecoder::new(gzip)
        .read_to_end(&mut raw)
        .context("gunzipping jemalloc_pprof's profile")?;
    let mut profile =
        proto::Profile::decode(raw.as_slice()).context("decoding jemalloc_pprof's profile")?;
    ensure!(
        profile.mapping.len() == segments.len(),
        "jemalloc_pprof wrote {} mappings for {} loaded segments",
        profile.mapping.len(),
        segments.len()
    );
    for (mapping, segment) in profile.mapping.iter_mut().zip(segments) {
        let size = segment.memory_end.saturating_sub(segment.memory_start) as u64;
        mapping.memory_start = segment.memory_offset as u64;
        mapping.memory_limit = mapping.memory_start + size;
        mapping.file_offset = segment.file_offset;
    }
    set_flags(&mut profile);
    profile.drop_frames = profile.string_table.len() as i64;
    profile.string_table.push(ALLOCATOR_FRAMES.to_string());
    let mut out = GzEncoder::new(Vec::new(), flate2::Compression::default());
    out.write_all(&profile.encode_to_vec())?;
    Ok(out.finish()?)
}

/// Each mapping's `has_functions`, `has_filenames`, `has_line_numbers` and
/// `has_inline_frames` from the locations in it: set when any of them names
/// a function, a source file, a line (inlined frames are resolved from the
/// DWARF the file names come from, as in `format::pprof`).
fn set_flags(profile: &mut proto::Profile) {
    let functions: HashMap<u64, &proto::Function> =
        profile.function.iter().map(|f| (f.id, f)).collect();
    let index: HashMap<u64, usize> = profile
        .mapping
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id, i))
        .collect();
    let mut flags = vec![(false, false, false); profile.mapping.len()];
    for location in &profile.location {
        let Some(&m) = index.get(&location.mapping_id) else {
            continue;
        };
        for line in &location.line {
            let Some(function) = functions.get(&line.function_id) else {
                continue;
            };
            flags[m].0 |= function.name != 0;
            flags[m].1 |= function.filename != 0;
            flags[m].2 |= line.line > 0;
        }
    }
    for (mapping, (named, files, lines)) in profile.mapping.iter_mut().zip(flags) {
        mapping.has_functions = named;
        mapping.has_filenames = files;
        mapping.has_line_numbers = lines;
        mapping.has_inline_frames = files;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn segment(start: usize, vaddr: usize, size: usize, offset: u64) -> Mapping {
        Mapping {
            memory_start: start,
            memory_end: start + size,
            memory_offset: vaddr,
            file_offset: offset,
            pathname: PathBuf::from("/bin/app"),
            build_id: None,
        }
    }

    fn gzip(profile: &proto::Profile) -> Vec<u8> {
        let mut out = GzEncoder::new(Vec::new(), flate2::Compression::default());
        out.write_all(&profile.encode_to_vec()).unwrap();
        out.finish().unwrap()
    }

    fn gunzip_decode(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        GzDecoder::new(bytes).read_to_end(&mut raw).unwrap();
        proto::Profile::decode(raw.as_slice()).unwrap()
    }

    /// As jemalloc_pprof writes them: both segments of one object over the
    /// whole address space, `has_functions` on the first only though the
    /// named location is in the second.
    #[test]
    fn mappings_get_their_segments_and_their_own_flags() {
        let whole = |id| proto::Mapping {
            id,
            memory_limit: u64::MAX,
            filename: 1,
            has_functions: id == 1,
            ..Default::default()
        };
        let profile = proto::Profile {
            mapping: vec![whole(1), whole(2)],
            location: vec![proto::Location {
                id: 1,
                mapping_id: 2,
                address: 0x2345,
                line: vec![
                    proto::Line {
                        function_id: 1,
                        line: 7,
                        column: 0,
                    },
                    proto::Line {
                        function_id: 1,
                        line: 9,
                        column: 0,
                    },
                ],
                is_folded: false,
            }],
            function: vec![proto::Function {
                id: 1,
                name: 2,
                system_name: 2,
                filename: 3,
                start_line: 0,
            }],
            string_table: vec!["".into(), "/bin/app".into(), "main".into(), "app.rs".into()],
            ..Default::default()
        };
        let segments = [
            segment(0x5555_0000_0000, 0, 0x1000, 0),
            segment(0x5555_0000_2000, 0x2000, 0x800, 0x1000),
        ];
        let p = gunzip_decode(&repair(&gzip(&profile), &segments).unwrap());
        let ranges: Vec<_> = p
            .mapping
            .iter()
            .map(|m| (m.memory_start, m.memory_limit, m.file_offset))
            .collect();
        assert_eq!(ranges, [(0, 0x1000, 0), (0x2000, 0x2800, 0x1000)]);
        let flags = |m: &proto::Mapping| {
            (
                m.has_functions,
                m.has_filenames,
                m.has_line_numbers,
                m.has_inline_frames,
            )
        };
        assert_eq!(flags(&p.mapping[0]), (false, false, false, false));
        assert_eq!(flags(&p.mapping[1]), (true, true, true, true));
        assert_eq!(p.location, profile.location);
        assert_eq!(p.function, profile.function);
        assert!(repair(&gzip(&profile), &segments[..1]).is_err());
    }
}
