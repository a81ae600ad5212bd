//! Profiles from the profiler to a collector, and to disk in continuous
//! mode: every window arrives, intact and labelled.

use super::*;

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
    let host = lightswitch::output::sender::hostname();
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
