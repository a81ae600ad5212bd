//! A Python process in a container: its own mount and pid namespaces
//! (`unshare --mount --pid --fork --mount-proc`), its interpreter at a
//! path that exists only there (a pyenv install bind-mounted under a tmpfs
//! on `/media`, the original hidden under another tmpfs; Debian's
//! statically linked interpreter bind-mounted alone), so the profiler can
//! reach it only through `/proc/PID/root`, and its threads numbered by the
//! container's pid namespace. Its chain from `<module>` must be named in
//! at least 95% of its samples, on every walked CPython installed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use super::chains::{pprof_stacks, traces_of};
use super::scenarios::{child_running, expected, pyenv_root, SCRIPT};
use super::{interpreters, qualified_names, WALKED_MINORS};
use crate::common::*;

/// Where the interpreter's install appears inside the container.
const INSIDE: &str = "/media/lsw-container";

/// The shell commands that set the container's mounts up and run `script` on `python`.
fn setup(python: &Path, script: &Path) -> String {
    let name = python.file_name().unwrap().to_string_lossy();
    let run = format!("exec {INSIDE}/bin/{name} {} main 30", s(script));
    match pyenv_root(python) {
        Some(root) => format!(
            "set -e; mount -t tmpfs lsw /media; mkdir -p {INSIDE}; mount --bind {root} {INSIDE}; \
             mount -t tmpfs lsw {versions}; export PYTHONHOME={INSIDE} \
             LD_LIBRARY_PATH={INSIDE}/lib; {run}",
            root = root.display(),
            versions = root.parent().unwrap().display(),
        ),
        None => format!(
            "set -e; mount -t tmpfs lsw /media; mkdir -p {INSIDE}/bin; touch {INSIDE}/bin/{name}; \
             mount --bind {} {INSIDE}/bin/{name}; {run}",
            python.display()
        ),
    }
}

#[test]
fn a_container_interpreter_is_walked_through_proc_root() {
    let _serial = serial();
    if !Path::new("/usr/bin/unshare").exists() {
        eprintln!("skipped: no unshare (util-linux)");
        return;
    }
    for python in interpreters(WALKED_MINORS) {
        let label = format!("container {}", python.display());
        let dir = tempdir();
        let script = dir.path().join("scenarios.py");
        std::fs::write(&script, SCRIPT).expect("write script");
        let mut container = Command::new("unshare")
            .args(["--mount", "--pid", "--fork", "--mount-proc", "sh", "-c"])
            .arg(setup(&python, &script))
            .stdout(Stdio::null())
            .spawn()
            .expect("unshare");
        let comm = python.file_name().unwrap().to_string_lossy();
        let pid = child_running(container.id(), &comm, Duration::from_secs(10));
        let Some(pid) = pid else {
            let _ = container.kill();
            panic!(
                "{label}: the interpreter did not start: {:?}",
                container.wait()
            );
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
        assert!(
            exe.starts_with(INSIDE) && !exe.exists(),
            "{label}: runs {}, which the host sees",
            exe.display()
        );
        thread::sleep(Duration::from_millis(300));
        let out_dir = dir.path().join("out");
        let out = run(
            &[
                "--pids",
                &pid.to_string(),
                "--duration",
                "2",
                "--sample-freq",
                "499",
                "--profile-format",
                "pprof",
                "--profile-path",
                s(&out_dir),
            ],
            Duration::from_secs(60),
        );
        // SAFETY: kill(2) of the interpreter we started; its namespace's init, so the container ends.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let _ = container.wait();
        out.assert_success();
        let traces = traces_of(&out_dir.join("profile.pb"));
        let chain = expected("<module>", &script, qualified_names(&python));
        let stacks = pprof_stacks(&traces);
        let all: u64 = stacks.iter().map(|st| st.count).sum();
        let good: u64 = stacks
            .iter()
            .filter(|st| chain.matches(st, true))
            .map(|st| st.count)
            .sum();
        let share = good as f64 / all.max(1) as f64;
        eprintln!("{label}: lightswitch {share:.3} of {all} samples");
        let misses: Vec<String> = stacks
            .iter()
            .filter(|st| !chain.matches(st, true))
            .take(3)
            .map(|st| st.render())
            .collect();
        assert!(all >= 30, "{label}: only {all} samples:\n{out}");
        assert!(
            share >= 0.95,
            "{label}: the chain in {share:.3} of samples; some others:\n{}",
            misses.join("\n--\n")
        );
    }
}
