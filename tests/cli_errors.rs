//! Each problem the profiler can detect before it starts gets a non-zero
//! exit and a message naming the problem. Every run is given `--duration 1`,
//! so a missing check shows up as a run that succeeds, not as a hang.
//! Needs root and util-linux (`setpriv`, `unshare`).

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(30);

/// A run that writes folded output into `out_dir` plus `extra` args.
fn args_with(out_dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--duration",
        "1",
        "--profile-format",
        "folded",
        "--profile-path",
        s(out_dir),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// Assert that no profile was written into `dir`.
fn assert_empty(dir: &Path) {
    let entries: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "a failed run left files behind: {entries:?}"
    );
}

fn max_sample_rate() -> u64 {
    fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn sample_freq_zero() {
    let dir = tempdir();
    let out = run(&args_with(dir.path(), &["--sample-freq", "0"]), TIMEOUT);
    let max = max_sample_rate().to_string();
    out.assert_error(&["perf_event_max_sample_rate", &max]);
    assert_empty(dir.path());
}

#[test]
fn sample_freq_above_kernel_max() {
    let dir = tempdir();
    let max = max_sample_rate();
    let too_high = (max + 1).to_string();
    let out = run(
        &args_with(dir.path(), &["--sample-freq", &too_high]),
        TIMEOUT,
    );
    out.assert_error(&["perf_event_max_sample_rate", &too_high, &max.to_string()]);
    assert_empty(dir.path());
}

/// A time option out of range is a usage error, like a malformed number:
/// exit status 2 from the command-line parser, before anything starts.
#[test]
fn duration_out_of_range() {
    for bad in ["0", "-1", "-0.5", "nan", "1e20"] {
        let dir = tempdir();
        let out = run(&args_with_duration(dir.path(), bad), TIMEOUT);
        out.assert_error(&["--duration", "at most"]);
        assert_eq!(out.status.code(), Some(2), "--duration {bad}:\n{out}");
        assert_empty(dir.path());
    }
    let dir = tempdir();
    let out = run(
        &args_with(dir.path(), &["--profile-interval", "-5"]),
        TIMEOUT,
    );
    out.assert_error(&["--profile-interval", "above 0"]);
    assert_eq!(out.status.code(), Some(2), "{out}");
}

/// Counts and intervals below their least value are usage errors too
/// (exit status 2, naming the option), before anything starts.
#[test]
fn counts_and_intervals_below_their_least_value_are_usage_errors() {
    let dir = tempdir();
    let storage = dir.path().join("storage");
    let cases: [&[&str]; 6] = [
        &["--profile-interval", "0.05"],
        &["--profile-interval", "1", "--max-profiles", "0"],
        &["--max-unwind-info-mb", "0"],
        &["--listen", "127.0.0.1:0", "--listen-max-connections", "0"],
        &["--sender", "remote", "--send-queue-bytes", "0"],
        &[
            "collector",
            "--storage",
            s(&storage),
            "--max-body-bytes",
            "0",
        ],
    ];
    for extra in cases {
        let args: Vec<&str> = if extra[0] == "collector" {
            extra.to_vec()
        } else {
            let mut args = vec!["--duration", "1", "--profile-path", s(dir.path())];
            args.extend_from_slice(extra);
            args
        };
        let out = run(&args, TIMEOUT);
        let flag = extra[extra.len() - 2];
        out.assert_error(&[flag, "at least"]);
        assert_eq!(out.status.code(), Some(2), "{extra:?}:\n{out}");
    }
    assert!(!storage.exists(), "the collector started");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Flags that conflict with each other are usage errors (exit status 2,
/// clap's format, naming the flag), before anything starts.
#[test]
fn conflicting_flags_are_usage_errors() {
    let dir = tempdir();
    let cases: [(&[&str], &str); 9] = [
        (
            &["record", "-p", "1", "--", "true"],
            "--pids does not apply",
        ),
        (
            &["--profile-name", ""],
            "--profile-name \"\" names no file: give a file name",
        ),
        (
            &["--server-url", "http://127.0.0.1:1"],
            "--server-url is for",
        ),
        (&["--max-profiles", "3"], "--max-profiles applies"),
        (
            &[
                "--profile-format",
                "svg",
                "--profile-format",
                "folded",
                "--profile-name",
                "x",
            ],
            "--profile-name names one file",
        ),
        // A network sender sends its own format or refuses: nothing is
        // silently replaced (docs/usage.md).
        (
            &["--sender", "remote", "--profile-format", "firefox"],
            "--sender remote sends only pprof: it cannot send --profile-format firefox",
        ),
        (
            &["--sender", "pyroscope", "--profile-format", "pprof,otlp"],
            "--sender pyroscope sends only pprof: it cannot send --profile-format otlp",
        ),
        (
            &["--sender", "otlp", "--profile-format", "pprof"],
            "--sender otlp sends only otlp: it cannot send --profile-format pprof",
        ),
        (
            &["--sender", "remote", "--otlp-header", "a=b"],
            "--otlp-header is for --sender otlp",
        ),
    ];
    for (extra, words) in cases {
        let mut args = vec!["--duration", "1", "--profile-path", s(dir.path())];
        if extra[0] == "record" {
            args.insert(0, "record");
            args.extend_from_slice(&extra[1..]);
        } else {
            args.extend_from_slice(extra);
        }
        let out = run(&args, TIMEOUT);
        out.assert_error(&[words]);
        assert!(out.stderr.contains("Usage:"), "{extra:?}:\n{out}");
        assert_eq!(out.status.code(), Some(2), "{extra:?}:\n{out}");
    }
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// [`args_with`], with `seconds` as the `--duration`.
fn args_with_duration(out_dir: &Path, seconds: &str) -> Vec<String> {
    let mut args = args_with(out_dir, &[]);
    args[1] = seconds.to_string();
    args
}

#[test]
fn pid_that_does_not_exist() {
    let dir = tempdir();
    // Above any possible pid_max (at most 2^22).
    let out = run(&args_with(dir.path(), &["--pids", "999999999"]), TIMEOUT);
    out.assert_error(&["999999999", "does not exist"]);
    assert_empty(dir.path());
}

/// A run in which the profiled process never ran has no samples: a flame
/// graph cannot be drawn, and then none of the requested formats is written
/// (not a pprof file and an empty folded file beside an error), nor is the
/// `--profile-path` directory the run would have made.
#[test]
fn no_samples_with_a_flame_graph_requested() {
    let dir = tempdir();
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let mut args = args_with(&dir.path().join("new/dir"), &["--pids", &pid]);
    args[3] = "pprof,folded,flame-graph".to_string();
    let out = run(&args, TIMEOUT);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    out.assert_error(&["no profile was written", "no samples were collected"]);
    assert_empty(dir.path());
}

/// A `--pids` target that exits before it is ever sampled (a short
/// command started just before): an error naming it, with the advice to
/// use `record`, and no (empty) profile written.
#[test]
fn a_target_gone_before_any_sample_fails_and_writes_nothing() {
    let dir = tempdir();
    let mut short = Command::new("sleep").arg("0.3").spawn().unwrap();
    let pid = short.id().to_string();
    let out = run(&args_with(dir.path(), &["--pids", &pid]), TIMEOUT);
    let _ = short.wait();
    out.assert_error(&[
        &format!("pid {pid}"),
        "exited during the run",
        "lightswitch record -- CMD",
    ]);
    assert_empty(dir.path());
}

/// A profile that cannot be written at the end of the run: the error names
/// the file, not just the errno. The run profiles a spinning program, so the
/// profile has bytes to write even on an idle machine (an empty folded
/// profile is zero bytes, and writing zero bytes to `/dev/full` succeeds).
#[test]
fn a_write_error_names_the_file() {
    let program = compile("writeerr", &chain_forever_source(), &["-O1"]);
    let spinner = Workload::spawn(&program);
    let pid = spinner.pid_arg();
    let out = run(
        &args_with(
            Path::new("/dev"),
            &["--profile-name", "full", "--pids", &pid],
        ),
        TIMEOUT,
    );
    out.assert_error(&["writing /dev/full: No space left on device"]);
}

/// `--profile-name -` with standard output closed (`>&-`): an error before
/// sampling, not a profile silently lost to the `/dev/null` the Rust
/// runtime puts in place of the closed descriptor.
#[test]
fn a_closed_stdout_is_an_error() {
    let dir = tempdir();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec \"$0\" \"$@\" >&-", BIN])
        .args(args_with(dir.path(), &["--profile-name", "-"]));
    let out = run_command(cmd, TIMEOUT);
    out.assert_error(&["standard output", "closed"]);
    // Standard output redirected to /dev/null is a choice, not an error.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "exec \"$0\" \"$@\" >/dev/null", BIN])
        .args(args_with(dir.path(), &["--profile-name", "-"]));
    run_command(cmd, TIMEOUT).assert_success();
}

#[test]
fn output_directory_under_a_regular_file() {
    let dir = tempdir();
    let file = dir.path().join("plain-file");
    fs::write(&file, "not a directory").unwrap();
    let target = file.join("sub");
    let out = run(&args_with(&target, &[]), TIMEOUT);
    out.assert_error(&[s(&target)]);
    assert_eq!(fs::read_to_string(&file).unwrap(), "not a directory");
}

#[test]
fn output_directory_not_writable() {
    // Even root cannot create files in /proc/sys.
    let out = run(&args_with(Path::new("/proc/sys"), &[]), TIMEOUT);
    out.assert_error(&["/proc/sys/folded.txt"]);
}

#[test]
fn output_file_is_a_directory() {
    let dir = tempdir();
    fs::create_dir(dir.path().join("taken")).unwrap();
    let out = run(
        &args_with(dir.path(), &["--profile-name", "taken"]),
        TIMEOUT,
    );
    out.assert_error(&["taken", "directory"]);
}

/// The capability names in the error, with parenthesized hints removed (the
/// hint says which capabilities would do; the rest says which are missing).
fn named_missing(stderr: &str) -> String {
    let mut text = String::new();
    let mut depth = 0usize;
    for c in stderr.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => text.push(c),
            _ => {}
        }
    }
    text
}

