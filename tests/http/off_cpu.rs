//! Off-CPU waits in the agent's own recordings: an agent started with
//! `--listen --off-cpu` records the waiter program through `POST
//! /v1/recordings` (what the web view does), and its merged profile of the
//! recording's range shows where the program waited, as the collector's
//! does (tests/remote/off_cpu.rs): pprof's off_cpu sample type read by `go
//! tool pprof -sample_index=off_cpu`, the off-CPU folded twin and flame
//! graph, and the `X-Lightswitch-Off-Cpu-Waits` header.

use super::*;

/// `GET url` answered 200: its body and its header `X-Lightswitch-Off-Cpu-Waits`.
fn merged(url: &str) -> (Vec<u8>, u64) {
    let response = get(url);
    let status = response.status();
    let waits = response
        .headers()
        .get("x-lightswitch-off-cpu-waits")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let bytes = response.bytes().unwrap().to_vec();
    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&bytes));
    (
        bytes,
        waits.unwrap_or_else(|| panic!("{url}: no waits header")),
    )
}

/// The waiter's 10 × 100 ms sleeps, recorded by an `--off-cpu` agent,
/// come back from its merged profile of the recording's range as 1.0 s
/// (±10%) off-CPU under `waiter` in `clock_nanosleep`.
#[test]
fn a_recording_keeps_where_threads_waited() {
    let _serial = common::serial();
    let program = common::compile(
        "lsw_http_offcpu",
        &common::waiter_burner_source(),
        common::FP_FLAGS,
    );
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&["--off-cpu", "--sample-freq", "999"], &[]);
    let record_url = agent.url("/v1/recordings?seconds=4");
    let recording = thread::spawn(move || {
        let response = client().post(&record_url).send().unwrap();
        body(response)
    });
    // The recording's span starts when sampling does.
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.perf_events() == 0 {
        assert!(Instant::now() < deadline, "the recording never started");
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(200));
    let status = Command::new(&program.path)
        .arg(dir.path().join("wall_ms"))
        .status()
        .unwrap();
    assert!(status.success(), "{} failed: {status}", program.name);
    let (status, described) = recording.join().unwrap();
    assert_eq!(status, StatusCode::OK, "{described}");
    let described: serde_json::Value = serde_json::from_str(&described).unwrap();
    let field = |k: &str| described[k].as_str().unwrap().to_string();
    let (from, to) = (field("from"), field("to"));
    assert!(described["waits"].as_u64().unwrap() >= 10, "{described}");
    let url = |format: &str| {
        agent.url(&format!(
            "/v1/profiles/merged?from={from}&to={to}&format={format}"
        ))
    };

    let (pprof_bytes, waits) = merged(&url("pprof"));
    assert!(waits >= 10, "{waits} waits in the range");
    let pprof_file = dir.path().join("merged.pb.gz");
    fs::write(&pprof_file, pprof_bytes).unwrap();
    let pprof = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-sample_index=off_cpu", "-unit=ms", common::s(&pprof_file)]);
        common::go_pprof(&all)
    };
    let waited_ms = common::pprof_cumulative_ms(&pprof(&["-top"]), "waiter");
    let sleeping_ms =
        common::pprof_cumulative_ms(&pprof(&["-top", "-focus=clock_nanosleep"]), "waiter");
    for ms in [waited_ms, sleeping_ms] {
        assert!(
            (900.0..=1100.0).contains(&ms),
            "pprof off_cpu: {waited_ms} ms under waiter, {sleeping_ms} ms of it in \
             clock_nanosleep; not 1.0 s ±10%"
        );
    }

    let (folded, _) = merged(&url("folded-off-cpu"));
    let folded = String::from_utf8(folded).unwrap();
    let slept = common::folded_ns_under_waiter(&folded, &program.name);
    assert!(
        (0.9e9..=1.1e9).contains(&(slept as f64)),
        "{slept} ns off-CPU under waiter in clock_nanosleep:\n{folded}"
    );
    // Without from and to, the range is all the recordings (here one), as
    // on the collector: the same profile (before: 400, "from= is missing").
    let (open, open_waits) = merged(&agent.url("/v1/profiles/merged?format=folded-off-cpu"));
    assert_eq!(String::from_utf8(open).unwrap(), folded);
    assert_eq!(open_waits, waits);
    let (svg, _) = merged(&url("flame-graph-off-cpu"));
    let svg = String::from_utf8(svg).unwrap();
    assert!(svg.contains("Off-CPU") && svg.contains("waiter"));
    eprintln!(
        "agent recording: {waited_ms} ms off-CPU under waiter (pprof), {sleeping_ms} ms of it \
         in clock_nanosleep; folded {slept} ns; {waits} waits"
    );
    agent.stop();
}
