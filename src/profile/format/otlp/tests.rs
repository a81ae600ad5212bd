use std::sync::Arc;

use super::proto::profiles::ProfilesDictionary;
use super::*;
use crate::commands::compare::input::{parse_input, InputFormat};
use crate::profile::format::folded;
use crate::profile::{Frame, Line, ProfileMapping, Sample, TimedSample};
use crate::sampling::records::UnwindStatus;

const START: u64 = 1_700_000_000_000_000_000;

fn frame(kind: FrameKind, address: u64, mapping: Option<usize>, names: &[&str]) -> Frame {
    Frame {
        kind,
        address,
        mapping,
        lines: names
            .iter()
            .map(|n| Line {
                function: Arc::from(*n),
                system_name: Arc::from(*n),
                file: Some(Arc::from("app.c")),
                line: Some(10),
            })
            .collect(),
        symbolized: kind != FrameKind::UnwindMarker,
    }
}

/// Two mappings (an executable with a build ID, the kernel), a kernel
/// frame, a frame with an inlined function, `main` and an unwind marker;
/// four stacks of pid 7, two of them the same stack and thread (as when a
/// thread was counted under two aggregator keys), one of thread 8 cut
/// short; a timeline of their 9 samples with one taken 5 µs before the
/// window's start and one counted in it 1 ms after its end.
fn profile() -> Profile {
    let sample = |tid, name: &str, frames: Vec<usize>, count, status| Sample {
        pid: 7,
        tid,
        process_comm: Arc::from("app"),
        thread_comm: Arc::from(name),
        frames,
        unwind_status: status,
        off_cpu_ns: 0,
        count,
    };
    let at = |offset_ns, sample| TimedSample { offset_ns, sample };
    Profile {
        start_unix_ns: START,
        duration_ns: 1_000_000_000,
        sample_freq_hz: 1000,
        host: Some(Arc::from("web-1")),
        mappings: vec![
            ProfileMapping {
                start: 0x1000,
                limit: 0x9000,
                file_offset: 0,
                filename: "/usr/bin/app".into(),
                build_id: Some("abcdef0123".into()),
            },
            ProfileMapping {
                start: 0xffff_ffff_8100_0000,
                limit: 0xffff_ffff_8200_0000,
                file_offset: 0,
                filename: "[kernel.kallsyms]".into(),
                build_id: None,
            },
        ],
        frames: vec![
            frame(
                FrameKind::Kernel,
                0xffff_ffff_8100_0010,
                Some(1),
                &["vfs_read"],
            ),
            frame(FrameKind::User, 0x1100, Some(0), &["mix", "burn"]),
            frame(FrameKind::User, 0x1200, Some(0), &["main"]),
            frame(FrameKind::UnwindMarker, 0, None, &["[unwind: truncated]"]),
        ],
        samples: vec![
            sample(7, "app", vec![1, 2], 3, UnwindStatus::Complete),
            sample(7, "app", vec![0, 1, 2], 2, UnwindStatus::Complete),
            sample(8, "worker", vec![1, 3], 1, UnwindStatus::Truncated),
            sample(7, "app", vec![1, 2], 3, UnwindStatus::Complete),
        ],
        timeline: vec![
            at(-5_000, 0),
            at(1_000, 3),
            at(2_000, 1),
            at(3_000, 0),
            at(4_000, 2),
            at(5_000, 3),
            at(6_000, 0),
            at(7_000, 1),
            at(1_001_000_000, 3),
        ],
        ..Default::default()
    }
}

fn dictionary(request: &ExportProfilesServiceRequest) -> &ProfilesDictionary {
    request.dictionary.as_ref().unwrap()
}

fn the_profile(request: &ExportProfilesServiceRequest) -> &otlp::Profile {
    assert_eq!(request.resource_profiles.len(), 1);
    let scopes = &request.resource_profiles[0].scope_profiles;
    assert_eq!(scopes.len(), 1);
    assert_eq!(scopes[0].scope.as_ref().unwrap().name, SCOPE_NAME);
    assert_eq!(scopes[0].profiles.len(), 1);
    &scopes[0].profiles[0]
}

