//! Hostile input and bad days, on loopback only: unprivileged processes'
//! perf maps and jitdumps (hostile.rs), a program on a FUSE mount whose
//! reads never answer (hung_fs.rs); the collector and the
//! agent's `--listen` server out of file descriptors, under idle and
//! surplus connections, fed decompression bombs and impossible times, asked
//! to merge many windows; profiles' file modes; the exit status of a run
//! whose windows could not be written.
//!
//! Every server binds 127.0.0.1; every wait is bounded in time.

#[path = "../common/mod.rs"]
mod common;
mod files;
mod heap;
mod hostile;
mod hung_fs;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::thread;
use std::time::{Duration, Instant};

use common::{Lightswitch, BIN};

/// How long a server started here may take to say where it listens.
const BANNER_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Helpers

/// A `lightswitch collector` (or agent with `--listen`) subprocess; killed on drop.
struct Collector {
    child: Child,
    url: String,
}

impl Collector {
    fn start(storage: &Path, extra: &[&str]) -> Collector {
        let mut cmd = Command::new(BIN);
        cmd.args(["collector", "--listen", "127.0.0.1:0", "--storage"])
            .arg(storage)
            .args(extra);
        let (child, url, _) = common::spawn_listening(cmd, BANNER_TIMEOUT);
        Collector { child, url }
    }

    fn profiles_url(&self) -> String {
        format!("{}/v1/profiles", self.url)
    }

    /// Peak resident memory so far (VmHWM), bytes.
    fn peak_rss(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status");
        kb * 1024
    }

    fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the collector has exited"
        );
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// `127.0.0.1:PORT` of an `http://127.0.0.1:PORT` URL.
fn authority(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// Open up to `n` idle TCP connections to `address` (stopping at the first
/// that fails: the test process has its own descriptor limit).
fn idle_connections(address: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map_while(|_| {
            TcpStream::connect_timeout(&address.parse().unwrap(), Duration::from_secs(2)).ok()
        })
        .collect()
}

/// Whether the server closed `stream` within `within` (read returns EOF or
/// a reset) rather than leaving it open.
fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// A small pprof profile (one stack, `count` samples) starting at `start`.
fn known_profile(start_unix_ns: u64, count: u64, stacks: usize) -> Vec<u8> {
    use lightswitch::profile::{Frame, FrameKind, Line, Profile, Sample};
    use lightswitch::sampling::records::UnwindStatus;
    use std::sync::Arc;
    let frame = |name: String, address: u64| Frame {
        kind: FrameKind::User,
        address,
        mapping: None,
        lines: vec![Line {
            function: Arc::from(name.as_str()),
            system_name: Arc::from(name.as_str()),
            file: None,
            line: None,
        }]
        .into(),
        symbolized: true,
    };
    let mut frames = vec![frame("main".into(), 0x1000)];
    let mut samples = Vec::new();
    for i in 0..stacks {
        frames.push(frame(
            format!("leaf_{i}_with_a_longish_name"),
            0x2000 + i as u64,
        ));
        samples.push(Sample {
            pid: 42,
            tid: 42,
            process_comm: Arc::from("app"),
            thread_comm: Arc::from("app"),
            frames: vec![frames.len() - 1, 0],
            unwind_status: UnwindStatus::Complete,
            off_cpu_ns: 0,
            count,
        });
    }
    let profile = Profile {
        start_unix_ns,
        duration_ns: 1_000_000_000,
        sample_freq_hz: 99,
        mappings: vec![],
        frames,
        samples,
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

const T0: u64 = 1_714_564_800_000_000_000; // 2024-05-01T12:00:00Z

// ---------------------------------------------------------------------------
// Connections

#[test]
fn collector_survives_running_out_of_descriptors_and_drops_idle_connections() {
    let dir = common::tempdir();
    let mut collector = Collector::start(&dir.path().join("store"), &[]);
    // Fewer descriptors left than connections allowed: accept() itself fails.
    let pid = collector.child.id();
    let open = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    set_open_files(pid, open + 32);
    let address = authority(&collector.url).to_string();
    let mut idle = idle_connections(&address, 120);
    assert!(idle.len() >= 100, "only {} connections", idle.len());
    thread::sleep(Duration::from_millis(500));
    collector.assert_alive();
    // Idle connections are closed by the server (10 s header timeout).
    let started = Instant::now();
    assert!(
        closed_by_server(&mut idle[0], Duration::from_secs(20)),
        "an idle connection was still open after {:?}",
        started.elapsed()
    );
    drop(idle);
    // Still serving, in time.
    let r = http().get(collector.profiles_url()).send().unwrap();
    assert_eq!(r.status(), 200);
    collector.assert_alive();
}

#[test]
fn idle_connections_make_room_and_a_burst_beyond_the_limit_is_closed() {
    let dir = common::tempdir();
    let mut collector = Collector::start(&dir.path().join("store"), &["--max-connections", "4"]);
    let address = authority(&collector.url).to_string();
    // Every slot held by an idle connection older than a second: a client
    // with a request still gets in, and the idle ones are closed for it.
    let mut idle = idle_connections(&address, 4);
    thread::sleep(Duration::from_millis(1500));
    let r = http().get(collector.profiles_url()).send().unwrap();
    assert_eq!(r.status(), 200);
    drop(r);
    assert!(closed_by_server(&mut idle[0], Duration::from_secs(2)));
    drop(idle);
    thread::sleep(Duration::from_millis(300));
    // Four fresh connections take every slot: a fifth is closed at once.
    let fresh = idle_connections(&address, 4);
    thread::sleep(Duration::from_millis(100));
    let mut surplus = TcpStream::connect(&address).unwrap();
    assert!(
        closed_by_server(&mut surplus, Duration::from_millis(900)),
        "a fifth connection was kept open over --max-connections 4"
    );
    drop(fresh);
    thread::sleep(Duration::from_millis(300));
    let r = http().get(collector.profiles_url()).send().unwrap();
    assert_eq!(r.status(), 200);
    collector.assert_alive();
}

/// Set the open-file limit of the running process `pid` (prlimit(2)).
fn set_open_files(pid: u32, n: u64) {
    let limit = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: prlimit on our own child with a valid rlimit; old value not read.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn agent_http_api_survives_running_out_of_descriptors() {
    let _serial = common::serial();
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", "127.0.0.1:0", "--unwind-cache-dir", "none"]);
    // The banner comes once sampling is set up (BPF loaded).
    let (child, url, _) = common::spawn_listening(cmd, BANNER_TIMEOUT);
    let mut agent = Collector { child, url };
    let url = agent.url.clone();
    // The process tracker holds a descriptor per mapped object, as many as
    // the machine runs: leave 64 more than the agent holds now.
    let pid = agent.child.id();
    let open = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    set_open_files(pid, open + 64);
    let idle = idle_connections(authority(&url), 200);
    thread::sleep(Duration::from_secs(1));
    drop(idle);
    // Answered again once the clients are gone (the accept back-off is at most 1 s).
    let client = http();
    let deadline = Instant::now() + Duration::from_secs(15);
    let healthz = loop {
        match client.get(format!("{url}/healthz")).send() {
            Ok(r) => break r,
            Err(e) if Instant::now() > deadline => panic!("/healthz: {e}"),
            Err(_) => thread::sleep(Duration::from_millis(200)),
        }
    };
    assert_eq!(healthz.status(), 200);
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let errors = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("lightswitch_http_connections_total{outcome=\"accept_error\"} ")
        })
        .expect("accept_error counter in /metrics");
    assert!(errors.parse::<u64>().unwrap() > 0, "{metrics}");
    agent.assert_alive();
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = agent.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not stop on SIGINT"
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn the_collector_stops_on_sigint_and_sigterm_and_says_so() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let dir = common::tempdir();
        let mut cmd = Command::new(BIN);
        cmd.args(["collector", "--listen", "127.0.0.1:0", "--storage"])
            .arg(dir.path().join("store"));
        // As a background job of a script: SIGINT ignored on entry.
        // SAFETY: signal(2) only changes the child's disposition.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                Ok(())
            });
        }
        let (mut child, url, lines) = common::spawn_listening(cmd, BANNER_TIMEOUT);
        // An idle keep-alive connection does not hold the stop up.
        let _idle = TcpStream::connect(authority(&url)).unwrap();
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
        let said = lines.recv_timeout(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the collector did not stop on signal {signal}");
            }
            thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(said.as_deref(), Ok("collector stopped"), "signal {signal}");
        assert!(status.success(), "signal {signal}: {status:?}");
    }
}

