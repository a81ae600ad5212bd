//! Reading a Perfetto trace back into a [`Profile`] (for `report` and
//! `diff`): the inverse of the encoder for its CPU samples.
//!
//! Interned data is read per packet sequence as Perfetto's trace processor
//! reads it (perfetto.dev, "Interned data"): accumulated packet by packet,
//! dropped when a packet sets `SEQ_INCREMENTAL_STATE_CLEARED`. Each
//! `PerfSample` is one sample at its time, of the process and thread its
//! pid and tid name; their names come from the process and thread track
//! descriptors (`[unknown]` when none). Each Perfetto frame is one
//! [`Frame`] of one function (the encoder writes a frame per inlined
//! function): a kernel frame when its kind is `KIND_KERNEL`, an unwind
//! marker when its mapping is [`UNWIND_MAPPING`], else a user frame;
//! frames of the mapping [`UNKNOWN_MAPPING`] have none. The trace's start
//! is its `REALTIME` clock snapshot (else its first sample), and every
//! sample is kept in [`Profile::timeline`]. Off-CPU slices are not read
//! back: they carry their stack as text only, and `report` and `diff`
//! count CPU samples. The sampling frequency is not in a trace (0).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use prost::Message;

use super::proto::{self, trace_packet::Data, BuiltinClock, InternedData, TracePacket};
use super::{UNKNOWN_MAPPING, UNWIND_MAPPING};
use crate::profile::{
    stack_unwind_status, Frame, FrameKind, Line, Profile, ProfileMapping, Sample, TimedSample,
};

/// Decode `bytes` (raw protobuf, not gzip'd) as a Perfetto trace with at
/// least one `PerfSample`. Errors when they do not decode as a `Trace`,
/// when it has no sample, or when a sample refers to a callstack, frame,
/// function name, mapping or path that its sequence never interned.
pub fn decode(bytes: &[u8]) -> Result<Profile> {
    let trace = proto::Trace::decode(bytes).context("it does not decode")?;
    let mut reader = Reader::default();
    for (number, packet) in trace.packet.iter().enumerate() {
        reader
            .packet(packet)
            .with_context(|| format!("packet {number}"))?;
    }
    reader.finish()
}

/// The interned tables of one packet sequence, by iid.
#[derive(Default)]
struct Sequence {
    function_names: HashMap<u64, Arc<str>>,
    mapping_paths: HashMap<u64, Vec<u8>>,
    build_ids: HashMap<u64, Vec<u8>>,
    /// iid -> index in [`Profile::mappings`], or `None` for [`UNKNOWN_MAPPING`]
    /// and [`UNWIND_MAPPING`] (whose frames have no mapping).
    mappings: HashMap<u64, Option<usize>>,
    /// iid -> whether the mapping is [`UNWIND_MAPPING`].
    unwind_mappings: HashMap<u64, bool>,
    /// iid -> index in [`Profile::frames`].
    frames: HashMap<u64, usize>,
    /// iid -> frame indices, leaf first.
    callstacks: HashMap<u64, Arc<[usize]>>,
}

#[derive(Default)]
struct Reader {
    profile: Profile,
    sequences: HashMap<u32, Sequence>,
    clock_start: Option<u64>,
    process_names: HashMap<u32, Arc<str>>,
    thread_names: HashMap<(u32, u32), Arc<str>>,
    /// (Unix ns, pid, tid, its frames), in the file's order.
    samples: Vec<(u64, u32, u32, Arc<[usize]>)>,
}