/// The string value of the attribute at `index`, and its key.
fn attribute(dict: &ProfilesDictionary, index: i32) -> (&str, String) {
    let kv = &dict.attribute_table[index as usize];
    let value = match kv.value.as_ref().unwrap().value.as_ref().unwrap() {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(n) => n.to_string(),
        other => panic!("unexpected value {other:?}"),
    };
    (dict.string_table[kv.key_strindex as usize].as_str(), value)
}

#[test]
fn every_table_starts_with_its_zero_element_and_every_index_is_in_range() {
    let request = to_request(&profile()).unwrap();
    let dict = dictionary(&request);
    assert_eq!(dict.mapping_table[0], Default::default());
    assert_eq!(dict.location_table[0], Default::default());
    assert_eq!(dict.function_table[0], Default::default());
    assert_eq!(dict.attribute_table[0], Default::default());
    assert_eq!(dict.stack_table[0], Default::default());
    assert_eq!(dict.string_table[0], "");
    assert_eq!(dict.link_table.len(), 1);
    assert!(dict.link_table[0].trace_id.iter().all(|&b| b == 0));
    let strings = dict.string_table.len() as i32;
    let in_range = |i: i32, len: usize| (0..len as i32).contains(&i);
    for m in &dict.mapping_table {
        assert!(in_range(m.filename_strindex, strings as usize));
        assert!(m
            .attribute_indices
            .iter()
            .all(|&a| in_range(a, dict.attribute_table.len())));
    }
    for l in &dict.location_table[1..] {
        assert!(in_range(l.mapping_index, dict.mapping_table.len()));
        for line in &l.lines {
            assert!(line.function_index > 0);
            assert!(in_range(line.function_index, dict.function_table.len()));
        }
    }
    for s in &dict.stack_table[1..] {
        assert!(s
            .location_indices
            .iter()
            .all(|&l| l > 0 && in_range(l, dict.location_table.len())));
    }
    for a in &dict.attribute_table[1..] {
        assert!(a.key_strindex > 0 && a.key_strindex < strings);
    }
    // Nothing is stored twice.
    let mut strings_seen = std::collections::HashSet::new();
    assert!(dict.string_table.iter().all(|s| strings_seen.insert(s)));
    let mut stacks_seen = std::collections::HashSet::new();
    assert!(dict
        .stack_table
        .iter()
        .all(|s| stacks_seen.insert(&s.location_indices)));
    for s in &the_profile(&request).samples {
        assert!(s.stack_index > 0 && in_range(s.stack_index, dict.stack_table.len()));
        assert!(s
            .attribute_indices
            .iter()
            .all(|&a| a > 0 && in_range(a, dict.attribute_table.len())));
    }
}

#[test]
fn samples_carry_every_timestamp_once_per_stack_and_attributes_inside_the_range() {
    let p = profile();
    let request = to_request(&p).unwrap();
    let message = the_profile(&request);
    // Samples 0 and 3 of the profile are one OTLP sample.
    assert_eq!(message.samples.len(), 3);
    let stamps: Vec<Vec<u64>> = message
        .samples
        .iter()
        .map(|s| s.timestamps_unix_nano.clone())
        .collect();
    assert_eq!(
        stamps,
        [
            vec![
                START - 5_000,
                START + 1_000,
                START + 3_000,
                START + 5_000,
                START + 6_000,
                START + 1_001_000_000
            ],
            vec![START + 2_000, START + 7_000],
            vec![START + 4_000],
        ]
    );
    assert!(message.samples.iter().all(|s| s.values.is_empty()));
    // The range is widened to hold the early and the late sample.
    assert_eq!(message.time_unix_nano, START - 5_000);
    assert_eq!(message.duration_nano, 1_001_000_000 + 5_000 + 1);
    let end = message.time_unix_nano + message.duration_nano;
    assert!(stamps
        .iter()
        .flatten()
        .all(|&t| (message.time_unix_nano..end).contains(&t)));
    let dict = dictionary(&request);
    let value_type = |t: &otlp::ValueType| {
        (
            dict.string_table[t.type_strindex as usize].as_str(),
            dict.string_table[t.unit_strindex as usize].as_str(),
        )
    };
    assert_eq!(
        value_type(message.sample_type.as_ref().unwrap()),
        ("samples", "count")
    );
    assert_eq!(
        value_type(message.period_type.as_ref().unwrap()),
        ("cpu", "nanoseconds")
    );
    assert_eq!(message.period, 1_000_000);
}

