//! The trace read back with the generated types, the way Perfetto's trace
//! processor reads it: interned data accumulated along the sequence, each
//! sample's callstack resolved through it. (tests/perfetto/ decodes real
//! runs with the Python `perfetto` package instead.)

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use prost::Message;

use super::proto::trace_packet::Data;
use super::proto::{self, Trace};
use super::*;
use crate::profile::format::firefox::tests::timed_profile;
use crate::profile::format::folded::tests::sample_profile;
use crate::profile::TimedWait;
use crate::sampling::records::UnwindStatus;

/// What a reader makes of a trace.
#[derive(Default)]
struct Decoded {
    /// (timestamp, pid, tid, folded stack without the process name).
    samples: Vec<(u64, u32, u32, String)>,
    /// uuid -> (pid, tid, name) of threads; tid 0 for processes.
    tracks: HashMap<u64, (i32, i32, String)>,
    /// (track, begin, end, name, args) of each slice.
    slices: Vec<(u64, u64, u64, String, Vec<String>)>,
    /// Mapping paths as readers join them.
    mappings: Vec<(String, Vec<u8>)>,
    packets: usize,
}

fn read(bytes: &[u8]) -> Decoded {
    let trace = Trace::decode(bytes).expect("a Trace");
    let mut out = Decoded {
        packets: trace.packet.len(),
        ..Decoded::default()
    };
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut paths: HashMap<u64, String> = HashMap::new();
    let mut frames: HashMap<u64, proto::Frame> = HashMap::new();
    let mut stacks: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut open: HashMap<u64, Vec<(u64, String, Vec<String>)>> = HashMap::new();
    let text = |b: &Option<Vec<u8>>| String::from_utf8(b.clone().unwrap()).unwrap();
    for (i, packet) in trace.packet.iter().enumerate() {
        assert_eq!(
            packet.optional_trusted_packet_sequence_id,
            Some(
                proto::trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(
                    SEQUENCE_ID
                )
            )
        );
        if let Some(new) = &packet.interned_data {
            for s in &new.function_names {
                assert!(names.insert(s.iid.unwrap(), text(&s.str)).is_none());
            }
            for s in &new.mapping_paths {
                assert!(paths.insert(s.iid.unwrap(), text(&s.str)).is_none());
            }
            for m in &new.mappings {
                let path: String = m
                    .path_string_ids
                    .iter()
                    .map(|p| format!("/{}", paths[p]))
                    .collect();
                let build_id = m
                    .build_id
                    .map(|b| {
                        new.build_ids
                            .iter()
                            .find(|s| s.iid == Some(b))
                            .unwrap()
                            .str
                            .clone()
                            .unwrap()
                    })
                    .unwrap_or_default();
                out.mappings.push((path, build_id));
            }
            for f in &new.frames {
                assert!(frames.insert(f.iid.unwrap(), *f).is_none());
            }
            for c in &new.callstacks {
                assert!(stacks.insert(c.iid.unwrap(), c.frame_ids.clone()).is_none());
            }
        }
        match packet.data.as_ref().expect("data") {
            Data::ClockSnapshot(clock) => {
                assert_eq!(i, 0);
                assert_eq!(
                    clock.primary_trace_clock,
                    Some(BuiltinClock::Realtime as i32)
                );
            }
            Data::TrackDescriptor(d) => {
                let track = match (&d.process, &d.thread) {
                    (Some(p), None) => (p.pid.unwrap(), 0, p.process_name.clone().unwrap()),
                    (None, Some(t)) => (
                        t.pid.unwrap(),
                        t.tid.unwrap(),
                        t.thread_name.clone().unwrap(),
                    ),
                    other => panic!("{other:?}"),
                };
                assert!(out.tracks.insert(d.uuid.unwrap(), track).is_none());
            }
            Data::PerfSample(s) => {
                assert_eq!(
                    packet.timestamp_clock_id,
                    Some(BuiltinClock::Realtime as u32)
                );
                let stack: Vec<String> = stacks[&s.callstack_iid.unwrap()]
                    .iter()
                    .map(|f| {
                        let frame = &frames[f];
                        let kernel = frame.kind_field
                            == Some(proto::frame::KindField::Kind(
                                proto::frame::Kind::Kernel as i32,
                            ));
                        let name = folded::clean(&names[&frame.function_name_id.unwrap()]);
                        if kernel {
                            name + "_[k]"
                        } else {
                            name
                        }
                    })
                    .collect();
                out.samples.push((
                    packet.timestamp.unwrap(),
                    s.pid.unwrap(),
                    s.tid.unwrap(),
                    stack.join(";"),
                ));
            }
            Data::TrackEvent(e) => {
                let track = e.track_uuid.unwrap();
                assert!(out.tracks.contains_key(&track));
                let t = packet.timestamp.unwrap();
                match e.r#type {
                    Some(1) => {
                        let Some(proto::track_event::NameField::Name(name)) = &e.name_field else {
                            panic!("a slice without a name")
                        };
                        let args = e
                            .debug_annotations
                            .iter()
                            .map(|a| format!("{:?}", a.value.as_ref().unwrap()))
                            .collect();
                        open.entry(track).or_default().push((t, name.clone(), args));
                    }
                    Some(2) => {
                        let (begin, name, args) = open.get_mut(&track).unwrap().pop().unwrap();
                        assert!(begin <= t);
                        out.slices.push((track, begin, t, name, args));
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }
    assert!(open.values().all(Vec::is_empty), "unbalanced slices");
    out
}

/// Folded lines (process name first) of what was read, as folded output writes them.
fn folded_of(read: &Decoded) -> BTreeMap<String, u64> {
    let mut lines = BTreeMap::new();
    for (_, pid, _, stack) in &read.samples {
        let process = read
            .tracks
            .values()
            .find(|(p, t, _)| *p == *pid as i32 && *t == 0)
            .expect("a process track");
        *lines
            .entry(format!("{};{stack}", folded::clean(&process.2)))
            .or_insert(0) += 1;
    }
    lines
}

#[test]
fn samples_are_at_their_time_on_their_thread_with_their_stack() {
    let profile = timed_profile();
    let bytes = encode(&profile, Compression::None).unwrap();
    let read = read(&bytes);
    assert_eq!(folded_of(&read), folded::folded_stacks(&profile));
    // Threads 7 (5 samples) and 8 (3) of process 7, named.
    let per_thread = read.samples.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.2).or_insert(0) += 1;
        m
    });
    assert_eq!(per_thread, BTreeMap::from([(7, 5), (8, 3)]));
    let mut tracks: Vec<_> = read.tracks.values().cloned().collect();
    tracks.sort();
    assert_eq!(
        tracks,
        vec![
            (7, 0, "app".to_string()),
            (7, 7, "worker;1".to_string()),
            (7, 8, "worker;1".to_string())
        ]
    );
    // Times: the start plus each offset (the first 2 µs before it), in order.
    let expected: Vec<u64> = profile
        .timeline
        .iter()
        .map(|t| (profile.start_unix_ns as i64 + { t.offset_ns }) as u64)
        .collect();
    let times: Vec<u64> = read.samples.iter().map(|s| s.0).collect();
    assert_eq!(times, expected);
    assert_eq!(times[0], profile.start_unix_ns - 2_000);
    // Mappings: /bin/app with its build ID's bytes, and the unwind marker's.
    assert!(read.mappings.contains(&(
        "/bin/app".to_string(),
        vec![
            0x0a, 0xa7, 0x0d, 0xc6, 0x6d, 0xec, 0x07, 0x7a, 0x91, 0x40, 0xa3, 0x91, 0xcc, 0x1a,
            0x09, 0x27, 0x37, 0xb7, 0x51, 0x48
        ]
    )));
    assert!(read.mappings.contains(&("/[unwind]".to_string(), vec![])));
    // Each stack is interned once: 3 stacks, 2 of them the same frames.
    let trace = Trace::decode(&bytes[..]).unwrap();
    let callstacks: usize = trace
        .packet
        .iter()
        .filter_map(|p| p.interned_data.as_ref())
        .map(|d| d.callstacks.len())
        .sum();
    assert_eq!(callstacks, 2);
}

