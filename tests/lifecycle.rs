//! Processes that change under the profiler (decision 0002): programs that live
//! 100 ms, started one after another by a shell; a process that execs a
//! second and a third image; a process that re-execs itself every ~0.6 ms.
//! Real programs compiled without frame pointers (only CFI unwinds them),
//! the real BPF program, folded output. Run as root.

mod common;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(90);

/// `NAME_work(seconds)` burns CPU in `NAME_burn` for `seconds` of wall time.
fn work_functions(name: &str) -> String {
    format!(
        r#"
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void {name}_burn(unsigned long n) {{
    for (unsigned long i = 0; i < n; i++) sink += i * 2654435761u;
}}
__attribute__((noinline)) void {name}_work(double seconds) {{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {{
        {name}_burn(2000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    }} while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
}}
"#
    )
}

/// A user stack (root to leaf) the walk completed: no unwind marker, every
/// frame named, and it starts at `_start`.
fn complete(user: &[&str]) -> bool {
    user.first() == Some(&"_start")
        && !user
            .iter()
            .any(|f| f.starts_with("[unwind: ") || f.starts_with("[unknown]"))
}

/// Samples of process `comm` whose user frames satisfy `pred`, and all of its samples.
fn count(stacks: &[Stack], comm: &str, pred: impl Fn(&[&str]) -> bool) -> (u64, u64) {
    of_process(stacks, comm)
        .iter()
        .fold((0, 0), |(hit, all), (frames, n)| {
            let user = user_frames(frames);
            (hit + if pred(&user) { *n } else { 0 }, all + n)
        })
}

/// The summary's count of every result that marks a stack (`[unwind: NAME]`)
/// equals the number of samples under that marker in the profile.
fn assert_summary_matches_profile(out: &Output, stacks: &[Stack]) {
    let summary = unwind_counts(&out.stdout)
        .unwrap_or_else(|| panic!("no `user stacks:` line in stdout:\n{out}"));
    let mut marked = std::collections::BTreeMap::<String, u64>::new();
    for (frames, n) in stacks {
        for f in frames {
            if let Some(name) = f
                .strip_prefix("[unwind: ")
                .and_then(|r| r.strip_suffix(']'))
            {
                *marked.entry(name.to_string()).or_default() += n;
            }
        }
    }
    for (name, n) in &summary {
        if ["complete", "frame_pointer", "no_user_stack"].contains(&name.as_str()) {
            assert!(!marked.contains_key(name), "{name} stacks carry no marker");
            continue;
        }
        assert_eq!(
            marked.get(name).copied().unwrap_or(0),
            *n,
            "summary says {name}={n}, the profile has {:?}\n{out}",
            marked.get(name)
        );
    }
    for (name, n) in &marked {
        assert_eq!(
            summary.get(name),
            Some(n),
            "{name} in the profile only\n{out}"
        );
    }
}

/// Start `program` with `args`, held until [`release`] writes a byte to its stdin.
fn spawn_held(program: &Program, args: &[&str]) -> Child {
    let mut cmd = Command::new(&program.path);
    cmd.args(args).stdin(Stdio::piped());
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().expect("starting the workload")
}

fn release(child: &mut Child) {
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"g").expect("releasing the workload");
}

const WAIT_FOR_GO: &str = r#"
#include <unistd.h>
static void wait_for_go(void) { char go; if (read(0, &go, 1) != 1) _exit(1); }
"#;

/// Programs that live 100 ms, started one after another by a shell loop
/// for 4 s, profiled machine-wide: at least 95% of their samples have
/// complete stacks (docs/reliability.md's promise). The program runs once before the
/// loop, so its table is known, as the target assumes.
#[test]
fn young_processes_started_by_a_shell_have_complete_stacks() {
    let _serial = serial();
    let source = format!(
        "{}\n#include <stdlib.h>\nint main(int argc, char **argv) {{ young_work(atof(argv[1])); return 0; }}\n",
        work_functions("young")
    );
    let program = compile("lsw_young", &source, NO_FP_FLAGS);
    let dir = tempdir();
    let mut profiler = Lightswitch::spawn(&[
        "--duration",
        "9",
        "--sample-freq",
        "997",
        "--max-unwind-info-mb",
        "256",
        "--profile-format",
        "folded",
        "--profile-path",
        s(dir.path()),
    ]);
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_secs(1));
    let script = format!(
        "P={}; $P 0.1; end=$((SECONDS + 4)); while [ $SECONDS -lt $end ]; do $P 0.1; done",
        program.path.display()
    );
    let status = Command::new("bash")
        .args(["-c", &script])
        .status()
        .expect("running bash");
    assert!(status.success());
    let out = profiler.wait(TIMEOUT);
    out.assert_success();
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let (done, all) = count(&stacks, &program.name, complete);
    let share = done as f64 / all.max(1) as f64;
    println!("young processes: {done} of {all} samples complete ({share:.3})");
    assert!(all >= 300, "only {all} samples of {}\n{out}", program.name);
    assert!(
        share >= 0.95,
        "{done} of {all} samples complete ({share:.3}):\n{}\n{out}",
        show(&of_process(&stacks, &program.name))
    );
    assert_summary_matches_profile(&out, &stacks);
}

