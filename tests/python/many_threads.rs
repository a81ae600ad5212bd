//! A Python process with more threads than the walker once searched (64):
//! the main thread starts 100 threads that block on an event, then runs
//! `<module> -> busy -> leaf_work`. CPython puts each new thread state at
//! the head of its interpreter's list, so the main thread's is the last of
//! 101: the walker must find it there (then keep it in its cache). Its
//! chain (names, files, lines) must be named in at least 95% of its
//! samples, on every walked CPython installed.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::chains::{body_of, line_of, pprof_stacks, traces_of, Expected, Step};
use super::scenarios::counted;
use super::{interpreters, WALKED_MINORS};
use crate::common::*;

/// Threads started before the busy one's work.
const IDLE_THREADS: usize = 100;

/// The workload: `argv[1]` idle threads, then `argv[2]` s of the main
/// thread's CPU time (`time.thread_time`, so that a loaded machine gives
/// it as many samples as an idle one) once a line arrives on stdin.
const SCRIPT: &str = "import sys, threading, time
def leaf_work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def busy(end):
    while time.thread_time() < end:
        leaf_work(20000)  # busy: call

stop = threading.Event()
idle = [threading.Thread(target=stop.wait) for _ in range(int(sys.argv[1]))]
for thread in idle:
    thread.start()
print('ready', flush=True)
sys.stdin.readline()
busy(time.thread_time() + float(sys.argv[2]))  # <module>: call
stop.set()
";

/// The main thread's chain, root first.
fn chain(script: &str) -> Expected {
    Expected {
        script: script.to_string(),
        steps: vec![
            Step::Python("<module>".into(), vec![line_of(SCRIPT, "# <module>: call")]),
            Step::Python("busy".into(), vec![line_of(SCRIPT, "# busy: call")]),
            Step::Python("leaf_work".into(), body_of(SCRIPT, "leaf_work")),
        ],
    }
}

#[test]
fn a_thread_behind_a_hundred_others_is_found() {
    let _serial = serial();
    for python in interpreters(WALKED_MINORS) {
        let label = format!("{} threads {}", IDLE_THREADS + 1, python.display());
        let dir = tempdir();
        let script = dir.path().join("threads.py");
        std::fs::write(&script, SCRIPT).expect("write script");
        let mut child = Command::new(&python)
            .arg(&script)
            .args([&IDLE_THREADS.to_string(), "1.5"])
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
            "--sample-freq",
            "999",
            "--profile-format",
            "pprof",
            "--profile-path",
            s(&out_dir),
        ]);
        profiler.expect_sampling();
        std::thread::sleep(Duration::from_millis(500));
        writeln!(child.stdin.take().unwrap(), "go").expect("start the work");
        assert!(child.wait().expect("python").success(), "{label}: failed");
        // The profiler stops once the process it profiles is gone.
        let out = profiler.wait(Duration::from_secs(60));
        out.assert_success();
        let traces = traces_of(&out_dir.join("profile.pb"));
        let expected = chain(s(&script));
        let (mut good, mut all, mut misses) = (0, 0, Vec::new());
        // The main thread's id is the pid; samples of its start-up (the
        // idle threads' starts) name no busy frame and are left out.
        for stack in pprof_stacks(&traces).iter().filter(|st| {
            st.tid == pid
                && counted(st, &script)
                && (st.frames.iter().all(|f| f.file != s(&script))
                    || st.frames.iter().any(|f| f.name == "busy"))
        }) {
            all += stack.count;
            if expected.matches(stack, true) {
                good += stack.count;
            } else if misses.len() < 3 {
                misses.push(stack.render());
            }
        }
        let share = good as f64 / all.max(1) as f64;
        eprintln!("{label}: the chain in {share:.3} of {all} samples");
        assert!(all >= 30, "{label}: only {all} samples:\n{out}");
        assert!(
            share >= 0.95,
            "{label}: the chain in {share:.3} of {all} samples; some misses:\n{}",
            misses.join("\n--\n")
        );
    }
}
