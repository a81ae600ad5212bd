//! The collector's HTTP API: what it accepts, stores and refuses.

use super::*;

/// A small profile with known stacks, as pprof bytes.
fn known_profile(start_unix_ns: u64, count: u64) -> Vec<u8> {
    use lightswitch::profile::{Frame, FrameKind, Line, Profile, Sample};
    use lightswitch::sampling::records::UnwindStatus;
    use std::sync::Arc;
    let line = |name: &str| Line {
        function: Arc::from(name),
        system_name: Arc::from(name),
        file: None,
        line: None,
    };
    let profile = Profile {
        start_unix_ns,
        duration_ns: 1_000_000_000,
        sample_freq_hz: 99,
        mappings: vec![],
        frames: vec![
            Frame {
                kind: FrameKind::User,
                address: 0x1000,
                mapping: None,
                lines: vec![line("leaf")].into(),
                symbolized: true,
            },
            Frame {
                kind: FrameKind::User,
                address: 0x2000,
                mapping: None,
                lines: vec![line("main")].into(),
                symbolized: true,
            },
        ],
        samples: vec![Sample {
            pid: 42,
            tid: 42,
            process_comm: Arc::from("app"),
            thread_comm: Arc::from("app"),
            frames: vec![0, 1],
            unwind_status: UnwindStatus::Complete,
            off_cpu_ns: 0,
            count,
        }],
        timeline: vec![],
        markers: vec![],
        lost: vec![],
        subject: None,
        host: None,
        targets: None,
        ..Default::default()
    };
    lightswitch::profile::format::pprof::encode(
        &profile,
        lightswitch::profile::format::Compression::None,
    )
    .unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn collector_validates_limits_authenticates_lists_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let collector = Collector::start(0, &store, &["--token", "t0k", "--max-body-bytes", "4096"]);
    let client = http();
    let url = collector.profiles_url();
    let post = |body: Vec<u8>, token: Option<&str>, host: &str| {
        let mut r = client
            .post(&url)
            .header("Content-Type", "application/vnd.google.protobuf")
            .header("X-Lightswitch-Host", host)
            .body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send().unwrap()
    };
    let s = 1_000_000_000u64;
    let t0 = 1_714_564_800 * s;

    // No token, wrong token: 401, nothing stored.
    assert_eq!(post(known_profile(t0, 1), None, "a").status(), 401);
    assert_eq!(post(known_profile(t0, 1), Some("nope"), "a").status(), 401);
    assert_eq!(client.get(&url).send().unwrap().status(), 401);
    // Malformed: 400 with a message, nothing stored.
    let negative = {
        use prost::Message;
        let mut p =
            lightswitch::profile::format::pprof::proto::Profile::decode(&known_profile(t0, 1)[..])
                .unwrap();
        p.sample[0].value[0] = -5;
        p.encode_to_vec()
    };
    for garbage in [
        b"this is not a profile".to_vec(),
        gzip(b"nor is this"),
        vec![0x1f, 0x8b, 0, 1],
        negative,
    ] {
        let r = post(garbage, Some("t0k"), "a");
        assert_eq!(r.status(), 400);
        let message = r.text().unwrap();
        assert!(
            message.contains("gzip") || message.contains("pprof"),
            "{message}"
        );
    }
    // Over the size limit: 413.
    let mut big = known_profile(t0, 1);
    big.resize(5000, 0);
    assert_eq!(post(big, Some("t0k"), "a").status(), 413);
    assert!(
        stored_files(&store).is_empty(),
        "nothing may be stored so far"
    );

    // Raw and gzip'd pprof from any client; the window from the profile.
    let r = post(known_profile(t0, 3), Some("t0k"), "web-1");
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());
    let r = post(gzip(&known_profile(t0 + s, 4)), Some("t0k"), "web-1");
    assert_eq!(r.status(), 200);
    let r = post(known_profile(t0 + s, 5), Some("t0k"), "web-2");
    assert_eq!(r.status(), 200);
    let files = stored_files(&store);
    assert_eq!(files.len(), 3);
    assert!(files
        .iter()
        .all(|f| decode_pprof_gz(&fs::read(f).unwrap()).sample.len() == 1));
    // No temporary files left behind.
    for f in fs::read_dir(store.join("web-1/2024-05-01")).unwrap() {
        assert!(!f.unwrap().file_name().to_string_lossy().starts_with('.'));
    }

    let get = |query: &str| {
        let r = client
            .get(format!("{url}{query}"))
            .bearer_auth("t0k")
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let (status, list) = get("");
    assert_eq!(status, 200);
    assert_eq!(list.matches("\"host\"").count(), 3, "{list}");
    let (_, list) = get("?host=web-1");
    assert_eq!(list.matches("\"host\":\"web-1\"").count(), 2, "{list}");
    let (_, list) = get(&format!("?from={}&to={}", t0 + s, t0 + 2 * s));
    assert_eq!(list.matches("\"host\"").count(), 2, "{list}");
    let (_, list) = get("?from=2024-05-01T12:00:01Z&host=web-1");
    assert_eq!(list.matches("\"host\"").count(), 1, "{list}");
    let (status, _) = get("?from=yesterday");
    assert_eq!(status, 400);

    // Merged: counts add up over hosts and windows.
    let (status, folded) = get("/merged?format=folded");
    assert_eq!(status, 200);
    assert_eq!(folded, "app;main;leaf 12\n");
    let (_, folded) = get("/merged?format=folded&host=web-1");
    assert_eq!(folded, "app;main;leaf 7\n");
    let (status, svg) = get("/merged?format=flame-graph&host=web-2");
    assert_eq!(status, 200);
    assert!(svg.contains("<svg") && svg.contains("leaf"));
    let merged = client
        .get(format!("{url}/merged?host=web-1"))
        .bearer_auth("t0k")
        .send()
        .unwrap();
    assert_eq!(merged.status(), 200);
    let merged = decode_pprof_gz(&merged.bytes().unwrap());
    assert_eq!(sample_count(&merged), 7);
    assert_eq!(merged.time_nanos as u64, t0);
    assert_eq!(merged.duration_nanos as u64, 2 * s);
    let (status, _) = get("/merged?from=1&to=2");
    assert_eq!(status, 404);
    let (status, _) = get("/merged?format=png");
    assert_eq!(status, 400);
}
