//! Tests of [`super`] (`cli.rs`).

use super::*;

/// The symbol settings the command line gives: the plan's of a profiling
/// run or of `record`, or `show-unwind`'s debug directories.
fn symbols(args: &[&str]) -> crate::symbolize::settings::SymbolSettings {
    let cli = Cli::try_parse_from(std::iter::once("lightswitch").chain(args.iter().copied()))
        .expect("parses");
    match &cli.command {
        Some(Command::ShowUnwind { debug_dirs, .. }) => {
            crate::symbolize::settings::SymbolSettings {
                debug_dirs: debug_dirs.clone(),
                ..Default::default()
            }
        }
        Some(Command::Record(record)) => record.plan().expect("a valid plan").run.symbols,
        _ => cli.profile.plan(false).expect("a valid plan").symbols,
    }
}

fn dirs(args: &[&str]) -> Vec<PathBuf> {
    symbols(args).debug_dirs
}

#[test]
fn debug_dirs_default_split_repeat_and_reach_show_unwind() {
    let default = vec![PathBuf::from("/usr/lib/debug")];
    let ab = vec![PathBuf::from("/a"), PathBuf::from("/b")];
    assert_eq!(dirs(&[]), default);
    assert_eq!(dirs(&["--debug-dirs", "/a,/b"]), ab);
    assert_eq!(dirs(&["--debug-dirs", "/a", "--debug-dirs", "/b"]), ab);
    assert_eq!(dirs(&["record", "--debug-dirs", "/a,/b", "--", "true"]), ab);
    assert_eq!(dirs(&["show-unwind", "/bin/true"]), default);
    // The path after the list is the object, not one more directory.
    assert_eq!(
        dirs(&["show-unwind", "--debug-dirs", "/a,/b", "/bin/true"]),
        ab
    );
}

/// The debuginfod flags reach the plan (top level and `record`'s own),
/// not a process-wide client.
#[test]
fn debuginfod_flags_travel_in_the_plan() {
    let given = symbols(&[
        "--debuginfod",
        "http://a,http://b",
        "--debuginfod-cache",
        "/c",
    ]);
    assert_eq!(given.debuginfod_urls, vec!["http://a", "http://b"]);
    assert_eq!(given.debuginfod_cache, Some(PathBuf::from("/c")));
    let record = symbols(&["record", "--debuginfod", "http://r", "--", "true"]);
    assert_eq!(record.debuginfod_urls, vec!["http://r"]);
    assert_eq!(symbols(&[]).debuginfod_urls, Vec::<String>::new());
}

#[test]
fn format_names_and_aliases_parse_in_any_case() {
    let formats = |value: &str| {
        Cli::try_parse_from(["lightswitch", "--profile-format", value])
            .map(|cli| cli.profile_format.clone())
    };
    assert_eq!(formats("PPROF").unwrap(), vec![ProfileFormat::Pprof]);
    assert_eq!(
        formats("SVG,Folded").unwrap(),
        vec![ProfileFormat::FlameGraph, ProfileFormat::Folded]
    );
    assert!(formats("png").is_err());
}

#[test]
fn record_takes_its_command_with_or_without_dashes() {
    let command = |args: &[&str]| {
        let cli = Cli::try_parse_from(["lightswitch", "record"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        match cli.command {
            Some(Command::Record(r)) => Ok(r.command),
            other => Err(format!("{other:?}")),
        }
    };
    let ls_la = vec![OsString::from("ls"), OsString::from("-la")];
    assert_eq!(command(&["ls", "-la"]).unwrap(), ls_la);
    assert_eq!(command(&["--", "ls", "-la"]).unwrap(), ls_la);
    // Options before the command are record's; after it, the command's.
    let cli = Cli::try_parse_from(["lightswitch", "record", "-F", "99", "ls", "-F", "7"]).unwrap();
    let Some(Command::Record(r)) = cli.command else {
        panic!("not record")
    };
    assert_eq!(r.profile.sample_freq, 99);
    assert_eq!(r.command, ["ls", "-F", "7"].map(OsString::from));
    // A list option takes one value (comma-separated); the next word is
    // the command, not a second format or pid.
    assert_eq!(
        command(&["--profile-format", "pprof", "true"]).unwrap(),
        ["true"]
    );
    assert_eq!(command(&["-p", "1", "true"]).unwrap(), ["true"]);
    assert!(command(&[]).is_err(), "a command is required");
    assert!(
        command(&["--bogus", "ls"]).is_err(),
        "an unknown option is an error"
    );
}

#[test]
fn record_help_leaves_out_pids() {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    let record = cli.find_subcommand_mut("record").expect("record");
    let help = record.render_long_help().to_string();
    assert!(help.contains("--sample-freq"), "{help}");
    assert!(!help.contains("--pids"), "{help}");
}

#[test]
fn report_span_takes_negative_numbers_for_the_run_to_reject() {
    let cli =
        Cli::try_parse_from(["lightswitch", "report", "--from", "-1", "p.json"]).expect("parsed");
    let Some(Command::Report(r)) = cli.command else {
        panic!("not report")
    };
    assert_eq!(r.from, Some(-1.0));
}

/// The command line builds the same plan a library user would build by
/// hand for the same run (compared by their debug form, field by field).
#[test]
fn flags_build_the_plan_a_library_user_would() {
    use crate::agent::run::RunPlan;
    use std::time::Duration;
    let plan = |args: &[&str]| {
        let cli = Cli::try_parse_from(["lightswitch"].iter().chain(args)).expect("parsed");
        cli.profile.plan(false)
    };
    let from_flags = plan(&[
        "-p",
        "7,9",
        "-F",
        "199",
        "-d",
        "2s",
        "--profile-format",
        "folded",
        "--profile-path",
        "/tmp/out",
        "--unwind-cache-dir",
        "none",
    ])
    .expect("a valid plan");
    let by_hand = RunPlan {
        sample_freq_hz: 199,
        pids: vec![7, 9],
        duration: Some(Duration::from_secs(2)),
        ..RunPlan::new("/tmp/out", ProfileFormat::Folded)
    };
    assert_eq!(format!("{from_flags:#?}"), format!("{by_hand:#?}"));
    // Continuous mode carries its sender's config, built here once.
    let continuous = plan(&["--profile-interval", "30s", "--max-profiles", "3"]).unwrap();
    let continuous = continuous.continuous.expect("continuous");
    assert_eq!(continuous.interval, Duration::from_secs(30));
    assert!(
        matches!(
            continuous.sender,
            crate::output::sender::SenderConfig::Disk {
                max_profiles: Some(3),
                ..
            }
        ),
        "{:?}",
        continuous.sender
    );
    // An empty --profile-name is named, with what to give instead.
    let err = plan(&["--profile-name", ""]).expect_err("empty name");
    let err = format!("{err:#}");
    assert!(
        err.contains("--profile-name \"\" names no file") && err.contains("- for standard output"),
        "{err}"
    );
}

#[test]
fn collector_takes_its_own_log_level() {
    let level = |args: &[&str]| {
        Cli::try_parse_from(std::iter::once("lightswitch").chain(args.iter().copied()))
            .map(|cli| cli.log_level())
    };
    let collector = ["collector", "--storage", "/tmp/s"];
    assert!(matches!(level(&collector), Ok(LogLevel::Warn)));
    let info = [&collector[..], &["--logging", "info"]].concat();
    assert!(matches!(level(&info), Ok(LogLevel::Info)));
    assert!(level(&[&collector[..], &["--logging", "loud"]].concat()).is_err());
}
