//! Reading received pprof bodies and merging stored profiles.
//!
//! Bodies are raw or gzip'd pprof ([`decode_body`]); a body is accepted only
//! if it decodes and is internally consistent ([`validate`]: string table
//! starting with "", sample types present, every index and id in range),
//! because protobuf decoding alone accepts many byte strings that are not
//! profiles.
//!
//! Merging converts each pprof message into the crate's format-neutral
//! [`Profile`] ([`profile_from_pprof`], the inverse of
//! [`crate::profile::format::pprof::to_proto`] for lightswitch's own profiles) and
//! merges those ([`merge`]): mappings, frames and stacks are deduplicated by
//! value, so string, function, location and mapping ids never need
//! remapping by hand, and the merged result is encoded by the same encoders
//! as everything else (pprof, flame graph, folded), so all three agree.
//! Counts come from the `samples/count` value (else the first value); the
//! merged profile's sampling frequency is the first input's (inputs from one
//! profiler share it; a mismatch is reported in [`Merged::mixed_frequencies`]).

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use flate2::read::GzDecoder;
use prost::Message;

use crate::profile::format::pprof::{self, proto};
use crate::profile::KERNEL_MAPPING_NAME;
use crate::profile::{
    stack_unwind_status, Frame, FrameKind, Line, Profile, ProfileMapping, Sample,
};
use crate::sampling::records::UnwindStatus;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Not gzip, not pprof, or an inconsistent pprof: HTTP 400.
    Malformed(String),
    /// Decompresses to more than the limit: HTTP 413.
    TooLarge(String),
}

/// Whether `bytes` start with the gzip magic number.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// Decode a raw or gzip'd pprof body, refusing one that decompresses to
/// more than `max_raw_bytes`. Returns the profile and its raw (uncompressed) bytes.
pub fn decode_body(
    body: &[u8],
    max_raw_bytes: usize,
) -> Result<(proto::Profile, Vec<u8>), BodyError> {
    let raw = inflate(body, max_raw_bytes)?;
    let profile = proto::Profile::decode(raw.as_slice()).map_err(|e| {
        BodyError::Malformed(format!("the body does not decode as a pprof profile: {e}"))
    })?;
    validate(&profile)
        .map_err(|e| BodyError::Malformed(format!("not a valid pprof profile: {e}")))?;
    Ok((profile, raw))
}

/// A body's bytes, gunzip'd when it starts with the gzip magic number,
/// refused when empty or when it decompresses to more than `max_raw_bytes`
/// (decompression stops there).
pub fn inflate(body: &[u8], max_raw_bytes: usize) -> Result<Vec<u8>, BodyError> {
    let raw = if is_gzip(body) {
        // Sized once from the gzip trailer's ISIZE (the decoded size mod
        // 2^32, a hint only), capped by the limit: no reallocation copies
        // for an honest body, and a bomb's buffer stops at the limit.
        let hint = body
            .last_chunk::<4>()
            .map_or(0, |isize| u32::from_le_bytes(*isize) as usize);
        let mut raw = Vec::with_capacity(hint.min(max_raw_bytes.saturating_add(1)));
        let limit = max_raw_bytes as u64 + 1;
        GzDecoder::new(body)
            .take(limit)
            .read_to_end(&mut raw)
            .map_err(|e| BodyError::Malformed(format!("the body is not valid gzip: {e}")))?;
        if raw.len() > max_raw_bytes {
            return Err(BodyError::TooLarge(format!(
                "the body decompresses to more than {max_raw_bytes} bytes"
            )));
        }
        raw
    } else {
        body.to_vec()
    };
    if raw.is_empty() {
        return Err(BodyError::Malformed("the body is empty".into()));
    }
    Ok(raw)
}

/// Largest sum of the sample counts (the `samples/count` values, else the
/// first sample type's; absolute values) a profile may have: 2^40, a
/// trillion samples, 30 years of one CPU at 1 kHz. Merging up to 2^23 such
/// profiles cannot overflow a `u64` count. Other sample types (such as
/// `cpu/nanoseconds`) are not limited.
pub const MAX_VALUE_TOTAL: u64 = 1 << 40;

