//! `lightswitch record -- CMD`: real commands (a shell running a compiled
//! C program) profiled from their first instruction with their
//! descendants; exit statuses passed on; interrupts; the status line.
//! Needs root, gcc and `script` (util-linux).

#[path = "../common/mod.rs"]
mod common;
mod compat;
mod start;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// Two phases of CPU time: `first_phase` until `argv[1]` ms of the
/// process's CPU time, then `second_phase` (through the chain) until
/// `argv[1] + argv[2]` ms. CPU time, not wall time, so that a loaded machine
/// changes only how long it takes.
fn phases_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <stdlib.h>
#include <time.h>
static double cpu_ms(void) {{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}}
volatile unsigned long spin;
__attribute__((noinline)) void first_phase(double until) {{ while (cpu_ms() < until) spin++; }}
{CHAIN_FUNCTIONS}
int main(int argc, char **argv) {{
    double first = atof(argv[1]), second = atof(argv[2]);
    first_phase(first);
    while (cpu_ms() < first + second) chain_a();
    return 0;
}}
"#
    )
}

/// `lightswitch record` with folded output into `dir`, then `command`.
fn record_args(dir: &Path, freq: &str, command: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "record",
        "--sample-freq",
        freq,
        "--profile-format",
        "folded",
        "--profile-path",
        s(dir),
        "--",
    ]
    .map(String::from)
    .to_vec();
    args.extend(command.iter().map(|a| a.to_string()));
    args
}

