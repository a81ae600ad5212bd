//! `lightswitch diff` and `lightswitch report` on profiles of real
//! programs recorded by lightswitch (pprof, raw and gzip'd, and folded):
//! a profile against itself, a function whose share doubles, JSON output,
//! the differential flame graph, the top table and re-encoding; one run
//! written in every format `diff` reads diffs to nothing across each pair
//! ([`formats`]). Needs root (recording), gcc and rustc.

#[path = "../common/mod.rs"]
mod common;
mod formats;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(120);

/// `alpha` and `beta` spin for `argv[1]` and `argv[2]` ms of CPU time.
const SPLIT_SOURCE: &str = r#"
#include <stdlib.h>
#include <time.h>
static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
volatile unsigned long spin;
__attribute__((noinline)) void alpha(double ms) { double end = cpu_ms() + ms; while (cpu_ms() < end) spin++; }
__attribute__((noinline)) void beta(double ms) { double end = cpu_ms() + ms; while (cpu_ms() < end) spin++; }
int main(int argc, char **argv) {
    for (int i = 0; i < 10; i++) { alpha(atof(argv[1]) / 10); beta(atof(argv[2]) / 10); spin++; }
    return 0;
}
"#;

/// Record `program alpha_ms beta_ms` into `dir/name` in `format`.
fn record(
    program: &Program,
    split: (u32, u32),
    dir: &Path,
    name: &str,
    format: &[&str],
) -> PathBuf {
    let mut args: Vec<String> = ["record", "--sample-freq", "499", "--profile-path", s(dir)]
        .map(String::from)
        .to_vec();
    args.extend(["--profile-name", name].map(String::from));
    args.extend(format.iter().map(|a| a.to_string()));
    args.extend([
        "--".to_string(),
        s(&program.path).to_string(),
        split.0.to_string(),
        split.1.to_string(),
    ]);
    let out = run(&args, TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{out}");
    dir.join(name)
}

/// Parse an SVG flame graph (inferno writes a DTD).
fn parse_svg(svg: &str) -> roxmltree::Document<'_> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(svg, options).expect("the SVG parses")
}

fn lightswitch(args: &[&str]) -> Output {
    run(args, TIMEOUT)
}

