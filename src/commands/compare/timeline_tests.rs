//! Tests of [`super`] (`compare/timeline.rs`).

use std::io::Read;

use super::*;
use crate::profile::format::{firefox, folded};
use crate::profile::slice::slice;
use crate::sampling::records::UnwindStatus;

/// The Firefox tests' profile (a sample every 10 µs from -2 µs, user
/// frames in `/bin/app`) with an exec, an exit and a lost-samples span.
fn timed_profile() -> Profile {
    let mut profile = firefox::tests::timed_profile();
    profile.markers = vec![
        ProcessMarker {
            offset_ns: 0,
            pid: 7,
            kind: ProcessMarkerKind::Exec,
        },
        ProcessMarker {
            offset_ns: 75_000,
            pid: 7,
            kind: ProcessMarkerKind::Exit,
        },
    ];
    profile.lost = vec![LostSamples {
        start_offset_ns: 20_000,
        end_offset_ns: 40_000,
        samples: 12,
    }];
    profile
}

fn written(profile: &Profile) -> Vec<u8> {
    let gzip = firefox::encode(profile).unwrap();
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(gzip.as_slice())
        .read_to_end(&mut json)
        .unwrap();
    json
}

#[test]
fn what_the_firefox_encoder_writes_reads_back() {
    let mut profile = timed_profile();
    profile.subject = Some("pid 7 (app)".into());
    let json = written(&profile);
    assert!(looks_like_json(&json));
    let read = parse_timeline(&json).unwrap();
    assert_eq!(read.subject.as_deref(), Some("pid 7 (app)"));
    let no_subject = parse_timeline(&written(&timed_profile())).unwrap();
    assert_eq!(no_subject.subject, None);
    assert_eq!(folded::encode(&read), folded::encode(&profile));
    assert_eq!(read.sample_freq_hz, 100);
    // The reference moved 2 µs earlier for the first sample: every
    // time is 2 µs later, and the start 2 µs earlier (to the 0.2 µs
    // an f64 of ms since 1970 resolves).
    let start_error = read.start_unix_ns.abs_diff(profile.start_unix_ns - 2_000);
    assert!(start_error < 1_000, "{start_error} ns off");
    let times: Vec<i64> = read.timeline.iter().map(|t| t.offset_ns).collect();
    let expected: Vec<i64> = (0..8).map(|i| i * 10_000).collect();
    assert_eq!(times, expected);
    for timed in &read.timeline {
        assert!(read.samples[timed.sample as usize].count > 0);
    }
    assert_eq!(read.timeline.len() as u64, read.total_samples());
    let markers: Vec<(i64, u32, ProcessMarkerKind)> = read
        .markers
        .iter()
        .map(|m| (m.offset_ns, m.pid, m.kind))
        .collect();
    assert_eq!(
        markers,
        vec![
            (2_000, 7, ProcessMarkerKind::Exec),
            (77_000, 7, ProcessMarkerKind::Exit)
        ]
    );
    assert_eq!(
        read.lost,
        vec![LostSamples {
            start_offset_ns: 22_000,
            end_offset_ns: 42_000,
            samples: 12
        }]
    );
    let truncated = read.samples.iter().find(|s| s.count == 1).unwrap();
    assert_eq!(truncated.unwind_status, UnwindStatus::Truncated);
    assert!(read
        .frames
        .iter()
        .any(|f| f.kind == FrameKind::Kernel && &*f.lines[0].function == "vfs_read"));
    // User frames are in /bin/app's library, at their file offsets.
    let main = read.frames.iter().find(|f| &*f.lines[0].function == "main");
    let mapping = main.and_then(|f| f.mapping).map(|m| &read.mappings[m]);
    assert_eq!(mapping.map(|m| m.filename.as_str()), Some("/bin/app"));
    assert_eq!(main.map(|f| f.address), Some(0x1100));
    assert_eq!(
        mapping.and_then(|m| m.build_id.as_deref()),
        Some("0aa70dc66dec077a9140a391cc1a092737b75148")
    );
}