/// The shell's child is followed (fork, then exec, in the BPF program), its
/// samples carry the whole call chain, and `exit 3` becomes lightswitch's
/// exit status.
#[test]
fn record_follows_a_shells_child_and_passes_its_exit_status_on() {
    let _serial = serial();
    let program = compile("rec_chain", &phases_source(), FP_FLAGS);
    let dir = tempdir();
    let script = format!("{} 1 600; exit 3", program.path.display());
    let out = run(
        &record_args(dir.path(), "499", &["sh", "-c", &script]),
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(3), "{out}");
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let mine = of_process(&stacks, &program.name);
    let samples: u64 = mine.iter().map(|(_, n)| n).sum();
    assert!(
        samples >= 30,
        "{samples} samples of the shell's child:\n{out}"
    );
    // The chain, below main the C runtime's start: a complete walk.
    let full: u64 = mine
        .iter()
        .filter(|(frames, _)| {
            let user = user_frames(frames);
            user.first() == Some(&"_start") && user.windows(CHAIN.len()).any(|w| w == CHAIN)
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        full * 2 >= samples,
        "only {full} of {samples} samples of the child carry _start..main..chain_hot:\n{out}"
    );
    // The summary goes to stderr: stdout is the command's.
    assert!(out.stderr.contains("profile written to"), "{out}");
    assert!(!out.stdout.contains("profile written to"), "{out}");
}

/// `--profile-name -`: the profile is all there is on stdout; the
/// command's own output goes to stderr instead of mixing into it.
#[test]
fn record_to_stdout_keeps_the_commands_output_apart() {
    let _serial = serial();
    let program = compile("rec_stdout", &phases_source(), FP_FLAGS);
    let dir = tempdir();
    let script = format!("echo HELLO-FROM-CMD; {} 1 300", program.path.display());
    let mut args = record_args(dir.path(), "499", &["sh", "-c", &script]);
    let dashdash = args.iter().position(|a| a == "--").unwrap();
    args.splice(dashdash..dashdash, ["--profile-name".into(), "-".into()]);
    let out = run(&args, TIMEOUT);
    out.assert_success();
    assert!(!out.stdout.contains("HELLO-FROM-CMD"), "{out}");
    assert!(out.stderr.contains("HELLO-FROM-CMD"), "{out}");
    // Every line of stdout is a folded stack.
    let stacks = parse_folded(&out.stdout);
    assert!(!of_process(&stacks, &program.name).is_empty(), "{out}");
}

/// The sampler is attached before the command execs: a 10 ms first phase
/// (at 1000 Hz about 10 samples) is in the profile.
///
/// Up to three runs: before the exec-time mapping lists (decision 0002), about
/// one run in ten left every user stack of a 50 ms program `no_mapping`
/// (its maps read before ld.so mapped libc); none in ten runs since.
#[test]
fn record_samples_the_first_milliseconds() {
    let _serial = serial();
    let program = compile("rec_phases", &phases_source(), FP_FLAGS);
    let mut tries = Vec::new();
    for _ in 0..3 {
        let dir = tempdir();
        let command = [s(&program.path), "10", "40"];
        let out = run(&record_args(dir.path(), "1000", &command), TIMEOUT);
        assert_eq!(out.status.code(), Some(0), "{out}");
        let stacks = read_folded(&dir.path().join("folded.txt"));
        let mine = of_process(&stacks, &program.name);
        let in_function = |name: &str| -> u64 {
            mine.iter()
                .filter(|(frames, _)| frames.iter().any(|f| f == name))
                .map(|(_, n)| n)
                .sum()
        };
        let first = in_function("first_phase");
        let second = in_function("chain_hot");
        if first >= 2 {
            return;
        }
        tries.push(format!(
            "{first} samples in the first 10 ms of CPU ({second} in the next 40 ms):\n{out}"
        ));
    }
    panic!("three runs without the first phase:\n{}", tries.join("\n"));
}

/// Death by signal N is exit status 128 + N; a command that cannot be
/// found is 127 with a message, and nothing is profiled.
#[test]
fn record_exit_statuses() {
    let _serial = serial();
    let dir = tempdir();
    let out = run(
        &record_args(dir.path(), "99", &["sh", "-c", "kill -KILL $$"]),
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(128 + 9), "{out}");
    let out = run(
        &record_args(dir.path(), "99", &["no-such-command-lsw"]),
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(127), "{out}");
    assert!(
        out.stderr
            .contains("no-such-command-lsw: command not found"),
        "{out}"
    );
    // Found but not executable: 126, as shells say it.
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    chmod(&script, 0o644);
    // A script whose interpreter is missing: 127, naming both.
    let bad_interp = dir.path().join("bad-interp.sh");
    std::fs::write(&bad_interp, "#!/nonexistent/interp\nexit 0\n").unwrap();
    chmod(&bad_interp, 0o755);
    let bad = format!("{}: bad interpreter /nonexistent/interp", s(&bad_interp));
    for (command, expected, message) in [
        (s(&bad_interp), 127, bad.as_str()),
        (s(&script), 126, "not executable (permission denied)"),
        (s(dir.path()), 126, "is a directory"),
        ("", 127, "the command is an empty string"),
    ] {
        let out = run(&record_args(dir.path(), "99", &[command]), TIMEOUT);
        assert_eq!(out.status.code(), Some(expected), "{command:?}: {out}");
        assert!(out.stderr.contains(message), "{command:?}: {out}");
    }
    // Too short to be sampled, so the (default) flame graph cannot be
    // drawn: the command's failure is still the exit status, and the
    // missing profile is said on stderr; a command that succeeded gets
    // record's own failure status, 125, which `exit 1` would not be.
    for (script, expected) in [
        ("exit 42", 42),
        ("kill -SEGV $$", 128 + 11),
        ("exit 0", lightswitch::commands::record::OWN_FAILURE_STATUS),
    ] {
        let out = run(
            &[
                "record",
                "--sample-freq",
                "9",
                "--profile-path",
                s(dir.path()),
                "--",
                "sh",
                "-c",
                script,
            ],
            TIMEOUT,
        );
        assert_eq!(out.status.code(), Some(expected), "{script}: {out}");
        assert!(
            out.stderr.contains("no profile was written"),
            "{script}: {out}"
        );
        assert!(
            out.stderr
                .contains("the command ran too briefly to be sampled at 9 Hz"),
            "{script}: {out}"
        );
    }
    // An output that cannot be written stops the run before the command
    // starts: record's own failure, 125 (not a shell's 127 for the
    // ENOENT/ENOTDIR on the way), and the held command leaves without a
    // word of its own.
    std::fs::write(dir.path().join("plain"), "").unwrap();
    let out = run(
        &[
            "record",
            "--profile-path",
            s(dir.path()),
            "--profile-name",
            "plain/x.svg",
            "true",
        ],
        TIMEOUT,
    );
    assert_eq!(
        out.status.code(),
        Some(lightswitch::commands::record::OWN_FAILURE_STATUS),
        "{out}"
    );
    assert!(out.stderr.contains("is not a directory"), "{out}");
    assert!(!out.stderr.contains("fatal runtime error"), "{out}");
}

/// SIGINT to lightswitch goes to the command; the profile is still written
/// and the command's death by SIGINT is the exit status (130).
#[test]
fn record_interrupt_reaches_the_command_and_the_profile_is_written() {
    let _serial = serial();
    let program = compile("rec_forever", &chain_forever_source(), FP_FLAGS);
    let dir = tempdir();
    let mut profiler = Lightswitch::spawn(&record_args(dir.path(), "99", &[s(&program.path)]));
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_secs(2));
    profiler.signal(libc::SIGINT);
    let out = profiler.wait(TIMEOUT);
    assert_eq!(out.status.code(), Some(130), "{out}");
    assert!(
        out.stderr.contains("stopping, writing the profile"),
        "{out}"
    );
    let stacks = read_folded(&dir.path().join("folded.txt"));
    assert!(!of_process(&stacks, &program.name).is_empty(), "{out}");
}