#[test]
fn diff_gates_on_a_doubled_share_and_not_on_itself() {
    let _serial = serial();
    let program = compile("cmp_split", SPLIT_SOURCE, FP_FLAGS);
    let dir = tempdir();
    let pprof = ["--profile-format", "pprof", "--pprof-compression", "gzip"];
    let base = record(&program, (250, 750), dir.path(), "base.pb.gz", &pprof);
    let new = record(
        &program,
        (500, 500),
        dir.path(),
        "new.pb",
        &["--profile-format", "pprof"],
    );
    let (base, new) = (s(&base), s(&new));

    let same = lightswitch(&["diff", "--fail-above", "1", base, base]);
    assert_eq!(same.status.code(), Some(0), "{same}");
    assert!(
        same.stdout.contains("no function's share changed"),
        "{same}"
    );

    // alpha: 25% -> 50% of the samples (expected +25 points).
    let grown = lightswitch(&["diff", "--fail-above", "10", base, new]);
    assert_eq!(grown.status.code(), Some(1), "{grown}");
    let fail: Vec<&str> = grown
        .stdout
        .lines()
        .filter(|l| l.starts_with("FAIL: "))
        .collect();
    // alpha is named; beta, which shrank, is not. (Frames every stack
    // shares, like main, can also grow when BASE had incomplete stacks.)
    assert!(
        fail.iter()
            .any(|l| l.starts_with("FAIL: alpha (cmp_split) grew by +")),
        "{grown}"
    );
    assert!(!fail.iter().any(|l| l.starts_with("FAIL: beta")), "{grown}");

    let json = lightswitch(&["diff", "--output", "json", "--fail-above", "10", base, new]);
    assert_eq!(json.status.code(), Some(1), "{json}");
    let value: serde_json::Value =
        serde_json::from_str(&json.stdout).expect("diff --output json parses");
    let alpha = value["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"] == "alpha")
        .unwrap_or_else(|| panic!("alpha not listed: {value:#}"));
    let change = alpha["inclusive_change"].as_f64().unwrap();
    assert!(
        (10.0..40.0).contains(&change),
        "alpha grew by {change} points: {value:#}"
    );
    assert_eq!(alpha["object"], "cmp_split");
    let base_share = alpha["base"]["inclusive"].as_f64().unwrap();
    assert!((10.0..40.0).contains(&base_share), "{value:#}");
    let grown = value["grown_above_threshold"].as_array().unwrap();
    assert!(grown.iter().any(|f| f["function"] == "alpha"), "{value:#}");

    // The flame graph: an SVG naming both functions.
    let svg_path = dir.path().join("diff.svg");
    let with_svg = lightswitch(&["diff", "--flame-graph", s(&svg_path), base, new]);
    assert_eq!(with_svg.status.code(), Some(0), "{with_svg}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    let doc = parse_svg(&svg);
    let titles: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text())
        .collect();
    assert!(
        titles.iter().any(|t| t.starts_with("alpha (")),
        "{titles:?}"
    );
    assert!(titles.iter().any(|t| t.starts_with("beta (")), "{titles:?}");

    // For CI: the gate as GitHub annotations, a JUnit report and Markdown.
    let junit_path = dir.path().join("diff.xml");
    let ci = lightswitch(&[
        "diff",
        "--format",
        "markdown",
        "--annotations",
        "github",
        "--fail-above",
        "10",
        "--junit",
        s(&junit_path),
        base,
        new,
    ]);
    assert_eq!(ci.status.code(), Some(1), "{ci}");
    let errors: Vec<&str> = ci
        .stdout
        .lines()
        .filter(|l| l.starts_with("::error "))
        .collect();
    assert!(
        errors
            .iter()
            .any(|l| l.starts_with("::error title=alpha (cmp_split) grew by +")),
        "{ci}"
    );
    assert!(!errors.iter().any(|l| l.contains("beta")), "{ci}");
    // The Markdown table, as a GFM parser reads it: alpha's row is marked failed.
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut cell: Option<String> = None;
    let mut row = Vec::new();
    use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
    for event in Parser::new_ext(&ci.stdout, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::TableCell) => cell = Some(String::new()),
            Event::End(TagEnd::TableCell) => row.push(cell.take().unwrap()),
            Event::End(TagEnd::TableRow | TagEnd::TableHead) => rows.push(std::mem::take(&mut row)),
            Event::Text(t) | Event::Code(t) => {
                if let Some(c) = cell.as_mut() {
                    c.push_str(&t)
                }
            }
            _ => {}
        }
    }
    let alpha_row = rows
        .iter()
        .find(|r| r.get(1).map(String::as_str) == Some("alpha"))
        .unwrap_or_else(|| panic!("no alpha row: {ci}"));
    assert_eq!(alpha_row[0], "❌", "{ci}");
    assert_eq!(alpha_row[2], "cmp_split", "{ci}");
    // JUnit: alpha's test case failed, beta's passed.
    let xml = std::fs::read_to_string(&junit_path).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let case = |name: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name("testcase") && n.attribute("name") == Some(name))
            .unwrap_or_else(|| panic!("no test case {name}: {xml}"))
    };
    assert!(
        case("alpha").children().any(|n| n.has_tag_name("failure")),
        "{xml}"
    );
    assert!(
        !case("beta").children().any(|n| n.has_tag_name("failure")),
        "{xml}"
    );
    assert_eq!(case("alpha").attribute("classname"), Some("cmp_split"));
}

#[test]
fn diff_of_folded_profiles_and_bad_input() {
    let _serial = serial();
    let program = compile("cmp_fold", SPLIT_SOURCE, FP_FLAGS);
    let dir = tempdir();
    let folded = ["--profile-format", "folded"];
    let base = record(&program, (250, 750), dir.path(), "base.txt", &folded);
    let new = record(&program, (500, 500), dir.path(), "new.txt", &folded);
    let out = lightswitch(&["diff", "--fail-above", "10", s(&base), s(&new)]);
    assert_eq!(out.status.code(), Some(1), "{out}");
    // Folded stacks know no objects: the function is its name.
    assert!(out.stdout.contains("FAIL: alpha grew by +"), "{out}");

    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"\x00\x01not a profile").unwrap();
    let bad = lightswitch(&["diff", s(&base), s(&garbage)]);
    assert_eq!(bad.status.code(), Some(2), "{bad}");
    assert!(bad.stderr.contains("garbage is not a profile"), "{bad}");
    let missing = lightswitch(&["diff", s(&base), "/nonexistent/profile.pb"]);
    assert_eq!(missing.status.code(), Some(2), "{missing}");

    // A run that ended before its first sample fails the gate (exit 2),
    // either side; it never passes as "no function grew". At 1 Hz, `true`
    // (about 1 ms) is sampled about once in a thousand runs; at the
    // default 99 Hz a clean-clone CI run caught it in ld.so's first page
    // fault.
    let never = lightswitch(&[
        "record",
        "--sample-freq",
        "1",
        "--profile-format",
        "pprof",
        "--profile-path",
        s(dir.path()),
        "--profile-name",
        "empty.pb",
        "--",
        "true",
    ]);
    assert_eq!(never.status.code(), Some(0), "{never}");
    let empty = dir.path().join("empty.pb");
    for pair in [[s(&base), s(&empty)], [s(&empty), s(&base)]] {
        let out = lightswitch(&["diff", "--fail-above", "5", pair[0], pair[1]]);
        assert_eq!(out.status.code(), Some(2), "{out}");
        assert!(out.stderr.contains("empty.pb holds no samples"), "{out}");
    }
}

