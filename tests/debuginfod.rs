//! Debug files fetched from a real debuginfod server (elfutils'
//! `debuginfod`, started by the test on a free port, serving a directory
//! that holds only the debug file): a stripped executable whose debug file
//! is nowhere on this machine is profiled by pid, every frame of its chain
//! named, the inlined function included, and the file lands in the cache
//! directory. With the server stopped, the run still succeeds and the
//! frames fall back to `object+0xOFFSET`. A server that trickles a byte a
//! second (a std::net listener of the test's own) costs a run no more than
//! `DEBUGINFOD_TIMEOUT` and leaves nothing in the cache. A server that
//! takes requests and never answers does not hold up a SIGTERM: the run
//! ends within 2 s of it, the request counted as cancelled.
//!
//! Needs root (BPF), gcc, binutils and the `debuginfod` package
//! (scripts/setup.sh installs it).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Longest any single profiler run may take before the test gives up.
const TIMEOUT: Duration = Duration::from_secs(90);

/// A debuginfod server on 127.0.0.1, killed on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Serve the ELF files under `dir` (database in `db`), and wait until
    /// it answers for build ID `id`.
    fn start(dir: &Path, db: &Path, id: &str) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("debuginfod")
            .args([
                "-F",
                "-p",
                &port.to_string(),
                "-d",
                s(db),
                "-t",
                "0",
                "-g",
                "0",
            ])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("running debuginfod (scripts/setup.sh installs it)");
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let probe = format!("{}/buildid/{id}/debuginfo", server.url);
        let client = reqwest::blocking::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !client
            .get(&probe)
            .send()
            .is_ok_and(|r| r.status().is_success())
        {
            assert!(
                Instant::now() < deadline,
                "debuginfod did not serve {id} in 60 s"
            );
            thread::sleep(Duration::from_millis(200));
        }
        server
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Profile the running `program` for 2 s with `DEBUGINFOD_URLS=url` and
/// the cache in `cache`; its stacks and the run's output text.
fn profile(program: &Program, url: &str, cache: &Path) -> (Vec<Stack>, String) {
    let workload = Workload::spawn(program);
    let dir = tempdir();
    let mut cmd = Command::new(BIN);
    cmd.args(["--pids", &workload.pid_arg(), "--duration", "2"])
        .args(["--sample-freq", "499", "--profile-format", "folded"])
        .args([
            "--profile-path",
            s(dir.path()),
            "--unwind-cache-dir",
            "none",
        ])
        .args(["--debug-dirs", "/nonexistent,/usr/lib/debug"])
        .args(["--debuginfod-cache", s(cache)])
        .env("DEBUGINFOD_URLS", url)
        .env("DEBUGINFOD_TIMEOUT", "10");
    let out = run_command(cmd, TIMEOUT);
    out.assert_success();
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let mine = of_process(&stacks, &program.name)
        .into_iter()
        .cloned()
        .collect();
    (mine, out.to_string())
}

/// Samples of `stacks` whose user frames end with `chain`.
fn with_chain(stacks: &[Stack], chain: &[&str]) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| ends_with_chain(&user_frames(frames), chain))
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn stripped_binary_named_from_a_debuginfod_server() {
    let _serial = serial();
    let flags = [NO_FP_FLAGS, &["-Wl,--build-id=sha1"]].concat();
    let program = compile("lsw_dinfod", &chain_source(), &flags);
    let served = tempdir();
    let debug = served.path().join("lsw_dinfod.debug");
    tool(
        "objcopy",
        &["--only-keep-debug", s(&program.path), s(&debug)],
    );
    tool("strip", &["-s", s(&program.path)]);
    let id = build_id(&program.path);
    let db = tempdir();
    let server = Server::start(served.path(), &db.path().join("db.sqlite"), &id);

    let cache = tempdir();
    let (stacks, out) = profile(&program, &server.url, cache.path());
    let chain = ["main", "alpha", "beta", "burn", "mix"];
    let all = total(&stacks);
    let named = with_chain(&stacks, &chain);
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 100, "only {all} samples:\n{out}");
    assert!(
        named as f64 >= 0.9 * all as f64,
        "{named} of {all} samples have {}:\n{}\n{out}",
        chain.join(";"),
        show(&refs)
    );
    // libc's debug file may be fetched too (a failure where it is
    // installed neither here nor on the server).
    let counts = debuginfod_counts(&out);
    assert_eq!(counts.get("fetched"), Some(&1), "{out}");
    let cached = cache.path().join(&id).join("debuginfo");
    assert_eq!(build_id(&cached), id, "the cached debug file");

    // The server stopped, nothing cached: placeholders, and still a profile.
    drop(server);
    let empty = tempdir();
    let (stacks, out) = profile(&program, "http://127.0.0.1:1", empty.path());
    let all = total(&stacks);
    let placeholders: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            user_frames(frames)
                .last()
                .is_some_and(|f| f.starts_with("lsw_dinfod+0x"))
        })
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 100, "only {all} samples:\n{out}");
    assert!(
        placeholders as f64 >= 0.9 * all as f64,
        "{placeholders} of {all} samples end in lsw_dinfod+0x...:\n{}\n{out}",
        show(&refs)
    );
    let counts = debuginfod_counts(&out);
    assert_eq!(counts.get("fetched"), Some(&0), "{out}");
    assert!(counts.get("failed").is_some_and(|&n| n >= 1), "{out}");
    assert!(!empty.path().join(&id).join("debuginfo").exists());
}

