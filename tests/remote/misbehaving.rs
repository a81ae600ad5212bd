//! The profiler's sender against servers that fail, stall, refuse or
//! lie: nothing lost that can be kept, every failure said.

use super::*;

#[test]
fn server_errors_are_retried_and_the_profile_delivered_once() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_remote500");
    let server = TestServer::start(Box::new(|n, _| {
        Some(if n < 2 {
            (500, "try again".to_string())
        } else {
            (200, "ok".to_string())
        })
    }));
    let out = profile_continuously(
        &workload,
        &[
            "--sender",
            "remote",
            "--server-url",
            &server.url("/ingest"),
            "--profile-interval",
            "1",
            "--duration",
            "1",
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.windows, 1, "{out}");
    assert_eq!(
        (
            summary.get("delivery.sent"),
            summary.get("delivery.retried"),
            summary.get("delivery.dropped"),
            summary.get("delivery.rejected")
        ),
        (1, 2, 0, 0),
        "{out}"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "requests: {requests:?}");
    // The same profile each time, with the documented headers.
    for r in &requests {
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/ingest");
        assert_eq!(r.body, requests[0].body);
        assert_eq!(r.headers["content-type"], "application/vnd.google.protobuf");
        assert_eq!(r.headers["content-encoding"], "gzip");
        assert_eq!(
            r.headers["x-lightswitch-host"],
            lightswitch::output::sender::hostname()
        );
        let start: u64 = r.headers["x-lightswitch-window-start"].parse().unwrap();
        let end: u64 = r.headers["x-lightswitch-window-end"].parse().unwrap();
        assert!(end > start);
        assert!(!r.headers.contains_key("authorization"));
    }
    assert_eq!(
        sample_count(&decode_pprof_gz(&requests[0].body)),
        summary.samples
    );
}

#[test]
fn sigterm_without_duration_flushes_the_partial_last_window() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_remote_sig");
    let server = TestServer::start(Box::new(|_, _| Some((200, String::new()))));
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg()])
        .args([
            "--sender",
            "remote",
            "--server-url",
            &server.url("/v1/profiles"),
        ])
        .args(["--profile-interval", "1"]);
    let mut profiler = Lightswitch::spawn_command(cmd);
    profiler.expect_sampling();
    thread::sleep(Duration::from_millis(2500));
    profiler.signal(libc::SIGTERM);
    let out = profiler.wait(Duration::from_secs(30));
    out.assert_success();
    let summary = Summary::parse(&out);
    assert!(summary.windows >= 2, "{out}");
    assert_eq!(summary.get("delivery.sent"), summary.windows, "{out}");
    let mut windows: Vec<(u64, u64)> = server
        .requests()
        .iter()
        .map(|r| {
            (
                r.headers["x-lightswitch-window-start"].parse().unwrap(),
                r.headers["x-lightswitch-window-end"].parse().unwrap(),
            )
        })
        .collect();
    windows.sort();
    assert_eq!(windows.len() as u64, summary.windows);
    for pair in windows.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "windows must meet: {windows:?}");
    }
    let (start, end) = *windows.last().unwrap();
    assert!(
        end - start < 1_000_000_000,
        "the last window is partial: {windows:?}"
    );
    let total: u64 = server
        .requests()
        .iter()
        .map(|r| sample_count(&decode_pprof_gz(&r.body)))
        .sum();
    assert_eq!(total, summary.samples);
}

#[test]
fn unauthorized_is_not_retried_and_logged_with_the_servers_message() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_remote401");
    let server = TestServer::start(Box::new(|_, _| {
        Some((401, "token expired for tenant acme".to_string()))
    }));
    let mut cmd = lightswitch_command();
    cmd.env("LIGHTSWITCH_TOKEN", "s3cret")
        .args(["--pids", &workload.pid_arg()])
        .args([
            "--sender",
            "remote",
            "--server-url",
            &server.url("/v1/profiles"),
        ])
        .args(["--profile-interval", "1", "--duration", "1"]);
    let out = Lightswitch::spawn_command(cmd).wait(Duration::from_secs(60));
    // A profile the server refused is lost: the exit status says so, and
    // the error names the server's answer.
    out.assert_error(&[
        "1 profile not delivered",
        "rejected=1",
        "first error: HTTP 401",
        "token expired for tenant acme",
    ]);
    let summary = Summary::parse(&out);
    assert_eq!(
        (
            summary.get("delivery.sent"),
            summary.get("delivery.retried"),
            summary.get("delivery.rejected")
        ),
        (0, 0, 1),
        "{out}"
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "a 401 must not be retried");
    assert_eq!(requests[0].headers["authorization"], "Bearer s3cret");
    assert!(
        out.stderr.contains("401") && out.stderr.contains("token expired for tenant acme"),
        "the log does not show the status and the server's message:\n{out}"
    );
    assert!(out.stderr.contains("not retried"), "{out}");
    assert!(!out.stderr.contains("s3cret") && !out.stdout.contains("s3cret"));
}