impl Reader {
    fn packet(&mut self, packet: &TracePacket) -> Result<()> {
        let id = match packet.optional_trusted_packet_sequence_id {
            Some(
                proto::trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(id),
            ) => id,
            None => 0,
        };
        let cleared = proto::trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32;
        if packet.sequence_flags.unwrap_or(0) & cleared != 0 {
            self.sequences.insert(id, Sequence::default());
        }
        if let Some(interned) = &packet.interned_data {
            self.intern(id, interned)?;
        }
        match &packet.data {
            Some(Data::ClockSnapshot(snapshot)) => {
                let realtime = snapshot
                    .clocks
                    .iter()
                    .find(|c| c.clock_id == Some(BuiltinClock::Realtime as u32));
                if let (None, Some(clock)) = (self.clock_start, realtime) {
                    self.clock_start = clock.timestamp;
                }
            }
            Some(Data::TrackDescriptor(d)) => {
                if let Some(t) = &d.thread {
                    let key = (t.pid.unwrap_or(0) as u32, t.tid.unwrap_or(0) as u32);
                    let name = t.thread_name.as_deref().unwrap_or_default();
                    self.thread_names.insert(key, Arc::from(name));
                } else if let Some(p) = &d.process {
                    let name = p.process_name.as_deref().unwrap_or_default();
                    self.process_names
                        .insert(p.pid.unwrap_or(0) as u32, Arc::from(name));
                }
            }
            Some(Data::PerfSample(s)) => {
                let sequence = self.sequences.entry(id).or_default();
                let iid = s.callstack_iid.context("a sample without a callstack")?;
                let frames = sequence
                    .callstacks
                    .get(&iid)
                    .with_context(|| format!("callstack {iid} was never interned"))?
                    .clone();
                let time = packet.timestamp.context("a sample without a timestamp")?;
                let (pid, tid) = (s.pid.unwrap_or(0), s.tid.unwrap_or(0));
                self.samples.push((time, pid, tid, frames));
            }
            Some(Data::TrackEvent(_)) | None => {}
        }
        Ok(())
    }

    /// Add `interned` to sequence `id`'s tables, in the order that lets
    /// each table refer to the ones before it.
    fn intern(&mut self, id: u32, interned: &InternedData) -> Result<()> {
        let profile = &mut self.profile;
        let seq = self.sequences.entry(id).or_default();
        for s in &interned.function_names {
            let name = String::from_utf8_lossy(s.str.as_deref().unwrap_or_default());
            seq.function_names
                .insert(s.iid.unwrap_or(0), Arc::from(name.as_ref()));
        }
        for s in &interned.mapping_paths {
            let part = s.str.clone().unwrap_or_default();
            seq.mapping_paths.insert(s.iid.unwrap_or(0), part);
        }
        for s in &interned.build_ids {
            let bytes = s.str.clone().unwrap_or_default();
            seq.build_ids.insert(s.iid.unwrap_or(0), bytes);
        }
        for m in &interned.mappings {
            let mut path = String::new();
            for part in &m.path_string_ids {
                let part = seq
                    .mapping_paths
                    .get(part)
                    .with_context(|| format!("mapping path {part} was never interned"))?;
                path.push('/');
                path.push_str(&String::from_utf8_lossy(part));
            }
            let iid = m.iid.unwrap_or(0);
            let name = path.strip_prefix('/').unwrap_or_default();
            seq.unwind_mappings.insert(iid, name == UNWIND_MAPPING);
            if name == UNKNOWN_MAPPING || name == UNWIND_MAPPING {
                seq.mappings.insert(iid, None);
                continue;
            }
            let build_id = match m.build_id {
                Some(b) => Some(hex(seq
                    .build_ids
                    .get(&b)
                    .with_context(|| format!("build ID {b} was never interned"))?)),
                None => None,
            };
            // `[kernel.kallsyms]`, `[vdso]`: names, not paths.
            let path = if name.starts_with('[') {
                name.to_string()
            } else {
                path
            };
            profile.mappings.push(ProfileMapping {
                start: m.start.unwrap_or(0),
                limit: m.end.unwrap_or(0),
                file_offset: m.exact_offset.or(m.start_offset).unwrap_or(0),
                filename: path,
                build_id,
            });
            seq.mappings.insert(iid, Some(profile.mappings.len() - 1));
        }
        for f in &interned.frames {
            let name_id = f.function_name_id.unwrap_or(0);
            let name = seq
                .function_names
                .get(&name_id)
                .with_context(|| format!("function name {name_id} was never interned"))?
                .clone();
            let mapping_id = f.mapping_id.unwrap_or(0);
            let mapping = *seq
                .mappings
                .get(&mapping_id)
                .with_context(|| format!("mapping {mapping_id} was never interned"))?;
            let kernel = f.kind_field
                == Some(proto::frame::KindField::Kind(
                    proto::frame::Kind::Kernel as i32,
                ));
            let kind = if seq.unwind_mappings.get(&mapping_id) == Some(&true) {
                FrameKind::UnwindMarker
            } else if kernel {
                FrameKind::Kernel
            } else {
                FrameKind::User
            };
            let rel_pc = f.rel_pc.unwrap_or(0);
            let address = match mapping {
                Some(m) => profile.mappings[m].start.saturating_add(rel_pc),
                None => rel_pc,
            };
            profile.frames.push(Frame {
                kind,
                address,
                mapping,
                lines: vec![Line {
                    function: name.clone(),
                    system_name: name,
                    file: None,
                    line: None,
                }]
                .into(),
                symbolized: kind != FrameKind::UnwindMarker,
            });
            seq.frames
                .insert(f.iid.unwrap_or(0), profile.frames.len() - 1);
        }
        for c in &interned.callstacks {
            // Perfetto's callstacks go root to leaf; a sample's frames leaf first.
            let frames = c
                .frame_ids
                .iter()
                .rev()
                .map(|f| {
                    seq.frames
                        .get(f)
                        .copied()
                        .with_context(|| format!("frame {f} was never interned"))
                })
                .collect::<Result<Arc<[usize]>>>()?;
            seq.callstacks.insert(c.iid.unwrap_or(0), frames);
        }
        Ok(())
    }

