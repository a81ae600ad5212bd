//! Timelines: every sample at its time on its thread, one file per
//! continuous window, on-demand requests, exit markers.

use super::*;

#[test]
fn timeline_of_named_threads_matches_folded_output() {
    let _serial = serial();
    let program = compile("tl-threads", &program_source(), &["-O2", "-g", "-pthread"]);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let before = SystemTime::now();
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            &FREQ.to_string(),
            "--duration",
            &SECONDS.to_string(),
            "--profile-format",
            "firefox,folded",
            "--profile-path",
            s(dir.path()),
        ],
        Duration::from_secs(60),
    );
    let after = SystemTime::now();
    out.assert_success();
    let folded = read_folded(&dir.path().join("folded.txt"));
    let (start_ms, interval_ms, threads) = read_profile(&dir.path().join("profile.json.gz"));
    assert!(
        (interval_ms - 1e3 / FREQ as f64).abs() < 1e-3,
        "{interval_ms}"
    );

    // One run, two formats: the same samples and stacks.
    let mut from_firefox: BTreeMap<String, u64> = BTreeMap::new();
    for thread in &threads {
        for stack in &thread.stacks {
            *from_firefox
                .entry(folded_line(&thread.process_name, stack))
                .or_default() += 1;
        }
    }
    let mut from_folded: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, n) in &folded {
        *from_folded.entry(frames.join(";")).or_default() += n;
    }
    assert_eq!(
        from_firefox, from_folded,
        "firefox and folded stacks differ"
    );
    let samples = total(&folded);
    assert_eq!(samples, out.summary().samples, "{out}");
    assert!(samples >= 1000, "too few samples ({samples}):\n{out}");

    // Times: each thread's in order (checked while decoding) and within the run.
    let (lo, hi) = (unix_ms(before), unix_ms(after));
    for thread in &threads {
        for &t in &thread.times {
            let wall = start_ms + t;
            assert!(
                (lo..=hi).contains(&wall),
                "thread {}: a sample at {wall:.3} ms is outside the run [{lo:.3}, {hi:.3}]",
                thread.name
            );
            assert!(
                t <= SECONDS * 1e3 + 1e3,
                "sample at {t} ms of a {SECONDS} s run"
            );
        }
    }

    let pid = workload.pid().to_string();
    for thread in &threads {
        assert_eq!(thread.pid, pid);
        assert_eq!(thread.process_name, program.name);
        assert_eq!(thread.is_main, thread.tid == pid, "{}", thread.name);
    }
    let main = threads.iter().find(|t| t.is_main).expect("the main thread");
    assert_eq!(main.name, program.name);

    let period_ms = 1e3 / FREQ as f64;
    for (name, function) in WORKERS {
        let thread = threads
            .iter()
            .find(|t| t.name == *name)
            .unwrap_or_else(|| panic!("no thread named {name}"));
        let with_function = |stack: &Vec<FxFrame>| stack.iter().any(|f| f.name == *function);
        let own = thread.stacks.iter().filter(|s| with_function(s)).count() as u64;
        let folded_own: u64 = folded
            .iter()
            .filter(|(frames, _)| frames.iter().any(|f| f == function))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(own, folded_own, "{name}: samples in {function}");
        assert!(
            own * 10 >= thread.stacks.len() as u64 * 9 && own >= 100,
            "{name}: only {own} of {} samples in {function}",
            thread.stacks.len()
        );
        // The function is a frame of the program's own library.
        let frame = thread
            .stacks
            .iter()
            .flatten()
            .find(|f| f.name == *function)
            .expect("the function's frame");
        assert_eq!(
            frame.lib.as_deref(),
            Some(program.name.as_str()),
            "{frame:?}"
        );
        assert_eq!(frame.category, "User");
        // A busy thread is sampled once a period while it runs: most gaps
        // between its samples are one period, whatever its share of a CPU.
        let mut gaps: Vec<f64> = thread.times.windows(2).map(|w| w[1] - w[0]).collect();
        let gap = median(&mut gaps);
        assert!(
            gap >= 0.8 * period_ms && gap <= 1.5 * period_ms,
            "{name}: median gap {gap:.4} ms, sampling period {period_ms:.4} ms"
        );
    }

    // The reader is mostly in read(2): kernel frames, in the Kernel category,
    // of the kernel's library, on top of its user frames.
    let reader = threads.iter().find(|t| t.name == "tl-reader").unwrap();
    let in_kernel = reader
        .stacks
        .iter()
        .filter(|stack| {
            let first = stack.iter().position(|f| f.category == "Kernel");
            first.is_some_and(|k| {
                stack[k..].iter().all(|f| {
                    f.category == "Kernel" && f.lib.as_deref() == Some("[kernel.kallsyms]")
                }) && stack[..k].iter().any(|f| f.name == "read_zero_loop")
                    && stack[k..].iter().any(|f| f.name.contains("read"))
            })
        })
        .count();
    assert!(
        in_kernel * 2 >= reader.stacks.len(),
        "only {in_kernel} of {} reader samples show the kernel's read path",
        reader.stacks.len()
    );
}

