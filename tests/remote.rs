//! Continuous profiling over the network, on loopback only: the profiler
//! (real BPF, as root) sending windows to a `lightswitch collector`
//! subprocess and to small HTTP servers written here (failing, stalling,
//! refusing, Pyroscope), and the collector's own API.
//!
//! Every server binds 127.0.0.1 (port 0 or a port just found free); every
//! loop and wait is bounded in time.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use common::{Lightswitch, Output, Workload, BIN};
use lightswitch::format::pprof::proto;
use prost::Message;

// ---------------------------------------------------------------------------
// Helpers

/// The profiler binary, talking to loopback directly even where the
/// environment names an HTTP proxy.
fn lightswitch_command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    cmd
}

/// A busy workload with a known call chain, profiled with `--pids`.
fn workload(name: &str) -> (common::Program, Workload) {
    let program = common::compile(name, &common::chain_forever_source(), common::FP_FLAGS);
    let workload = Workload::spawn(&program);
    (program, workload)
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

/// A `lightswitch collector` subprocess; killed on drop.
struct Collector {
    child: Child,
    url: String,
    storage: PathBuf,
}

impl Collector {
    /// Start a collector on `port` (0: any free one) storing in `storage`.
    fn start(port: u16, storage: &Path, extra: &[&str]) -> Collector {
        let mut cmd = lightswitch_command();
        cmd.args([
            "collector",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--storage",
        ])
        .arg(storage)
        .args(extra);
        let (child, url, _) = common::spawn_listening(cmd, Duration::from_secs(20));
        Collector {
            child,
            url,
            storage: storage.to_path_buf(),
        }
    }

    fn profiles_url(&self) -> String {
        format!("{}/v1/profiles", self.url)
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every stored profile file under `dir`, sorted by path.
fn stored_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(".pb.gz") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut raw)
        .expect("gzip data");
    raw
}

fn decode_pprof_gz(bytes: &[u8]) -> proto::Profile {
    proto::Profile::decode(gunzip(bytes).as_slice()).expect("a pprof profile")
}

/// Sum of the `samples/count` values of a pprof profile.
fn sample_count(p: &proto::Profile) -> u64 {
    let s = |i: i64| p.string_table[i as usize].as_str();
    let index = p
        .sample_type
        .iter()
        .position(|t| s(t.r#type) == "samples" && s(t.unit) == "count")
        .expect("a samples/count sample type");
    p.sample.iter().map(|x| x.value[index] as u64).sum()
}

/// Function names appearing in a pprof profile.
fn function_names(p: &proto::Profile) -> Vec<String> {
    p.function
        .iter()
        .map(|f| p.string_table[f.name as usize].clone())
        .collect()
}

/// The continuous-mode summary: the first line's numbers and every
/// `key=value` of the `windows:` and `delivery:` lines.
#[derive(Debug)]
struct Summary {
    windows: u64,
    samples: u64,
    lost: u64,
    values: BTreeMap<String, u64>,
}

impl Summary {
    fn parse(out: &Output) -> Summary {
        let first = out
            .stdout
            .lines()
            .find(|l| {
                [" queued for ", " written to "].iter().any(|verb| {
                    l.contains(&format!(" windows{verb}")) || l.contains(&format!(" window{verb}"))
                })
            })
            .unwrap_or_else(|| panic!("no continuous summary in stdout:\n{out}"));
        let windows = first.split(' ').next().unwrap().parse().unwrap();
        let (_, counts) = first.rsplit_once(": ").unwrap();
        let numbers: Vec<u64> = counts
            .split(", ")
            .map(|part| part.split(' ').next().unwrap().parse().unwrap())
            .collect();
        let mut values = BTreeMap::new();
        for line in out.stdout.lines() {
            let Some((section, rest)) = line.split_once(": ") else {
                continue;
            };
            if section != "windows" && section != "delivery" {
                continue;
            }
            for pair in rest.split(' ') {
                if let Some((k, v)) = pair.split_once('=') {
                    values.insert(format!("{section}.{k}"), v.parse().unwrap());
                }
            }
        }
        Summary {
            windows,
            samples: numbers[0],
            lost: numbers[2],
            values,
        }
    }

    fn get(&self, key: &str) -> u64 {
        *self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in the summary: {self:?}"))
    }
}

/// One HTTP request as a test server saw it.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    path: String,
    /// Lower-case names.
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// Read one HTTP/1.1 request (Content-Length bodies only).
fn read_request(stream: &mut TcpStream) -> Option<Request> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

fn respond(stream: &mut TcpStream, status: u16, body: &str) {
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.flush();
}

/// What a test server does with the n-th request (0-based): answer with a
/// status and body, or `None` to stall (hold the connection, never answer).
type Handler = Box<dyn FnMut(usize, &Request) -> Option<(u16, String)> + Send>;

/// A one-thread HTTP server on 127.0.0.1 for at most 60 s.
struct TestServer {
    port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(mut handler: Handler) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, stopped) = (requests.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut held = Vec::new();
            while !stopped.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        let Some(request) = read_request(&mut stream) else {
                            continue;
                        };
                        let n = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(request.clone());
                            seen.len() - 1
                        };
                        match handler(n, &request) {
                            Some((status, body)) => respond(&mut stream, status, &body),
                            None => held.push(stream),
                        }
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        TestServer {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Profile `workload` continuously with `args` (after the common ones) and
/// wait for the run to end (at most `timeout`).
fn profile_continuously(workload: &Workload, args: &[&str], timeout: Duration) -> Output {
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "99"])
        .args(args);
    Lightswitch::spawn_command(cmd).wait(timeout)
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------
// Profiler -> collector

#[test]
fn three_windows_reach_the_collector_contiguous_and_complete() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_remote3");
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(0, &dir.path().join("store"), &[]);
    let out = profile_continuously(
        &workload,
        &[
            "--sender",
            "remote",
            "--server-url",
            &collector.profiles_url(),
            "--profile-interval",
            "1",
            "--duration",
            "3",
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.windows, 3, "{out}");
    assert_eq!(summary.get("delivery.sent"), 3, "{out}");
    assert_eq!(summary.get("delivery.dropped"), 0, "{out}");
    assert_eq!(summary.get("windows.late_samples"), 0, "{out}");
    assert!(
        summary.samples > 50,
        "too few samples of a busy loop: {out}"
    );

    let files = stored_files(&collector.storage);
    assert_eq!(files.len(), 3, "{files:?}");
    let host = lightswitch::sender::hostname();
    let mut profiles: Vec<proto::Profile> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(&collector.storage).unwrap();
            assert!(
                rel.starts_with(&host),
                "{} is not under the host",
                rel.display()
            );
            decode_pprof_gz(&fs::read(f).unwrap())
        })
        .collect();
    profiles.sort_by_key(|p| p.time_nanos);
    for pair in profiles.windows(2) {
        let end = pair[0].time_nanos + pair[0].duration_nanos;
        assert!(
            (end - pair[1].time_nanos).abs() < 1_000_000,
            "windows do not meet: one ends at {end}, the next starts at {}",
            pair[1].time_nanos
        );
    }
    for p in &profiles[..2] {
        assert!(
            (p.duration_nanos - 1_000_000_000).abs() < 1_000_000,
            "{}",
            p.duration_nanos
        );
    }
    let stored: u64 = profiles.iter().map(sample_count).sum();
    assert_eq!(
        stored, summary.samples,
        "stored samples vs the profiler's total\n{out}"
    );
    assert!(profiles
        .iter()
        .any(|p| function_names(p).iter().any(|f| f == "chain_hot")));

    // The collector's listing and merged view agree with the files.
    let client = http();
    let list = client.get(collector.profiles_url()).send().unwrap();
    assert_eq!(list.status(), 200);
    let list = list.text().unwrap();
    assert_eq!(list.matches("\"start_unix_ns\"").count(), 3, "{list}");
    let merged = client
        .get(format!(
            "{}/merged?format=folded&host={host}",
            collector.profiles_url()
        ))
        .send()
        .unwrap();
    assert_eq!(merged.status(), 200);
    let folded = common::parse_folded(&merged.text().unwrap());
    assert_eq!(folded.iter().map(|(_, c)| c).sum::<u64>(), summary.samples);
    assert!(folded
        .iter()
        .any(|(frames, _)| frames.iter().any(|f| f == "chain_hot")));
    // Only the second window, by time range.
    let (from, to) = (
        profiles[1].time_nanos,
        profiles[1].time_nanos + profiles[1].duration_nanos,
    );
    let one = client
        .get(format!(
            "{}/merged?format=pprof&from={from}&to={to}",
            collector.profiles_url()
        ))
        .send()
        .unwrap();
    assert_eq!(one.status(), 200);
    let one = decode_pprof_gz(&one.bytes().unwrap());
    assert_eq!(sample_count(&one), sample_count(&profiles[1]));
    assert_eq!(one.time_nanos, profiles[1].time_nanos);
}

#[test]
fn collector_down_at_start_gets_every_window_later() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_remote_dn");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/v1/profiles");
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "99"])
        .args(["--sender", "remote", "--server-url", &url])
        .args([
            "--profile-interval",
            "1",
            "--duration",
            "4",
            "--flush-timeout",
            "20",
        ]);
    let started = Instant::now();
    let profiler = Lightswitch::spawn_command(cmd);
    // Up 5 s after the profiler started.
    thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
    let collector = Collector::start(port, &dir.path().join("store"), &[]);
    let out = profiler.wait(Duration::from_secs(60));
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.windows, 4, "{out}");
    assert_eq!(summary.get("delivery.sent"), 4, "{out}");
    assert_eq!(summary.get("delivery.dropped"), 0, "{out}");
    assert!(summary.get("delivery.retried") >= 1, "{out}");
    assert!(out.stderr.contains("will retry"), "{out}");
    let files = stored_files(&collector.storage);
    assert_eq!(files.len(), 4, "{files:?}");
    let stored: u64 = files
        .iter()
        .map(|f| sample_count(&decode_pprof_gz(&fs::read(f).unwrap())))
        .sum();
    assert_eq!(stored, summary.samples);
}

