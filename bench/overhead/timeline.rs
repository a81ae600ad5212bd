//! Timeline mode (the size and speed targets of decisions 0012, and 0015 for
//! OTLP with `--timeline-format otlp`): lightswitch on the whole machine at
//! 10 kHz with `--profile-format firefox,folded` (or `otlp,folded`, gzip'd), one
//! workload process per CPU and a small Python loop beside them, stopped
//! with SIGINT after the run length. Measures how soon after the stop each
//! file is complete (the profiler renames a finished file into place, so a
//! file is complete when its name appears), their sizes, the peak RSS while
//! sampling (`VmHWM` at the stop) and over the whole life (`wait4`
//! ru_maxrss), and checks that the timeline keeps every sample: its
//! per-thread sample counts (the gzip'd JSON decoded with serde_json; the
//! OTLP file read back by `lightswitch::profile::format::otlp::read`, counting
//! timestamps), summed per process name, against the folded counts of the
//! same run.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::measure;
use crate::profiler::{self, Kind, Tools};
use crate::report;
use crate::workload::Workloads;

/// Settings of the timeline mode.
pub struct TimelineConfig {
    /// The workload binary.
    pub workload: PathBuf,
    /// Sampling frequency, Hz.
    pub freq: u64,
    /// Time from the start of lightswitch to the SIGINT, s.
    pub seconds: f64,
    /// Workload processes (one per CPU).
    pub cpus: usize,
    /// The markdown file whose `timeline` (or `timeline-otlp`) block is rewritten.
    pub doc: PathBuf,
    /// The timeline format measured.
    pub format: TimelineFormat,
}

/// Which format keeps every sample's time in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TimelineFormat {
    /// The Firefox Profiler's processed format, gzip'd JSON.
    Firefox,
    /// OTLP profiles, gzip'd protobuf.
    Otlp,
}

impl TimelineFormat {
    /// The files the run writes, in the order it writes them.
    fn files(self) -> [&'static str; 2] {
        match self {
            TimelineFormat::Firefox => ["profile.json.gz", "folded.txt"],
            TimelineFormat::Otlp => ["profile.otlp.pb", "folded.txt"],
        }
    }

    /// The profiler's format flags.
    fn flags(self) -> &'static [&'static str] {
        match self {
            TimelineFormat::Firefox => &["--profile-format", "firefox,folded"],
            TimelineFormat::Otlp => &[
                "--profile-format",
                "otlp,folded",
                "--pprof-compression",
                "gzip",
            ],
        }
    }

    /// The doc block the run rewrites.
    fn block(self) -> &'static str {
        match self {
            TimelineFormat::Firefox => "timeline",
            TimelineFormat::Otlp => "timeline-otlp",
        }
    }
}

/// What one timeline run measured.
struct TimelineResult {
    samples: u64,
    lost: u64,
    /// From the profiler's log: `N samples, M distinct stacks, ...`.
    distinct_stacks: Option<u64>,
    /// Time from the SIGINT to each of [`TimelineFormat::files`] being complete, s.
    file_s: Vec<Option<f64>>,
    /// Time from the SIGINT to the exit, s.
    exit_s: f64,
    /// Sizes of [`TimelineFormat::files`], bytes.
    sizes: Vec<Option<u64>>,
    /// VmHWM at the stop, KiB.
    hwm_at_stop_kib: Option<u64>,
    /// ru_maxrss, KiB.
    max_rss_kib: u64,
    /// The profiler's log lines about symbolizing and encoding.
    log: Vec<String>,
    /// Timeline sample total, folded total, and the process names whose
    /// totals differ between the two.
    check: KeptCheck,
    /// Load average (1 min) at the start and at the end.
    load: (String, String),
}

