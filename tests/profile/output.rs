//! What a one-shot run writes and where: the SVG flame graph, the profile
//! written when SIGINT or SIGTERM stops a run without `--duration`, and a
//! profile on standard output beside the summary on standard error.

use super::*;

/// The default output is an SVG flame graph, well-formed XML, with every
/// function of the chain as a frame.
#[test]
fn flamegraph_svg() {
    let _serial = serial();
    let program = compile("lsw_flame", &chain_forever_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    let out_dir = tempdir();
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--duration",
            "1",
            "--sample-freq",
            "199",
            "--profile-path",
            s(out_dir.path()),
        ],
        TIMEOUT,
    );
    out.assert_success();
    let file = out_dir.path().join("flamegraph.svg");
    assert_eq!(out.summary().path, file, "{out}");
    let svg = fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {}: {e}\n{out}", file.display()));
    let trimmed = svg.trim();
    assert!(
        trimmed.starts_with("<?xml"),
        "not an XML document: {:.200}",
        svg
    );
    assert!(
        trimmed.ends_with("</svg>"),
        "does not end with </svg>: ...{}",
        &trimmed[trimmed.len().saturating_sub(200)..]
    );

    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options)
        .unwrap_or_else(|e| panic!("invalid XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    for function in [
        "lsw_flame",
        "main",
        "chain_a",
        "chain_b",
        "chain_c",
        "chain_hot",
    ] {
        assert!(
            titles
                .iter()
                .any(|t| t.starts_with(&format!("{function} ("))),
            "no frame titled {function} in the flame graph; titles: {titles:?}"
        );
    }
}

/// Without --duration the profiler runs until `signal`, then writes the
/// profile and exits 0.
fn stops_on(signal: libc::c_int, name: &str) {
    let _serial = serial();
    let program = compile(name, &chain_forever_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    let out_dir = tempdir();
    let args = folded_args(
        &out_dir,
        "s.txt",
        &["--pids", &workload.pid_arg(), "--sample-freq", "199"],
    );
    let mut profiler = Lightswitch::spawn(&args);
    profiler.expect_sampling();
    let cpu_start = workload.cpu_time();
    thread::sleep(Duration::from_millis(1500));
    let cpu = workload.cpu_time() - cpu_start;
    assert!(
        profiler.is_running(),
        "lightswitch stopped by itself without --duration"
    );
    profiler.signal(signal);
    let out = profiler.wait(Duration::from_secs(30));
    out.assert_success();
    let summary = out.summary();
    let file = out_dir.path().join("s.txt");
    assert_eq!(summary.path, file, "{out}");
    let stacks = read_folded(&file);
    assert_eq!(total(&stacks), summary.samples, "{out}");
    // Samples until the signal at least (about 300 on an idle machine).
    let lower = (0.25 * 199.0 * cpu.as_secs_f64()).max(1.0);
    assert!(
        summary.samples as f64 >= lower,
        "only {} samples of a workload that used {cpu:?} of CPU at 199 Hz before the signal:\n{out}",
        summary.samples
    );
    assert!(
        stacks
            .iter()
            .any(|(f, _)| comm(f) == name && f.iter().any(|x| x == "chain_hot")),
        "profile lacks the workload's chain:\n{}",
        show(&stacks.iter().collect::<Vec<_>>())
    );
}

#[test]
fn sigint_stops_and_writes_profile() {
    stops_on(libc::SIGINT, "lsw_sigint");
}

#[test]
fn sigterm_stops_and_writes_profile() {
    stops_on(libc::SIGTERM, "lsw_sigterm");
}

/// With the profile on stdout, what stdout already held stays: a shell's
/// `>>` appends (the file is written through the descriptor the profiler
/// was given, not opened again and truncated).
#[test]
fn profile_to_stdout_appends_to_a_file_opened_for_appending() {
    let _serial = serial();
    let program = compile(&unique_name("lsw_sa"), &chain_forever_source(), FP_FLAGS);
    let _workload = Workload::spawn(&program);
    let dir = tempdir();
    let log = dir.path().join("log.txt");
    fs::write(&log, "line1\nline2\n").unwrap();
    let appending = fs::OpenOptions::new().append(true).open(&log).unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--duration", "500ms", "--profile-format", "folded"])
        .args(["--profile-name", "-"])
        .stdout(appending)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = fs::read_to_string(&log).unwrap();
    let profile = text
        .strip_prefix("line1\nline2\n")
        .unwrap_or_else(|| panic!("what the file held is gone:\n{text}"));
    assert!(total(&parse_folded(profile)) > 0, "no samples:\n{text}");
}

/// `--profile-name /dev/stdout` (or `-`) writes the profile through the symlink into
/// the pipe (the link stays), and the summary goes to stderr, so stdout is
/// the profile alone.
#[test]
fn profile_to_stdout_leaves_the_summary_on_stderr() {
    let _serial = serial();
    // A busy program, so an otherwise idle machine has samples to write.
    let program = compile(&unique_name("lsw_so"), &chain_forever_source(), FP_FLAGS);
    let _workload = Workload::spawn(&program);
    let dir = tempdir();
    // `-` is standard output, as for most Unix tools: no file named `-`.
    for name in ["/dev/stdout", "-"] {
        let out = run(
            &[
                "--duration",
                "500ms",
                "--profile-format",
                "folded",
                "--profile-path",
                s(dir.path()),
                "--profile-name",
                name,
            ],
            TIMEOUT,
        );
        out.assert_success();
        let stacks = parse_folded(&out.stdout);
        assert!(total(&stacks) > 0, "{name}: no samples on stdout:\n{out}");
        assert!(
            out.stderr.contains("profile written to /dev/stdout"),
            "{name}: {out}"
        );
        assert!(!dir.path().join("-").exists(), "a file named - was written");
    }
    let link = fs::symlink_metadata("/dev/stdout").expect("/dev/stdout");
    assert!(link.file_type().is_symlink());
}