/// Continuous mode: one Firefox file per window beside the folded file of
/// the same window, with the same stacks; windows follow each other in time.
#[test]
fn continuous_windows_write_one_timeline_each() {
    let _serial = serial();
    let program = compile("tl-windows", &program_source(), &["-O2", "-g", "-pthread"]);
    let workload = Workload::spawn(&program);
    let dir = tempdir();
    let out = run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            "999",
            "--duration",
            "2.5",
            "--profile-interval",
            "1",
            "--profile-format",
            "firefox,folded",
            "--profile-path",
            s(dir.path()),
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let mut names: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let timelines: Vec<&String> = names.iter().filter(|n| n.ends_with(".json.gz")).collect();
    assert_eq!(timelines.len(), 3, "{names:?}\n{out}");
    let mut previous_end = 0.0f64;
    let mut samples = 0;
    for name in timelines {
        let stamp = name
            .strip_prefix("profile-")
            .and_then(|n| n.strip_suffix(".json.gz"))
            .unwrap_or_else(|| panic!("window file name {name}"));
        let (start, _, threads) = read_profile(&dir.path().join(name));
        let folded = read_folded(&dir.path().join(format!("folded-{stamp}.txt")));
        assert_eq!(as_folded(&threads), folded_lines(&folded), "window {stamp}");
        samples += total(&folded);
        let times = threads
            .iter()
            .flat_map(|t| t.times.iter().map(|x| start + x));
        let (first, last) = times.fold((f64::MAX, 0.0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
        // A sample read after its window closed (a stalled reader, counted
        // in `late_samples`) goes to the next window: allow for one.
        assert!(
            first >= previous_end - 100.0,
            "window {stamp} starts before the last one ended"
        );
        assert!(
            last - first <= 1_000.0 + 60.0,
            "window {stamp} spans {} ms",
            last - first
        );
        previous_end = last;
    }
    assert!(samples > 100, "{samples} samples\n{out}");
}

/// On demand: `format=firefox` answers a gzip'd timeline of the request's
/// span with the program's named threads.
/// Start `lightswitch --listen 127.0.0.1:0 --pids PIDS`; returns the
/// process and the URL its banner gives.
pub(super) fn listen(pids: &str) -> (std::process::Child, String) {
    let mut agent = std::process::Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--pids", pids])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawning lightswitch");
    let mut banner = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(agent.stdout.take().unwrap()),
        &mut banner,
    )
    .expect("reading the banner");
    let url = banner
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected banner {banner:?}"))
        .to_string();
    (agent, url)
}

#[test]
fn on_demand_request_answers_a_timeline() {
    let _serial = serial();
    let program = compile("tl-http", &program_source(), &["-O2", "-g", "-pthread"]);
    let workload = Workload::spawn(&program);
    let (mut agent, url) = listen(&workload.pid_arg());
    let before = unix_ms(SystemTime::now());
    let response = reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
        .get(format!(
            "{url}/debug/pprof/profile?seconds=1&format=firefox&sample_freq=999"
        ))
        .send()
        .expect("GET profile");
    let after = unix_ms(SystemTime::now());
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "application/gzip"
    );
    let (start, _, threads) = decode_profile(&response.bytes().unwrap());
    for name in ["tl-alpha", "tl-beta", "tl-gamma", "tl-reader"] {
        let thread = threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no thread {name}"));
        assert!(
            thread.stacks.len() >= 10,
            "{name}: {} samples",
            thread.stacks.len()
        );
        for t in &thread.times {
            assert!(
                (before..=after).contains(&(start + t)),
                "{name}: sample outside the request"
            );
        }
    }
}

/// A process that exits while it is profiled (released once sampling runs,
/// it spins 2 s of a 4 s run; the test reaps it only at its end, so the
/// run is given a duration): an `exit` marker on its main thread, after its
/// last sample, within the run.
#[test]
fn exit_is_a_marker_on_the_main_thread() {
    let _serial = serial();
    let source = format!(
        r#"{DIE_WITH_PARENT}
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double now(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}}
int main(void) {{
    char c;
    if (read(0, &c, 1) != 1) return 1;
    double end = now() + 2;
    while (now() < end) sink++;
    return 0;
}}
"#
    );
    let program = compile("tl-exits", &source, &["-O2", "-g"]);
    let mut workload = Workload::spawn(&program);
    let dir = tempdir();
    let before = unix_ms(SystemTime::now());
    let mut agent = Lightswitch::spawn(&[
        "--pids",
        &workload.pid_arg(),
        "--sample-freq",
        "999",
        "--duration",
        "4",
        "--profile-format",
        "firefox",
        "--profile-path",
        s(dir.path()),
    ]);
    // A slow start on a loaded machine must not miss the workload's run.
    agent.expect_sampling();
    std::thread::sleep(Duration::from_millis(300));
    workload.release();
    let out = agent.wait(Duration::from_secs(60));
    let after = unix_ms(SystemTime::now());
    out.assert_success();
    let (start, _, threads) = read_profile(&dir.path().join("profile.json.gz"));
    let main = threads
        .iter()
        .find(|t| t.is_main)
        .unwrap_or_else(|| panic!("no main thread\n{out}"));
    let exits: Vec<f64> = main
        .markers
        .iter()
        .filter(|(name, _)| name == "exit")
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(exits.len(), 1, "{:?}\n{out}", main.markers);
    let last_sample = main.times.last().copied().unwrap_or(0.0);
    // The exit event is stamped at the sched_process_exit tracepoint; the
    // rest of do_exit (releasing files, the cgroup) can still be sampled,
    // for well under a few ms.
    assert!(
        exits[0] + 5.0 >= last_sample,
        "exit at {} ms, last sample at {last_sample} ms",
        exits[0]
    );
    assert!((before..=after).contains(&(start + exits[0])));
}
