//! `--off-cpu` on a Python process: a thread that sleeps in `time.sleep`
//! under `<module> -> sleeper -> nap` has its waits under that Python chain
//! (off-CPU records are walked for Python as cpu-clock samples are), not
//! under `[python: unknown]`, on every walked CPython installed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{interpreters, WALKED_MINORS};
use crate::common::*;

/// How long the script sleeps in 5 ms naps, s.
const SECONDS: f64 = 1.0;

/// The workload: naps of 5 ms for `argv[1]` s once a line arrives on stdin.
const SCRIPT: &str = "import sys, time
def nap():
    time.sleep(0.005)

def sleeper(end):
    while time.time() < end:
        nap()

print('ready', flush=True)
sys.stdin.readline()
sleeper(time.time() + float(sys.argv[1]))
";

/// Whether `user` (root to leaf) has the Python chain, in order (native
/// frames may lie between: on 3.8-3.10 each Python frame has its own
/// eval-loop call).
fn under_chain(user: &[&str]) -> bool {
    let mut frames = user.iter();
    ["<module>", "sleeper", "nap"]
        .iter()
        .all(|want| frames.any(|f| f == want))
}

#[test]
fn a_sleeping_thread_waits_under_its_python_chain() {
    let _serial = serial();
    for python in interpreters(WALKED_MINORS) {
        let label = format!("off-CPU {}", python.display());
        let dir = tempdir();
        let script = dir.path().join("naps.py");
        std::fs::write(&script, SCRIPT).expect("write script");
        let mut child = Command::new(&python)
            .arg(&script)
            .arg(SECONDS.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python");
        let pid = child.id();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
        let out_dir = dir.path().join("out");
        let mut profiler = Lightswitch::spawn(&[
            "--pids",
            &pid.to_string(),
            "--off-cpu",
            "--profile-format",
            "folded",
            "--profile-path",
            s(&out_dir),
        ]);
        profiler.expect_sampling();
        std::thread::sleep(Duration::from_millis(500));
        writeln!(child.stdin.take().unwrap(), "go").expect("start the naps");
        assert!(child.wait().expect("python").success(), "{label}: failed");
        let out = profiler.wait(Duration::from_secs(60));
        out.assert_success();
        let off = read_folded(&out_dir.join("folded-off-cpu.txt"));
        let comm = python.file_name().unwrap().to_string_lossy();
        let mine = of_process(&off, &comm);
        let chained: u64 = mine
            .iter()
            .filter(|(frames, _)| under_chain(&user_frames(frames)))
            .map(|(_, ns)| ns)
            .sum();
        eprintln!(
            "{label}: {:.3} s off-CPU under the chain",
            chained as f64 / 1e9
        );
        // The naps are SECONDS less the loop's own time; the rest of the
        // process's waits (its wait for the line, before) are elsewhere.
        assert!(
            chained as f64 >= 0.8e9 * SECONDS,
            "{label}: {chained} ns off-CPU under <module>;sleeper;nap:\n{}",
            show(&mine)
        );
    }
}
