//! The agent's HTTP API (`--listen`), on loopback only: on-demand CPU
//! profiles of real programs read by `go tool pprof` and as folded stacks
//! and flame graphs, overlapping requests with their own pid filters, the
//! profiler's own heap profile, metrics, the error answers (token, bad
//! query, unknown path, too many requests, frequency conflict), and the
//! off-CPU waits of the web view's recordings (`off_cpu.rs`).
//!
//! Needs root (BPF), gcc and Go (`go tool pprof`). Every request and wait is
//! bounded in time.

#[path = "../common/mod.rs"]
mod common;
mod heap;
mod off_cpu;

use std::collections::BTreeMap;
use std::fs;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{Workload, BIN};
use reqwest::blocking::{Client, Response};
use reqwest::StatusCode;

/// A `lightswitch --listen 127.0.0.1:0 ...` agent; killed on drop.
struct Agent {
    child: Child,
    url: String,
    stdout: Option<mpsc::Receiver<String>>,
}

impl Agent {
    /// Start the agent with `args` and `envs`, and wait (at most 30 s) for
    /// it to say where it listens.
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Agent {
        let mut cmd = Command::new(BIN);
        cmd.args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(envs.iter().copied());
        let (child, url, rx) = common::spawn_listening(cmd, Duration::from_secs(30));
        Agent {
            child,
            url,
            stdout: Some(rx),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// Perf events the agent has open now.
    fn perf_events(&self) -> usize {
        fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|dir| {
                dir.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
                    .filter(|target| target.to_string_lossy().contains("[perf_event]"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Stop the agent with SIGINT and return what it printed after the banner.
    fn stop(self) -> String {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        self.wait()
    }

    /// Wait (at most 30 s) for the agent to exit successfully; what it
    /// printed after the banner.
    fn wait(mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "lightswitch did not stop within 30 s"
            );
            thread::sleep(Duration::from_millis(20));
        };
        let lines: Vec<String> = self.stdout.take().unwrap().try_iter().collect();
        let out = lines.join("\n");
        assert!(status.success(), "lightswitch failed ({status}):\n{out}");
        out
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn get(url: &str) -> Response {
    client()
        .get(url)
        .send()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

fn body(response: Response) -> (StatusCode, String) {
    let status = response.status();
    (status, response.text().unwrap())
}

/// A busy workload running the known chain, named `name`.
fn workload(name: &str) -> (common::Program, Workload) {
    let program = common::compile(name, &common::chain_forever_source(), common::FP_FLAGS);
    let workload = Workload::spawn(&program);
    (program, workload)
}

/// The function names of `go tool pprof -top` rows.
fn top_functions(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(5).map(str::to_string))
        .collect()
}

/// Folded stacks of `name` whose user frames end with the known chain,
/// asserting that every stack is `name`'s and that most carry the chain.
fn assert_only_chain_of(text: &str, name: &str) {
    let stacks = common::parse_folded(text);
    assert!(
        common::total(&stacks) >= 5,
        "too few samples of {name}:\n{text}"
    );
    let others: Vec<&common::Stack> = stacks
        .iter()
        .filter(|(f, _)| common::comm(f) != name)
        .collect();
    assert!(
        others.is_empty(),
        "samples of other processes in {name}'s profile:\n{}",
        common::show(&others)
    );
    let chained: u64 = stacks
        .iter()
        .filter(|(f, _)| common::ends_with_chain(&common::user_frames(f), common::CHAIN))
        .map(|(_, n)| n)
        .sum();
    assert!(
        chained * 10 >= common::total(&stacks) * 8,
        "the chain is missing from most of {name}'s stacks:\n{}",
        common::show(&stacks.iter().collect::<Vec<_>>())
    );
}

/// Parse Prometheus text exposition strictly: every sample belongs to a
/// family declared by `# TYPE` before it; returns `name{labels}` -> value.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            assert!(valid_name(name), "bad metric name in {line:?}");
            assert!(["counter", "gauge"].contains(&kind), "bad type in {line:?}");
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "family declared twice: {line:?}"
            );
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(
            !line.is_empty() && !line.starts_with('#'),
            "unexpected line {line:?}"
        );
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let name = series.split('{').next().unwrap();
        assert!(valid_name(name), "bad metric name in {line:?}");
        assert!(
            types.contains_key(name),
            "sample before its # TYPE: {line:?}"
        );
        if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
            let inner = labels
                .strip_prefix('{')
                .and_then(|l| l.strip_suffix('}'))
                .unwrap_or_else(|| panic!("bad labels in {line:?}"));
            for pair in inner.split(',') {
                let (k, v) = pair.split_once('=').expect("label pair");
                assert!(valid_name(k), "bad label name in {line:?}");
                assert!(
                    v.len() >= 2 && v.starts_with('"') && v.ends_with('"'),
                    "bad label value in {line:?}"
                );
            }
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        samples.insert(series.to_string(), value);
    }
    samples
}

/// `go tool pprof -top` on the live URL shows the chain; two overlapping
/// requests with different pid filters each get only their process; the
/// flame graph is SVG with the chain; the sample counter grows while
/// profiling; perf events are open only while a request is in progress.
#[test]
fn on_demand_profiles() {
    let _serial = common::serial();
    let name_a = common::unique_name("httpa");
    let name_b = common::unique_name("httpb");
    let (_pa, wa) = workload(&name_a);
    let (_pb, wb) = workload(&name_b);
    let agent = Agent::start(&["--unwind-cache-dir", "none"], &[]);
    assert_eq!(
        agent.perf_events(),
        0,
        "listen-only mode samples while idle"
    );
    let metrics_before = parse_prometheus(&body(get(&agent.url("/metrics"))).1);

    let url = agent.url(&format!("/debug/pprof/profile?seconds=2&pids={}", wa.pid()));
    let top = common::go_pprof(&["-top", &url]);
    let functions = top_functions(&top);
    for f in common::CHAIN {
        assert!(
            functions.iter().any(|g| g == f),
            "{f} missing from `go tool pprof -top`:\n{top}"
        );
    }

    let metrics_after = parse_prometheus(&body(get(&agent.url("/metrics"))).1);
    let samples = |m: &BTreeMap<String, f64>| m["lightswitch_samples_total"];
    assert!(
        samples(&metrics_after) > samples(&metrics_before) + 20.0,
        "lightswitch_samples_total did not grow: {metrics_before:?} -> {metrics_after:?}"
    );
    assert!(metrics_after["process_resident_memory_bytes"] > 1e6);
    // jemalloc's counters: live heap within what it holds resident.
    let heap = |kind: &str| metrics_after[&format!("lightswitch_heap_bytes{{kind=\"{kind}\"}}")];
    assert!(heap("allocated") > 1e5, "{metrics_after:?}");
    assert!(heap("allocated") <= heap("active") && heap("active") <= heap("resident"));
    assert!(metrics_after.contains_key("lightswitch_samples_lost_total"));
    assert!(metrics_after.contains_key("lightswitch_unwind_table_bytes"));
    assert!(metrics_after
        .contains_key("lightswitch_symbol_tables_built_total{table=\"minidebuginfo\"}"));
    // Issue 18: what a retired mapping or a panic in one window cost.
    assert_eq!(
        metrics_after["lightswitch_samples_missing_mapping_total"],
        0.0
    );
    assert_eq!(
        metrics_after["lightswitch_windows_total{outcome=\"panicked\"}"],
        0.0
    );
    assert!(metrics_after.contains_key("lightswitch_unwind_results_total{result=\"complete\"}"));

    // Overlapping requests, one per process.
    let folded = |pid: u32, delay: Duration| {
        let url = agent.url(&format!(
            "/debug/pprof/profile?seconds=2&format=folded&pids={pid}"
        ));
        thread::spawn(move || {
            thread::sleep(delay);
            body(get(&url))
        })
    };
    let a = folded(wa.pid(), Duration::ZERO);
    let b = folded(wb.pid(), Duration::from_millis(700));
    let (status_a, text_a) = a.join().unwrap();
    let (status_b, text_b) = b.join().unwrap();
    assert_eq!(status_a, StatusCode::OK, "{text_a}");
    assert_eq!(status_b, StatusCode::OK, "{text_b}");
    assert_only_chain_of(&text_a, &name_a);
    assert_only_chain_of(&text_b, &name_b);

    let response = get(&agent.url(&format!(
        "/debug/pprof/profile?seconds=1&format=flame-graph&pids={}",
        wb.pid()
    )));
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "image/svg+xml");
    let svg = response.text().unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options)
        .expect("the flame graph is well-formed SVG");
    // The title says what the request profiled.
    let title = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("title"))
        .and_then(|n| n.text());
    assert_eq!(
        title,
        Some(format!("CPU profile of pid {} (on demand)", wb.pid()).as_str())
    );
    for f in common::CHAIN {
        assert!(svg.contains(f), "{f} missing from the flame graph");
    }