#[test]
fn a_window_without_late_or_early_samples_keeps_its_own_range() {
    let mut p = profile();
    p.timeline
        .retain(|t| (0..1_000_000_000).contains(&{ t.offset_ns }));
    p.samples[0].count = 2;
    p.samples[3].count = 2;
    let request = to_request(&p).unwrap();
    let message = the_profile(&request);
    assert_eq!(
        (message.time_unix_nano, message.duration_nano),
        (START, 1_000_000_000)
    );
}

#[test]
fn without_a_timeline_samples_carry_their_counts_as_values() {
    let mut p = profile();
    p.timeline.clear();
    let request = to_request(&p).unwrap();
    let message = the_profile(&request);
    let values: Vec<Vec<i64>> = message.samples.iter().map(|s| s.values.clone()).collect();
    assert_eq!(values, [vec![6], vec![2], vec![1]]);
    assert!(message
        .samples
        .iter()
        .all(|s| s.timestamps_unix_nano.is_empty()));
    assert_eq!(
        (message.time_unix_nano, message.duration_nano),
        (START, 1_000_000_000)
    );
}

#[test]
fn a_timeline_that_does_not_hold_every_sample_is_refused() {
    let mut p = profile();
    p.timeline.pop();
    let err = to_request(&p).unwrap_err();
    assert!(
        err.to_string().contains("timeline holds 8 samples"),
        "{err:#}"
    );
}

#[test]
fn attributes_follow_the_semantic_conventions() {
    let request = to_request(&profile()).unwrap();
    let dict = dictionary(&request);
    let resource = request.resource_profiles[0].resource.as_ref().unwrap();
    assert_eq!(resource.attributes.len(), 1);
    assert_eq!(resource.attributes[0].key, "host.name");
    assert_eq!(
        resource.attributes[0].value.as_ref().unwrap().value,
        Some(any_value::Value::StringValue("web-1".into()))
    );
    let worker = &the_profile(&request).samples[2];
    let attributes: Vec<(&str, String)> = worker
        .attribute_indices
        .iter()
        .map(|&a| attribute(dict, a))
        .collect();
    assert_eq!(
        attributes,
        [
            ("process.pid", "7".to_string()),
            ("thread.id", "8".to_string()),
            ("thread.name", "worker".to_string()),
            ("process.executable.name", "app".to_string()),
        ]
    );
    let exe = &dict.mapping_table[1];
    assert_eq!(
        dict.string_table[exe.filename_strindex as usize],
        "/usr/bin/app"
    );
    assert_eq!(
        exe.attribute_indices
            .iter()
            .map(|&a| attribute(dict, a))
            .collect::<Vec<_>>(),
        [("process.executable.build_id.gnu", "abcdef0123".to_string())]
    );
    let kernel = &dict.mapping_table[2];
    assert_eq!(
        dict.string_table[kernel.filename_strindex as usize],
        "[kernel.kallsyms]"
    );
    assert!(kernel.attribute_indices.is_empty());
}

#[test]
fn inlined_functions_are_lines_of_one_location_and_markers_stand_alone() {
    let request = to_request(&profile()).unwrap();
    let dict = dictionary(&request);
    let function = |line: &otlp::Line| {
        let f = &dict.function_table[line.function_index as usize];
        dict.string_table[f.name_strindex as usize].as_str()
    };
    let frame_type = |l: &otlp::Location| {
        l.attribute_indices
            .iter()
            .map(|&a| attribute(dict, a).1)
            .collect::<Vec<_>>()
    };
    let inlined = &dict.location_table[2];
    assert_eq!(
        inlined.lines.iter().map(function).collect::<Vec<_>>(),
        ["mix", "burn"]
    );
    assert_eq!((inlined.mapping_index, inlined.address), (1, 0x1100));
    assert_eq!(inlined.lines[0].line, 10);
    assert_eq!(frame_type(inlined), ["native"]);
    let kernel = &dict.location_table[1];
    assert_eq!(
        (kernel.mapping_index, function(&kernel.lines[0])),
        (2, "vfs_read")
    );
    assert_eq!(frame_type(kernel), ["kernel"]);
    let marker = &dict.location_table[4];
    assert_eq!((marker.mapping_index, marker.address), (0, 0));
    assert_eq!(function(&marker.lines[0]), "[unwind: truncated]");
    assert!(frame_type(marker).is_empty());
    // Stacks are leaf first: the truncated one is [mix/burn, marker].
    let truncated = &the_profile(&request).samples[2];
    assert_eq!(
        dict.stack_table[truncated.stack_index as usize].location_indices,
        [2, 4]
    );
}