// ---------------------------------------------------------------------------
// Bodies, merges, times

#[test]
fn a_decompression_bomb_costs_at_most_the_decoded_limit() {
    let dir = common::tempdir();
    let mut collector = Collector::start(&dir.path().join("store"), &[]);
    // 512 MiB of zeros, about 0.5 MB gzip'd: under the body limit.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..512 {
        gz.write_all(&zeros).unwrap();
    }
    let bomb = gz.finish().unwrap();
    let before = collector.peak_rss();
    let r = http()
        .post(collector.profiles_url())
        .body(bomb)
        .send()
        .unwrap();
    assert_eq!(r.status(), 413);
    let message = r.text().unwrap();
    assert!(message.contains("--max-decoded-bytes"), "{message}");
    let grown = collector.peak_rss().saturating_sub(before);
    // The default bound is 64 MiB; allow for the decoder's buffer doubling.
    assert!(grown < 256 << 20, "peak RSS grew by {} MiB", grown >> 20);
    collector.assert_alive();
}

#[test]
fn merges_stream_and_refuse_more_windows_than_the_limit() {
    let dir = common::tempdir();
    let collector = Collector::start(&dir.path().join("store"), &["--max-merge-profiles", "200"]);
    let client = http();
    // 150 windows of the same 10,000 stacks: the merged answer is the size of one.
    let profile = known_profile(T0, 1, 10_000);
    let s = 1_000_000_000u64;
    for i in 0..150 {
        let start = T0 + i * s;
        let r = client
            .post(collector.profiles_url())
            .header("X-Lightswitch-Window-Start", start.to_string())
            .header("X-Lightswitch-Window-End", (start + s).to_string())
            .body(profile.clone())
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let before = collector.peak_rss();
    let merged = client
        .get(format!("{}/merged?format=folded", collector.profiles_url()))
        .send()
        .unwrap();
    assert_eq!(merged.status(), 200);
    assert_eq!(merged.headers()["X-Lightswitch-Merged-Profiles"], "150");
    assert_eq!(merged.headers()["X-Lightswitch-Skipped-Profiles"], "0");
    let folded = merged.text().unwrap();
    assert_eq!(folded.lines().count(), 10_000);
    assert!(
        folded.lines().all(|l| l.ends_with(" 150")),
        "{}",
        &folded[..200]
    );
    // Decoding every window before merging held all 150 in memory at once.
    let grown = collector.peak_rss().saturating_sub(before);
    assert!(grown < 128 << 20, "peak RSS grew by {} MiB", grown >> 20);

    // More windows than --max-merge-profiles: 413 naming both numbers.
    for i in 150..210 {
        let start = T0 + i * s;
        client
            .post(collector.profiles_url())
            .header("X-Lightswitch-Window-Start", start.to_string())
            .body(known_profile(start, 1, 1))
            .send()
            .unwrap();
    }
    let r = client
        .get(format!("{}/merged", collector.profiles_url()))
        .send()
        .unwrap();
    assert_eq!(r.status(), 413);
    let message = r.text().unwrap();
    assert!(
        message.contains("210") && message.contains("200"),
        "{message}"
    );
}

#[test]
fn times_past_2554_are_refused_not_wrapped() {
    let dir = common::tempdir();
    let store = dir.path().join("store");
    let collector = Collector::start(&store, &[]);
    let client = http();
    let r = client
        .post(collector.profiles_url())
        .header("X-Lightswitch-Window-Start", "9999-12-31T23:59:59Z")
        .body(known_profile(T0, 1, 1))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    let message = r.text().unwrap();
    assert!(message.contains("9999-12-31T23:59:59Z"), "{message}");
    let r = client
        .get(format!(
            "{}?to=2600-01-01T00:00:00Z",
            collector.profiles_url()
        ))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    // The last representable instant is still a time.
    let r = client
        .post(collector.profiles_url())
        .header("X-Lightswitch-Window-Start", "2554-07-21T23:34:33Z")
        .header("X-Lightswitch-Window-End", u64::MAX.to_string())
        .body(known_profile(T0, 1, 1))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

// ---------------------------------------------------------------------------
// Slow-header clients

/// A client that sends a request line and then one header line every
/// 300 ms, never ending its headers ("slowloris"), for at most 20 s; the
/// thread returns how long the server kept the connection open, or `None`
/// if it was still open at the end.
fn slow_header_client(address: &str) -> thread::JoinHandle<Option<Duration>> {
    let mut stream = TcpStream::connect(address).unwrap();
    thread::spawn(move || {
        let started = Instant::now();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: slow\r\n")
            .ok()?;
        stream
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        while started.elapsed() < Duration::from_secs(20) {
            if stream.write_all(b"X-Slow: 1\r\n").is_err() {
                return Some(started.elapsed());
            }
            let mut byte = [0u8; 64];
            match stream.read(&mut byte) {
                Ok(_) => return Some(started.elapsed()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return Some(started.elapsed()),
            }
        }
        None
    })
}

/// Slow-header clients holding every slot are closed as soon as a client
/// with a request needs one (before, such a client was refused until the
/// 10 s header timeout freed a slot), on the collector and on the agent's
/// `/healthz`; with slots to spare, the header timeout closes them.
#[test]
fn slow_header_clients_are_dropped_and_the_servers_keep_answering() {
    let _serial = common::serial();
    let dir = common::tempdir();
    let mut collector = Collector::start(&dir.path().join("store"), &["--max-connections", "4"]);
    let mut sleeper = Command::new("sleep").arg("120").spawn().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", "127.0.0.1:0", "--listen-max-connections", "4"])
        .args([
            "--unwind-cache-dir",
            "none",
            "--pids",
            &sleeper.id().to_string(),
        ]);
    let (child, url, _) = common::spawn_listening(cmd, BANNER_TIMEOUT);
    let mut agent = Collector { child, url };
    let client = http();
    for (server, probe) in [(&mut collector, "/v1/profiles"), (&mut agent, "/healthz")] {
        let address = authority(&server.url).to_string();
        let slow: Vec<_> = (0..4).map(|_| slow_header_client(&address)).collect();
        thread::sleep(Duration::from_millis(1500));
        let started = Instant::now();
        let r = client
            .get(format!("{}{probe}", server.url))
            .send()
            .unwrap_or_else(|e| panic!("{probe} with slow clients in every slot: {e}"));
        assert_eq!(r.status(), 200);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        for (i, s) in slow.into_iter().enumerate() {
            let open = s.join().unwrap();
            assert!(
                open.is_some_and(|t| t < Duration::from_secs(5)),
                "slow client {i} of {probe}'s server kept for {open:?}"
            );
        }
        server.assert_alive();
    }
    // Slots to spare: the header timeout (10 s) closes them.
    let slow: Vec<_> = (0..2)
        .map(|_| slow_header_client(authority(&collector.url)))
        .collect();
    for s in slow {
        let open = s.join().unwrap();
        assert!(
            open.is_some_and(|t| t >= Duration::from_secs(9) && t < Duration::from_secs(15)),
            "a slow client was kept for {open:?}"
        );
    }
    collector.assert_alive();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