#[test]
fn report_tops_and_reencodes() {
    let _serial = serial();
    let program = compile("cmp_report", SPLIT_SOURCE, FP_FLAGS);
    let dir = tempdir();
    let pprof = record(
        &program,
        (200, 600),
        dir.path(),
        "p.pb",
        &["--profile-format", "pprof"],
    );
    let out = lightswitch(&["report", "--top", "5", s(&pprof)]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert_eq!(out.stdout.lines().count(), 2 + 5, "{out}");
    assert!(out.stdout.contains("showing 5 of "), "{out}");
    // The workload's self time is mostly in clock_gettime: look up cum%
    // in the whole table.
    let all = lightswitch(&["report", "--top", "0", s(&pprof)]);
    let cum = |name: &str| -> f64 {
        let line = all
            .stdout
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{all}"));
        let cum = line.split_whitespace().nth(4).unwrap();
        cum.trim_end_matches('%').parse().unwrap()
    };
    // beta has 3/4 of the CPU time, main all of it.
    assert!(cum("beta") > 40.0, "{all}");
    assert!(cum("beta") > cum("alpha"), "{all}");
    assert!(cum("main") > 90.0, "{all}");

    // pprof -> folded and flame graph, decoded again.
    let folded = dir.path().join("p.txt");
    let re = lightswitch(&["report", "--format", "folded", "-o", s(&folded), s(&pprof)]);
    assert_eq!(re.status.code(), Some(0), "{re}");
    let stacks = read_folded(&folded);
    assert!(of_process(&stacks, "cmp_report")
        .iter()
        .any(|(f, _)| f.iter().any(|x| x == "alpha")));
    let svg = dir.path().join("p.svg");
    let re = lightswitch(&[
        "report",
        "--format",
        "flame-graph",
        "-o",
        s(&svg),
        s(&pprof),
    ]);
    assert_eq!(re.status.code(), Some(0), "{re}");
    parse_svg(&std::fs::read_to_string(&svg).unwrap());
    // And back from folded to pprof: the folded report equals the original's.
    let pb = dir.path().join("again.pb");
    let re = lightswitch(&["report", "--format", "pprof", "-o", s(&pb), s(&folded)]);
    assert_eq!(re.status.code(), Some(0), "{re}");
    let twice = lightswitch(&["report", "--top", "0", s(&pb)]);
    let once = lightswitch(&["report", "--top", "0", s(&folded)]);
    assert_eq!(
        twice.stdout.lines().skip(1).collect::<Vec<_>>(),
        once.stdout.lines().skip(1).collect::<Vec<_>>()
    );
}

/// `fa` spins until `argv[1]` ms after the start (wall clock), then `fb`
/// until `argv[2]` ms after that.
const HALVES_SOURCE: &str = r#"
#include <stdlib.h>
#include <time.h>
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}
volatile unsigned long spin;
__attribute__((noinline)) void fa(double until) { while (now_ms() < until) spin++; }
__attribute__((noinline)) void fb(double until) { while (now_ms() < until) spin++; }
int main(int argc, char **argv) {
    double start = now_ms();
    fa(start + atof(argv[1]));
    fb(start + atof(argv[1]) + atof(argv[2]));
    return 0;
}
"#;

/// The names in the function column of a `report --top 0` table, with
/// their cum%.
fn reported(out: &Output) -> Vec<(String, f64)> {
    out.stdout
        .lines()
        .skip(2)
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let cum = cols[4].trim_end_matches('%').parse().unwrap();
            (cols[5..].join(" "), cum)
        })
        .collect()
}

/// Sample times (ms after `meta.startTime`) of every thread of a gzip'd
/// Firefox profile, decoded with serde_json.
fn timeline_times(path: &Path) -> Vec<f64> {
    use std::io::Read;
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut json)
        .unwrap();
    let profile: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let mut times = Vec::new();
    for thread in profile["threads"].as_array().unwrap() {
        let mut t = 0.0;
        for delta in thread["samples"]["timeDeltas"].as_array().unwrap() {
            t += delta.as_f64().unwrap();
            times.push(t);
        }
    }
    times
}