    /// The profile of the samples read: one [`Sample`] per thread and
    /// stack, every sample in the timeline in time order.
    fn finish(mut self) -> Result<Profile> {
        if self.samples.is_empty() {
            bail!("it holds no PerfSample");
        }
        let first = self.samples.iter().map(|s| s.0).min().unwrap_or(0);
        let last = self.samples.iter().map(|s| s.0).max().unwrap_or(0);
        let start = self.clock_start.unwrap_or(first).min(first);
        let profile = &mut self.profile;
        (profile.start_unix_ns, profile.duration_ns) = (start, last - start);
        let unknown: Arc<str> = Arc::from("[unknown]");
        let mut index: BTreeMap<(u32, u32, Arc<[usize]>), u32> = BTreeMap::new();
        let mut timeline = Vec::with_capacity(self.samples.len());
        for (time, pid, tid, frames) in self.samples {
            let next = profile.samples.len() as u32;
            let sample = *index.entry((pid, tid, frames.clone())).or_insert(next);
            if sample == next {
                let process = self.process_names.get(&pid).unwrap_or(&unknown);
                let thread = self.thread_names.get(&(pid, tid)).unwrap_or(process);
                profile.samples.push(Sample {
                    pid,
                    tid,
                    process_comm: process.clone(),
                    thread_comm: thread.clone(),
                    unwind_status: stack_unwind_status(&frames, &profile.frames),
                    frames: frames.to_vec(),
                    count: 0,
                    off_cpu_ns: 0,
                });
            }
            profile.samples[sample as usize].count += 1;
            // Within the u64 of ns since 1970 for 292 years: fits an i64.
            let offset_ns = i64::try_from(time - start).unwrap_or(i64::MAX);
            timeline.push(TimedSample { offset_ns, sample });
        }
        timeline.sort_by_key(|t| t.offset_ns);
        profile.timeline = timeline;
        Ok(self.profile)
    }
}

/// `bytes` in lower-case hex, as [`ProfileMapping::build_id`] holds a GNU
/// build ID.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
