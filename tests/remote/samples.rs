//! The collector's sample store end to end: every sample sent over OTLP
//! keeps its time, `merged` answers any range at sample resolution across
//! window edges, the timeline adds up, damaged blocks are skipped, and
//! retention deletes the oldest data.

use lightswitch::profile::format::otlp;
use lightswitch::profile::Profile;

use super::*;

/// Every sample's time of `p` (ns since the Unix epoch), sorted.
fn times(p: &Profile) -> Vec<u64> {
    let mut t: Vec<u64> = p
        .timeline
        .iter()
        .map(|s| p.start_unix_ns.wrapping_add_signed(s.offset_ns))
        .collect();
    t.sort_unstable();
    t
}

/// Folded stacks (`comm;frames... count`, sorted) of the samples of `p`
/// whose time lies in `[from, to)`.
fn folded_in(p: &Profile, from: u64, to: u64) -> Vec<(Vec<String>, u64)> {
    let mut counts: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    for t in &p.timeline {
        let time = p.start_unix_ns.wrapping_add_signed(t.offset_ns);
        if !(from..to).contains(&time) {
            continue;
        }
        let s = &p.samples[t.sample as usize];
        let mut key = vec![s.process_comm.to_string()];
        key.extend(
            s.frames
                .iter()
                .rev()
                .map(|&f| p.frames[f].lines.last().unwrap().function.to_string()),
        );
        *counts.entry(key).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// The store's block files under the storage directory `store`, sorted by
/// their first sample's time.
fn block_files(store: &Path) -> Vec<PathBuf> {
    let mut blocks = Vec::new();
    let mut stack = vec![store.join(".samples/blocks")];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "blk") {
                blocks.push(e.path());
            }
        }
    }
    let first = |p: &PathBuf| -> u64 {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        name.split('-').next().unwrap().parse().unwrap()
    };
    blocks.sort_by_key(first);
    blocks
}

/// `GET url` answered 200: its headers and body.
fn get_ok(url: &str) -> (reqwest::header::HeaderMap, Vec<u8>) {
    let r = http().get(url).send().unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let body = r.bytes().unwrap().to_vec();
    assert_eq!(status, 200, "{url}: {}", String::from_utf8_lossy(&body));
    (headers, body)
}

fn header_u64(headers: &reqwest::header::HeaderMap, name: &str) -> u64 {
    headers[name].to_str().unwrap().parse().unwrap()
}

/// The merged OTLP answer for `query`, decoded, and its sample-count header.
fn merged_otlp(collector: &Collector, query: &str) -> (Profile, u64, u64) {
    let (headers, body) = get_ok(&format!(
        "{}/merged?format=otlp&{query}",
        collector.profiles_url()
    ));
    let p = otlp::read::decode(&gunzip(&body)).expect("a gzip'd OTLP answer");
    (
        p,
        header_u64(&headers, "X-Lightswitch-Samples"),
        header_u64(&headers, "X-Lightswitch-Merged-Profiles"),
    )
}