/// `timeout -s INT` signals lightswitch, then its whole process group
/// (lightswitch again, and the command): one interrupt, not two. The
/// profile is written. The command gets the group's SIGINT, and at most
/// one more: lightswitch does not pass it on when it saw it twice, but the
/// kernel merges the two when both arrive before lightswitch runs, and then
/// it cannot tell that the group had it.
#[test]
fn an_interrupt_sent_to_the_process_and_its_group_counts_once() {
    let _serial = serial();
    let dir = tempdir();
    let count = dir.path().join("sigints");
    // The command counts SIGINTs for 3 s of wall time, then writes the count.
    let script = format!(
        "n=0; trap 'n=$((n+1))' INT; end=$(($(date +%s)+3)); \
         while [ $(date +%s) -lt $end ]; do :; done; echo $n > {}",
        s(&count)
    );
    let mut cmd = Command::new(BIN);
    cmd.args(record_args(dir.path(), "99", &["sh", "-c", &script]));
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut profiler = Lightswitch::spawn_command(cmd);
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_millis(500));
    let pid = profiler.pid() as libc::pid_t;
    // SAFETY: plain kill(2): our child, then the process group it leads.
    unsafe {
        assert_eq!(libc::kill(pid, libc::SIGINT), 0);
        assert_eq!(libc::kill(-pid, libc::SIGINT), 0);
    }
    let out = profiler.wait(TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert!(!out.stderr.contains("interrupted again"), "{out}");
    assert!(dir.path().join("folded.txt").exists(), "{out}");
    let seen = std::fs::read_to_string(&count).unwrap_or_default();
    assert!(
        ["1", "2"].contains(&seen.trim()),
        "SIGINTs the command saw: {seen:?}; {out}"
    );
}