/// The Firefox profile as far as the check needs it (serde ignores the rest).
#[derive(Deserialize)]
struct FxProfile {
    threads: Vec<FxThread>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FxThread {
    process_name: Option<String>,
    samples: FxSamples,
}

#[derive(Deserialize)]
struct FxSamples {
    length: u64,
    weight: Option<Vec<f64>>,
}

/// Whether the timeline kept every sample.
struct KeptCheck {
    threads: usize,
    timeline_total: u64,
    folded_total: u64,
    /// Process names whose sample totals differ, of all names.
    differing: (usize, usize),
}

/// Per-process-name totals of the timeline's threads (sample counts, or
/// sums of weights where samples carry one).
fn timeline_counts(path: &Path) -> Result<(usize, BTreeMap<String, u64>)> {
    let file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let gunzip = BufReader::new(flate2::read::GzDecoder::new(BufReader::new(file)));
    let profile: FxProfile = serde_json::from_reader(gunzip)
        .with_context(|| format!("decoding {} (gzip'd JSON)", path.display()))?;
    let mut counts = BTreeMap::new();
    for thread in &profile.threads {
        let n = match &thread.samples.weight {
            Some(w) => w.iter().sum::<f64>() as u64,
            None => thread.samples.length,
        };
        *counts
            .entry(thread.process_name.clone().unwrap_or_default())
            .or_insert(0) += n;
    }
    Ok((profile.threads.len(), counts))
}

/// Per-process-name totals of an OTLP file (each timestamp, or each
/// value's count, is a sample), and how many threads it names.
fn otlp_counts(path: &Path) -> Result<(usize, BTreeMap<String, u64>)> {
    let mut bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut raw)
            .with_context(|| format!("gunzipping {}", path.display()))?;
        bytes = raw;
    }
    let profile = lightswitch::profile::format::otlp::read::decode(&bytes)
        .with_context(|| format!("decoding {}", path.display()))?;
    let mut counts = BTreeMap::new();
    let mut threads = std::collections::BTreeSet::new();
    for sample in &profile.samples {
        threads.insert((sample.pid, sample.tid));
        *counts.entry(sample.process_comm.to_string()).or_insert(0) += sample.count;
    }
    Ok((threads.len(), counts))
}

/// Per-process-name totals of a folded file (the name is the first field).
fn folded_counts(path: &Path) -> Result<BTreeMap<String, u64>> {
    let file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut counts = BTreeMap::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        let (stack, count) = line
            .rsplit_once(' ')
            .with_context(|| format!("folded line without a count: {line}"))?;
        let name = stack.split(';').next().unwrap_or_default();
        *counts.entry(name.to_string()).or_insert(0) += count.parse::<u64>()?;
    }
    Ok(counts)
}

fn check_kept(out: &Path, format: TimelineFormat) -> Result<KeptCheck> {
    let files = format.files();
    let (threads, timeline) = match format {
        TimelineFormat::Firefox => timeline_counts(&out.join(files[0]))?,
        TimelineFormat::Otlp => otlp_counts(&out.join(files[0]))?,
    };
    let folded = folded_counts(&out.join(files[1]))?;
    let mut names: Vec<&String> = timeline.keys().chain(folded.keys()).collect();
    names.sort();
    names.dedup();
    let differing = names
        .iter()
        .filter(|n| timeline.get(**n) != folded.get(**n))
        .count();
    Ok(KeptCheck {
        threads,
        timeline_total: timeline.values().sum(),
        folded_total: folded.values().sum(),
        differing: (differing, names.len()),
    })
}

