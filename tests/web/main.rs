//! The web view in a real browser: Debian's headless `chromium`, driven by
//! npm's `playwright-core` (`tests/web/drive.js`; both installed by
//! scripts/setup.sh, playwright-core into web/node_modules from the
//! committed web/package-lock.json). A program in which one thread spins in
//! `critical_section` for 300 µs once a second, among busy background
//! threads, is profiled at 10 kHz with real BPF; the page is opened on the
//! server that holds its samples, and the test checks what a person would
//! see: the host, process and thread rows; the flame graph of a range
//! dragged across one burst, with exactly the `critical_section` samples
//! that `GET /v1/profiles/merged` returns for that range; none in a range as
//! long between bursts; a differential graph for a second (shift-dragged)
//! range; downloads that decode; a shared link that reloads the same view.
//! Screenshots are left in the cargo target directory (`web-view*.png`).

#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{compile, Workload, BIN, FP_FLAGS};
use serde_json::Value;

/// One thread spins in `critical_section` for 300 µs once a second and
/// writes the burst's CLOCK_REALTIME start and end (ns) to the file named
/// by argv[1]; two threads spin in `background_work` all along.
const BURST_SOURCE: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <time.h>
static volatile unsigned long sink;
static unsigned long long now_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1000000000ULL + t.tv_nsec;
}
__attribute__((noinline)) void background_work(void) {
    for (int i = 0; i < 1000; i++) sink += i;
}
static void *background(void *arg) {
    pthread_setname_np(pthread_self(), "background");
    for (;;) background_work();
    return arg;
}
__attribute__((noinline)) void critical_section(unsigned long long until) {
    while (now_ns(CLOCK_MONOTONIC) < until) sink++;
}
static void *critical(void *arg) {
    FILE *bursts = arg;
    pthread_setname_np(pthread_self(), "critical");
    for (;;) {
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
        unsigned long long start = now_ns(CLOCK_REALTIME);
        critical_section(now_ns(CLOCK_MONOTONIC) + 300000);
        fprintf(bursts, "%llu %llu\n", start, now_ns(CLOCK_REALTIME));
        fflush(bursts);
    }
    return arg;
}
int main(int argc, char **argv) {
    FILE *bursts = fopen(argv[1], "w");
    if (!bursts) return 1;
    pthread_t t[3];
    pthread_create(&t[0], NULL, background, NULL);
    pthread_create(&t[1], NULL, background, NULL);
    pthread_create(&t[2], NULL, critical, bursts);
    pthread_join(t[2], NULL);
    return 0;
}
"#;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where screenshots and downloads go: the cargo target directory.
fn out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let dir = target.join("web-test");
    std::fs::create_dir_all(&dir).expect("creating the web test's output directory");
    dir
}