/// The status line is drawn on a terminal (a pseudo-terminal from
/// `script`) and absent when stderr is a pipe.
#[test]
fn status_line_only_on_a_terminal() {
    let _serial = serial();
    let program = compile("rec_status", &phases_source(), FP_FLAGS);
    let dir = tempdir();
    let command = [s(&program.path), "1", "2500"];
    let args = record_args(dir.path(), "99", &command);
    let piped = run(&args, TIMEOUT);
    assert_eq!(piped.status.code(), Some(0), "{piped}");
    assert!(!piped.stderr.contains("lightswitch: "), "{piped}");

    let line = std::iter::once(BIN.to_string())
        .chain(args)
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let started = Instant::now();
    let mut script = Command::new("script");
    script.args(["-qec", &line, "/dev/null"]);
    let out = run_command(script, TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    // script merges the terminal's output onto its stdout.
    assert!(out.stdout.contains("\r\x1b[Klightswitch: "), "{out}");
    assert!(out.stdout.contains(" lost, 1 process, "), "{out}");
}

/// Started "through sudo" (SUDO_UID/SUDO_GID set), the command runs as that
/// user with its home directory; `--as-root` keeps root.
#[test]
fn record_runs_the_command_as_the_sudo_user() {
    let _serial = serial();
    let dir = tempdir();
    let script = "echo $(id -u):$(id -g):$HOME:$USER";
    let args = record_args(dir.path(), "99", &["sh", "-c", script]);
    let as_user = |extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(&args[..1]).args(extra).args(&args[1..]);
        cmd.env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534")
            .env("SUDO_USER", "nobody");
        run_command(cmd, TIMEOUT)
    };
    let out = as_user(&[]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert_eq!(
        out.stdout.trim(),
        "65534:65534:/nonexistent:nobody",
        "{out}"
    );
    // The profile is the invoking user's, still private.
    let owner = |path: &Path| {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).unwrap();
        (meta.uid(), meta.gid(), meta.mode() & 0o777)
    };
    let folded = dir.path().join("folded.txt");
    assert_eq!(owner(&folded), (65534, 65534, 0o600), "{out}");
    let out = as_user(&["--as-root"]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert!(out.stdout.starts_with("0:0:"), "{out}");
    assert_eq!(owner(&folded), (0, 0, 0o600), "{out}");
    // A --profile-path the run created is given away too.
    let created = dir.path().join("made-by-record");
    let mut cmd = Command::new(BIN);
    cmd.args(["record", "--profile-format", "folded", "--profile-path"])
        .arg(&created)
        .args(["--", "true"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534");
    let out = run_command(cmd, TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert_eq!(owner(&created).0, 65534, "{out}");
    assert_eq!(owner(&created.join("folded.txt")).0, 65534, "{out}");
}

/// A second interrupt ends lightswitch at once (130), writing nothing,
/// even though the command ignores SIGINT and is still running.
#[test]
fn second_interrupt_exits_without_writing() {
    let _serial = serial();
    let dir = tempdir();
    let args = record_args(dir.path(), "99", &["sh", "-c", "trap '' INT; sleep 5"]);
    let mut profiler = Lightswitch::spawn(&args);
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_millis(500));
    profiler.signal(libc::SIGINT);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        profiler.is_running(),
        "the first interrupt waits for the command"
    );
    profiler.signal(libc::SIGINT);
    let out = profiler.wait(Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(130), "{out}");
    assert!(
        out.stderr.contains("stopping, writing the profile"),
        "{out}"
    );
    assert!(
        out.stderr
            .contains("interrupted again: exiting now, no profile written"),
        "{out}"
    );
    assert!(!dir.path().join("folded.txt").exists(), "{out}");
}

/// The flame graph of `record` says what it shows: the command in the
/// title; host, start, duration, frequency and the summary's sample count
/// in the subtitle; boxes coloured by frame kind (the program's functions
/// yellow, kernel frames orange, the process name blue-grey, unwind
/// results grey), read back with a real XML parser.
#[test]
fn record_flame_graph_title_subtitle_and_colours() {
    let _serial = serial();
    let program = compile("rec_flame", &phases_source(), FP_FLAGS);
    let dir = tempdir();
    let out = run(
        &[
            "record",
            "-F",
            "499",
            "--profile-format",
            "flame-graph,folded",
            "--profile-path",
            s(dir.path()),
            "--",
            s(&program.path),
            "150",
            // atof reads the number; the title quotes the argument.
            "150 ms",
        ],
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(0), "{out}");
    let svg = std::fs::read_to_string(dir.path().join("flamegraph.svg")).unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options).expect("the SVG parses");
    let text_of = |id: &str| {
        doc.descendants()
            .find(|n| n.attribute("id") == Some(id))
            .and_then(|n| n.text())
            .unwrap_or_else(|| panic!("no #{id}"))
            .to_string()
    };
    assert_eq!(
        text_of("title"),
        format!("CPU profile of {} 150 '150 ms'", program.path.display())
    );
    let subtitle = text_of("subtitle");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    // The summary is on stderr (stdout is the command's).
    let samples = Summary::parse(&out.stderr).expect("summary").samples;
    assert!(
        subtitle.starts_with(&format!("host {}, started 20", host.trim())),
        "{subtitle}"
    );
    assert!(subtitle.contains(" UTC, "), "{subtitle}");
    assert!(
        subtitle.ends_with(&format!(" at 499 Hz, {samples} samples")),
        "{subtitle}"
    );
    let seconds: f64 = subtitle
        .split(" UTC, ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.2..5.0).contains(&seconds), "{subtitle}");

    // Kernel frames as folded output names them (inferno's titles drop `_[k]`).
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let kernel: std::collections::HashSet<&str> = stacks
        .iter()
        .flat_map(|(frames, _)| kernel_frames(frames))
        .collect();
    let mut seen = std::collections::BTreeMap::<&str, u32>::new();
    for group in doc.descendants().filter(|n| n.has_tag_name("g")) {
        let (Some(title), Some(rect)) = (
            group
                .children()
                .find(|n| n.has_tag_name("title"))
                .and_then(|t| t.text()),
            group.children().find(|n| n.has_tag_name("rect")),
        ) else {
            continue;
        };
        let name = title.rsplit_once(" (").map_or(title, |(name, _)| name);
        let fill = rect.attribute("fill").unwrap();
        let rgb: Vec<u8> = fill
            .trim_start_matches("rgb(")
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.parse().unwrap())
            .collect();
        let (r, g, b) = (rgb[0], rgb[1], rgb[2]);
        let class = if name == "rec_flame" {
            assert!((130..=160).contains(&r) && b == 230, "{name}: {fill}");
            "process"
        } else if name.starts_with("[unwind: ") {
            assert!(
                r == g && g == b && (150..=190).contains(&r),
                "{name}: {fill}"
            );
            "unwind"
        } else if ["first_phase", "chain_a", "chain_hot", "main"].contains(&name) {
            assert!(
                r >= 230 && (180..=230).contains(&g) && (40..=90).contains(&b),
                "{name}: {fill}"
            );
            "user native"
        } else if kernel.contains(name) && !name.contains('+') {
            assert!(
                r >= 230 && (100..=150).contains(&g) && b <= 40,
                "{name}: {fill}"
            );
            "kernel"
        } else {
            continue;
        };
        *seen.entry(class).or_default() += 1;
    }
    assert!(seen.contains_key("process"), "{seen:?}");
    assert!(
        seen.get("user native").copied().unwrap_or(0) >= 3,
        "{seen:?}"
    );
}
