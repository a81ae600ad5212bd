//! `--spool-dir`: windows an agent could not deliver survive its end
//! (SIGTERM) and its death (`kill -9`) and arrive once the collector is
//! up, each exactly once, also when sent again; a full spool disk costs
//! what could not be kept, said and counted, never the run.

use super::full_disk::{metric, stored, Tmpfs};
use super::*;

/// The spool files in `dir` (not the skipped ones).
fn spooled(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.to_string_lossy().ends_with(".spool"));
    files.sort();
    files
}

/// An OTLP agent with 1 s windows spooling to `spool`, sending to `url`.
fn agent(workload: &Workload, url: &str, spool: &Path, duration: Option<u32>) -> Lightswitch {
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "199"])
        .args(["--sender", "otlp", "--server-url", url])
        .args(["--profile-interval", "1", "--flush-timeout", "1"])
        .arg("--spool-dir")
        .arg(spool);
    if let Some(seconds) = duration {
        cmd.args(["--duration", &seconds.to_string()]);
    }
    Lightswitch::spawn_command(cmd)
}

/// Wait until `dir` holds at least `n` spool files.
fn wait_spooled(dir: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while spooled(dir).len() < n {
        assert!(Instant::now() < deadline, "fewer than {n} spool files");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn windows_spooled_before_sigterm_and_kill_9_arrive_exactly_once() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_spool");
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");

    // The collector is down. SIGTERM: every window, the last partial one
    // too, is kept for the next start; nothing is lost, so it exits 0.
    let first = agent(&workload, &url, &spool, None);
    wait_spooled(&spool, 3);
    first.signal(libc::SIGTERM);
    let out = first.wait(Duration::from_secs(30));
    out.assert_success();
    let summary = Summary::parse(&out);
    let after_sigterm = spooled(&spool);
    assert_eq!(after_sigterm.len() as u64, summary.windows, "{out}");
    assert!(
        out.stdout
            .contains(&format!("spool: kept={}", summary.windows)),
        "{out}"
    );
    assert!(
        out.stdout.contains(&format!("left={}", summary.windows)),
        "{out}"
    );
    let replay = dir.path().join("replay");
    fs::create_dir(&replay).unwrap();
    for f in &after_sigterm {
        fs::copy(f, replay.join(f.file_name().unwrap())).unwrap();
    }

    // kill -9: what was spooled before stays; the open window is lost.
    let second = agent(&workload, &url, &spool, None);
    wait_spooled(&spool, after_sigterm.len() + 3);
    second.signal(libc::SIGKILL);
    let _ = second.wait(Duration::from_secs(10));
    let before_up = spooled(&spool).len() as u64;

    // The collector is up: a new agent sends the spool first, then its own.
    let collector = Collector::start(port, &dir.path().join("store"), &[]);
    let third = agent(&workload, &url, &spool, Some(2));
    let out = third.wait(Duration::from_secs(60));
    out.assert_success();
    let summary = Summary::parse(&out);
    assert!(
        out.stdout.contains(&format!("resent={before_up} ")),
        "{out}"
    );
    assert_eq!(
        summary.get("delivery.sent"),
        before_up + summary.windows,
        "{out}"
    );
    assert!(spooled(&spool).is_empty(), "{:?}", spooled(&spool));
    let (samples, windows) = stored(&collector);
    assert_eq!(windows, before_up + summary.windows, "{out}");

    // Sent again (as by an agent that died after the collector stored its
    // windows but before it heard so): counted once.
    for f in spooled(&replay) {
        fs::copy(&f, spool.join(f.file_name().unwrap())).unwrap();
    }
    let fourth = agent(&workload, &url, &spool, Some(1));
    let out = fourth.wait(Duration::from_secs(60));
    out.assert_success();
    let again = Summary::parse(&out);
    assert!(
        out.stdout
            .contains(&format!("resent={} ", after_sigterm.len())),
        "{out}"
    );
    let (samples_now, windows_now) = stored(&collector);
    assert_eq!(windows_now, windows + again.windows, "{out}");
    assert_eq!(samples_now, samples + again.samples, "{out}");
    assert_eq!(
        metric(&collector, "lightswitch_collector_duplicate_windows_total"),
        after_sigterm.len() as u64
    );
}

#[test]
fn a_full_spool_disk_costs_what_could_not_be_kept_said_and_counted() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_spoolfull");
    // The spool's file system is full from the start.
    let disk = Tmpfs::mount("256k");
    let spool = disk.path().join("spool");
    fs::create_dir(&spool).unwrap();
    disk.fill(&disk.path().join("ballast"));
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = agent(&workload, &url, &spool, Some(4)).wait(Duration::from_secs(60));
    // The collector never came: what is not in the spool is lost, and said.
    let summary = Summary::parse(&out);
    assert_eq!(summary.windows, 4, "{out}");
    let failed = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("spool: "))
        .and_then(|l| l.split(' ').find_map(|kv| kv.strip_prefix("failed=")))
        .unwrap_or_else(|| panic!("no spool line: {out}"))
        .parse::<u64>()
        .unwrap();
    assert_eq!(failed, 4, "{out}");
    assert!(spooled(&spool).is_empty());
    assert!(out.stderr.contains("cannot keep a profile"), "{out}");
    assert_eq!(summary.get("delivery.dropped"), failed, "{out}");
    assert!(!out.status.success(), "{out}");
    assert!(out.stderr.contains("not delivered"), "{out}");
}
