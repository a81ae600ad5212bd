//! Command-line conventions (docs/usage.md, and the summary's wording,
//! docs/reading-output.md): short flags and durations with units on real runs, `--help`
//! examples, shell completions the shells accept, a man page `man` renders,
//! the `--pids` hint when only a target's children ran, singular nouns in
//! the summary, and a network run whose every delivery failed.
//! Needs root (BPF), gcc, bash and man (groff).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// `lightswitch ARGS` without sampling (help, completions, man), its
/// status and stdout.
fn plain(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn short_flags_and_durations_with_units() {
    let _serial = serial();
    let program = compile("cli_short", &chain_forever_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let args = [
        "-p",
        &workload.pid_arg(),
        "-F",
        "999",
        "-d",
        "1500ms",
        "--profile-format",
        "folded",
        "--profile-path",
        s(dir.path()),
    ];
    let started = Instant::now();
    // Sampled for at least 1 s of the 1.5 s.
    let profiled = profile_workload(&workload, &args, 1.0);
    let took = started.elapsed();
    let out = &profiled.out;
    out.assert_success();
    let summary = out.summary();
    // One process: the noun is singular.
    assert_eq!(summary.processes, 1, "{out}");
    assert!(out.stdout.contains(" 1 process, "), "{out}");
    // -F 999 over -d 1500ms: as many samples as the workload's CPU time at
    // 999 Hz allows (a loaded machine gives it less than all of 1.5 s); the
    // default 99 Hz would give a tenth, below the lower bound.
    profiled.assert_plausible(summary.samples, 999.0);
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let stacks = read_folded(&dir.path().join("folded.txt"));
    assert_eq!(total(&stacks), summary.samples);

    // Windows of 500 ms over 1.6 s: three closed ones and the last part.
    let windows = tempdir();
    let out = run(
        &[
            "-p",
            &workload.pid_arg(),
            "--duration",
            "1600ms",
            "--profile-interval",
            "500ms",
            "--profile-format",
            "folded",
            "--profile-path",
            s(windows.path()),
        ],
        TIMEOUT,
    );
    out.assert_success();
    let files = std::fs::read_dir(windows.path()).unwrap().count();
    assert!((3..=5).contains(&files), "{files} window files\n{out}");
    assert!(out.stdout.contains("windows written to"), "{out}");

    // Bad durations are usage errors naming the value.
    let (code, _, stderr) = plain(&["-d", "5 parsecs"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("\"5 parsecs\" is not a duration"),
        "{stderr}"
    );
}

#[test]
fn help_ends_with_examples() {
    let (code, stdout, _) = plain(&["--help"]);
    assert_eq!(code, Some(0));
    let examples = stdout.rfind("Examples:").expect("an Examples section");
    let tail = &stdout[examples..];
    assert!(tail.contains("lightswitch record -- ./bench"), "{tail}");
    assert!(tail.contains("-p 1234 -F 999 -d 30s"), "{tail}");
    assert!(stdout.contains("-p, --pids"), "{stdout}");
    assert!(stdout.contains("-F, --sample-freq"), "{stdout}");
    assert!(stdout.contains("-d, --duration"), "{stdout}");
    for sub in ["record", "diff", "report", "completions", "man"] {
        let (code, out, _) = plain(&[sub, "--help"]);
        assert_eq!(code, Some(0), "{sub}");
        assert!(out.contains("Examples:"), "{sub} --help:\n{out}");
    }
}

#[test]
fn completion_scripts_load_in_their_shells() {
    let dir = tempdir();
    let (code, bash, _) = plain(&["completions", "bash"]);
    assert_eq!(code, Some(0));
    let script = dir.path().join("lightswitch.bash");
    std::fs::write(&script, &bash).unwrap();
    // Sourcing defines the function; completing `lightswitch rec` offers record.
    let check = format!(
        ". {}; COMP_WORDS=(lightswitch rec); COMP_CWORD=1; COMP_LINE='lightswitch rec'; \
         COMP_POINT=15; _lightswitch lightswitch rec lightswitch; echo \"${{COMPREPLY[@]}}\"",
        s(&script)
    );
    let out = Command::new("bash").args(["-c", &check]).output().unwrap();
    let offered = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{offered}");
    assert_eq!(offered.trim(), "record", "{offered}");
    for shell in ["zsh", "fish"] {
        let (code, text, _) = plain(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}");
        assert!(text.contains("sample-freq"), "{shell}:\n{text}");
        assert!(text.contains("record"), "{shell}:\n{text}");
    }
    let (code, _, stderr) = plain(&["completions", "tcsh"]);
    assert_eq!(code, Some(2), "{stderr}");
    // A write that fails is one error line and status 1, not a panic.
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn man_page_renders() {
    let dir = tempdir();
    let (code, roff, _) = plain(&["man"]);
    assert_eq!(code, Some(0));
    assert!(roff.contains(".TH lightswitch 1"), "{roff}");
    let page = dir.path().join("lightswitch.1");
    std::fs::write(&page, &roff).unwrap();
    let out = Command::new("man")
        .args(["-l", s(&page)])
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    // man may render hyphens as U+2010; compare without them.
    let text = text.replace(['\u{2010}', '\u{2011}'], "-");
    for needle in ["NAME", "SYNOPSIS", "--sample-freq", "--duration", "record"] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

/// Every subcommand lightswitch(1) lists as lightswitch-NAME(1) has that
/// page: `lightswitch man NAME`; a name it does not have is a usage error.
#[test]
fn every_listed_subcommand_page_renders() {
    let (_, main_page, _) = plain(&["man"]);
    let listed: Vec<&str> = main_page
        .lines()
        .filter_map(|l| l.strip_prefix("lightswitch\\-")?.strip_suffix("(1)"))
        .collect();
    assert!(listed.len() >= 8, "{listed:?}\n{main_page}");
    for name in listed {
        let name = name.replace("\\-", "-");
        let (code, roff, stderr) = plain(&["man", &name]);
        assert_eq!(code, Some(0), "man {name}: {stderr}");
        assert!(
            roff.contains(&format!(".TH lightswitch-{name} 1")),
            "man {name}:\n{roff}"
        );
        assert!(roff.contains(".SH SYNOPSIS"), "man {name}:\n{roff}");
    }
    let (code, _, stderr) = plain(&["man", "no-such-command"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("show-unwind"), "{stderr}");
}

/// `-p` on a shell that only waits for its busy child: no samples, and the
/// message names the child and `record`.
#[test]
fn pids_of_a_waiting_parent_name_its_busy_children() {
    let _serial = serial();
    let program = compile("cli_child", &chain_forever_source(), FP_FLAGS);
    let mut shell = Command::new("sh")
        .args(["-c", &format!("{}; true", s(&program.path))])
        .spawn()
        .unwrap();
    // Let the child start and use some CPU.
    std::thread::sleep(Duration::from_millis(300));
    let dir = tempdir();
    let out = run(
        &[
            "-p",
            &shell.id().to_string(),
            "-d",
            "1s",
            "--profile-path",
            s(dir.path()),
        ],
        TIMEOUT,
    );
    let _ = Command::new("pkill")
        .args(["-KILL", "-P", &shell.id().to_string()])
        .status();
    let _ = shell.kill();
    let _ = shell.wait();
    assert_eq!(out.status.code(), Some(1), "{out}");
    let expected = format!(
        "pid {} (sh) took no samples, but its children ran: ",
        shell.id()
    );
    assert!(out.stderr.contains(&expected), "{out}");
    assert!(out.stderr.contains("(cli_child)"), "{out}");
    assert!(out.stderr.contains("lightswitch record -- CMD"), "{out}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "{out}");
}

/// Every delivery refused (nothing listens): exit 1, and the summary's
/// error names the first failure.
#[test]
fn a_run_whose_every_delivery_failed_exits_non_zero() {
    let _serial = serial();
    // A port nothing listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1/profiles");
    let out = run(
        &[
            "--sender",
            "remote",
            "--server-url",
            &url,
            "-d",
            "1200ms",
            "--profile-interval",
            "500ms",
            "--flush-timeout",
            "300ms",
        ],
        TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(1), "{out}");
    assert!(out.stdout.contains("delivery: sent=0 "), "{out}");
    let error = out
        .stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line\n{out}"));
    assert!(error.contains("not delivered to"), "{out}");
    assert!(error.contains("first error: "), "{out}");
    assert!(error.to_lowercase().contains("connect"), "{out}");
}

/// Listen-only mode writes no profile, so its Ctrl-C does not say it does;
/// the summary still says what was served, in the right number.
#[test]
fn listen_only_interrupt_promises_no_profile() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let _serial = serial();
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    stdout.read_line(&mut banner).unwrap();
    assert!(banner.starts_with("listening on http://"), "{banner}");
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("stopping, no profile is written in listen-only mode"),
        "{stderr}"
    );
    assert!(!stderr.contains("writing the profile"), "{stderr}");
    assert!(rest.starts_with("0 on-demand profiles served: "), "{rest}");
}

/// `record`'s help and bash completion leave out `-p`/`--pids`, which
/// record rejects; completion leaves the command's own words to the
/// command (`record ls -` offers none of record's options) and completes
/// its name from `PATH`, after record's options or `--`.
#[test]
fn record_help_and_completion_leave_the_command_alone() {
    for help in ["--help", "-h"] {
        let (code, text, _) = plain(&["record", help]);
        assert_eq!(code, Some(0));
        assert!(text.contains("--sample-freq"), "{text}");
        assert!(!text.contains("--pids") && !text.contains("-p,"), "{text}");
    }
    let dir = tempdir();
    let (_, bash, _) = plain(&["completions", "bash"]);
    let script = dir.path().join("lightswitch.bash");
    std::fs::write(&script, &bash).unwrap();
    let complete = |words: &[&str]| -> Vec<String> {
        let check = format!(
            ". {}; COMP_WORDS=(\"$@\"); COMP_CWORD=$(( $# - 1 )); \
             _lightswitch lightswitch \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            s(&script)
        );
        let out = Command::new("bash")
            .args(["-c", &check, "bash"])
            .args(words)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    };
    let ours = complete(&["lightswitch", "record", "-"]);
    assert!(ours.contains(&"--sample-freq".to_string()), "{ours:?}");
    assert!(!ours.contains(&"--pids".to_string()), "{ours:?}");
    assert!(!ours.contains(&"-p".to_string()), "{ours:?}");
    for words in [
        &["lightswitch", "record", "ls", "-"][..],
        &["lightswitch", "record", "-F", "99", "ls", "--s"],
        &["lightswitch", "record", "--", "ls", "-"],
    ] {
        let offered = complete(words);
        assert!(
            !offered.iter().any(|o| o.starts_with("--s")),
            "{words:?}: {offered:?}"
        );
    }
    for words in [
        &["lightswitch", "record", "-F", "99", "ech"][..],
        &["lightswitch", "record", "--", "ech"],
    ] {
        let offered = complete(words);
        assert!(
            offered.contains(&"echo".to_string()),
            "{words:?}: {offered:?}"
        );
    }
}

/// Flame graphs say "1 sample" in the tooltip of a box of one sample, and
/// keep the plural for more (`report --format flame-graph` of folded stacks,
/// and `diff --flame-graph`).
#[test]
fn flame_graph_tooltips_count_one_sample() {
    let dir = tempdir();
    let folded = dir.path().join("in.txt");
    std::fs::write(&folded, "prog;main;rare 1\nprog;main;hot 11\n").unwrap();
    let svg = dir.path().join("out.svg");
    let (code, _, stderr) = plain(&[
        "report",
        "--format",
        "flame-graph",
        "-o",
        s(&svg),
        s(&folded),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("rare (1 sample, "), "{text}");
    assert!(text.contains("hot (11 samples, "), "{text}");
    assert!(!text.contains(" 1 samples"), "{text}");
    let diff = dir.path().join("diff.svg");
    let (code, _, stderr) = plain(&["diff", "--flame-graph", s(&diff), s(&folded), s(&folded)]);
    assert_eq!(code, Some(0), "{stderr}");
    let text = std::fs::read_to_string(&diff).unwrap();
    assert!(text.contains("rare (1 sample, "), "{text}");
    assert!(!text.contains(" 1 samples"), "{text}");
}