// ---------------------------------------------------------------------------
// Profiler -> misbehaving servers

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
            lightswitch::sender::hostname()
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
        let push =
            lightswitch::sender::pyroscope::proto::push::v1::PushRequest::decode(r.body.as_slice())
                .expect("a push.v1.PushRequest");
        assert_eq!(push.series.len(), 1);
        let series = &push.series[0];
        let labels: BTreeMap<&str, &str> = series
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        let host = lightswitch::sender::hostname();
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

// ---------------------------------------------------------------------------
// Continuous mode on disk

#[test]
fn disk_windows_are_files_named_by_start_and_only_the_newest_are_kept() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_diskwin");
    let dir = tempfile::tempdir().unwrap();
    let out = profile_continuously(
        &workload,
        &[
            "--profile-interval",
            "0.5",
            "--duration",
            "3",
            "--profile-format",
            "folded",
            "--profile-path",
            dir.path().to_str().unwrap(),
            "--max-profiles",
            "2",
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.windows, 6, "{out}");
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    for name in &names {
        assert!(
            name.starts_with("folded-")
                && name.ends_with("Z.txt")
                && name.len() == "folded-20240501T120000.000Z.txt".len(),
            "{name}"
        );
        let stacks = common::read_folded(&dir.path().join(name));
        assert!(stacks.iter().map(|(_, c)| c).sum::<u64>() > 0);
    }
}

// ---------------------------------------------------------------------------
// The collector's API

/// A small profile with known stacks, as pprof bytes.
fn known_profile(start_unix_ns: u64, count: u64) -> Vec<u8> {
    use lightswitch::profile::{Frame, FrameKind, Line, Profile, Sample};
    use lightswitch::sample::UnwindStatus;
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
                lines: vec![line("leaf")],
                symbolized: true,
            },
            Frame {
                kind: FrameKind::User,
                address: 0x2000,
                mapping: None,
                lines: vec![line("main")],
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
            count,
        }],
        timeline: vec![],
        markers: vec![],
        lost: vec![],
        subject: None,
        host: None,
        targets: None,
    };
    lightswitch::format::pprof::encode(&profile, lightswitch::format::Compression::None).unwrap()
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
    for garbage in [
        b"this is not a profile".to_vec(),
        gzip(b"nor is this"),
        vec![0x1f, 0x8b, 0, 1],
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