#[test]
fn waits_are_nested_slices_on_their_threads() {
    let mut profile = timed_profile();
    profile.waits = vec![
        TimedWait {
            start_offset_ns: 1_000,
            duration_ns: 5_000,
            sample: 1,
        },
        // Overlaps the first on the same thread: starts where it ended.
        TimedWait {
            start_offset_ns: 4_000,
            duration_ns: 10_000,
            sample: 2,
        },
        TimedWait {
            start_offset_ns: 0,
            duration_ns: 3_000,
            sample: 0,
        },
    ];
    let read = read(&encode(&profile, Compression::Gzip).map(gunzip).unwrap());
    assert_eq!(read.slices.len(), 3);
    let start = profile.start_unix_ns;
    let thread = |tid: i32| {
        read.tracks
            .iter()
            .find(|(_, t)| t.1 == tid)
            .map(|(uuid, _)| *uuid)
            .unwrap()
    };
    let mut on_8: Vec<_> = read.slices.iter().filter(|s| s.0 == thread(8)).collect();
    on_8.sort_by_key(|s| s.1);
    assert_eq!(
        on_8.iter()
            .map(|s| (s.1 - start, s.2 - start))
            .collect::<Vec<_>>(),
        vec![(1_000, 6_000), (6_000, 14_000)]
    );
    assert!(on_8.iter().all(|s| s.3 == OFF_CPU_SLICE));
    assert_eq!(on_8[0].4[0], "UintValue(5000)");
    assert_eq!(
        on_8[1].4[1],
        "StringValue(\"[unwind: truncated];c;inner_inlined\")"
    );
    let on_7: Vec<_> = read.slices.iter().filter(|s| s.0 == thread(7)).collect();
    assert_eq!((on_7[0].1 - start, on_7[0].2 - start), (0, 3_000));
}

