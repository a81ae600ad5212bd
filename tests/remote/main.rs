//! Continuous profiling over the network, on loopback only: the profiler
//! (real BPF, as root) sending windows to a `lightswitch collector`
//! subprocess and to small HTTP servers written here (failing, stalling,
//! refusing, Pyroscope), and the collector's own API.
//!
//! Every server binds 127.0.0.1 (port 0 or a port just found free); every
//! loop and wait is bounded in time.

mod api;
#[path = "../common/mod.rs"]
mod common;
mod delivery;
mod full_disk;
mod misbehaving;
mod off_cpu;
mod samples;
mod spool;

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
use lightswitch::profile::format::pprof::proto;
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