/// stage1 execs stage2, which execs stage3, each working 0.8 s: every
/// sample is named by the image that was running (no `[unknown]` frames,
/// no stage's functions under another stage's name), and at least 90% of
/// each stage's samples are complete.
#[test]
fn exec_chain_samples_belong_to_the_image_that_ran() {
    let _serial = serial();
    let dir = tempdir();
    let mut programs = Vec::new();
    for stage in 1..=3 {
        let next = dir.path().join(format!("lsw_stage{}", stage + 1));
        let source = format!(
            r#"{}{WAIT_FOR_GO}
#include <stdio.h>
int main(void) {{
    if ({stage} == 1) wait_for_go();
    stage{stage}_work(0.8);
    if ({stage} < 3) {{ execl("{next}", "{next}", (char *)0); perror("exec"); return 1; }}
    return 0;
}}
"#,
            work_functions(&format!("stage{stage}")),
            next = next.display()
        );
        let program = compile(&format!("lsw_stage{stage}"), &source, NO_FP_FLAGS);
        std::fs::copy(&program.path, dir.path().join(&program.name)).unwrap();
        programs.push(program);
    }
    let mut child = spawn_held(&programs[0], &[]);
    let out_dir = tempdir();
    let mut profiler = Lightswitch::spawn(&[
        "--pids",
        &child.id().to_string(),
        "--sample-freq",
        "997",
        "--profile-format",
        "folded",
        "--profile-path",
        s(out_dir.path()),
    ]);
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_millis(300));
    release(&mut child);
    assert!(child.wait().unwrap().success());
    let out = profiler.wait(TIMEOUT);
    out.assert_success();
    let stacks = read_folded(&out_dir.path().join("folded.txt"));
    // A sample taken inside the kernel's exit path (do_exit) may come after
    // the address space is gone: nothing is left to name its user frames
    // by, and it honestly says `[unwind: mappings_unknown]`.
    let alive: Vec<Stack> = stacks
        .iter()
        .filter(|(frames, _)| !frames.iter().any(|f| f == "do_exit_[k]"))
        .cloned()
        .collect();
    for stage in 1..=3 {
        let comm = format!("lsw_stage{stage}");
        let own = format!("stage{stage}_");
        let (named, all) = count(&alive, &comm, |u| {
            !u.iter().any(|f| f.starts_with("[unknown]"))
                && u.iter()
                    .all(|f| !f.starts_with("stage") || f.starts_with(&own))
        });
        let (done, _) = count(&stacks, &comm, complete);
        println!("{comm}: {all} samples, {named} named by their own image, {done} complete");
        assert!(all >= 100, "only {all} samples of {comm}\n{out}");
        assert_eq!(
            named,
            all,
            "samples of {comm} with [unknown] frames or another image's:\n{}",
            show(&of_process(&stacks, &comm))
        );
        // Each stage is a binary never seen before: its first samples may
        // wait for its table to be built.
        assert!(
            done as f64 >= 0.9 * all as f64,
            "{done} of {all} samples of {comm} complete:\n{}",
            show(&of_process(&stacks, &comm))
        );
    }
    assert_summary_matches_profile(&out, &stacks);
}

/// A process that re-execs itself every ~0.6 ms, 2000 times: the samples
/// taken in its own code (not the dynamic loader's start-up) are complete,
/// no sample with a complete walk has an `[unknown]` frame, and the
/// summary agrees with the profile.
#[test]
fn a_process_reexecing_every_millisecond_has_complete_stacks() {
    let _serial = serial();
    let source = format!(
        r#"{}{WAIT_FOR_GO}
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {{
    long left = argc > 1 ? atol(argv[1]) : -1;
    if (left < 0) {{ wait_for_go(); left = 2000; }}
    reexec_work(0.0006);
    if (left > 0) {{
        char n[32];
        snprintf(n, sizeof n, "%ld", left - 1);
        execl(argv[0], argv[0], n, (char *)0);
        perror("exec");
        return 1;
    }}
    return 0;
}}
"#,
        work_functions("reexec")
    );
    let program = compile("lsw_reexec", &source, NO_FP_FLAGS);
    let mut child = spawn_held(&program, &[]);
    let out_dir = tempdir();
    let mut profiler = Lightswitch::spawn(&[
        "--pids",
        &child.id().to_string(),
        "--sample-freq",
        "997",
        "--profile-format",
        "folded",
        "--profile-path",
        s(out_dir.path()),
    ]);
    profiler.expect_sampling();
    std::thread::sleep(Duration::from_millis(300));
    release(&mut child);
    assert!(child.wait().unwrap().success());
    let out = profiler.wait(TIMEOUT);
    out.assert_success();
    let stacks = read_folded(&out_dir.path().join("folded.txt"));
    let in_work = |u: &[&str]| u.contains(&"reexec_work");
    let (working, _) = count(&stacks, &program.name, in_work);
    let (done, all) = count(&stacks, &program.name, |u| in_work(u) && complete(u));
    let (unknown, _) = count(&stacks, &program.name, |u| {
        !u.iter().any(|f| f.starts_with("[unwind: "))
            && u.iter().any(|f| f.starts_with("[unknown]"))
    });
    let share = done as f64 / working.max(1) as f64;
    println!(
        "re-exec: {all} samples, {working} in reexec_work, {done} of them complete ({share:.3}), {unknown} walked but not named"
    );
    assert!(
        working >= 200,
        "only {working} samples in reexec_work\n{out}"
    );
    assert!(
        share >= 0.9,
        "{done} of {working} samples in reexec_work complete:\n{}",
        show(&of_process(&stacks, &program.name))
    );
    let unnamed: Vec<&Stack> = of_process(&stacks, &program.name)
        .into_iter()
        .filter(|(frames, _)| {
            !frames.iter().any(|f| f.starts_with("[unwind: "))
                && frames.iter().any(|f| f.starts_with("[unknown]"))
        })
        .collect();
    assert_eq!(
        unknown,
        0,
        "complete walks with unnamed frames:\n{}",
        show(&unnamed)
    );
    assert_summary_matches_profile(&out, &stacks);
}