/// Sum of the `[index, count]` pairs of a timeline series.
fn series_sum(series: &serde_json::Value) -> u64 {
    series["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c[1].as_u64().unwrap())
        .sum()
}

#[test]
fn otlp_windows_keep_every_sample_time_and_ranges_cut_at_sample_resolution() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_samples");
    let dir = tempfile::tempdir().unwrap();
    let collector = Collector::start(0, &dir.path().join("store"), &[]);
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "999"])
        .args(["--sender", "otlp", "--server-url", &collector.url])
        .args(["--profile-interval", "1", "--duration", "3"]);
    let out = Lightswitch::spawn_command(cmd).wait(Duration::from_secs(60));
    out.assert_success();
    let summary = Summary::parse(&out);
    assert_eq!(summary.get("delivery.sent"), 3, "{out}");
    assert!(summary.samples > 100, "too few samples: {out}");

    // Everything: each sample once, with its own time, three windows.
    let (all, n, windows) = merged_otlp(&collector, "");
    assert_eq!((n, windows), (summary.samples, 3), "{out}");
    let all_times = times(&all);
    assert_eq!(all_times.len() as u64, summary.samples);
    assert!(all_times.windows(2).any(|w| w[0] != w[1]), "times differ");

    // 20 ms inside a window, and 20 ms across the edge of two windows.
    let (first, last) = (all_times[0], *all_times.last().unwrap());
    let middle = all_times[all_times.len() / 2];
    // The first sample of the second window (block) is an edge.
    let blocks = block_files(&collector.storage);
    assert_eq!(blocks.len(), 3, "{blocks:?}");
    let edge: u64 = blocks[1]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let before_edge = *all_times.iter().rfind(|&&t| t < edge).unwrap();
    for (from, to) in [(middle, middle + 20_000_000), (before_edge, edge + 1)] {
        let want: Vec<u64> = all_times
            .iter()
            .copied()
            .filter(|t| (from..to).contains(t))
            .collect();
        assert!(!want.is_empty(), "no sample in [{from}, {to})");
        let (cut, n, windows) = merged_otlp(&collector, &format!("from={from}&to={to}"));
        assert_eq!(times(&cut), want, "[{from}, {to})");
        if from == before_edge {
            assert_eq!(windows, 2, "the range holds the edge of two windows");
        }
        assert_eq!(n, want.len() as u64);
        assert_eq!(folded_in(&cut, from, to), folded_in(&all, from, to));
        // The folded answer of the same range counts the same stacks.
        let (h, folded) = get_ok(&format!(
            "{}/merged?format=folded&from={from}&to={to}&pid={}",
            collector.profiles_url(),
            workload.pid()
        ));
        let folded = common::parse_folded(&String::from_utf8(folded).unwrap());
        assert_eq!(common::total(&folded), want.len() as u64);
        assert_eq!(header_u64(&h, "X-Lightswitch-Samples"), want.len() as u64);
    }

    // The timeline: every level adds up to the samples of the range.
    let (from, to) = (first, last + 1);
    let step = (to - from).div_ceil(300);
    let (h, body) = get_ok(&format!(
        "{}/v1/timeline?from={from}&to={to}&step={step}",
        collector.url
    ));
    assert_eq!(header_u64(&h, "X-Lightswitch-Samples"), summary.samples);
    let timeline: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(timeline["from"], from.to_string());
    assert_eq!(timeline["buckets"], 300);
    let hosts = timeline["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 1);
    let host = &hosts[0];
    assert_eq!(host["host"], lightswitch::output::sender::hostname());
    assert_eq!(host["total"].as_u64().unwrap(), summary.samples);
    assert_eq!(series_sum(host), summary.samples);
    let processes = host["processes"].as_array().unwrap();
    assert_eq!(processes[0]["pid"], workload.pid());
    for p in processes {
        let threads: u64 = p["threads"]
            .as_array()
            .unwrap()
            .iter()
            .map(series_sum)
            .sum();
        assert_eq!(threads, p["total"].as_u64().unwrap());
        assert_eq!(series_sum(p), p["total"].as_u64().unwrap());
    }
    // The counts of one bucket are the samples in it.
    let cell = &processes[0]["counts"][10];
    let i = cell[0].as_u64().unwrap();
    let (b_from, b_to) = (from + i * step, from + (i + 1) * step);
    let in_bucket = all_times
        .iter()
        .filter(|t| (b_from..b_to).contains(t))
        .count() as u64;
    assert_eq!(cell[1].as_u64().unwrap(), in_bucket);
    // A range too large for its step: 413 naming the largest allowed.
    let r = http()
        .get(format!(
            "{}/v1/timeline?from={from}&to={}&step=1",
            collector.url,
            from + 30_000
        ))
        .send()
        .unwrap();
    assert_eq!(r.status(), 413);
    assert!(r.text().unwrap().contains("20000 ns"));

    let (_, hosts) = get_ok(&format!("{}/v1/hosts", collector.url));
    let hosts: serde_json::Value = serde_json::from_slice(&hosts).unwrap();
    assert_eq!(hosts["hosts"][0]["first"], first.to_string());
    let (_, metrics) = get_ok(&format!("{}/metrics", collector.url));
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains(&format!(
            "lightswitch_collector_samples_stored_total {}",
            summary.samples
        )),
        "{metrics}"
    );
}