fn gunzip(bytes: Vec<u8>) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_end(&mut raw)
        .unwrap();
    raw
}

#[test]
fn a_profile_without_its_timeline_is_refused_and_an_empty_one_is_its_clock() {
    let mut profile = sample_profile();
    let err = encode(&profile, Compression::None).unwrap_err().to_string();
    assert!(err.contains("8 samples and 0 timed"), "{err}");
    profile.samples.clear();
    let read = read(&encode(&profile, Compression::None).unwrap());
    assert_eq!(read.packets, 1);
    assert!(read.samples.is_empty());
}

/// [`read::decode`] gives back the samples: the same folded stacks, the
/// same threads with their names, every sample at its time, the mapping
/// with its build ID in hex, unwind markers and their stacks' status.
#[test]
fn a_trace_reads_back_as_its_samples() {
    let profile = timed_profile();
    let back = read::decode(&encode(&profile, Compression::None).unwrap()).unwrap();
    assert_eq!(
        folded::folded_stacks(&back),
        folded::folded_stacks(&profile)
    );
    let threads: BTreeMap<(u32, u32), (u64, &str, &str)> =
        back.samples.iter().fold(BTreeMap::new(), |mut m, s| {
            let entry = m
                .entry((s.pid, s.tid))
                .or_insert((0, &*s.process_comm, &*s.thread_comm));
            entry.0 += s.count;
            m
        });
    assert_eq!(
        threads,
        BTreeMap::from([
            ((7, 7), (5, "app", "worker;1")),
            ((7, 8), (3, "app", "worker;1"))
        ])
    );
    let times = |p: &Profile| -> Vec<(i128, u64)> {
        p.timeline
            .iter()
            .map(|t| {
                let s = &p.samples[t.sample as usize];
                (
                    i128::from(p.start_unix_ns) + i128::from(t.offset_ns),
                    u64::from(s.tid),
                )
            })
            .collect()
    };
    assert_eq!(times(&back), times(&profile));
    assert!(back.mappings.iter().any(|m| m.filename == "/bin/app"
        && m.build_id.as_deref() == Some("0aa70dc66dec077a9140a391cc1a092737b75148")));
    assert!(back
        .samples
        .iter()
        .any(|s| s.unwind_status == UnwindStatus::Truncated));
    assert!(back.frames.iter().any(|f| f.kind == FrameKind::Kernel));
}

/// Bytes that are no trace, a trace without samples, and a sample whose
/// callstack was never interned are errors that say so.
#[test]
fn bad_traces_are_errors() {
    let err = |bytes: &[u8]| format!("{:#}", read::decode(bytes).unwrap_err());
    assert!(err(b"\xff\xff\xff").contains("does not decode"));
    let mut empty = timed_profile();
    empty.samples.clear();
    empty.timeline.clear();
    let e = err(&encode(&empty, Compression::None).unwrap());
    assert!(e.contains("no PerfSample"), "{e}");
    let bytes = encode(&timed_profile(), Compression::None).unwrap();
    let mut trace = Trace::decode(&bytes[..]).unwrap();
    for packet in &mut trace.packet {
        packet.interned_data = None;
    }
    let e = err(&trace.encode_to_vec());
    assert!(e.contains("callstack 1 was never interned"), "{e}");
    let truncated = err(&bytes[..bytes.len() - 3]);
    assert!(truncated.contains("does not decode"), "{truncated}");
}