    // Idle again: the perf events close once no request is in progress.
    let deadline = Instant::now() + Duration::from_secs(3);
    while agent.perf_events() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(agent.perf_events(), 0, "perf events stay open while idle");
    let summary = agent.stop();
    assert!(summary.contains("4 on-demand profiles served"), "{summary}");
}

/// Token, bad query, unknown path, too many requests and a frequency
/// conflict.
#[test]
fn errors_and_limits() {
    let _serial = common::serial();
    let agent = Agent::start(
        &[
            "--listen-max-requests",
            "2",
            "--listen-max-seconds",
            "5",
            "--unwind-cache-dir",
            "none",
        ],
        &[("LIGHTSWITCH_LISTEN_TOKEN", "s3cret")],
    );
    let authed = |url: &str| {
        client()
            .get(url)
            .bearer_auth("s3cret")
            .send()
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
    };
    assert_eq!(
        body(get(&agent.url("/healthz"))),
        (StatusCode::OK, "ok\n".into())
    );
    for path in [
        "/metrics",
        "/debug/pprof/heap",
        "/debug/pprof/profile?seconds=1",
        "/nope",
    ] {
        let response = get(&agent.url(path));
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let wrong = client()
            .get(agent.url(path))
            .bearer_auth("s3creT")
            .send()
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    assert_eq!(authed(&agent.url("/metrics")).status(), StatusCode::OK);
    let (status, text) = body(authed(&agent.url("/nope")));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(text.contains("/nope"), "{text}");
    for (query, expected) in [
        ("seconds=0", "seconds"),
        ("seconds=6", "at most 5"),
        ("pids=12,abc", "\"abc\" is not a process id"),
        ("format=png", "not one of pprof, flame-graph, folded"),
        ("sample_freq=0", "sample_freq"),
        ("second=1", "unknown query parameter"),
    ] {
        let (status, text) = body(authed(&agent.url(&format!("/debug/pprof/profile?{query}"))));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {text}");
        assert!(text.contains(expected), "{query}: {text}");
    }
    // Above the largest pid_max (2^22): no such process can exist.
    let (status, text) = body(authed(
        &agent.url("/debug/pprof/profile?seconds=1&pids=4194305"),
    ));
    assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
    assert!(text.contains("process 4194305 does not exist"), "{text}");

    // Two requests in progress (the limit), the first at 99 Hz.
    let long = |delay_ms: u64| {
        let url = agent.url("/debug/pprof/profile?seconds=2&sample_freq=99&format=folded");
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(delay_ms));
            client()
                .get(&url)
                .bearer_auth("s3cret")
                .send()
                .unwrap()
                .status()
        })
    };
    let first = long(0);
    thread::sleep(Duration::from_millis(400));
    let (status, text) = body(authed(
        &agent.url("/debug/pprof/profile?seconds=1&sample_freq=49"),
    ));
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("99 Hz"), "{text}");
    let second = long(0);
    thread::sleep(Duration::from_millis(400));
    let (status, text) = body(authed(&agent.url("/debug/pprof/profile?seconds=1")));
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
    assert_eq!(first.join().unwrap(), StatusCode::OK);
    assert_eq!(second.join().unwrap(), StatusCode::OK);
    let metrics = parse_prometheus(&body(authed(&agent.url("/metrics"))).1);
    assert_eq!(
        metrics["lightswitch_profile_requests_total{outcome=\"too_many\"}"],
        1.0
    );
    assert_eq!(
        metrics["lightswitch_profile_requests_total{outcome=\"conflict\"}"],
        1.0
    );
    assert_eq!(
        metrics["lightswitch_profile_requests_total{outcome=\"served\"}"],
        2.0
    );
    agent.stop();
}

