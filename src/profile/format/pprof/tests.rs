//! pprof encoding: the messages written, decoded back.

use std::io::Read;
use std::sync::Arc;

use prost::Message;

use super::*;
use crate::profile::format::folded::tests::sample_profile;
use crate::profile::ProfileMapping;

fn decode(bytes: &[u8]) -> proto::Profile {
    proto::Profile::decode(bytes).unwrap()
}

fn string(p: &proto::Profile, i: i64) -> &str {
    &p.string_table[i as usize]
}

#[test]
fn header_fields_and_string_table() {
    let p = decode(&encode(&sample_profile(), Compression::None).unwrap());
    assert_eq!(p.string_table[0], "");
    let mut seen = std::collections::HashSet::new();
    assert!(
        p.string_table.iter().all(|s| seen.insert(s)),
        "strings are unique"
    );
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (string(&p, t.r#type), string(&p, t.unit)))
        .collect();
    assert_eq!(types, vec![("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = p.period_type.as_ref().unwrap();
    assert_eq!(
        (string(&p, pt.r#type), string(&p, pt.unit)),
        ("cpu", "nanoseconds")
    );
    assert_eq!(p.period, 10_000_000, "1e9 / 100 Hz");
    assert_eq!(string(&p, p.default_sample_type), "cpu");
    assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
    assert_eq!(p.duration_nanos, 2_000_000_000);
    assert!(p.comment.is_empty(), "no subject, no host: no comment");
}

#[test]
fn subject_and_host_are_comments_read_back() {
    let mut profile = sample_profile();
    profile.subject = Some("./bench 150 '150 ms'".into());
    profile.host = Some("web-1".into());
    let p = decode(&encode(&profile, Compression::None).unwrap());
    let comments: Vec<&str> = p.comment.iter().map(|&i| string(&p, i)).collect();
    assert_eq!(comments, ["subject: ./bench 150 '150 ms'", "host: web-1"]);
    let back = crate::profile::merge::profile_from_pprof(&p);
    assert_eq!(back.subject.as_deref(), Some("./bench 150 '150 ms'"));
    assert_eq!(back.host.as_deref(), Some("web-1"));
}

#[test]
fn samples_values_labels_and_dedup() {
    let profile = sample_profile();
    let p = decode(&encode(&profile, Compression::None).unwrap());
    assert_eq!(p.sample.len(), 3);
    let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    let cpu: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    assert_eq!(total as u64, profile.total_samples());
    assert_eq!(cpu, total * 10_000_000);
    let s = &p.sample[0];
    assert_eq!(s.location_id, vec![1, 2, 3, 4]);
    let labels: Vec<(&str, String)> = s
        .label
        .iter()
        .map(|l| {
            let v = if l.str != 0 {
                string(&p, l.str).to_string()
            } else {
                l.num.to_string()
            };
            (string(&p, l.key), v)
        })
        .collect();
    assert_eq!(
        labels,
        vec![
            ("pid", "7".to_string()),
            ("tid", "7".to_string()),
            ("comm", "app".to_string()),
            ("thread_name", "worker;1".to_string())
        ]
    );
    // Five frames -> five locations; six distinct functions; the frame
    // with an inlined call has two lines, innermost first.
    assert_eq!(p.location.len(), 5);
    assert_eq!(p.function.len(), 6);
    let inl = &p.location[2];
    let names: Vec<&str> = inl
        .line
        .iter()
        .map(|l| string(&p, p.function[l.function_id as usize - 1].name))
        .collect();
    assert_eq!(names, vec!["inner_inlined", "c"]);
    // The truncated stack ends in the unwind marker.
    let last = *p.sample[2].location_id.last().unwrap();
    let marker = &p.location[last as usize - 1];
    assert_eq!(
        string(&p, p.function[marker.line[0].function_id as usize - 1].name),
        "[unwind: truncated]"
    );
}

#[test]
fn mapping_flags_follow_symbolization() {
    let mut profile = sample_profile();
    profile.mappings = vec![
        ProfileMapping {
            start: 0x1000,
            limit: 0x3000,
            file_offset: 0,
            filename: "/bin/app".into(),
            build_id: Some("abcd".into()),
        },
        ProfileMapping {
            start: 0xffff_0000,
            limit: 0xffff_1000,
            file_offset: 0,
            filename: "[kernel.kallsyms]".into(),
            build_id: None,
        },
    ];
    profile.frames[0].mapping = Some(1);
    profile.frames[1].mapping = Some(1);
    profile.frames[2].mapping = Some(0);
    profile.frames[3].mapping = Some(0);
    profile.frames[3].symbolized = false;
    let p = decode(&encode(&profile, Compression::None).unwrap());
    let app = &p.mapping[0];
    assert_eq!(string(&p, app.filename), "/bin/app");
    assert_eq!(string(&p, app.build_id), "abcd");
    assert_eq!((app.memory_start, app.memory_limit), (0x1000, 0x3000));
    assert!(app.has_functions, "symbolized frames have functions");
    assert!(!app.has_filenames && !app.has_line_numbers && !app.has_inline_frames);
    // One frame with DWARF lines is enough to say the mapping has them.
    let mut lines = profile.frames[2].lines.to_vec();
    lines[0].file = Some("app.c".into());
    lines[0].line = Some(3);
    profile.frames[2].lines = lines.into();
    let p = decode(&encode(&profile, Compression::None).unwrap());
    let app = &p.mapping[0];
    assert!(app.has_filenames && app.has_line_numbers && app.has_inline_frames);
    let kernel = &p.mapping[1];
    assert!(kernel.has_functions);
    assert!(!kernel.has_filenames && !kernel.has_line_numbers);
    assert_eq!(p.location[2].mapping_id, 1);
    assert_eq!(p.location[0].mapping_id, 2);
}

#[test]
fn the_first_mapping_is_the_profiled_program() {
    let mut profile = sample_profile();
    let mapping = |filename: &str, start| ProfileMapping {
        start,
        limit: start + 0x1000,
        file_offset: 0,
        filename: filename.into(),
        build_id: None,
    };
    profile.mappings = vec![
        mapping("[kernel.kallsyms]", 0xffff_0000),
        mapping("/lib/libc.so.6", 0x7000),
        mapping("/bin/app", 0x1000),
    ];
    profile.frames[0].mapping = Some(0);
    profile.frames[1].mapping = Some(0);
    profile.frames[2].mapping = Some(1);
    profile.frames[3].mapping = Some(2);
    // Another process, sampled most, whose stacks start in libc.
    let mut other = profile.samples[2].clone();
    (other.pid, other.count) = (9, 100);
    profile.samples.push(other);
    let first = |profile: &Profile| {
        let p = decode(&encode(profile, Compression::None).unwrap());
        p.mapping
            .iter()
            .map(|m| (m.id, string(&p, m.filename).to_string()))
            .collect::<Vec<_>>()
    };
    let owned = |names: &[(u64, &str)]| -> Vec<(u64, String)> {
        names.iter().map(|&(id, n)| (id, n.to_string())).collect()
    };
    // pid 7's 7 samples start in main (/bin/app); its truncated one's
    // outermost user frame is c (libc here), behind its unwind marker.
    profile.targets = Some(Arc::from([7]));
    let app_first = owned(&[
        (3, "/bin/app"),
        (1, "[kernel.kallsyms]"),
        (2, "/lib/libc.so.6"),
    ]);
    assert_eq!(first(&profile), app_first);
    // Most of its samples cut short in libc (a shell stopped in
    // `__libc_vfork`): its whole stacks still decide.
    let mut cut = profile.samples[2].clone();
    cut.count = 50;
    profile.samples.push(cut);
    assert_eq!(first(&profile), app_first);
    profile.samples.pop();
    // The whole machine: the kernel, not the process sampled most.
    profile.targets = Some(Arc::from([]));
    let kernel_first = owned(&[
        (1, "[kernel.kallsyms]"),
        (2, "/lib/libc.so.6"),
        (3, "/bin/app"),
    ]);
    assert_eq!(first(&profile), kernel_first);
    profile.mappings.swap(0, 2);
    profile.frames[0].mapping = Some(2);
    profile.frames[1].mapping = Some(2);
    profile.frames[3].mapping = Some(0);
    let p = decode(&encode(&profile, Compression::None).unwrap());
    assert_eq!(string(&p, p.mapping[0].filename), "[kernel.kallsyms]");
    assert_eq!(p.mapping[0].id, 3);
    // Unknown targets (read back, merged): the order stays.
    profile.targets = None;
    let kept = owned(&[
        (1, "/bin/app"),
        (2, "/lib/libc.so.6"),
        (3, "[kernel.kallsyms]"),
    ]);
    assert_eq!(first(&profile), kept);
    assert_eq!(p.location[3].mapping_id, 1);
}

#[test]
fn gzip_round_trips() {
    let raw = encode(&sample_profile(), Compression::None).unwrap();
    let gz = encode(&sample_profile(), Compression::Gzip).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b]);
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut out)
        .unwrap();
    assert_eq!(out, raw);
}

/// The message written part by part, decoded, is the message built in
/// memory: every field, in the same order.
#[test]
fn streamed_encoding_is_the_whole_message() {
    let mut profile = sample_profile();
    profile.subject = Some(Arc::from("pid 42 (nginx)"));
    profile.host = Some(Arc::from("web-1"));
    let whole = to_proto(&profile);
    assert!(!whole.location.is_empty() && !whole.sample.is_empty());
    assert_eq!(decode(&encode(&profile, Compression::None).unwrap()), whole);
    let mut gz = Vec::new();
    flate2::read::GzDecoder::new(&encode(&profile, Compression::Gzip).unwrap()[..])
        .read_to_end(&mut gz)
        .unwrap();
    assert_eq!(decode(&gz), whole);
}

#[test]
fn container_id_label_only_on_container_processes() {
    let mut profile = sample_profile();
    let id = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";
    // Thread 8 made a process of its own, in a container.
    for s in profile.samples.iter_mut().filter(|s| s.tid == 8) {
        s.pid = 8;
    }
    profile.containers.insert(8, Arc::from(id));
    let p = decode(&encode(&profile, Compression::None).unwrap());
    for s in &p.sample {
        let label = |key: &str| s.label.iter().find(|l| string(&p, l.key) == key);
        let pid = label("pid").unwrap().num;
        let container = label("container.id").map(|l| string(&p, l.str));
        assert_eq!(container, (pid == 8).then_some(id), "pid {pid}");
    }
    assert!(p.sample.iter().any(|s| s.label.len() == 5));
    assert!(p.sample.iter().any(|s| s.label.len() == 4));
    // Without containers the key is not even a string of the table.
    let plain = decode(&encode(&sample_profile(), Compression::None).unwrap());
    assert!(plain.string_table.iter().all(|s| s != "container.id"));
}