fn require(tool: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{tool} (util-linux) is required by this test");
}

/// Run the profiler as `nobody` (no capabilities at all).
#[test]
fn unprivileged_user() {
    require("setpriv");
    // The binary and the output directory must be reachable by nobody,
    // wherever the target directory is.
    let (_bin_dir, bin) = copy_binary("lightswitch");
    let out_dir = tempdir();
    chmod(out_dir.path(), 0o777);

    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(args_with(out_dir.path(), &[]))
        .current_dir(out_dir.path());
    let out = run_command(cmd, TIMEOUT);
    out.assert_error(&["CAP_BPF", "CAP_PERFMON"]);
    let missing = named_missing(&out.stderr);
    assert!(
        missing.contains("CAP_BPF") && missing.contains("CAP_PERFMON"),
        "both capabilities should be named as missing:\n{out}"
    );
    assert_empty(out_dir.path());
}

/// Root whose capabilities lack `dropped` (CAP_SYS_ADMIN is always dropped
/// too, as it stands in for both): the error names exactly what is missing.
fn root_without(dropped: &str, missing: &str, present: &str) {
    require("setpriv");
    let out_dir = tempdir();
    let caps = format!("-{dropped},-sys_admin");
    let mut cmd = Command::new("setpriv");
    // As root, the capabilities after exec are the bounding set plus the
    // inheritable set: drop them from both.
    cmd.arg(format!("--bounding-set={caps}"))
        .arg(format!("--inh-caps={caps}"))
        .arg(BIN)
        .args(args_with(out_dir.path(), &[]));
    let out = run_command(cmd, TIMEOUT);
    out.assert_error(&[missing]);
    let named = named_missing(&out.stderr);
    assert!(
        named.contains(missing) && !named.contains(present),
        "only {missing} should be named as missing (outside the hint in parentheses):\n{out}"
    );
    assert_empty(out_dir.path());
}