/// `--listen` beside a `--duration` run with `--pids`: requests share its
/// sampling at `--sample-freq` (another frequency gets 409), may only narrow
/// its pids, and a request that outlives the run gets 503; the run still
/// writes its own profile.
#[test]
fn listen_beside_a_run() {
    let _serial = common::serial();
    let name = common::unique_name("httpc");
    let (_program, w) = workload(&name);
    let dir = common::tempdir();
    let agent = Agent::start(
        &[
            "--duration",
            "4",
            "--pids",
            &w.pid_arg(),
            "--profile-format",
            "folded",
            "--profile-path",
            common::s(dir.path()),
        ],
        &[],
    );
    assert!(
        agent.perf_events() > 0,
        "a --duration run samples from the start"
    );
    let late = {
        let url = agent.url("/debug/pprof/profile?seconds=10");
        thread::spawn(move || body(get(&url)))
    };
    let (status, text) = body(get(
        &agent.url("/debug/pprof/profile?seconds=1&format=folded")
    ));
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_only_chain_of(&text, &name);
    let (status, text) = body(get(
        &agent.url("/debug/pprof/profile?seconds=1&sample_freq=49")
    ));
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("99 Hz"), "{text}");
    let other = if w.pid() == 1 { 2 } else { 1 };
    let (status, text) = body(get(
        &agent.url(&format!("/debug/pprof/profile?seconds=1&pids={other}"))
    ));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("--pids"), "{text}");
    let (status, text) = late.join().unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    let summary = agent.wait();
    assert!(summary.contains("profile written to"), "{summary}");
    let written = common::read_folded(&dir.path().join("folded.txt"));
    assert!(common::total(&written) > 0, "{summary}");
}

