//! Markers: lost-sample spans and exec/exit instants.

use super::timeline::listen;
use super::*;

/// Two threads spinning 100 calls deep (records of about 900 bytes, so a
/// ring buffer fills within a second when nobody reads it). With an
/// argument: wait for a byte on stdin, spin 0.5 s, exec itself with `again`
/// (same pid, new program), spin 3.5 s in two threads, exit. Without one:
/// spin forever.
fn deep_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double until;
static double now(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}}
__attribute__((noinline)) void deep(int n) {{
    if (n == 0) {{ while (until == 0 || now() < until) sink++; return; }}
    deep(n - 1);
    sink++;
}}
static void *worker(void *arg) {{ deep(100); return arg; }}
static void spin_threads(void) {{
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    deep(100);
    pthread_join(t, 0);
}}
int main(int argc, char **argv) {{
    if (argc == 1) {{ spin_threads(); return 0; }}
    if (strcmp(argv[1], "again") == 0) {{ until = now() + 3.5; spin_threads(); return 0; }}
    char c;
    if (read(0, &c, 1) != 1) return 1;
    until = now() + 0.5;
    deep(10);
    execl(argv[0], argv[0], "again", (char *)0);
    return 2;
}}
"#
    )
}

/// Decode a gzip'd Firefox profile as JSON.
fn json_of(gzip: &[u8]) -> Value {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(gzip)
        .read_to_end(&mut json)
        .expect("the profile is gzip'd");
    serde_json::from_slice(&json).expect("the profile is JSON")
}

/// The lost-samples markers of a profile: start and end (ms after
/// `meta.startTime`) and samples lost, with the names of the thread and
/// process they are on (the Firefox Profiler names a main thread after its
/// process).
fn lost_markers(profile: &Value) -> Vec<(f64, f64, u64, String, String)> {
    let mut out = Vec::new();
    for thread in profile["threads"].as_array().expect("threads") {
        let markers = &thread["markers"];
        let data = column(markers, "data");
        for (i, d) in data.iter().enumerate() {
            if d["type"] != "LightswitchLostSamples" {
                continue;
            }
            out.push((
                column(markers, "startTime")[i].as_f64().expect("startTime"),
                column(markers, "endTime")[i].as_f64().expect("endTime"),
                d["samples"].as_f64().expect("samples") as u64,
                thread["name"].as_str().unwrap_or_default().to_string(),
                thread["processName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ));
        }
    }
    out
}

/// Stop `pid` with SIGSTOP for `pause`, then continue it; returns the wall
/// clock (ms) at the stop and at the continue.
fn pause_process(pid: u32, pause: Duration) -> (f64, f64) {
    let stopped = unix_ms(SystemTime::now());
    // SAFETY: kill(2) on a child of this test.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    std::thread::sleep(pause);
    let continued = unix_ms(SystemTime::now());
    // SAFETY: as above.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
    (stopped, continued)
}

/// A profiler stopped (SIGSTOP) for 2 s while its target fills the ring
/// buffers with deep stacks loses samples: the timeline has them as
/// markers on the main thread of a `lightswitch` pseudo-process, as
/// many as the summary counts, in a span that covers the stop.
#[test]
fn lost_samples_are_markers_spanning_the_stop() {
    let _serial = serial();
    let program = compile("tl-deep", &deep_source(), &DEEP_FLAGS);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let mut agent = Lightswitch::spawn(&[
        "--pids",
        &workload.pid_arg(),
        "--sample-freq",
        "999",
        "--duration",
        "6",
        "--profile-format",
        "firefox",
        "--profile-path",
        s(dir.path()),
    ]);
    agent.expect_sampling();
    std::thread::sleep(Duration::from_millis(700));
    let (stopped, continued) = pause_process(agent.pid(), Duration::from_secs(2));
    let out = agent.wait(Duration::from_secs(60));
    out.assert_success();
    let text = format!("{}{}", out.stdout, out.stderr);
    let summary = Summary::parse(&text).unwrap_or_else(|| panic!("no summary: {text}"));
    assert!(summary.lost > 0, "nothing lost: {text}");
    let profile = json_of(&fs::read(dir.path().join("profile.json.gz")).unwrap());
    let start = profile["meta"]["startTime"].as_f64().unwrap();
    let lost = lost_markers(&profile);
    let sum: u64 = lost.iter().map(|l| l.2).sum();
    assert_eq!(sum, summary.lost, "{lost:?}\n{text}");
    for (_, _, _, thread, process) in &lost {
        assert_eq!(
            (thread.as_str(), process.as_str()),
            ("lightswitch", "lightswitch")
        );
    }
    // The counter was read last before the stop and next after it: the
    // span that holds the losses covers the stop.
    assert!(
        lost.iter()
            .any(|l| start + l.0 <= stopped + 50.0 && start + l.1 >= continued - 50.0),
        "stopped at {stopped}, continued at {continued}, spans {lost:?} from {start}"
    );
}

/// On-demand `format=firefox` answers carry markers too: a process that
/// execs (same pid) and exits during the request has `exec` and `exit`
/// markers on its main thread, in order; the agent stopped for 2 s during
/// the request has its lost samples as markers.
#[test]
fn on_demand_timeline_has_exec_exit_and_lost_markers() {
    let _serial = serial();
    let program = compile("tl-reexec", &deep_source(), &DEEP_FLAGS);
    let mut workload = {
        let mut child = std::process::Command::new(&program.path)
            .arg("wait")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawning the workload");
        let stdin = child.stdin.take().unwrap();
        (child, stdin)
    };
    let pid = workload.0.id().to_string();
    let (mut agent, url) = listen(&pid);
    let request = std::thread::spawn(move || {
        reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
            .get(format!(
                "{url}/debug/pprof/profile?seconds=5&format=firefox&sample_freq=999"
            ))
            .send()
            .expect("GET profile")
    });
    std::thread::sleep(Duration::from_millis(300));
    std::io::Write::write_all(&mut workload.1, b"g").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    pause_process(agent.id(), Duration::from_secs(2));
    let response = request.join().unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = workload.0.wait();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let profile = json_of(&response.bytes().unwrap());
    let main = profile["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["isMainThread"] == true && t["pid"] == pid.as_str())
        .unwrap_or_else(|| panic!("no main thread of {pid}"));
    let strings = main["stringArray"].as_array().unwrap();
    let markers: Vec<(&str, f64)> = column(&main["markers"], "name")
        .iter()
        .zip(column(&main["markers"], "startTime"))
        .map(|(n, t)| {
            (
                strings[n.as_u64().unwrap() as usize].as_str().unwrap(),
                t.as_f64().unwrap(),
            )
        })
        .collect();
    let names: Vec<&str> = markers.iter().map(|m| m.0).collect();
    assert_eq!(names, ["exec", "exit"], "{markers:?}");
    // exec 0.5 s after the release, exit 3.5 s after that.
    let gap = markers[1].1 - markers[0].1;
    assert!((3400.0..4500.0).contains(&gap), "{markers:?}");
    let lost = lost_markers(&profile);
    assert!(lost.iter().map(|l| l.2).sum::<u64>() > 0, "{lost:?}");
}