#[test]
fn stalled_server_does_not_slow_sampling_and_the_queue_drops_oldest() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_stall");
    let server = TestServer::start(Box::new(|_, _| None));
    let url = server.url("/v1/profiles");
    let pid = workload.pid_arg();
    let args = [
        "--pids",
        &pid,
        "--sample-freq",
        "99",
        "--sender",
        "remote",
        "--server-url",
        &url,
        "--profile-interval",
        "0.5",
        "--duration",
        "4",
        "--send-timeout",
        "1",
        "--send-queue-bytes",
        "1",
        "--flush-timeout",
        "1",
    ];
    // As common::profile_workload, with the proxy-free command.
    let started = Instant::now();
    let cpu_start = workload.cpu_time();
    let mut cmd = lightswitch_command();
    cmd.args(args);
    let mut profiler = Lightswitch::spawn_command(cmd);
    profiler.expect_sampling();
    let cpu_window_start = workload.cpu_time();
    thread::sleep(Duration::from_secs(4));
    let cpu_window = workload.cpu_time() - cpu_window_start;
    let out = profiler.wait(Duration::from_secs(60));
    let profiled = common::Profiled {
        out,
        cpu_total: workload.cpu_time() - cpu_start,
        cpu_window,
    };
    let elapsed = started.elapsed();
    let out = &profiled.out;
    // Profiles dropped unsent are lost: the exit status says so.
    out.assert_error(&["profiles not delivered"]);
    let summary = Summary::parse(out);
    // Every window was closed and handed over on time, none sent.
    assert_eq!(summary.windows, 8, "{out}");
    assert_eq!(summary.get("windows.dropped"), 0, "{out}");
    assert_eq!(summary.get("delivery.sent"), 0, "{out}");
    assert!(summary.get("delivery.dropped") >= 5, "{out}");
    assert!(out.stderr.contains("send queue full"), "{out}");
    assert_eq!(summary.lost, 0, "{out}");
    // Sampling went on at full rate meanwhile.
    profiled.assert_plausible(summary.samples, 99.0);
    // Bounded shutdown: duration + flush deadline + start-up, not the stall.
    assert!(elapsed < Duration::from_secs(25), "took {elapsed:?}\n{out}");
    assert!(!server.requests().is_empty());
}

#[test]
fn pyroscope_push_has_labels_tenant_auth_and_gzipped_pprof() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_pyro");
    let server = TestServer::start(Box::new(|_, _| Some((200, String::new()))));
    let base = format!("http://alice:pa%24s@127.0.0.1:{}", server.port);
    let out = profile_continuously(
        &workload,
        &[
            "--sender",
            "pyroscope",
            "--server-url",
            &base,
            "--pyroscope-app-name",
            "checkout",
            "--pyroscope-tenant-id",
            "tenant-7",
            "--label",
            "env=test",
            "--label",
            "zone=z1",
            "--profile-interval",
            "1",
            "--duration",
            "2",
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.get("delivery.sent"), 2, "{out}");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let mut total = 0;
    for r in &requests {
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/push.v1.PusherService/Push");
        assert_eq!(r.headers["content-type"], "application/proto");
        assert_eq!(r.headers["x-scope-orgid"], "tenant-7");
        // base64("alice:pa$s")
        assert_eq!(r.headers["authorization"], "Basic YWxpY2U6cGEkcw==");
        let push = lightswitch::output::sender::pyroscope::proto::push::v1::PushRequest::decode(
            r.body.as_slice(),
        )
        .expect("a push.v1.PushRequest");
        assert_eq!(push.series.len(), 1);
        let series = &push.series[0];
        let labels: BTreeMap<&str, &str> = series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        let host = lightswitch::output::sender::hostname();
        let expected: BTreeMap<&str, &str> = [
            ("__name__", "process_cpu"),
            ("service_name", "checkout"),
            ("host", host.as_str()),
            ("env", "test"),
            ("zone", "z1"),
        ]
        .into_iter()
        .collect();
        assert_eq!(labels, expected);
        assert_eq!(series.samples.len(), 1);
        assert_eq!(series.samples[0].id.len(), 36, "a UUID");
        let raw = &series.samples[0].raw_profile;
        assert_eq!(&raw[..2], &[0x1f, 0x8b], "raw_profile is gzip'd");
        let pprof = decode_pprof_gz(raw);
        assert!(pprof.time_nanos > 0);
        total += sample_count(&pprof);
    }
    assert_eq!(total, summary.samples);
}