/// `/metrics` never shows more windows written than closed: a window is
/// counted closed before it is handed to the worker that writes it. Short
/// windows, scraped as fast as the agent answers, for two seconds.
#[test]
fn windows_written_never_exceed_closed() {
    let _serial = common::serial();
    let name = common::unique_name("httpw");
    let (_program, w) = workload(&name);
    let dir = common::tempdir();
    let agent = Agent::start(
        &[
            "--duration",
            "3",
            "--profile-interval",
            "100ms",
            "--pids",
            &w.pid_arg(),
            "--profile-format",
            "folded",
            "--profile-path",
            common::s(dir.path()),
        ],
        &[],
    );
    let windows = |m: &BTreeMap<String, f64>, outcome: &str| {
        m[&format!("lightswitch_windows_total{{outcome=\"{outcome}\"}}")]
    };
    let started = Instant::now();
    let mut most_written = 0.0;
    while started.elapsed() < Duration::from_secs(2) {
        let metrics = parse_prometheus(&body(get(&agent.url("/metrics"))).1);
        let (closed, written) = (windows(&metrics, "closed"), windows(&metrics, "written"));
        assert!(written <= closed, "{written} written, {closed} closed");
        most_written = f64::max(most_written, written);
    }
    assert!(most_written >= 3.0, "{most_written} windows written");
    let summary = agent.wait();
    assert!(summary.contains("windows written to"), "{summary}");
}