/// A server on 127.0.0.1 that answers every request with 200, a
/// `Content-Length` of 100 MB, and then one byte a second until the client
/// goes away; its URL.
fn trickling_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n";
                let mut sent = stream.write_all(head.as_bytes());
                while sent.is_ok() {
                    sent = stream.write_all(b"\x7f").and_then(|()| stream.flush());
                    thread::sleep(Duration::from_secs(1));
                }
            });
        }
    });
    url
}

#[test]
fn a_trickling_server_costs_a_run_no_more_than_its_timeout() {
    let _serial = serial();
    let flags = [NO_FP_FLAGS, &["-Wl,--build-id=sha1"]].concat();
    let program = compile("lsw_dtrickle", &chain_source(), &flags);
    tool("strip", &["-s", s(&program.path)]);
    let workload = Workload::spawn(&program);
    let url = trickling_server();
    let (dir, cache) = (tempdir(), tempdir());
    let mut cmd = Command::new(BIN);
    cmd.args(["--pids", &workload.pid_arg(), "--duration", "3"])
        .args(["--sample-freq", "499", "--profile-format", "folded"])
        .args(["--profile-path", s(dir.path())])
        .args(["--unwind-cache-dir", "none"])
        .args(["--debug-dirs", "/nonexistent"])
        .args(["--debuginfod", &url, "--debuginfod-cache", s(cache.path())])
        .env("DEBUGINFOD_TIMEOUT", "3");
    let started = Instant::now();
    let out = run_command(cmd, TIMEOUT);
    let took = started.elapsed();
    out.assert_success();
    // Its duration, at most DEBUGINFOD_TIMEOUT on debuginfod, and start-up
    // and symbolization within the rest.
    assert!(took < Duration::from_secs(3 + 10), "took {took:?}:\n{out}");
    let counts = debuginfod_counts(&out.to_string());
    assert!(counts.get("timed_out").is_some_and(|&n| n >= 1), "{out}");
    assert_eq!(counts.get("fetched"), Some(&0), "{out}");
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let mine: u64 = of_process(&stacks, &program.name)
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert!(
        mine >= 100,
        "only {mine} samples of {}:\n{out}",
        program.name
    );
    let left: Vec<_> = walk(cache.path());
    assert!(left.is_empty(), "left in the cache: {left:?}");
}

/// A server on 127.0.0.1 that reads each request and never answers (the
/// connection stays open); its URL, and a channel that gets a message per
/// request read.
fn silent_server() -> (String, std::sync::mpsc::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = tx.send(());
            held.push(stream);
        }
    });
    (url, rx)
}

#[test]
fn sigterm_cuts_a_debuginfod_request_that_never_answers() {
    let _serial = serial();
    let flags = [NO_FP_FLAGS, &["-Wl,--build-id=sha1"]].concat();
    let program = compile("lsw_dsilent", &chain_source(), &flags);
    tool("strip", &["-s", s(&program.path)]);
    let workload = Workload::spawn(&program);
    let (url, asked) = silent_server();
    let (dir, cache) = (tempdir(), tempdir());
    let mut cmd = Command::new(BIN);
    cmd.args(["--pids", &workload.pid_arg(), "--duration", "2"])
        .args(["--sample-freq", "499", "--profile-format", "folded"])
        .args(["--profile-path", s(dir.path())])
        .args(["--unwind-cache-dir", "none"])
        .args(["--debug-dirs", "/nonexistent"])
        .args(["--debuginfod", &url, "--debuginfod-cache", s(cache.path())])
        // Without the cut, the run would wait this long for the server.
        .env("DEBUGINFOD_TIMEOUT", "60");
    let run = Lightswitch::spawn_command(cmd);
    // The end of the run's symbolization asks the server, which never answers.
    asked
        .recv_timeout(Duration::from_secs(60))
        .expect("the server was asked for a debug file");
    thread::sleep(Duration::from_millis(300));
    let signalled = Instant::now();
    run.signal(libc::SIGTERM);
    let out = run.wait(TIMEOUT);
    let took = signalled.elapsed();
    out.assert_success();
    assert!(
        took < Duration::from_secs(2),
        "ended {took:?} after SIGTERM:\n{out}"
    );
    let counts = debuginfod_counts(&out.to_string());
    assert!(counts.get("cancelled").is_some_and(|&n| n >= 1), "{out}");
    assert_eq!(counts.get("fetched"), Some(&0), "{out}");
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let mine: u64 = of_process(&stacks, &program.name)
        .iter()
        .map(|(_, n)| n)
        .sum();
    assert!(
        mine >= 100,
        "only {mine} samples of {}:\n{out}",
        program.name
    );
    let left = walk(cache.path());
    assert!(left.is_empty(), "left in the cache: {left:?}");
}

/// Every file under `dir`, at any depth.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// The counts of the summary line `debuginfod: fetched=N cached=N failed=N ...`.
fn debuginfod_counts(out: &str) -> std::collections::BTreeMap<String, u64> {
    out.lines()
        .find_map(|l| l.strip_prefix("debuginfod:"))
        .unwrap_or_else(|| panic!("no debuginfod line:\n{out}"))
        .split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}
