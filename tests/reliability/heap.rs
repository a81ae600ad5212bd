//! The agent's heap dumps (`/debug/pprof/heap`): repeated dumps do not
//! accumulate memory, and each names functions.

use super::*;

/// Anonymous resident memory of `pid` (RssAnon), bytes.
fn rss_anon(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/PID/status");
    kb * 1024
}

/// Whether a gzip'd pprof names at least one function (its stacks were
/// symbolized).
fn names_functions(gzipped: &[u8]) -> bool {
    use prost::Message;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gzipped)
        .read_to_end(&mut raw)
        .expect("the heap profile is gzip");
    let profile = lightswitch::profile::format::pprof::proto::Profile::decode(raw.as_slice())
        .expect("the heap profile decodes as pprof");
    !profile.function.is_empty()
}

/// 30 heap dumps with sampling on, each symbolizing the agent's stacks:
/// the agent's anonymous memory comes back to within 16 MiB of what it was
/// before the first (it stayed about 60 MiB higher for good while the
/// symbolizer's cache of the binary's line tables was kept; 5 MiB higher
/// 5 s after the dumps without it).
#[test]
fn heap_dumps_do_not_accumulate_memory() {
    let _serial = common::serial();
    let mut sleeper = Command::new("sleep").arg("300").spawn().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", "127.0.0.1:0", "--unwind-cache-dir", "none"])
        .args(["--pids", &sleeper.id().to_string()])
        // One sampled allocation per 4 KiB (not 512 KiB): every dump has
        // stacks to symbolize, from the first on.
        .env(
            lightswitch::agent::heap::MALLOC_CONF_ENV,
            "lg_prof_sample:12",
        );
    let (child, url, _) = common::spawn_listening(cmd, BANNER_TIMEOUT);
    let mut agent = Collector { child, url };
    let pid = agent.child.id();
    let client = http();
    let on = client
        .post(format!(
            "{}/debug/pprof/heap/settings?enabled=true",
            agent.url
        ))
        .send()
        .unwrap();
    assert_eq!(on.status(), 200);
    thread::sleep(Duration::from_secs(1));
    let before = rss_anon(pid);
    let mut symbolized = 0;
    for _ in 0..30 {
        let dump = client
            .get(format!("{}/debug/pprof/heap", agent.url))
            .send()
            .unwrap();
        assert_eq!(dump.status(), 200);
        symbolized += usize::from(names_functions(&dump.bytes().unwrap()));
    }
    assert!(symbolized >= 25, "only {symbolized} of 30 dumps had stacks");
    // Freed pages go back to the kernel after jemalloc's 1 s decay.
    let limit = before + 16 * 1024 * 1024;
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut after = rss_anon(pid);
    while after > limit && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(500));
        after = rss_anon(pid);
    }
    agent.assert_alive();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        after <= limit,
        "RssAnon {} MiB before the dumps, {} MiB 15 s after",
        before >> 20,
        after >> 20
    );
}
