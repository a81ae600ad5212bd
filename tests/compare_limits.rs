//! `lightswitch report` and `diff` on hostile inputs (decision 0013): counts
//! that add up past 2^64-1, a gzip bomb and a huge file against
//! `--max-input-mb` (refused at the cap, in bounded memory, measured by
//! /usr/bin/time), and that flag's parsing. Needs neither root nor BPF.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use flate2::write::GzEncoder;
use flate2::Compression;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Run `lightswitch args` under `/usr/bin/time`: its output, and its peak
/// resident memory, MiB.
fn run_measured(args: &[&str]) -> (Output, u64) {
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "maxrss_kib=%M", BIN]).args(args);
    let out = run_command(cmd, TIMEOUT);
    let kib: u64 = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kib="))
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time:\n{out}"))
        .trim()
        .parse()
        .unwrap();
    (out, kib / 1024)
}

#[test]
fn saturated_counts_are_an_error_naming_file_and_line() {
    let dir = tempdir();
    let path = dir.path().join("saturated.txt");
    let max = u64::MAX;
    std::fs::write(&path, format!("app;main;a {max}\napp;main;b {max}\n")).unwrap();
    for args in [vec!["report", s(&path)], vec!["diff", s(&path), s(&path)]] {
        let out = run(&args, TIMEOUT);
        assert_eq!(out.status.code(), Some(2), "{out}");
        out.assert_error(&[
            &format!("adding up the counts of {}", path.display()),
            &format!("line 2: its count {max} brings the total past {max} samples"),
        ]);
        assert!(out.stdout.is_empty(), "{out}");
    }
    // One saturated line adds up: all of it is main's.
    std::fs::write(&path, format!("app;main {max}\n")).unwrap();
    let out = run(&["report", s(&path)], TIMEOUT);
    out.assert_success();
    assert!(out.stdout.contains("100.00%  main"), "{out}");
}

/// Write `bytes` zeros gzip'd into `path`, streaming (about 1/1000 of it
/// on disk).
fn write_gzip_zeros(path: &Path, bytes: u64) {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut gzip = GzEncoder::new(file, Compression::default());
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..bytes >> 20 {
        gzip.write_all(&chunk).unwrap();
    }
    gzip.finish().unwrap().flush().unwrap();
}

#[test]
fn a_gzip_bomb_and_a_huge_file_stop_at_the_cap() {
    let dir = tempdir();
    let bomb = dir.path().join("bomb.pb.gz");
    write_gzip_zeros(&bomb, 2 << 30);
    assert!(std::fs::metadata(&bomb).unwrap().len() < 16 << 20);
    // 1 GiB, sparse: costs no disk.
    let huge = dir.path().join("huge.txt");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let cap_mib = 64;
    let cap = cap_mib.to_string();
    let cases = [
        (
            vec!["report", "--max-input-mb", &cap, s(&bomb)],
            "decompresses to",
        ),
        (vec!["report", "--max-input-mb", &cap, s(&huge)], "is"),
        (
            vec!["diff", "--max-input-mb", &cap, s(&huge), s(&bomb)],
            "is",
        ),
    ];
    for (args, verb) in cases {
        let start = Instant::now();
        let (out, peak_mib) = run_measured(&args);
        let took = start.elapsed();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out}");
        out.assert_error(&[&format!(
            "it {verb} more than {cap_mib} MiB, the limit of --max-input-mb"
        )]);
        assert!(
            peak_mib < cap_mib + 200,
            "{args:?}: peak RSS {peak_mib} MiB with a cap of {cap_mib} MiB"
        );
        assert!(took < Duration::from_secs(20), "{args:?} took {took:?}");
    }
}

#[test]
fn max_input_mb_must_be_a_whole_number_of_mib_at_least_1() {
    let dir = tempdir();
    let path = dir.path().join("small.txt");
    std::fs::write(&path, "app;main;a 3\napp;main;b 1\n").unwrap();
    for bad in ["0", "1.5", "lots", "4294967296"] {
        for args in [
            vec!["report", "--max-input-mb", bad, s(&path)],
            vec!["diff", "--max-input-mb", bad, s(&path), s(&path)],
        ] {
            let out = run(&args, TIMEOUT);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {out}");
            out.assert_error(&["--max-input-mb"]);
            if bad == "0" {
                out.assert_error(&["at least 1"]);
            }
        }
    }
    let out = run(&["report", "--max-input-mb", "1", s(&path)], TIMEOUT);
    out.assert_success();
    assert!(out.stdout.starts_with("4 samples"), "{out}");
    let out = run(
        &["diff", "--max-input-mb", "1", s(&path), s(&path)],
        TIMEOUT,
    );
    out.assert_success();
}