#[test]
fn a_recorded_otlp_file_is_stored_sample_by_sample_damage_is_skipped_and_retention_deletes() {
    let _serial = common::serial();
    let (_program, workload) = workload("lsw_smp_file");
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let mut cmd = lightswitch_command();
    cmd.args(["--pids", &workload.pid_arg(), "--sample-freq", "999"])
        .args(["--duration", "2", "--profile-format", "otlp"])
        .arg("--profile-path")
        .arg(&out_dir);
    Lightswitch::spawn_command(cmd)
        .wait(Duration::from_secs(60))
        .assert_success();
    let file = fs::read(out_dir.join("profile.otlp.pb")).unwrap();
    let recorded = otlp::read::decode(&file).unwrap();
    let recorded_times = times(&recorded);
    assert!(recorded_times.len() > 50);

    let store = dir.path().join("store");
    let collector = Collector::start(0, &store, &[]);
    let r = http()
        .post(format!("{}/v1development/profiles", collector.url))
        .header("Content-Type", "application/x-protobuf")
        .body(file.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-protobuf");
    // A window of pprof (no per-sample times) goes in at its start.
    let pprof = lightswitch::profile::format::pprof::encode(
        &recorded,
        lightswitch::profile::format::Compression::Gzip,
    )
    .unwrap();
    let pprof_start = recorded.start_unix_ns + 10 * 1_000_000_000;
    let r = http()
        .post(collector.profiles_url())
        .header("X-Lightswitch-Window-Start", pprof_start.to_string())
        .header(
            "X-Lightswitch-Window-End",
            (pprof_start + 1_000_000_000).to_string(),
        )
        .body(pprof)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);

    // 20 ms in the middle of the file: exactly its samples there.
    let from = recorded_times[recorded_times.len() / 2];
    let to = from + 20_000_000;
    let (cut, n, windows) = merged_otlp(&collector, &format!("from={from}&to={to}"));
    let want: Vec<u64> = recorded_times
        .iter()
        .copied()
        .filter(|t| (from..to).contains(t))
        .collect();
    assert_eq!(
        (times(&cut), n, windows),
        (want.clone(), want.len() as u64, 1)
    );
    assert_eq!(folded_in(&cut, from, to), folded_in(&recorded, from, to));
    // The pprof window: every sample at its start, none 1 ns later.
    let (p, n, _) = merged_otlp(
        &collector,
        &format!("from={pprof_start}&to={}", pprof_start + 1),
    );
    assert_eq!(n, recorded_times.len() as u64);
    assert!(times(&p).iter().all(|&t| t == pprof_start));
    let r = http()
        .get(format!(
            "{}/merged?from={}&to={}",
            collector.profiles_url(),
            pprof_start + 1,
            pprof_start + 1_000_000_000
        ))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    // Not a request: 400, nothing stored.
    let r = http()
        .post(format!("{}/v1development/profiles", collector.url))
        .body(&b"\xff\xff not protobuf"[..])
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    drop(collector);

    // A torn block and a crashed write's temporary file: skipped, counted.
    let blocks = block_files(&store);
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let torn = &blocks[1];
    let bytes = fs::read(torn).unwrap();
    fs::write(torn, &bytes[..bytes.len() - 100]).unwrap();
    fs::write(
        torn.with_file_name(".tmp-crashed"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let collector = Collector::start(0, &store, &[]);
    let (headers, _) = get_ok(&format!(
        "{}/merged?format=folded",
        collector.profiles_url()
    ));
    assert_eq!(header_u64(&headers, "X-Lightswitch-Skipped-Profiles"), 1);
    assert_eq!(
        header_u64(&headers, "X-Lightswitch-Samples"),
        recorded_times.len() as u64
    );
    drop(collector);

    // Retention: a collector keeping 1 day deletes this old data at start.
    let old = 1_714_564_800_000_000_000u64;
    let collector = Collector::start(0, &store, &[]);
    let r = http()
        .post(collector.profiles_url())
        .header("X-Lightswitch-Window-Start", old.to_string())
        .body(
            lightswitch::profile::format::pprof::encode(
                &recorded,
                lightswitch::profile::format::Compression::None,
            )
            .unwrap(),
        )
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(collector);
    let collector = Collector::start(0, &store, &["--retention", "1d", "--max-storage", "1GiB"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = get_ok(&format!("{}/metrics", collector.url));
        let metrics = String::from_utf8(metrics).unwrap();
        // The old block and its archived pprof file.
        if metrics.contains("lightswitch_collector_retention_deleted_by_age_total 2") {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        thread::sleep(Duration::from_millis(100));
    }
    let r = http()
        .get(format!(
            "{}/merged?to={}",
            collector.profiles_url(),
            old + 2_000_000_000
        ))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    let (headers, _) = get_ok(&format!(
        "{}/merged?format=folded",
        collector.profiles_url()
    ));
    assert!(header_u64(&headers, "X-Lightswitch-Samples") >= recorded_times.len() as u64);
}
