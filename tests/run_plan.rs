//! The library's own entry: a run configured by a `RunPlan` built in code,
//! not by the command line. Profiles a real program with real BPF, in this
//! process. Needs root and gcc.

mod common;

use std::time::Duration;

use common::*;
use lightswitch::agent::run::{Continuous, RunPlan};
use lightswitch::output::sender::SenderConfig;
use lightswitch::profile::format::{Compression, ProfileFormat};

/// A plan built in code for one process, one second, folded stacks: the
/// run writes the file it names, with the program's call chain, and its
/// summary counts what the file holds. A second run in the same process,
/// continuous, writes a file per window.
#[test]
fn a_plan_built_in_code_profiles_a_program() {
    let _serial = serial();
    let program = compile("plan_chain", &chain_forever_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let plan = RunPlan {
        sample_freq_hz: 199,
        pids: vec![workload.pid()],
        duration: Some(Duration::from_secs(1)),
        ..RunPlan::new(dir.path(), ProfileFormat::Folded)
    };
    plan.check().expect("a valid plan");
    let summary = lightswitch::agent::run::run(&plan).expect("the run succeeds");
    let output = dir.path().join("folded.txt");
    assert_eq!(summary.outputs, vec![output.clone()]);
    assert!(summary.continuous.is_none(), "one profile of the run");
    assert_eq!(summary.processes, 1, "{summary}");
    let stacks = read_folded(&output);
    assert_eq!(total(&stacks), summary.samples, "{summary}");
    let ours = of_process(&stacks, "plan_chain");
    let chained: u64 = ours
        .iter()
        .filter(|(frames, _)| ends_with_chain(&user_frames(frames), CHAIN))
        .map(|(_, n)| n)
        .sum();
    // Half the workload's samples at least: the rest may be taken before
    // its table is loaded, or in the kernel.
    assert!(
        summary.samples > 0 && chained * 2 >= summary.samples,
        "{chained} of {} samples end in the chain:\n{}",
        summary.samples,
        show(&ours)
    );

    let windows = tempdir();
    let outputs = vec![(ProfileFormat::Folded, windows.path().join("folded.txt"))];
    let plan = RunPlan {
        outputs: outputs.clone(),
        output_dir: windows.path().to_path_buf(),
        continuous: Some(Continuous {
            interval: Duration::from_millis(300),
            sender: SenderConfig::Disk {
                outputs,
                compression: Compression::None,
                max_profiles: None,
                mode: 0o600,
            },
            flush_timeout: Duration::from_secs(5),
        }),
        ..plan
    };
    let summary = lightswitch::agent::run::run(&plan).expect("a second run in the same process");
    let continuous = summary.continuous.as_ref().expect("continuous");
    assert!(continuous.windows >= 3, "{summary}");
    let files = std::fs::read_dir(windows.path()).unwrap().count();
    assert!(
        files >= 3 && files == summary.outputs.len(),
        "{files} files\n{summary}"
    );
}

/// A plan built in code is checked as the command line's is: errors name
/// what is wrong, before anything is loaded.
#[test]
fn a_plan_built_in_code_is_checked() {
    let dir = tempdir();
    let mut plan = RunPlan::new(dir.path(), ProfileFormat::Folded);
    plan.outputs.clear();
    let err = lightswitch::agent::run::run(&plan).expect_err("no output");
    assert!(
        format!("{err:#}").contains("at least one output format"),
        "{err:#}"
    );
    let plan = RunPlan {
        duration: Some(Duration::ZERO),
        ..RunPlan::new(dir.path(), ProfileFormat::Folded)
    };
    let err = plan.check().expect_err("a zero duration");
    assert!(format!("{err:#}").contains("--duration"), "{err:#}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