#[test]
fn read_back_it_is_the_same_profile_with_its_timeline() {
    let p = profile();
    for compression in [Compression::None, Compression::Gzip] {
        let bytes = encode(&p, compression).unwrap();
        let (back, format) = parse_input(&bytes).unwrap();
        assert_eq!(format, InputFormat::Otlp, "{compression:?}");
        assert_eq!(folded::encode(&back), folded::encode(&p));
        assert_eq!(back.total_samples(), 9);
        assert_eq!(back.host.as_deref(), Some("web-1"));
        assert_eq!(back.sample_freq_hz, 1000);
        assert_eq!(back.mappings, p.mappings);
        let kinds = |p: &Profile| p.frames.iter().map(|f| f.kind).collect::<Vec<_>>();
        assert_eq!(kinds(&back), kinds(&p));
        assert_eq!(back.samples[2].unwind_status, UnwindStatus::Truncated);
        // The timeline comes back, its offsets from the widened start.
        let times = |p: &Profile| {
            let mut t: Vec<(u64, u32)> = p
                .timeline
                .iter()
                .map(|t| {
                    (
                        p.start_unix_ns.saturating_add_signed(t.offset_ns),
                        p.samples[t.sample as usize].tid,
                    )
                })
                .collect();
            t.sort();
            t
        };
        assert_eq!(times(&back), times(&p));
    }
}

#[test]
fn pprof_is_still_read_as_pprof_and_garbage_names_both_formats() {
    let pprof = crate::profile::format::pprof::encode(&profile(), Compression::None).unwrap();
    assert_eq!(parse_input(&pprof).unwrap().1, InputFormat::Pprof);
    let err = parse_input(&[0x0a, 0xff, 0x01]).unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("not a pprof profile") && message.contains("nor OTLP"),
        "{message}"
    );
}

#[test]
fn an_empty_profile_is_a_request_without_samples() {
    let bytes = encode(&Profile::default(), Compression::None).unwrap();
    let request = ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap();
    assert!(the_profile(&request).samples.is_empty());
    assert_eq!(dictionary(&request).string_table[0], "");
}

const CONTAINER: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";

/// The profile with its worker thread made a process of its own (pid 9),
/// and pid 7 in a container.
fn profile_with_a_container() -> Profile {
    let mut p = profile();
    p.samples[2].pid = 9;
    p.containers.insert(7, Arc::from(CONTAINER));
    p
}

#[test]
fn container_id_is_an_attribute_of_the_samples_of_container_processes_only() {
    let request = to_request(&profile_with_a_container()).unwrap();
    let dict = dictionary(&request);
    let samples = &the_profile(&request).samples;
    assert_eq!(samples.len(), 3);
    for s in samples {
        let attributes: Vec<(&str, String)> = s
            .attribute_indices
            .iter()
            .map(|&a| attribute(dict, a))
            .collect();
        let pid = &attributes[0];
        let container = attributes.iter().find(|(k, _)| *k == "container.id");
        match pid.1.as_str() {
            "7" => {
                assert_eq!(container, Some(&("container.id", CONTAINER.to_string())));
                assert_eq!(attributes.len(), 5);
            }
            "9" => assert_eq!(container, None, "{attributes:?}"),
            other => panic!("unexpected pid {other}"),
        }
    }
    // One attribute in the dictionary, shared by both samples of pid 7.
    let keyed = dict
        .attribute_table
        .iter()
        .filter(|kv| dict.string_table[kv.key_strindex as usize] == "container.id")
        .count();
    assert_eq!(keyed, 1);
    // Without containers, no sample has the attribute.
    let plain = to_request(&profile()).unwrap();
    assert!(dictionary(&plain)
        .string_table
        .iter()
        .all(|s| s != "container.id"));
}

#[test]
fn container_ids_are_read_back() {
    let p = profile_with_a_container();
    let (back, _) = parse_input(&encode(&p, Compression::None).unwrap()).unwrap();
    assert_eq!(back.containers, p.containers);
    assert_eq!(folded::encode(&back), folded::encode(&p));
}