/// `report --from/--to` on the timeline of a program whose hot function
/// switches from `fa` to `fb` after 1 s of its CPU time: the part of the
/// run before 40% of its samples shows only `fa`, the part after 60% only
/// `fb`; a re-encoded slice holds exactly the samples the file has in that
/// span; `--from` on pprof is an error (exit 2). The cut points come from
/// the file's own sample times (cpu-clock samples follow CPU time), not
/// from the wall clock, which a loaded machine stretches.
#[test]
fn report_slices_a_timeline_by_time() {
    let _serial = serial();
    let program = compile("cmp_halves", HALVES_SOURCE, FP_FLAGS);
    let dir = tempdir();
    let firefox = ["--profile-format", "firefox"];
    let timeline = record(&program, (1000, 1000), dir.path(), "t.json.gz", &firefox);
    let path = s(&timeline);
    let mut times = timeline_times(&timeline);
    times.sort_by(f64::total_cmp);
    assert!(times.len() > 200, "{} samples", times.len());
    // Midway between the sample at quantile q and the next (ms), so that
    // no sample lies on a cut; and as a flag value (s).
    let at_ms = |q: f64| {
        let k = ((times.len() - 2) as f64 * q) as usize;
        (times[k] + times[k + 1]) / 2.0
    };
    let at = |q: f64| format!("{:.4}", at_ms(q) / 1000.0);

    let first = lightswitch(&[
        "report",
        "--top",
        "0",
        "--from",
        "0",
        "--to",
        &at(0.4),
        path,
    ]);
    assert_eq!(first.status.code(), Some(0), "{first}");
    let rows = reported(&first);
    let share = |rows: &[(String, f64)], name: &str| {
        rows.iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, cum)| *cum)
    };
    assert!(share(&rows, "fa") > 80.0, "{first}");
    assert_eq!(share(&rows, "fb"), 0.0, "{first}");
    let second = lightswitch(&["report", "--top", "0", "--from", &at(0.6), path]);
    assert_eq!(second.status.code(), Some(0), "{second}");
    let rows = reported(&second);
    assert!(share(&rows, "fb") > 80.0, "{second}");
    assert_eq!(share(&rows, "fa"), 0.0, "{second}");
    // The whole timeline has both, each about half.
    let whole = reported(&lightswitch(&["report", "--top", "0", path]));
    for name in ["fa", "fb"] {
        assert!((25.0..75.0).contains(&share(&whole, name)), "{whole:?}");
    }

    // A slice re-encoded as folded stacks has as many samples as the file
    // has times in [from, to).
    let (from, to) = (at(0.1), at(0.75));
    let out = lightswitch(&[
        "report", "--from", &from, "--to", &to, "--format", "folded", "-o", "-", path,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    let folded = parse_folded(&out.stdout);
    let span_ms = |a: &str, b: &str| {
        (
            a.parse::<f64>().unwrap() * 1e3,
            b.parse::<f64>().unwrap() * 1e3,
        )
    };
    let (from_ms, to_ms) = span_ms(&from, &to);
    let in_span = times
        .iter()
        .filter(|&&t| (from_ms..to_ms).contains(&t))
        .count() as u64;
    assert!(in_span > 100, "{in_span} samples in the span");
    assert_eq!(total(&folded), in_span);
    // Re-encoded as a timeline again, the slice starts at 0.
    let (from, to) = (at(0.6), at(0.9));
    let (from_ms, to_ms) = span_ms(&from, &to);
    let sliced = dir.path().join("slice.json.gz");
    let out = lightswitch(&[
        "report",
        "--from",
        &from,
        "--to",
        &to,
        "--format",
        "firefox",
        "-o",
        s(&sliced),
        path,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    let times = timeline_times(&sliced);
    assert!(
        !times.is_empty() && times.iter().all(|&t| t < to_ms - from_ms + 1.0),
        "{times:?}"
    );

    let pprof = record(
        &program,
        (100, 100),
        dir.path(),
        "p.pb",
        &["--profile-format", "pprof"],
    );
    let bad = lightswitch(&["report", "--from", "0", "--to", "1", s(&pprof)]);
    assert_eq!(bad.status.code(), Some(2), "{bad}");
    assert!(bad.stderr.contains("--from/--to need a timeline"), "{bad}");
    let empty = lightswitch(&["report", "--from", "2", "--to", "1", path]);
    assert_eq!(empty.status.code(), Some(2), "{empty}");
}

/// `diff` reads timelines, gzip'd or plain JSON: a timeline against itself
/// changes nothing; `alpha` doubling its share fails the gate, named with
/// its object.
#[test]
fn diff_of_timelines() {
    let _serial = serial();
    let program = compile("cmp_tl", SPLIT_SOURCE, FP_FLAGS);
    let dir = tempdir();
    let firefox = ["--profile-format", "firefox"];
    let base = record(&program, (250, 750), dir.path(), "base.json.gz", &firefox);
    let new = record(&program, (500, 500), dir.path(), "new.json.gz", &firefox);
    let plain = dir.path().join("base.json");
    {
        use std::io::Read;
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&base).unwrap())
            .read_to_end(&mut json)
            .unwrap();
        std::fs::write(&plain, json).unwrap();
    }
    let same = lightswitch(&["diff", "--fail-above", "1", s(&plain), s(&base)]);
    assert_eq!(same.status.code(), Some(0), "{same}");
    assert!(
        same.stdout.contains("no function's share changed"),
        "{same}"
    );
    let grown = lightswitch(&["diff", "--fail-above", "10", s(&base), s(&new)]);
    assert_eq!(grown.status.code(), Some(1), "{grown}");
    assert!(
        grown.stdout.contains("FAIL: alpha (cmp_tl) grew by +"),
        "{grown}"
    );
    assert!(!grown.stdout.contains("FAIL: beta"), "{grown}");
}

/// The mode bits of `path`.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// What a new user ran into: `report` exits 2 on bad input (as `diff`);
/// text that is not folded stacks is named as such, with its bad line;
/// outputs are private (0600) and go into directories made for them; a
/// folded line of a single frame keeps its samples.
#[test]
fn report_and_diff_inputs_and_outputs() {
    let _serial = serial();
    let program = compile("cmp_nits", SPLIT_SOURCE, FP_FLAGS);
    let dir = tempdir();
    let folded = ["--profile-format", "folded"];
    let base = record(&program, (300, 300), dir.path(), "base.txt", &folded);
    let new = record(&program, (300, 600), dir.path(), "new.txt", &folded);

    // Text, but not folded stacks: the line is named, not a protobuf error.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "main;work 12\nthis is not a stack\n").unwrap();
    let bad = lightswitch(&["report", s(&notes)]);
    assert_eq!(bad.status.code(), Some(2), "{bad}");
    assert!(
        bad.stderr.contains("it is text, but not folded stacks"),
        "{bad}"
    );
    assert!(
        bad.stderr.contains("line 2 does not end in a count"),
        "{bad}"
    );
    assert!(!bad.stderr.to_lowercase().contains("protobuf"), "{bad}");
    let missing = lightswitch(&["report", "/nonexistent/profile.pb"]);
    assert_eq!(missing.status.code(), Some(2), "{missing}");

    // One-frame lines (as other tools write them) keep their samples.
    let flat = dir.path().join("flat.txt");
    std::fs::write(&flat, "main 30\napp;main;work 70\n").unwrap();
    let out = lightswitch(&["report", s(&flat)]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert!(out.stdout.starts_with("100 samples"), "{out}");
    let row = |name: &str| -> Vec<String> {
        out.stdout
            .lines()
            .find(|l| l.split_whitespace().last() == Some(name))
            .unwrap_or_else(|| panic!("{name} not listed:\n{out}"))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(
        row("main")[..5],
        ["30", "30.00%", "100.00%", "100", "100.00%"],
        "{out}"
    );

    // Outputs: 0600, directories made as for profiles.
    let svg = dir.path().join("new/dir/diff.svg");
    let out = lightswitch(&["diff", "--flame-graph", s(&svg), s(&base), s(&new)]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert_eq!(mode(&svg), 0o600);
    parse_svg(&std::fs::read_to_string(&svg).unwrap());
    let pb = dir.path().join("other/p.pb");
    let out = lightswitch(&["report", "--format", "pprof", "-o", s(&pb), s(&base)]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert_eq!(mode(&pb), 0o600);
    // A directory that cannot be made (under a regular file): exit 2, named.
    let under_file = base.join("diff.svg");
    let out = lightswitch(&["diff", "--flame-graph", s(&under_file), s(&base), s(&new)]);
    assert_eq!(out.status.code(), Some(2), "{out}");
    assert!(
        out.stderr.contains("writing the differential flame graph"),
        "{out}"
    );
    assert!(out.stderr.contains(s(&base)), "{out}");
}