/// A Python loop beside the workload (an interpreter's stacks, as on a
/// real machine); `None` without python3.
fn python_loop() -> Option<Child> {
    Command::new("python3")
        .args([
            "-c",
            "import time\nwhile True:\n    sum(range(10000)); time.sleep(0.01)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}

/// `N` of the first log line with `... N <what>`.
fn logged_count(stderr: &str, what: &str) -> Option<u64> {
    stderr.lines().find_map(|l| {
        let before = l.split_once(what)?.0;
        before.rsplit(' ').next()?.parse().ok()
    })
}

fn run_once(tools: &Tools, config: &TimelineConfig) -> Result<TimelineResult> {
    let load_start = load_average();
    let workloads = Workloads::start(&config.workload, config.cpus)?;
    let mut python = python_loop();
    let name = "timeline";
    let out = tools.scratch.join(name);
    let _ = fs::remove_dir_all(&out);
    let files = config.format.files();
    let extra: Vec<String> = config
        .format
        .flags()
        .iter()
        .chain(&["--logging", "info"])
        .map(|f| f.to_string())
        .collect();
    let mut running = profiler::start(tools, Kind::Lightswitch, config.freq, name, &extra)?;
    sleep(Duration::from_secs_f64(config.seconds));
    running.check_alive()?;
    let pid = running.pid();
    let hwm_at_stop_kib = measure::status_kib(pid, "VmHWM");
    running.interrupt();
    let stopped = Instant::now();
    let mut file_s = vec![None; files.len()];
    while running.alive() {
        for (seen, file) in file_s.iter_mut().zip(files) {
            if seen.is_none() && out.join(file).exists() {
                *seen = Some(stopped.elapsed().as_secs_f64());
            }
        }
        sleep(Duration::from_millis(20));
    }
    let exit_s = stopped.elapsed().as_secs_f64();
    let finished = running.wait(None)?;
    drop(workloads);
    if let Some(p) = python.as_mut() {
        let _ = p.kill();
        let _ = p.wait();
    }
    let sizes = files
        .iter()
        .map(|f| fs::metadata(out.join(f)).ok().map(|m| m.len()))
        .collect();
    let log = finished
        .stderr
        .lines()
        .filter(|l| l.contains("symbolized in") || l.contains("bytes encoded"))
        .filter_map(|l| {
            l.split_once("lightswitch::agent::run: ")
                .map(|(_, m)| m.to_string())
        })
        .collect();
    Ok(TimelineResult {
        samples: finished.samples,
        lost: finished.lost,
        distinct_stacks: logged_count(&finished.stderr, " distinct stacks"),
        file_s,
        exit_s,
        sizes,
        hwm_at_stop_kib,
        max_rss_kib: finished.max_rss_kib,
        log,
        check: check_kept(&out, config.format)?,
        load: (load_start, load_average()),
    })
}

/// The `timeline` mode: one run, its block in the doc.
pub fn timeline(tools: &Tools, config: &TimelineConfig) -> Result<()> {
    eprintln!(
        "overhead: timeline, {} Hz for {} s",
        config.freq, config.seconds
    );
    let files = config.format.files();
    let conditions = format!(
        "lightswitch at {} Hz on the whole machine, `{}`, stopped with \
         SIGINT {} s after its start; one workload process per CPU and a Python loop",
        config.freq,
        config.format.flags().join(" "),
        config.seconds
    );
    // The machine line gives the load average at the start.
    let machine = report::machine_line(config.cpus, &conditions);
    let r = run_once(tools, config)?;
    let secs = |v: Option<f64>| v.map_or("not written".into(), |s| format!("{s:.2} s"));
    let mb = |v: Option<u64>| v.map_or("—".into(), |b| format!("{:.1} MB", b as f64 / 1e6));
    let mib = |kib: u64| format!("{:.1} MiB", kib as f64 / 1024.0);
    let c = &r.check;
    let kept = c.timeline_total == c.folded_total && c.timeline_total == r.samples;
    let rows = vec![
        vec![
            "samples".to_string(),
            format!("{} ({} lost)", r.samples, r.lost),
        ],
        vec![
            "distinct stacks".into(),
            r.distinct_stacks.map_or("—".into(), |n| n.to_string()),
        ],
        vec![
            format!("{} complete after the stop", files[0]),
            secs(r.file_s[0]),
        ],
        vec![
            format!("{} complete after the stop", files[1]),
            secs(r.file_s[1]),
        ],
        vec!["exit after the stop".into(), format!("{:.2} s", r.exit_s)],
        vec![format!("{} size", files[0]), mb(r.sizes[0])],
        vec![format!("{} size", files[1]), mb(r.sizes[1])],
        vec![
            "VmHWM at the stop".into(),
            r.hwm_at_stop_kib.map_or("—".into(), mib),
        ],
        vec!["peak RSS (ru_maxrss)".into(), mib(r.max_rss_kib)],
        vec![
            "every sample kept".into(),
            format!(
                "{}: timeline {} samples in {} threads, folded {}; per process name, {} of {} totals differ",
                if kept { "yes" } else { "NO" },
                c.timeline_total,
                c.threads,
                c.folded_total,
                c.differing.0,
                c.differing.1
            ),
        ],
        vec![
            "load average (1 min) at start / end".into(),
            format!("{} / {}", r.load.0, r.load.1),
        ],
    ];
    let log: String = r.log.iter().map(|l| format!("- `{l}`\n")).collect();
    let body = format!(
        "{}\n\n{}\nFrom the profiler's log:\n\n{log}\n\
         Times after the stop: from the SIGINT until the file's name appears (files are renamed into \
         place when complete), polled every 20 ms. Per process name: the timeline's threads \
         (samples.length, or the sum of weights) summed by processName against the folded lines \
         summed by their first field; a pid that exec'd is named after its latest sample in the \
         timeline, after each sample's own process in folded, so some names may differ while the \
         totals agree.\n",
        machine,
        report::table(&["what", "value"], &rows)
    );
    println!("{body}");
    report::write_block(&config.doc, config.format.block(), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_stacks_come_from_the_symbolization_log_line() {
        let stderr = "2026-12-01T04:05:27Z  INFO lightswitch::agent::run: 594428 samples, \
                      365376 distinct stacks, 370350 frames symbolized in 37.8s\n";
        assert_eq!(logged_count(stderr, " distinct stacks"), Some(365_376));
        assert_eq!(logged_count("no such line\n", " distinct stacks"), None);
    }

    #[test]
    fn folded_totals_are_summed_per_process_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("folded.txt");
        fs::write(&path, "a;main;f 3\nb;main 2\na;main;g 4\n").unwrap();
        let counts = folded_counts(&path).unwrap();
        assert_eq!(counts.get("a"), Some(&7));
        assert_eq!(counts.get("b"), Some(&2));
        fs::write(&path, "a;main\n").unwrap();
        assert!(folded_counts(&path).is_err());
    }
}
