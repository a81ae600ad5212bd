//! The profiler's own heap profile over HTTP (`/debug/pprof/heap`): read
//! by `go tool pprof` and decoded here, mappings included.

use super::*;

/// Heap sampling switched on, a profile request so the agent allocates,
/// then `/debug/pprof/heap` decodes with `go tool pprof -top` and names the
/// agent's own functions; switched off, the setting reads back false.
#[test]
fn heap_profile_of_the_agent() {
    let _serial = common::serial();
    // One sampled allocation per 4 KiB (not 512 KiB): at the default rate a
    // short-lived agent may hold no sampled allocation at the dump, and the
    // profile is empty (seen in CI once the symbolizer allocated less).
    let agent = Agent::start(
        &["--unwind-cache-dir", "none"],
        &[(
            lightswitch::agent::heap::MALLOC_CONF_ENV,
            "lg_prof_sample:12",
        )],
    );
    let settings = agent.url("/debug/pprof/heap/settings");
    assert_eq!(
        body(get(&settings)),
        (
            StatusCode::OK,
            "{\"enabled\":false,\"available\":true}\n".into()
        )
    );
    let on = client()
        .post(format!("{settings}?enabled=true"))
        .send()
        .unwrap();
    assert_eq!(
        body(on),
        (
            StatusCode::OK,
            "{\"enabled\":true,\"available\":true}\n".into()
        )
    );
    assert_eq!(
        body(get(&agent.url("/debug/pprof/profile?seconds=1"))).0,
        StatusCode::OK
    );

    let response = get(&agent.url("/debug/pprof/heap"));
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.bytes().unwrap();
    let dir = common::tempdir();
    let file = dir.path().join("heap.pb.gz");
    fs::write(&file, &bytes).unwrap();
    // With -lines each row names a function and its source line: some must
    // be in this crate's own sources.
    let top = common::go_pprof(&["-top", "-lines", common::s(&file)]);
    let own = format!("{}/src/", env!("CARGO_MANIFEST_DIR"));
    assert!(
        top.lines().any(|l| l.contains(&own)),
        "no allocation site in lightswitch's own code in the heap profile ({} bytes):\n{top}",
        bytes.len()
    );
    let unnamed = check_heap_mappings(&bytes);
    // pprof keeps the names it was given: none of lightswitch's frames is
    // shown as its mapping's file only (it would be, were they symbolized
    // again from the binary).
    let top = common::go_pprof(&["-top", common::s(&file)]);
    assert!(
        unnamed > 0 || !top.contains("[lightswitch]"),
        "go tool pprof shows unnamed lightswitch frames:\n{top}"
    );
    // The allocator's own frames are dropped (the profile's drop_frames):
    // the flat bytes go to the functions that allocated, as in Go's heap
    // profiles, not all to jemalloc's sampling function.
    let allocator = [
        "prof_backtrace_impl",
        "_rjem_",
        "do_rallocx",
        "__rust_alloc",
    ];
    let shown: Vec<&str> = top
        .lines()
        .filter(|l| allocator.iter().any(|a| l.contains(a)))
        .collect();
    assert!(shown.is_empty(), "allocator frames shown:\n{top}");
    let svg = get(&agent.url("/debug/pprof/heap?format=flame-graph"))
        .text()
        .unwrap();
    assert!(svg.contains("<svg"), "{svg}");

    let off = client()
        .post(format!("{settings}?enabled=false"))
        .send()
        .unwrap();
    assert_eq!(body(off).0, StatusCode::OK);
    assert_eq!(
        body(get(&settings)),
        (
            StatusCode::OK,
            "{\"enabled\":false,\"available\":true}\n".into()
        )
    );
    let (status, text) = body(get(&format!("{settings}?enabled=true")));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("POST"), "{text}");
    let bad = client()
        .post(format!("{settings}?enabled=maybe"))
        .send()
        .unwrap();
    assert_eq!(body(bad).0, StatusCode::BAD_REQUEST);
}

/// Decode the heap profile (gzip'd pprof) and check the lightswitch
/// binary's mappings: one segment each, in address order without overlap
/// (not each the whole address space), holding its locations' addresses, `has_functions` where its
/// locations are named, and some of the functions named `lightswitch::`.
/// Returns how many of its locations have no function.
fn check_heap_mappings(gzip: &[u8]) -> usize {
    use lightswitch::profile::format::pprof::proto;
    use prost::Message;
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gzip), &mut raw).unwrap();
    let p = proto::Profile::decode(raw.as_slice()).expect("decoding the heap profile");
    let string = |i: i64| p.string_table[i as usize].as_str();
    let ours: Vec<&proto::Mapping> = p
        .mapping
        .iter()
        .filter(|m| string(m.filename).ends_with("/lightswitch"))
        .collect();
    assert!(
        !ours.is_empty(),
        "no mapping of the lightswitch binary: {:?}",
        p.mapping
    );
    let ranges: Vec<(u64, u64)> = ours
        .iter()
        .map(|m| (m.memory_start, m.memory_limit))
        .collect();
    assert!(
        ranges.windows(2).all(|w| w[0].1 <= w[1].0),
        "segments in address order, none overlapping: {ranges:#x?}"
    );
    let (mut named, mut unnamed) = (0, 0);
    for m in &ours {
        assert!(
            m.memory_start < m.memory_limit && m.memory_limit < 1 << 48,
            "{m:?}"
        );
        for l in p.location.iter().filter(|l| l.mapping_id == m.id) {
            assert!(
                (m.memory_start..m.memory_limit).contains(&l.address),
                "{l:?} outside {m:?}"
            );
            assert!(
                m.has_functions || l.line.is_empty(),
                "{l:?} is named; {m:?}"
            );
            unnamed += usize::from(l.line.is_empty());
            named += l
                .line
                .iter()
                .filter(|line| {
                    let f = &p.function[line.function_id as usize - 1];
                    string(f.name).contains("lightswitch::")
                })
                .count();
        }
    }
    assert!(
        named > 0,
        "no frame of the lightswitch binary names a lightswitch:: function"
    );
    unnamed
}