#[test]
fn a_slice_keeps_its_samples_and_markers_only() {
    let read = parse_timeline(&written(&timed_profile())).unwrap();
    // Samples at 0, 10, ..., 70 µs: [15 µs, 45 µs) holds 20, 30, 40.
    let cut = slice(&read, 15_000, 45_000);
    assert_eq!(cut.total_samples(), 3);
    assert_eq!(cut.timeline.len(), 3);
    assert_eq!({ cut.timeline[0].offset_ns }, 5_000);
    assert!(cut.samples.iter().all(|s| s.count > 0));
    assert_eq!(cut.start_unix_ns, read.start_unix_ns + 15_000);
    assert_eq!(cut.duration_ns, 30_000);
    assert!(cut.markers.is_empty());
    assert_eq!(cut.lost.len(), 1);
    // A re-encoded slice is a valid timeline again.
    let again = parse_timeline(&written(&cut)).unwrap();
    assert_eq!(again.total_samples(), 3);
    assert_eq!(slice(&read, 100_000, 200_000).total_samples(), 0);
}

#[test]
fn plain_json_weights_and_shared_strings() {
    let json = r#"{"meta": {"startTime": 1000.5, "interval": 0.1,
        "categories": [{"name": "Other"}, {"name": "Kernel"}]},
      "libs": [{"path": "/bin/x", "codeId": "ab"}],
      "shared": {"stringArray": ["main", "work", "sys"]},
      "threads": [{"name": "x", "pid": 5, "tid": "6",
        "samples": {"stack": [1, 2, null], "time": [0.5, 1.0, 1.5], "weight": [2, 1, 1]},
        "stackTable": {"prefix": [null, 0, 1], "frame": [0, 1, 2]},
        "frameTable": {"address": [16, 32, -1], "category": [0, 0, 1], "func": [0, 1, 2]},
        "funcTable": {"name": [0, 1, 2], "resource": [0, 0, -1]},
        "resourceTable": {"lib": [0]}}]}"#;
    let p = parse_timeline(json.as_bytes()).unwrap();
    assert_eq!(p.sample_freq_hz, 10_000);
    assert_eq!(p.start_unix_ns, 1_000_500_000);
    assert_eq!(
        folded::encode(&p),
        "x 1\nx;main;work 2\nx;main;work;sys_[k] 1\n"
    );
    assert_eq!(p.timeline.len(), 4);
    assert_eq!((p.samples[0].pid, p.samples[0].tid), (5, 6));
    let work = p.frames.iter().find(|f| &*f.lines[0].function == "work");
    assert_eq!(work.map(|f| (f.mapping, f.address)), Some((Some(0), 32)));
    assert_eq!(p.mappings[0].build_id.as_deref(), Some("ab"));
}

#[test]
fn bad_indices_and_shapes_are_errors() {
    let base = |stack: &str, prefix: &str| {
        format!(
            r#"{{"meta": {{"startTime": 0, "interval": 1}},
            "threads": [{{"name": "x", "pid": 1, "tid": 1, "stringArray": ["f"],
            "samples": {{"stack": [{stack}], "timeDeltas": [1]}},
            "stackTable": {{"prefix": [{prefix}], "frame": [0]}},
            "frameTable": {{"category": [null], "func": [0]}},
            "funcTable": {{"name": [0], "resource": [null]}}}}]}}"#
        )
    };
    assert!(parse_timeline(base("0", "null").as_bytes()).is_ok());
    let err = parse_timeline(base("3", "null").as_bytes()).unwrap_err();
    assert!(
        format!("{err:#}").contains("stackTable.frame index 3"),
        "{err:#}"
    );
    let err = parse_timeline(base("0", "0").as_bytes()).unwrap_err();
    assert!(
        format!("{err:#}").contains("not an earlier stack"),
        "{err:#}"
    );
    let err = parse_timeline(br#"{"meta": {}}"#).unwrap_err();
    assert!(format!("{err:#}").contains("not a Firefox"), "{err:#}");
    let weight = base("0", "null").replace(r#""timeDeltas""#, r#""weight": [0.5], "time""#);
    let err = parse_timeline(weight.as_bytes()).unwrap_err();
    assert!(format!("{err:#}").contains("weight 0.5"), "{err:#}");
}
