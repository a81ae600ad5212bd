//! Off-CPU waits end to end: `lightswitch record --off-cpu` sending OTLP
//! to a real `lightswitch collector`, whose merged profile of the run's
//! range shows where the program waited, in pprof (`go tool pprof
//! -sample_index=off_cpu`), the off-CPU folded twin and OTLP with each
//! wait's start.

use std::time::{SystemTime, UNIX_EPOCH};

use lightswitch::profile::format::otlp;

use super::*;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// `GET url` answered 200: its body.
fn get_body(url: &str) -> Vec<u8> {
    let r = http().get(url).send().unwrap();
    let status = r.status();
    let body = r.bytes().unwrap().to_vec();
    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    body
}

/// The sleeper's 10 × 100 ms, recorded with `--off-cpu` and sent over
/// OTLP, come back from the collector's merged profile of the run's range
/// as 1.0 s (±10%) off-CPU under `waiter` in `clock_nanosleep`: in pprof's
/// off_cpu sample type, in the off-CPU folded stacks, and as OTLP waits
/// with their starts inside the range.
#[test]
fn off_cpu_waits_sent_over_otlp_come_back_from_the_collector() {
    let _serial = common::serial();
    let program = common::compile(
        "lsw_offcpu_wait",
        &common::waiter_burner_source(),
        common::FP_FLAGS,
    );
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(0, &dir.path().join("store"), &[]);
    let from = now_ns();
    let mut cmd = lightswitch_command();
    cmd.args(["record", "--off-cpu", "--sample-freq", "999"])
        .args(["--sender", "otlp", "--server-url", &collector.url, "--"])
        .arg(&program.path)
        .arg(dir.path().join("wall_ms"));
    let out = Lightswitch::spawn_command(cmd).wait(Duration::from_secs(120));
    out.assert_success();
    let to = now_ns();
    let merged = |format: &str| {
        let url = format!(
            "{}/merged?from={from}&to={to}&format={format}",
            collector.profiles_url()
        );
        get_body(&url)
    };

    let pprof_file = dir.path().join("merged.pb.gz");
    fs::write(&pprof_file, merged("pprof")).unwrap();
    let pprof = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["-sample_index=off_cpu", "-unit=ms", common::s(&pprof_file)]);
        common::go_pprof(&all)
    };
    let waited_ms = common::pprof_cumulative_ms(&pprof(&["-top"]), "waiter");
    assert!(
        (900.0..=1100.0).contains(&waited_ms),
        "pprof off_cpu: {waited_ms} ms under waiter, not 1.0 s ±10%:\n{out}"
    );
    let sleeping_ms =
        common::pprof_cumulative_ms(&pprof(&["-top", "-focus=clock_nanosleep"]), "waiter");
    assert!(
        (900.0..=1100.0).contains(&sleeping_ms),
        "pprof off_cpu: {sleeping_ms} ms under waiter in clock_nanosleep"
    );

    // The off-CPU folded twin, as `record --off-cpu` writes it.
    let folded = String::from_utf8(merged("folded-off-cpu")).unwrap();
    let slept = common::folded_ns_under_waiter(&folded, &program.name);
    assert!(
        (0.9e9..=1.1e9).contains(&(slept as f64)),
        "{slept} ns off-CPU under waiter in clock_nanosleep:\n{folded}"
    );

    // OTLP: every wait with its start, inside the run's range.
    let request = gunzip(&merged("otlp"));
    let back = otlp::read::decode(&request).expect("an OTLP answer");
    assert!(back.off_cpu && !back.waits.is_empty(), "no waits in OTLP");
    let waited: u64 = back.waits.iter().map(|w| w.duration_ns).sum();
    assert_eq!(waited, back.total_off_cpu_ns());
    let starts = back
        .waits
        .iter()
        .map(|w| back.start_unix_ns.wrapping_add_signed(w.start_offset_ns));
    assert!(starts.clone().all(|t| (from..to).contains(&t)));
    // At least the 10 sleeps, each at its own time.
    let mut distinct: Vec<u64> = starts.collect();
    distinct.dedup();
    assert!(
        distinct.len() >= 10,
        "{} distinct wait starts",
        distinct.len()
    );
    eprintln!(
        "collector: {waited_ms} ms off-CPU under waiter (pprof), {sleeping_ms} ms of it in \
         clock_nanosleep; folded {slept} ns; OTLP {} waits, {waited} ns",
        back.waits.len()
    );
}