/// Check that `p` is a consistent pprof profile (what `go tool pprof`
/// checks when it reads one) whose counts add up to at most
/// [`MAX_VALUE_TOTAL`]. Errors say what is wrong.
pub fn validate(p: &proto::Profile) -> Result<(), String> {
    if p.string_table.first().map(String::as_str) != Some("") {
        return Err("string_table must start with the empty string".into());
    }
    if p.sample_type.is_empty() {
        return Err("no sample_type".into());
    }
    let strings = p.string_table.len() as i64;
    let string = |i: i64, what: &str| {
        if (0..strings).contains(&i) {
            Ok(())
        } else {
            Err(format!("{what}: string index {i} out of range"))
        }
    };
    for t in p.sample_type.iter().chain(p.period_type.iter()) {
        string(t.r#type, "value type")?;
        string(t.unit, "value type")?;
    }
    let mut mapping_ids = std::collections::HashSet::new();
    for m in &p.mapping {
        if m.id == 0 || !mapping_ids.insert(m.id) {
            return Err(format!("mapping id {} is zero or repeated", m.id));
        }
        string(m.filename, "mapping")?;
        string(m.build_id, "mapping")?;
    }
    let mut function_ids = std::collections::HashSet::new();
    for f in &p.function {
        if f.id == 0 || !function_ids.insert(f.id) {
            return Err(format!("function id {} is zero or repeated", f.id));
        }
        string(f.name, "function")?;
        string(f.system_name, "function")?;
        string(f.filename, "function")?;
    }
    let mut location_ids = std::collections::HashSet::new();
    for l in &p.location {
        if l.id == 0 || !location_ids.insert(l.id) {
            return Err(format!("location id {} is zero or repeated", l.id));
        }
        if l.mapping_id != 0 && !mapping_ids.contains(&l.mapping_id) {
            return Err(format!(
                "location {} names unknown mapping {}",
                l.id, l.mapping_id
            ));
        }
        if let Some(line) = l
            .line
            .iter()
            .find(|line| !function_ids.contains(&line.function_id))
        {
            return Err(format!(
                "location {} names unknown function {}",
                l.id, line.function_id
            ));
        }
    }
    // The count column (what merges add up): `samples/count`, else the first.
    let name = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let count_index = p
        .sample_type
        .iter()
        .position(|t| name(t.r#type) == "samples" && name(t.unit) == "count")
        .unwrap_or(0);
    let mut total = 0u64;
    for s in &p.sample {
        if s.value.len() != p.sample_type.len() {
            return Err(format!(
                "a sample has {} values for {} sample types",
                s.value.len(),
                p.sample_type.len()
            ));
        }
        if let Some(id) = s.location_id.iter().find(|id| !location_ids.contains(id)) {
            return Err(format!("a sample names unknown location {id}"));
        }
        // Counts and times are never negative in a profile of a run (a
        // `pprof -diff_base` difference has them; it cannot be merged).
        if let Some(v) = s.value.iter().find(|&&v| v < 0) {
            return Err(format!("a sample has the negative value {v}"));
        }
        total = total.saturating_add(s.value.get(count_index).map_or(0, |&v| v as u64));
        if total > MAX_VALUE_TOTAL {
            return Err(format!(
                "sample counts add up to more than {MAX_VALUE_TOTAL} (2^40)"
            ));
        }
        for label in &s.label {
            string(label.key, "label")?;
            string(label.str, "label")?;
            string(label.num_unit, "label")?;
        }
    }
    string(p.default_sample_type, "default_sample_type")?;
    Ok(())
}

/// Lowest kernel address on x86-64 and arm64 (the upper half).
const KERNEL_SPACE_START: u64 = 0xffff_8000_0000_0000;

/// Convert a (validated) pprof profile into the crate's model. Kernel
/// frames are those in the `[kernel.kallsyms]` mapping; unwind markers are
/// address-0 locations without mapping named `[unwind: ...]`; labels `pid`,
/// `tid`, `comm`, `thread_name` give a sample's process and thread; the
/// comments `subject: ...` and `host: ...` give what the profile shows and
/// where.
pub fn profile_from_pprof(p: &proto::Profile) -> Profile {
    let mut names = PprofNames::new(p);
    let count_index = p
        .sample_type
        .iter()
        .position(|t| names.str(t.r#type) == "samples" && names.str(t.unit) == "count")
        .unwrap_or(0);
    // A lightswitch profile with off-CPU time (`--off-cpu`).
    let off_cpu_index = p.sample_type.iter().position(|t| {
        names.str(t.r#type) == pprof::OFF_CPU_TYPE && names.str(t.unit) == "nanoseconds"
    });
    let period_ns = p
        .period_type
        .as_ref()
        .filter(|t| names.str(t.unit) == "nanoseconds")
        .map_or(0, |_| p.period.max(0) as u64);
    let sample_freq_hz = (1_000_000_000 + period_ns / 2)
        .checked_div(period_ns)
        .unwrap_or(1);
    let comment = |prefix: &str| {
        p.comment
            .iter()
            .find_map(|&i| names.str(i).strip_prefix(prefix).map(Arc::from))
    };
    let mut profile = Profile {
        start_unix_ns: p.time_nanos.max(0) as u64,
        duration_ns: p.duration_nanos.max(0) as u64,
        sample_freq_hz: sample_freq_hz.max(1),
        subject: comment(pprof::SUBJECT_COMMENT),
        host: comment(pprof::HOST_COMMENT),
        off_cpu: off_cpu_index.is_some(),
        ..Default::default()
    };
    let mut mapping_index = HashMap::new();
    for m in &p.mapping {
        mapping_index.insert(m.id, profile.mappings.len());
        let build_id = names.str(m.build_id);
        profile.mappings.push(ProfileMapping {
            start: m.memory_start,
            limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: names.str(m.filename).to_string(),
            build_id: (!build_id.is_empty()).then(|| build_id.to_string()),
        });
    }
    let mut location_index = HashMap::new();
    for l in &p.location {
        let mapping = mapping_index.get(&l.mapping_id).copied();
        location_index.insert(l.id, profile.frames.len());
        let frame = frame_of_location(l, mapping, &profile.mappings, &mut names);
        profile.frames.push(frame);
    }
    let unknown: Arc<str> = Arc::from("[unknown]");
    for sample in &p.sample {
        let count = sample.value.get(count_index).copied().unwrap_or(0);
        let off_cpu_ns = off_cpu_index
            .and_then(|i| sample.value.get(i).copied())
            .unwrap_or(0);
        if count <= 0 && off_cpu_ns <= 0 {
            continue;
        }
        let frames: Vec<usize> = sample
            .location_id
            .iter()
            .filter_map(|id| location_index.get(id).copied())
            .collect();
        let status = stack_unwind_status(&frames, &profile.frames);
        let mut sample = sample_of(
            &sample.label,
            frames,
            status,
            count.max(0) as u64,
            &unknown,
            &mut names,
        );
        sample.off_cpu_ns = off_cpu_ns.max(0) as u64;
        profile.samples.push(sample);
    }
    profile
}

/// The strings and functions of one pprof message, and the names taken
/// from it so far (each string shared by every frame and sample naming it).
struct PprofNames<'p> {
    p: &'p proto::Profile,
    functions: HashMap<u64, &'p proto::Function>,
    names: HashMap<i64, Arc<str>>,
}

impl<'p> PprofNames<'p> {
    fn new(p: &'p proto::Profile) -> Self {
        PprofNames {
            p,
            functions: p.function.iter().map(|f| (f.id, f)).collect(),
            names: HashMap::new(),
        }
    }

    /// String `i` of the string table ("" when out of range).
    fn str(&self, i: i64) -> &'p str {
        self.p
            .string_table
            .get(i as usize)
            .map_or("", String::as_str)
    }

    /// String `i`, shared.
    fn name(&mut self, i: i64) -> Arc<str> {
        let s = self.str(i);
        self.names.entry(i).or_insert_with(|| Arc::from(s)).clone()
    }
}

/// The frame of pprof location `l`, in mapping `mapping` (an index into
/// `mappings`, the profile's mappings so far). A location without lines is
/// named `FILE+0xADDRESS` (`[unknown]+0xADDRESS` without a mapping).
fn frame_of_location(
    l: &proto::Location,
    mapping: Option<usize>,
    mappings: &[ProfileMapping],
    names: &mut PprofNames<'_>,
) -> Frame {
    let mut lines: Vec<Line> = Vec::with_capacity(l.line.len());
    for line in &l.line {
        let Some(f) = names.functions.get(&line.function_id).copied() else {
            continue;
        };
        lines.push(Line {
            function: names.name(f.name),
            system_name: names.name(f.system_name),
            file: (f.filename != 0).then(|| names.name(f.filename)),
            line: u32::try_from(line.line).ok().filter(|&n| n > 0),
        });
    }
    let symbolized = !lines.is_empty();
    let kernel = match mapping {
        Some(m) => mappings[m].filename == KERNEL_MAPPING_NAME,
        // No mapping: the upper half of the address space is the kernel's.
        None => l.address >= KERNEL_SPACE_START,
    };
    let marker = mapping.is_none()
        && l.address == 0
        && lines.len() == 1
        && lines[0].function.starts_with("[unwind: ");
    if lines.is_empty() {
        let label = match mapping {
            Some(m) => {
                let file = &mappings[m].filename;
                let short = file.rsplit('/').next().unwrap_or(file);
                format!("{short}+0x{:x}", l.address)
            }
            None => format!("[unknown]+0x{:x}", l.address),
        };
        let label: Arc<str> = Arc::from(label);
        lines.push(Line {
            function: label.clone(),
            system_name: label,
            file: None,
            line: None,
        });
    }
    Frame {
        kind: if marker {
            FrameKind::UnwindMarker
        } else if kernel {
            FrameKind::Kernel
        } else {
            FrameKind::User
        },
        address: l.address,
        mapping,
        lines: lines.into(),
        symbolized: symbolized && !marker,
    }
}

/// `count` samples of stack `frames` that ended `status`, with their
/// process and thread from the labels `pid`, `tid`, `comm` and
/// `thread_name` (`unknown` without a `comm`; the thread's name is the
/// process's without a `thread_name`).
fn sample_of(
    labels: &[proto::Label],
    frames: Vec<usize>,
    status: UnwindStatus,
    count: u64,
    unknown: &Arc<str>,
    names: &mut PprofNames<'_>,
) -> Sample {
    let mut pid = 0;
    let mut tid = 0;
    let mut comm = unknown.clone();
    let mut thread = None;
    for label in labels {
        match names.str(label.key) {
            "pid" => pid = label.num as u32,
            "tid" => tid = label.num as u32,
            "comm" => comm = names.name(label.str),
            "thread_name" => thread = Some(names.name(label.str)),
            _ => {}
        }
    }
    Sample {
        pid,
        tid,
        thread_comm: thread.unwrap_or_else(|| comm.clone()),
        process_comm: comm,
        frames,
        unwind_status: status,
        count,
        off_cpu_ns: 0,
    }
}

/// The result of [`merge`].
#[derive(Debug, Default)]
pub struct Merged {
    /// The merged profile: from the earliest start to the latest end.
    pub profile: Profile,
    /// Inputs merged.
    pub inputs: usize,
    /// Whether inputs had different sampling frequencies (the first one's is used).
    pub mixed_frequencies: bool,
}

type FrameKey = (FrameKind, Option<usize>, u64, Vec<Arc<str>>);
type SampleKey = (u32, u32, Arc<str>, Arc<str>, Vec<usize>);

/// Merge profiles: identical mappings, frames (kind, mapping, address,
/// function names) and stacks (process, thread, frames) become one, counts
/// and off-CPU ns add up (the result has off-CPU time when an input has);
/// timelines and waits are not kept.
pub fn merge(profiles: impl IntoIterator<Item = Profile>) -> Merged {
    let mut out = Merged::default();
    let mut mappings: HashMap<ProfileMapping, usize> = HashMap::new();
    let mut frames: HashMap<FrameKey, usize> = HashMap::new();
    let mut samples: HashMap<SampleKey, usize> = HashMap::new();
    let mut end = 0u64;
    for p in profiles {
        let merged = &mut out.profile;
        if out.inputs == 0 {
            merged.start_unix_ns = p.start_unix_ns;
            merged.sample_freq_hz = p.sample_freq_hz;
        } else if p.sample_freq_hz != merged.sample_freq_hz {
            out.mixed_frequencies = true;
        }
        out.inputs += 1;
        merged.off_cpu |= p.off_cpu;
        merged.start_unix_ns = merged.start_unix_ns.min(p.start_unix_ns);
        end = end.max(p.start_unix_ns + p.duration_ns);
        let mapping_map: Vec<usize> = p
            .mappings
            .into_iter()
            .map(|m| {
                *mappings.entry(m.clone()).or_insert_with(|| {
                    merged.mappings.push(m);
                    merged.mappings.len() - 1
                })
            })
            .collect();
        let frame_map: Vec<usize> = p
            .frames
            .into_iter()
            .map(|mut f| {
                f.mapping = f.mapping.map(|m| mapping_map[m]);
                let key = (
                    f.kind,
                    f.mapping,
                    f.address,
                    f.lines.iter().map(|l| l.function.clone()).collect(),
                );
                *frames.entry(key).or_insert_with(|| {
                    merged.frames.push(f);
                    merged.frames.len() - 1
                })
            })
            .collect();
        for mut s in p.samples {
            s.frames = s.frames.iter().map(|&f| frame_map[f]).collect();
            let key = (
                s.pid,
                s.tid,
                s.process_comm.clone(),
                s.thread_comm.clone(),
                s.frames.clone(),
            );
            match samples.get(&key) {
                Some(&i) => {
                    let into = &mut merged.samples[i];
                    into.count = into.count.saturating_add(s.count);
                    into.off_cpu_ns = into.off_cpu_ns.saturating_add(s.off_cpu_ns);
                }
                None => {
                    samples.insert(key, merged.samples.len());
                    merged.samples.push(s);
                }
            }
        }
    }
    out.profile.duration_ns = end.saturating_sub(out.profile.start_unix_ns);
    out
}

#[cfg(test)]
#[path = "merge_tests.rs"]
mod tests;
