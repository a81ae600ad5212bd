//! The debuginfod client against servers of the test's own on 127.0.0.1
//! (a `std::net` listener answering every request with a handler): one
//! that serves a real ELF file, and hostile ones that trickle, stall after
//! their headers, announce or send more than the cap. Each checks the
//! outcome, the time it took, the counts, and that the cache holds no
//! partial file afterwards.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use super::*;

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// libc's bytes and build ID, or `None` (the test is skipped) when absent.
fn libc() -> Option<(Vec<u8>, Vec<u8>)> {
    let Ok(bytes) = std::fs::read(LIBC) else {
        eprintln!("skipped: {LIBC} is absent");
        return None;
    };
    let id = object::File::parse(&*bytes)
        .ok()
        .and_then(|f| f.build_id().ok().flatten().map(<[u8]>::to_vec))
        .expect("libc has a build ID");
    Some((bytes, id))
}

/// A server on a free port of 127.0.0.1 that reads each request's head and
/// hands the connection to `answer` (on a thread per connection, which
/// ends when the client goes away); its URL.
fn serve(answer: fn(&mut TcpStream)) -> String {
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
                answer(&mut stream);
            });
        }
    });
    url
}

/// Headers of a 200 answer, with `Content-Length: length` when given.
fn head(stream: &mut TcpStream, length: Option<u64>) -> std::io::Result<()> {
    let length = length.map_or(String::new(), |n| format!("Content-Length: {n}\r\n"));
    write!(
        stream,
        "HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n"
    )?;
    stream.flush()
}

/// Waits until the client closes the connection (reads return 0 or fail).
fn until_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    while std::io::Read::read(stream, &mut byte).is_ok_and(|n| n > 0) {}
}

/// A client of `url` caching in `cache`, with `timeout` and `max_bytes`.
fn client(url: &str, cache: &Path, timeout: Duration, max_bytes: u64) -> Debuginfod {
    let limits = Limits { timeout, max_bytes };
    Debuginfod::with_limits(vec![url.to_string()], cache.to_path_buf(), limits)
}

/// Every file under `dir`, at any depth.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// A far deadline: the window's budget plays no part.
fn far() -> Instant {
    Instant::now() + Duration::from_secs(600)
}

#[test]
fn cache_hits_and_a_negative_cache_for_what_no_server_has() {
    let Some((libc, id)) = libc() else { return };
    let cache = tempfile::tempdir().expect("tempdir");
    // Nothing listens on port 1: every request fails at once.
    let urls = ["http://127.0.0.1:1/".to_string()];
    let client = Debuginfod::new(&urls, Some(cache.path().to_path_buf())).expect("a server");
    assert_eq!(client.urls, ["http://127.0.0.1:1"]);
    assert_eq!(client.debuginfo(&id, far()), None);
    assert_eq!(client.debuginfo(&id, far()), None, "not asked again");
    let counts = client.stats();
    assert_eq!((counts.fetched, counts.cached, counts.failed), (0, 0, 1));
    // A file in the cache (any ELF file with that build ID) is used.
    let cached = cache.path().join(hex(&id)).join("debuginfo");
    std::fs::create_dir_all(cached.parent().expect("dir")).expect("mkdir");
    std::fs::write(&cached, &libc).expect("write");
    assert_eq!(client.debuginfo(&id, far()), Some(cached.clone()));
    assert_eq!(client.stats().cached, 1);
    // A file with another build ID is not.
    std::fs::write(&cached, b"\x7fELF but not really").expect("write");
    assert_eq!(client.debuginfo(&id, far()), None);
    assert!(Debuginfod::new(&[], None).is_none() || std::env::var("DEBUGINFOD_URLS").is_ok());
}

#[test]
fn a_whole_file_is_fetched_into_the_cache() {
    let Some((libc, id)) = libc() else { return };
    let url = serve(|stream| {
        let libc = std::fs::read(LIBC).expect("libc");
        let _ = head(stream, Some(libc.len() as u64)).and_then(|()| stream.write_all(&libc));
    });
    let cache = tempfile::tempdir().expect("tempdir");
    let client = client(&url, cache.path(), Duration::from_secs(30), 1 << 30);
    let path = client.debuginfo(&id, far()).expect("fetched");
    assert_eq!(std::fs::read(&path).expect("cached"), libc);
    assert_eq!(files_under(cache.path()), [path]);
    assert_eq!(client.stats().fetched, 1);
}