#[test]
fn root_without_cap_bpf() {
    root_without("bpf", "CAP_BPF", "CAP_PERFMON");
}

#[test]
fn root_without_cap_perfmon() {
    root_without("perfmon", "CAP_PERFMON", "CAP_BPF");
}

/// A kernel without BTF (simulated by hiding /sys/kernel/btf in a private
/// mount namespace).
#[test]
fn kernel_without_btf() {
    require("unshare");
    let out_dir = tempdir();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        r#"mount -t tmpfs none /sys/kernel/btf || { echo "MOUNT FAILED" >&2; exit 99; }; exec "$0" "$@""#,
        BIN,
    ])
    .args(args_with(out_dir.path(), &[]));
    let out = run_command(cmd, TIMEOUT);
    assert_ne!(
        out.status.code(),
        Some(99),
        "could not hide /sys/kernel/btf:\n{out}"
    );
    out.assert_error(&["BTF"]);
    assert_empty(out_dir.path());
}

#[test]
fn listen_address_that_cannot_be_bound() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    for (listen, expected) in [
        (
            format!("127.0.0.1:{port}"),
            format!("cannot listen on 127.0.0.1:{port}"),
        ),
        (
            format!(":{port}"),
            format!("cannot listen on 127.0.0.1:{port}"),
        ),
    ] {
        let dir = tempdir();
        let out = run(&args_with(dir.path(), &["--listen", &listen]), TIMEOUT);
        out.assert_error(&[&expected]);
        assert_empty(dir.path());
    }
}