/// Run tests/web/drive.js against `url`, where the data is either the
/// recording of `record_seconds` the page makes (an agent) or was taken in
/// `span` (ns since the Unix epoch); its JSON report.
fn drive(
    url: &str,
    bursts: &Path,
    record_seconds: Option<u32>,
    span: Option<[u64; 2]>,
    token: Option<&str>,
) -> Value {
    let modules = repo().join("web/node_modules");
    assert!(
        modules.join("playwright-core").is_dir(),
        "web/node_modules/playwright-core is missing: run scripts/setup.sh"
    );
    assert!(
        Path::new("/usr/bin/chromium").exists(),
        "chromium is missing: run scripts/setup.sh"
    );
    let config = serde_json::json!({
        "url": url,
        "bursts": bursts,
        "out": out_dir(),
        "record_seconds": record_seconds,
        "span": span.map(|s| s.map(|t| t.to_string())),
        "token": token,
        "chromium": "/usr/bin/chromium",
    });
    let output = Command::new("node")
        .arg(repo().join("tests/web/drive.js"))
        .arg(config.to_string())
        .env("NODE_PATH", &modules)
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .expect("running node (is it installed?)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "drive.js failed:\n{}{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Samples of `function` and in all in a downloaded profile, decoded by
/// `lightswitch report` into folded stacks.
fn decoded_counts(file: &str, function: &str) -> (u64, u64) {
    let out = Command::new(BIN)
        .args(["report", "--format", "folded", "--output", "-", file])
        .output()
        .expect("running lightswitch report");
    assert!(
        out.status.success(),
        "report {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut with, mut all) = (0, 0);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap();
        all += n;
        if stack.split(';').any(|f| f == function) {
            with += n;
        }
    }
    (with, all)
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// What every run of the page must show, whichever server answers it.
fn check_report(report: &Value, workload: &Workload, program: &str) {
    let rows: Vec<&str> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let host = lightswitch::output::sender::hostname();
    assert!(rows.contains(&host.as_str()), "no host row: {rows:?}");
    let process = format!("{program} ({})", workload.pid());
    assert!(
        rows.iter().any(|r| r.ends_with(&process)),
        "no process row {process}: {rows:?}"
    );
    assert!(
        rows.iter().any(|r| r.starts_with("critical (")),
        "no thread row: {rows:?}"
    );
    let zoom = &report["zoom"];
    let (before, after): (u64, u64) = (
        zoom["before"].as_str().unwrap().parse().unwrap(),
        zoom["after"].as_str().unwrap().parse().unwrap(),
    );
    assert!(after * 2 <= before + 2, "zoom in halves the span: {zoom}");

    let selected = &report["selected"];
    let in_flame = count(&selected["flame"]["total"]);
    let merged = count(&selected["merged"]["count"]);
    assert!(
        merged > 0,
        "the burst's range holds critical_section: {selected}"
    );
    assert_eq!(in_flame, merged, "flame graph against merged: {selected}");

    let quiet = &report["quiet"];
    assert_eq!(quiet["flame"]["seen"], false, "between bursts: {quiet}");
    assert_eq!(count(&quiet["merged"]["count"]), 0, "{quiet}");
    assert!(
        count(&quiet["merged"]["total"]) > 0,
        "background samples: {quiet}"
    );
    assert!(
        count(&quiet["flame"]["frames"]) > 0,
        "a flame graph: {quiet}"
    );

    let diff = &report["diff"];
    assert!(
        diff["title"].as_str().unwrap().contains("differential"),
        "{diff}"
    );
    assert_eq!(diff["flame"]["seen"], true, "critical_section grew: {diff}");
    assert_eq!(report["reload"]["same_url"], true, "{}", report["reload"]);
    assert_eq!(
        report["reload"]["flame"], diff["flame"],
        "the link reloads the view"
    );

    let total = count(&selected["merged"]["total"]);
    for (id, file) in report["downloads"].as_object().unwrap() {
        let (with, all) = decoded_counts(file.as_str().unwrap(), "critical_section");
        assert_eq!((with, all), (merged, total), "{id}: {file}");
    }
    assert_eq!(report["errors"], serde_json::json!([]), "no script errors");
}

const TOKEN: &str = "web-test-token";

/// With a token, the page answers 401 with a Basic challenge (a browser
/// then asks for it), and the token as a Basic password or a Bearer opens it.
fn check_token_asked(url: &str) {
    let client = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap();
    let page = format!("{url}/");
    let denied = client.get(&page).send().unwrap();
    assert_eq!(denied.status(), 401);
    let challenge = denied.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Basic realm="), "{challenge}");
    let data = client.get(format!("{url}/v1/recordings")).send().unwrap();
    assert_eq!(data.status(), 401, "the page's queries too");
    let basic = client.get(&page).basic_auth("anyone", Some(TOKEN)).send();
    assert_eq!(basic.unwrap().status(), 200);
    let bearer = client.get(&page).bearer_auth(TOKEN).send().unwrap();
    assert_eq!(bearer.status(), 200);
    assert!(bearer.text().unwrap().contains("uPlot"));
}

#[test]
fn the_agents_page_records_and_shows_a_burst() {
    let _serial = common::serial();
    let program = compile("web-burst", BURST_SOURCE, FP_FLAGS);
    let bursts = program.dir().join("bursts.txt");
    let workload = Workload::spawn_with_args(&program, &[&bursts]);
    let mut agent = Command::new(BIN);
    agent.env("LIGHTSWITCH_LISTEN_TOKEN", TOKEN).args([
        "--listen",
        "127.0.0.1:0",
        "--sample-freq",
        "10000",
        "--pids",
        &workload.pid_arg(),
    ]);
    let (mut child, url, _lines) = common::spawn_listening(agent, Duration::from_secs(30));
    check_token_asked(&url);
    let report = drive(&format!("{url}/"), &bursts, Some(4), None, Some(TOKEN));
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("{report:#}");
    check_report(&report, &workload, &program.name);
}

#[test]
fn the_collectors_page_shows_a_burst_at_sample_resolution() {
    let _serial = common::serial();
    let program = compile("web-burst", BURST_SOURCE, FP_FLAGS);
    let bursts = program.dir().join("bursts.txt");
    let workload = Workload::spawn_with_args(&program, &[&bursts]);
    let storage = tempfile::tempdir().unwrap();
    let mut collector = Command::new(BIN);
    collector
        .args(["collector", "--listen", "127.0.0.1:0", "--storage"])
        .arg(storage.path());
    let (mut child, url, _lines) = common::spawn_listening(collector, Duration::from_secs(30));
    // An agent sending its windows over OTLP, every sample with its time.
    let started = lightswitch::util::timefmt::now_unix_ns();
    let out = common::run(
        &[
            "--pids",
            &workload.pid_arg(),
            "--sample-freq",
            "10000",
            "--duration",
            "4",
            "--profile-interval",
            "1",
            "--sender",
            "otlp",
            "--server-url",
            &url,
        ],
        Duration::from_secs(60),
    );
    out.assert_success();
    let ended = lightswitch::util::timefmt::now_unix_ns();
    let report = drive(
        &format!("{url}/"),
        &bursts,
        None,
        Some([started, ended]),
        None,
    );
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("{report:#}");
    check_report(&report, &workload, &program.name);
}