#[test]
fn a_trickling_server_is_cut_at_the_timeout_and_leaves_nothing() {
    let url = serve(|stream| {
        // Announces 100 MB, sends a byte a second.
        if head(stream, Some(100_000_000)).is_err() {
            return;
        }
        while stream
            .write_all(b"\x7f")
            .and_then(|()| stream.flush())
            .is_ok()
        {
            thread::sleep(Duration::from_secs(1));
        }
    });
    let cache = tempfile::tempdir().expect("tempdir");
    let client = client(&url, cache.path(), Duration::from_secs(2), 1 << 30);
    let started = Instant::now();
    // A window's deadline as the symbolizer sets it (its budget, the
    // timeout, from the window's start): the first request's timeout is
    // still the server's failure, remembered.
    let window = started + client.window_budget();
    assert_eq!(client.debuginfo(&[1, 2, 3, 4], window), None);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    let counts = client.stats();
    assert_eq!((counts.timed_out, counts.failed), (1, 1), "{counts:?}");
    assert_eq!(files_under(cache.path()), Vec::<PathBuf>::new());
}

#[test]
fn the_window_deadline_ends_a_request_before_its_timeout() {
    let url = serve(|stream| {
        // Headers, then nothing until the client goes away.
        if head(stream, Some(100_000_000)).is_ok() {
            until_closed(stream);
        }
    });
    let cache = tempfile::tempdir().expect("tempdir");
    let client = client(&url, cache.path(), Duration::from_secs(60), 1 << 30);
    let id = [5, 6, 7, 8];
    let started = Instant::now();
    let deadline = started + Duration::from_millis(1500);
    assert_eq!(client.debuginfo(&id, deadline), None);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // Cut by the window at less than half its own timeout: not remembered
    // as a failure.
    let counts = client.stats();
    assert_eq!((counts.timed_out, counts.failed), (1, 0), "{counts:?}");
    // The window's budget is spent: not asked at all.
    let started = Instant::now();
    assert_eq!(client.debuginfo(&id, deadline), None);
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(client.stats().skipped, 1);
    assert_eq!(files_under(cache.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_content_length_over_the_cap_is_refused_without_reading_the_body() {
    let url = serve(|stream| {
        // Announces 2 MiB, then stalls: reading the body would wait for
        // the timeout.
        if head(stream, Some(2 << 20)).is_ok() {
            until_closed(stream);
        }
    });
    refused_as_too_large(&url, &[9, 10]);
}

#[test]
fn a_body_growing_past_the_cap_is_cut() {
    let url = serve(|stream| {
        // No Content-Length: a body that never ends.
        if head(stream, None).is_err() {
            return;
        }
        let chunk = vec![b'A'; 64 << 10];
        while stream.write_all(&chunk).is_ok() {}
    });
    refused_as_too_large(&url, &[11, 12]);
}

/// Asks the server at `url` (1 MiB cap, 20 s timeout) for `build_id`: it
/// must be refused as too large within 5 s, leaving nothing in the cache.
fn refused_as_too_large(url: &str, build_id: &[u8]) {
    let cache = tempfile::tempdir().expect("tempdir");
    let client = client(url, cache.path(), Duration::from_secs(20), 1 << 20);
    let started = Instant::now();
    assert_eq!(client.debuginfo(build_id, far()), None);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let counts = client.stats();
    assert_eq!((counts.too_large, counts.timed_out), (1, 0), "{counts:?}");
    assert_eq!(files_under(cache.path()), Vec::<PathBuf>::new());
}

#[test]
fn stale_partial_files_are_removed_at_start() {
    let cache = tempfile::tempdir().expect("tempdir");
    let dir = cache.path().join("0102");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let write = |name: &str, age: Duration| {
        let path = dir.join(name);
        let file = std::fs::File::create(&path).expect("create");
        file.set_modified(SystemTime::now() - age).expect("mtime");
        path
    };
    let stale = write(".tmpAbC123", Duration::from_secs(3600));
    let live = write(".tmpXyZ789", Duration::ZERO);
    let kept = write("debuginfo", Duration::from_secs(3600));
    let _client = client(
        "http://127.0.0.1:1",
        cache.path(),
        Duration::from_secs(30),
        1,
    );
    assert!(!stale.exists(), "a partial file an old run left");
    assert!(live.exists(), "a partial file a live fetch may still write");
    assert!(kept.exists(), "a complete debug file");
}