#[test]
fn an_empty_token_is_an_error_not_an_open_door() {
    // A secret that failed to render: the variable is set, but empty.
    let cases: [(&str, &[&str]); 3] = [
        ("LIGHTSWITCH_LISTEN_TOKEN", &["--listen", "0.0.0.0:0"]),
        (
            "LIGHTSWITCH_TOKEN",
            &["--sender", "remote", "--profile-interval", "1"],
        ),
        ("LIGHTSWITCH_COLLECTOR_TOKEN", &[]),
    ];
    for (variable, extra) in cases {
        let dir = tempdir();
        let mut cmd = Command::new(BIN);
        cmd.env(variable, "");
        if variable == "LIGHTSWITCH_COLLECTOR_TOKEN" {
            let storage = dir.path().join("store");
            cmd.args(["collector", "--listen", "127.0.0.1:0", "--storage"])
                .arg(&storage);
        } else if extra.contains(&"--sender") {
            // The remote sender sends pprof only: not args_with's folded.
            cmd.args(["--duration", "1", "--profile-path", s(dir.path())])
                .args(extra);
        } else {
            cmd.args(args_with(dir.path(), extra));
        }
        let out = run_command(cmd, TIMEOUT);
        out.assert_error(&[variable, "set but empty"]);
        assert_empty(dir.path());
    }
}

/// `report --from -1` is answered, not met with clap's "use -- -1" hint: a
/// usage error (exit status 2) naming --from and the range it takes, before
/// the file is read.
#[test]
fn a_negative_report_span_is_answered() {
    let dir = tempdir();
    let missing = dir.path().join("none.json");
    for args in [
        &["report", "--from", "-1", s(&missing)][..],
        &["report", "--to", "-0.5", s(&missing)][..],
    ] {
        let out = run(args, TIMEOUT);
        out.assert_error(&["--from and --to must be seconds with 0 <= --from < --to"]);
        assert_eq!(out.status.code(), Some(2), "{args:?}:\n{out}");
        assert!(!out.stderr.contains("-- -"), "{args:?}:\n{out}");
    }
}
