//! pprof output, end to end: small C programs compiled here are profiled by
//! pid with `--profile-format pprof`, and the written profile is read both
//! by `go tool pprof` (`-top`, `-traces`, `-tags`, `-tagfocus`, `-lines`)
//! and by decoding it with the crate's own prost types. Checked: the call
//! chain's flat/cum ordering and trace, the `pid`/`tid`/`comm`/`thread_name`
//! labels, file:line from DWARF, totals that equal the folded output of the
//! same run, mappings with paths and GNU build IDs (the kernel's included),
//! gzip compression, inlined frames as several lines of one location, and
//! the `[unwind: truncated]` marker.
//!
//! Needs root (BPF), gcc, binutils (`readelf`) and Go (`go tool pprof`, which
//! `scripts/setup.sh` installs).
//!
//! Every run samples for 2 s at 499 Hz. Shares are asserted rather than
//! exact counts, except where the counts are equal by construction (one
//! profile encoded twice, or a filter that selects whole samples).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lightswitch::format::pprof::proto;
use prost::Message;

use common::*;

/// Longest any single profiler run may take before the test gives up.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Sampling frequency of every run.
const FREQ: u64 = 499;

/// Length of every run, seconds.
const SECONDS: f64 = 2.0;

/// Optimized, no frame pointers, with DWARF (line tables, inlining).
const NO_FP: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];

/// Fewer samples than this make shares meaningless.
const MIN_SAMPLES: u64 = 100;

/// The mapping name of kernel frames.
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// The marker of a walk that stopped at the frame limit.
const TRUNCATED: &str = "[unwind: truncated]";

/// The walker's user-frame limit.
const FRAME_LIMIT: usize = 1024;

// ---------------------------------------------------------------------------
// Programs

/// `main -> chain_a -> chain_b -> chain_hot`, none inlined, each caller doing
/// work after its call (so no tail calls), each call on a line of its own.
fn chain_source() -> String {
    format!(
        "{DIE_WITH_PARENT}
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void chain_hot(void) {{
    for (volatile int i = 0; i < 1000000; i++) sink += i;
}}
__attribute__((noinline)) void chain_b(void) {{
    chain_hot();
    sink++;
}}
__attribute__((noinline)) void chain_a(void) {{
    chain_b();
    sink++;
}}
int main(void) {{
    while (!stop) {{
        chain_a();
        sink++;
    }}
    return 0;
}}
"
    )
}

/// A program that spends its time in the kernel: `read()` of /dev/zero.
fn reader_source() -> String {
    format!(
        "{DIE_WITH_PARENT}
#include <fcntl.h>
#include <unistd.h>
volatile int stop;
volatile unsigned long sink;
static char buf[1 << 16];
__attribute__((noinline)) void read_loop(int fd) {{
    while (!stop) {{
        if (read(fd, buf, sizeof buf) > 0) sink += buf[0];
    }}
}}
int main(void) {{
    int fd = open(\"/dev/zero\", O_RDONLY);
    if (fd < 0) return 1;
    read_loop(fd);
    sink++;
    return 0;
}}
"
    )
}

/// `main -> outer`, with `inner` always inlined into `outer`, the call on
/// a line of its own.
fn inline_source() -> String {
    format!(
        "{DIE_WITH_PARENT}
volatile int stop;
volatile unsigned long sink;
static inline __attribute__((always_inline)) void inner(unsigned long n) {{
    for (volatile unsigned long i = 0; i < n; i++) sink += i;
}}
__attribute__((noinline)) void outer(void) {{
    inner(1000000);
    sink++;
}}
int main(void) {{
    while (!stop) {{
        outer();
        sink++;
    }}
    return 0;
}}
"
    )
}

/// The 1-based line of `source` that contains `needle` (exactly one does).
fn line_of(source: &str, needle: &str) -> i64 {
    let lines: Vec<usize> = source
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(lines.len(), 1, "{needle:?} must be on exactly one line");
    lines[0] as i64
}

/// The C source file `compile` wrote for `program`.
fn source_path(program: &Program) -> PathBuf {
    program.dir().join(format!("{}.c", program.name))
}

// ---------------------------------------------------------------------------
// Profiling

/// One finished profiler run and the pprof profile it wrote.
struct Run {
    out: Output,
    summary: Summary,
    /// The `user stacks:` counts of the summary (`complete` -> N, ...).
    unwind: BTreeMap<String, u64>,
    dir: tempfile::TempDir,
    /// The pprof file.
    path: PathBuf,
    /// Its bytes as written.
    bytes: Vec<u8>,
    /// Decoded (gunzipped first when compressed).
    profile: proto::Profile,
    /// Wall clock just before the profiler started and just after it exited.
    started: SystemTime,
    finished: SystemTime,
}

impl Run {
    fn index(&self) -> Index<'_> {
        Index::new(&self.profile)
    }

    fn truncated(&self) -> u64 {
        self.unwind.get("truncated").copied().unwrap_or(0)
    }
}

/// Profile `pids` for 2 s at 499 Hz with `--profile-format formats` (which
/// must include pprof; every format gets its default file name) and
/// `extra` arguments, then read and structurally check the pprof file.
fn profile(pids: &[u32], formats: &str, extra: &[&str]) -> Run {
    let dir = tempdir();
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let mut args: Vec<String> = [
        "--pids",
        &pids.join(","),
        "--duration",
        &SECONDS.to_string(),
        "--sample-freq",
        &FREQ.to_string(),
        "--profile-format",
        formats,
        "--profile-path",
        s(dir.path()),
        // Its own, empty, unwind-table cache: no table of another build.
        "--unwind-cache-dir",
        s(&dir.path().join("cache")),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    let started = SystemTime::now();
    let out = run(&args, TIMEOUT);
    let finished = SystemTime::now();
    out.assert_success();
    let summary = out.summary();
    let unwind = unwind_counts(&out.stdout)
        .unwrap_or_else(|| panic!("no `user stacks:` line in stdout:\n{out}"));
    let path = dir.path().join("profile.pb");
    let bytes =
        fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}\n{out}", path.display()));
    let profile = decode(&bytes);
    check_structure(&profile);
    let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(
        total as u64, summary.samples,
        "pprof sample counts must add up to the summary's sample count:\n{out}"
    );
    Run {
        out,
        summary,
        unwind,
        dir,
        path,
        bytes,
        profile,
        started,
        finished,
    }
}

/// Decode pprof bytes, gunzipping them first if they are gzip.
fn decode(bytes: &[u8]) -> proto::Profile {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        proto::Profile::decode(gunzip(bytes).as_slice()).expect("decoding the gunzipped pprof")
    } else {
        proto::Profile::decode(bytes).expect("decoding the pprof protobuf")
    }
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("gunzipping the pprof file");
    out
}

/// Assert what every valid profile satisfies: string 0 is "", ids are
/// non-zero and unique, every reference (sample -> location -> mapping and
/// function, any string index) resolves, and only unwind markers and
/// addresses in no mapping lack a mapping.
fn check_structure(p: &proto::Profile) {
    assert_eq!(
        p.string_table.first().map(String::as_str),
        Some(""),
        "string_table[0] must be \"\""
    );
    let strings = p.string_table.len() as i64;
    let string_ok = |i: i64| (0..strings).contains(&i);
    let ids = |what: &str, ids: Vec<u64>| -> HashSet<u64> {
        let set: HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(set.len(), ids.len(), "{what} ids must be unique: {ids:?}");
        assert!(!set.contains(&0), "{what} id 0 is reserved");
        set
    };
    let mapping_ids = ids("mapping", p.mapping.iter().map(|m| m.id).collect());
    let location_ids = ids("location", p.location.iter().map(|l| l.id).collect());
    let function_ids = ids("function", p.function.iter().map(|f| f.id).collect());
    for m in &p.mapping {
        assert!(string_ok(m.filename) && string_ok(m.build_id), "{m:?}");
        assert!(m.memory_start < m.memory_limit, "empty mapping {m:?}");
    }
    for f in &p.function {
        assert!(
            string_ok(f.name) && string_ok(f.system_name) && string_ok(f.filename),
            "{f:?}"
        );
        assert!(!p.string_table[f.name as usize].is_empty(), "unnamed {f:?}");
    }
    for l in &p.location {
        assert!(!l.line.is_empty(), "location without lines: {l:?}");
        for line in &l.line {
            assert!(
                function_ids.contains(&line.function_id),
                "{l:?} refers to a missing function"
            );
        }
        if l.mapping_id == 0 {
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            let name = &p.string_table[f.name as usize];
            assert!(
                name.starts_with("[unwind: ") || name.starts_with("[unknown]+0x"),
                "only unwind markers and unmapped addresses may lack a mapping: {name} {l:?}"
            );
        } else {
            assert!(
                mapping_ids.contains(&l.mapping_id),
                "{l:?} refers to a missing mapping"
            );
        }
    }
    for s in &p.sample {
        assert_eq!(s.value.len(), p.sample_type.len(), "{s:?}");
        assert!(!s.location_id.is_empty(), "sample without locations: {s:?}");
        for id in &s.location_id {
            assert!(
                location_ids.contains(id),
                "{s:?} refers to a missing location"
            );
        }
        for l in &s.label {
            assert!(string_ok(l.key) && string_ok(l.str), "{l:?}");
        }
    }
    for t in p.sample_type.iter().chain(&p.period_type) {
        assert!(string_ok(t.r#type) && string_ok(t.unit), "{t:?}");
    }
    assert!(string_ok(p.default_sample_type));
}

/// Lookups into a decoded profile.
struct Index<'a> {
    p: &'a proto::Profile,
    locations: HashMap<u64, &'a proto::Location>,
    functions: HashMap<u64, &'a proto::Function>,
    mappings: HashMap<u64, &'a proto::Mapping>,
}

impl<'a> Index<'a> {
    fn new(p: &'a proto::Profile) -> Self {
        Index {
            p,
            locations: p.location.iter().map(|l| (l.id, l)).collect(),
            functions: p.function.iter().map(|f| (f.id, f)).collect(),
            mappings: p.mapping.iter().map(|m| (m.id, m)).collect(),
        }
    }

    fn str(&self, i: i64) -> &'a str {
        &self.p.string_table[i as usize]
    }

    fn location(&self, id: u64) -> &'a proto::Location {
        self.locations[&id]
    }

    fn function(&self, id: u64) -> &'a proto::Function {
        self.functions[&id]
    }

    /// The sample's locations, leaf first.
    fn stack(&self, s: &'a proto::Sample) -> Vec<&'a proto::Location> {
        s.location_id.iter().map(|&id| self.location(id)).collect()
    }

    /// Function names of a location, innermost first.
    fn names(&self, l: &proto::Location) -> Vec<&'a str> {
        l.line
            .iter()
            .map(|line| self.str(self.function(line.function_id).name))
            .collect()
    }

    /// The location's (outermost) function name.
    fn name(&self, l: &proto::Location) -> &'a str {
        self.names(l).last().copied().unwrap_or("")
    }

    fn mapping_of(&self, l: &proto::Location) -> Option<&'a proto::Mapping> {
        self.mappings.get(&l.mapping_id).copied()
    }

    fn is_kernel(&self, l: &proto::Location) -> bool {
        self.mapping_of(l)
            .is_some_and(|m| self.str(m.filename) == KERNEL_MAPPING)
    }

    fn is_marker(&self, l: &proto::Location) -> bool {
        l.mapping_id == 0 && l.line.len() == 1 && self.name(l).starts_with("[unwind: ")
    }

    /// User locations of a sample (no kernel frames, no marker), leaf first.
    fn user_stack(&self, s: &'a proto::Sample) -> Vec<&'a proto::Location> {
        self.stack(s)
            .into_iter()
            .filter(|l| !self.is_kernel(l) && !self.is_marker(l))
            .collect()
    }

    fn num_label(&self, s: &proto::Sample, key: &str) -> Option<i64> {
        s.label
            .iter()
            .find(|l| self.str(l.key) == key)
            .map(|l| l.num)
    }

    fn str_label(&self, s: &proto::Sample, key: &str) -> Option<&'a str> {
        s.label
            .iter()
            .find(|l| self.str(l.key) == key)
            .map(|l| self.str(l.str))
    }

    /// Samples (value[0]) of the samples that satisfy `filter`.
    fn count(&self, mut filter: impl FnMut(&'a proto::Sample) -> bool) -> u64 {
        self.p
            .sample
            .iter()
            .filter(|s| filter(s))
            .map(|s| s.value[0] as u64)
            .sum()
    }

    fn count_pid(&self, pid: u32) -> u64 {
        self.count(|s| self.num_label(s, "pid") == Some(pid.into()))
    }

    /// The profile as folded stacks, as `--profile-format folded` writes
    /// them: `comm;root;..;leaf`, inlined functions after their caller,
    /// kernel frames suffixed `_[k]`, identical stacks merged.
    fn folded(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for s in &self.p.sample {
            let comm = self.str_label(s, "comm").expect("comm label");
            let mut names = vec![comm.to_string()];
            for l in self.stack(s).into_iter().rev() {
                for name in self.names(l).into_iter().rev() {
                    let mut name = name.to_string();
                    if self.is_kernel(l) {
                        name.push_str(KERNEL_SUFFIX);
                    }
                    names.push(name);
                }
            }
            *out.entry(names.join(";")).or_insert(0) += s.value[0] as u64;
        }
        out
    }

    /// The heaviest stacks as text (leaf first), for assertion messages.
    fn show(&self) -> String {
        let mut samples: Vec<&proto::Sample> = self.p.sample.iter().collect();
        samples.sort_by_key(|s| std::cmp::Reverse(s.value[0]));
        let mut text = String::new();
        for s in samples.iter().take(15) {
            let names: Vec<String> = self
                .stack(s)
                .iter()
                .map(|l| self.names(l).join("<-inlined-in-"))
                .collect();
            let mut line = names.join(" <- ");
            if line.len() > 300 {
                let cut = (0..=300).rev().find(|&i| line.is_char_boundary(i)).unwrap();
                line.truncate(cut);
                line.push_str(" ...");
            }
            text.push_str(&format!(
                "{} pid={:?} tid={:?}: {line}\n",
                s.value[0],
                self.num_label(s, "pid"),
                self.num_label(s, "tid")
            ));
        }
        if samples.len() > 15 {
            text.push_str(&format!("... and {} more samples\n", samples.len() - 15));
        }
        text
    }
}

// ---------------------------------------------------------------------------
// go tool pprof

/// A pprof value as printed: a count (`481`) or a duration (`1.47s`,
/// `953.91ms`), durations in nanoseconds.
fn parse_value(text: &str) -> Option<f64> {
    let at = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(at);
    let scale = match unit {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "mins" => 60e9,
        "hrs" => 3600e9,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// One row of `go tool pprof -top`.
#[derive(Debug, Clone)]
struct TopRow {
    flat: f64,
    cum: f64,
    /// The node: a function, or with `-lines` `function file:line`.
    name: String,
}

/// Split off the first whitespace-separated token of `text`.
fn token(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    (&text[..end], text[end..].trim_start())
}

/// The rows of `go tool pprof -top` output (after the `flat flat% sum%
/// cum cum%` header).
fn parse_top(text: &str) -> Vec<TopRow> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| {
            l.split_whitespace().collect::<Vec<_>>() == ["flat", "flat%", "sum%", "cum", "cum%"]
        })
        .unwrap_or_else(|| panic!("no table header in `go tool pprof -top` output:\n{text}"));
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (flat, rest) = token(line);
            let (_, rest) = token(rest);
            let (_, rest) = token(rest);
            let (cum, rest) = token(rest);
            let (_, name) = token(rest);
            let value = |v: &str| {
                parse_value(v).unwrap_or_else(|| panic!("bad value {v:?} in row {line:?}:\n{text}"))
            };
            TopRow {
                flat: value(flat),
                cum: value(cum),
                name: name.to_string(),
            }
        })
        .collect()
}

/// The row of node `name` (panics with the table if missing).
fn row<'a>(rows: &'a [TopRow], name: &str, text: &str) -> &'a TopRow {
    rows.iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no row {name:?} in `go tool pprof -top` output:\n{text}"))
}

/// The number after `Total samples = ` in a pprof header.
fn header_total(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.split_once("Total samples = ").map(|(_, t)| t.trim()))
        .and_then(|t| parse_value(token(t).0))
        .unwrap_or_else(|| panic!("no `Total samples = ` in pprof output:\n{text}"))
}

/// One trace of `go tool pprof -traces`.
#[derive(Debug)]
struct Trace {
    labels: BTreeMap<String, String>,
    value: f64,
    /// Leaf first.
    frames: Vec<String>,
}

fn parse_traces(text: &str) -> Vec<Trace> {
    let separator = |l: &str| l.starts_with("-----------+");
    let mut traces = Vec::new();
    let mut blocks = text.split('\n').skip_while(|l| !separator(l)).peekable();
    while blocks.next().is_some() {
        let mut trace = Trace {
            labels: BTreeMap::new(),
            value: -1.0,
            frames: Vec::new(),
        };
        while let Some(line) = blocks.next_if(|l| !separator(l)) {
            if line.trim().is_empty() {
                continue;
            }
            let (first, rest) = token(line);
            if trace.value < 0.0 {
                if let Some(key) = first.strip_suffix(':') {
                    trace
                        .labels
                        .insert(key.to_string(), rest.trim().to_string());
                } else {
                    trace.value = parse_value(first)
                        .unwrap_or_else(|| panic!("bad trace line {line:?}:\n{text}"));
                    trace.frames.push(rest.trim().to_string());
                }
            } else {
                trace.frames.push(line.trim().to_string());
            }
        }
        if trace.value >= 0.0 {
            traces.push(trace);
        }
    }
    assert!(
        !traces.is_empty(),
        "no traces in `go tool pprof -traces` output:\n{text}"
    );
    traces
}

/// `go tool pprof -tags`: tag -> the values listed for it.
fn parse_tags(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut tags: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some((key, _)) = line.trim().split_once(": Total ") {
            current = Some(key.to_string());
            tags.entry(key.to_string()).or_default();
        } else if let (Some(key), Some((_, value))) = (&current, line.split_once("): ")) {
            tags.get_mut(key).unwrap().insert(value.trim().to_string());
        }
    }
    tags
}

// ---------------------------------------------------------------------------
// Independent facts about files and processes

/// The GNU build ID of `path` as `readelf -n` prints it ("" if none).
fn readelf_build_id(path: &str) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("running readelf (binutils)");
    assert!(
        out.status.success(),
        "readelf -n {path} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Build ID: ")
                .map(|id| id.trim().to_string())
        })
        .unwrap_or_default()
}

/// The running kernel's GNU build ID, parsed from the ELF notes in
/// /sys/kernel/notes (namesz, descsz, type, name and desc padded to 4).
fn kernel_build_id() -> String {
    let notes = fs::read("/sys/kernel/notes").expect("reading /sys/kernel/notes");
    let word = |at: usize| u32::from_le_bytes(notes[at..at + 4].try_into().unwrap()) as usize;
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at), word(at + 4), word(at + 8));
        let name = &notes[at + 12..at + 12 + namesz];
        let desc_at = at + 12 + pad(namesz);
        if name == b"GNU\0" && kind == 3 {
            return notes[desc_at..desc_at + descsz]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
        }
        at = desc_at + pad(descsz);
    }
    panic!("no GNU build-ID note in /sys/kernel/notes");
}

/// One line of /proc/PID/maps.
#[derive(Debug)]
struct MapsLine {
    start: u64,
    end: u64,
    offset: u64,
    path: String,
}

fn proc_maps(pid: u32) -> Vec<MapsLine> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).expect("reading /proc/PID/maps");
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, _perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (_dev, _inode) = (f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            let (start, end) = range.split_once('-')?;
            Some(MapsLine {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                path,
            })
        })
        .collect()
}

/// The tid of the thread of `pid` named `name`, waiting up to 10 s for it.
fn thread_named(pid: u32, name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                if comm.trim_end() == name {
                    return task.file_name().to_string_lossy().parse().unwrap();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no thread {name} in {pid} within 10 s"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

// ---------------------------------------------------------------------------
// Tests

/// `go tool pprof -top` and `-traces` on the chain `main -> chain_a ->
/// chain_b -> chain_hot` (no frame pointers): `chain_hot` has the highest
/// flat and nearly all of it, its callers' cum covers it and grows towards
/// the leaf, and the heaviest trace is the whole chain leaf first, down to
/// `_start`, labelled with the target's pid.
#[test]
fn go_tool_pprof_top_and_traces() {
    let _serial = serial();
    let program = compile("lsw_pp_chain", &chain_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let file = s(&r.path);

    let top = common::go_pprof(&["-top", file]);
    let rows = parse_top(&top);
    let total = header_total(&top);
    let hot = row(&rows, "chain_hot", &top);
    let max_flat = rows.iter().map(|r| r.flat).fold(0.0, f64::max);
    assert!(
        hot.flat == max_flat && hot.flat >= 0.8 * total,
        "chain_hot must have the highest flat, and most of the {total} total:\n{top}"
    );
    let mut below = hot.cum;
    for caller in ["chain_b", "chain_a", "main"] {
        let r = row(&rows, caller, &top);
        assert!(
            r.flat <= 0.05 * hot.flat,
            "{caller} only calls: its flat must be tiny next to chain_hot's:\n{top}"
        );
        assert!(
            r.cum <= below + r.flat && r.cum >= 0.9 * hot.flat,
            "{caller}'s cum must cover chain_hot's flat (all but samples still waiting for \
             an unwind table) and not exceed its callee's cum (plus its own flat):\n{top}"
        );
        below = r.cum;
    }

    let traces_text = common::go_pprof(&["-traces", file]);
    let traces = parse_traces(&traces_text);
    let dominant = traces
        .iter()
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .unwrap();
    let frames: Vec<&str> = dominant.frames.iter().map(String::as_str).collect();
    let chain = ["chain_hot", "chain_b", "chain_a", "main"];
    assert!(
        frames.len() > chain.len()
            && frames[..chain.len()] == chain
            && frames.last() == Some(&"_start")
            && frames[chain.len()..]
                .iter()
                .all(|f| LIBC_START_FRAMES.contains(f)),
        "the heaviest trace must be chain_hot, chain_b, chain_a, main, then libc start-up \
         down to _start:\n{dominant:?}\n{traces_text}"
    );
    assert_eq!(
        dominant.labels.get("pid"),
        Some(&target.pid_arg()),
        "{dominant:?}"
    );
    assert_eq!(
        dominant.labels.get("comm").map(String::as_str),
        Some("lsw_pp_chain"),
        "{dominant:?}"
    );
    let with_chain: f64 = traces
        .iter()
        .filter(|t| t.frames.windows(chain.len()).any(|w| w == chain))
        .map(|t| t.value)
        .sum();
    let all: f64 = traces.iter().map(|t| t.value).sum();
    assert!(
        with_chain >= 0.85 * all,
        "only {with_chain} of {all} in traces through chain_hot <- chain_b <- chain_a <- main:\n\
         {traces_text}"
    );
}

/// Two processes in one run, one of them with a named second thread, each
/// thread spinning in its own function: `-tagfocus pid=` and `-tagfocus
/// tid=` select exactly those samples (the totals equal the decoded
/// profile's per-label counts) and no other process's or thread's function;
/// `-tags` lists the `pid`, `tid`, `comm` and `thread_name` values.
#[test]
fn tagfocus_pid_and_tid() {
    let _serial = serial();
    let source_a = format!(
        "#define _GNU_SOURCE
{DIE_WITH_PARENT}
#include <pthread.h>
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void a_main_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void *a_worker_hot(void *arg) {{ while (!stop) sink++; return arg; }}
int main(void) {{
    pthread_t t;
    if (pthread_create(&t, 0, a_worker_hot, 0)) return 1;
    pthread_setname_np(t, \"lsw_pp_worker\");
    a_main_hot();
    sink++;
    return 0;
}}
"
    );
    let source_b = format!(
        "{DIE_WITH_PARENT}
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void b_hot(void) {{ while (!stop) sink++; }}
int main(void) {{ b_hot(); sink++; return 0; }}
"
    );
    let mut flags_a = NO_FP.to_vec();
    flags_a.push("-pthread");
    let prog_a = compile("lsw_pp_tag_a", &source_a, &flags_a);
    let prog_b = compile("lsw_pp_tag_b", &source_b, NO_FP);
    let a = Workload::spawn(&prog_a);
    let b = Workload::spawn(&prog_b);
    let worker = thread_named(a.pid(), "lsw_pp_worker");
    let r = profile(&[a.pid(), b.pid()], "pprof", &[]);
    assert_eq!(r.summary.processes, 2, "{}", r.out);
    let ix = r.index();

    // Labels in the decoded profile: exactly pid, tid, comm, thread_name,
    // with the values /proc has.
    for sample in &r.profile.sample {
        let keys: Vec<&str> = sample.label.iter().map(|l| ix.str(l.key)).collect();
        assert_eq!(keys, ["pid", "tid", "comm", "thread_name"], "{sample:?}");
        let pid = ix.num_label(sample, "pid").unwrap();
        let tid = ix.num_label(sample, "tid").unwrap();
        let comm = ix.str_label(sample, "comm").unwrap();
        let thread_name = ix.str_label(sample, "thread_name").unwrap();
        let (want_comm, want_thread) = if pid == i64::from(a.pid()) {
            let thread = if tid == i64::from(worker) {
                "lsw_pp_worker"
            } else {
                assert_eq!(tid, i64::from(a.pid()), "{sample:?}");
                "lsw_pp_tag_a"
            };
            ("lsw_pp_tag_a", thread)
        } else {
            assert_eq!(pid, i64::from(b.pid()), "{sample:?}");
            assert_eq!(tid, pid, "{sample:?}");
            ("lsw_pp_tag_b", "lsw_pp_tag_b")
        };
        assert_eq!((comm, thread_name), (want_comm, want_thread), "{sample:?}");
    }
    let count_a = ix.count_pid(a.pid());
    let count_b = ix.count_pid(b.pid());
    let count_worker = ix.count(|s| ix.num_label(s, "tid") == Some(worker.into()));
    for (what, n) in [("A", count_a), ("B", count_b), ("A's worker", count_worker)] {
        assert!(
            n >= MIN_SAMPLES,
            "only {n} samples of {what}:\n{}\n{}",
            ix.show(),
            r.out
        );
    }

    let file = s(&r.path);
    // Counts (-sample_index=samples) and every node (-nodefraction=0), so
    // the rows' flats add up exactly to the selected samples.
    let focus = |filter: String| {
        let text = common::go_pprof(&[
            "-tagfocus",
            &filter,
            "-sample_index=samples",
            "-nodefraction=0",
            "-top",
            file,
        ]);
        let rows = parse_top(&text);
        (rows, text)
    };
    let cases = [
        (
            format!("pid={}", a.pid()),
            count_a,
            vec!["a_main_hot", "a_worker_hot"],
            vec!["b_hot"],
        ),
        (
            format!("pid={}", b.pid()),
            count_b,
            vec!["b_hot"],
            vec!["a_main_hot", "a_worker_hot"],
        ),
        (
            format!("tid={worker}"),
            count_worker,
            vec!["a_worker_hot"],
            vec!["a_main_hot", "b_hot"],
        ),
    ];
    for (filter, count, shown, hidden) in cases {
        let (rows, text) = focus(filter.clone());
        let flat: f64 = rows.iter().map(|r| r.flat).sum();
        assert_eq!(
            flat as u64, count,
            "-tagfocus {filter} must select exactly the {count} samples with that label:\n{text}"
        );
        let hot: f64 = shown.iter().map(|f| row(&rows, f, &text).flat).sum();
        assert!(
            hot >= 0.8 * flat,
            "-tagfocus {filter}: {shown:?} must have most of the samples:\n{text}"
        );
        for f in hidden {
            assert!(
                rows.iter().all(|r| r.name != f),
                "-tagfocus {filter} must not show {f}:\n{text}"
            );
        }
    }

    let tags_text = common::go_pprof(&["-tags", file]);
    let tags = parse_tags(&tags_text);
    let set =
        |values: &[&str]| -> BTreeSet<String> { values.iter().map(|v| v.to_string()).collect() };
    let (pid_a, pid_b, tid_w) = (a.pid_arg(), b.pid_arg(), worker.to_string());
    let expected: BTreeMap<String, BTreeSet<String>> = [
        ("comm", set(&["lsw_pp_tag_a", "lsw_pp_tag_b"])),
        (
            "thread_name",
            set(&["lsw_pp_tag_a", "lsw_pp_worker", "lsw_pp_tag_b"]),
        ),
        ("pid", set(&[&pid_a, &pid_b])),
        ("tid", set(&[&pid_a, &tid_w, &pid_b])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(tags, expected, "`go tool pprof -tags`:\n{tags_text}");
}

/// A `-g` build: `go tool pprof -lines -top` names `chain_hot` at the line
/// of its loop in the C file written here, and each caller at the line of
/// its call (return addresses are mapped to their call sites). The decoded
/// functions carry the source file.
#[test]
fn lines_with_debug_info() {
    let _serial = serial();
    let source = chain_source();
    let program = compile("lsw_pp_lines", &source, NO_FP);
    let src = source_path(&program);
    let src = s(&src);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);

    let text = common::go_pprof(&["-lines", "-sample_index=samples", "-top", s(&r.path)]);
    let rows = parse_top(&text);
    let total = r.summary.samples as f64;
    let loop_line = line_of(&source, "sink += i;");
    let hot = row(&rows, &format!("chain_hot {src}:{loop_line}"), &text);
    assert!(
        hot.flat >= 0.8 * total,
        "the loop line of chain_hot must hold most of the {total} samples:\n{text}"
    );
    for (caller, call) in [
        ("chain_b", "chain_hot();"),
        ("chain_a", "chain_b();"),
        ("main", "chain_a();"),
    ] {
        let name = format!("{caller} {src}:{}", line_of(&source, call));
        let r = row(&rows, &name, &text);
        assert!(
            r.cum >= 0.8 * total,
            "{name} (the call site) must be on most stacks:\n{text}"
        );
    }

    let ix = r.index();
    for name in ["chain_hot", "chain_b", "chain_a", "main"] {
        let f = r
            .profile
            .function
            .iter()
            .find(|f| ix.str(f.name) == name)
            .unwrap_or_else(|| panic!("no function {name}"));
        assert_eq!(ix.str(f.filename), src, "{name}: {f:?}");
        assert_eq!(ix.str(f.system_name), name, "{name}: {f:?}");
    }
}

/// `--profile-format pprof,folded`: both files come from the same samples,
/// so the pprof stacks (rebuilt as folded lines) equal the folded file
/// line for line, the sample total equals the folded total and the
/// summary's, and the cpu value is count x period. Header fields: sample
/// types, period type, period = 1e9 / 499, default sample type, and a time
/// window inside the run's.
#[test]
fn totals_match_folded() {
    let _serial = serial();
    let chain = compile("lsw_pp_total", &chain_source(), NO_FP);
    let reader = compile("lsw_pp_treader", &reader_source(), NO_FP);
    let chain = Workload::spawn(&chain);
    let reader = Workload::spawn(&reader);
    let r = profile(&[chain.pid(), reader.pid()], "pprof,folded", &[]);
    let ix = r.index();
    let p = &r.profile;

    let folded = read_folded(&r.dir.path().join("folded.txt"));
    let folded_total = total(&folded);
    let samples: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    let cpu: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    assert!(
        r.summary.samples >= 2 * MIN_SAMPLES,
        "only {} samples:\n{}",
        r.summary.samples,
        r.out
    );
    assert_eq!(
        samples as u64, folded_total,
        "pprof vs folded totals:\n{}",
        r.out
    );
    assert_eq!(
        samples as u64, r.summary.samples,
        "pprof vs summary:\n{}",
        r.out
    );
    let folded_map: BTreeMap<String, u64> = folded
        .iter()
        .map(|(frames, n)| (frames.join(";"), *n))
        .collect();
    assert_eq!(folded_map.len(), folded.len(), "folded lines are distinct");
    let from_pprof = ix.folded();
    if from_pprof != folded_map {
        let only_pprof: Vec<_> = from_pprof
            .iter()
            .filter(|(k, v)| folded_map.get(*k) != Some(v))
            .collect();
        let only_folded: Vec<_> = folded_map
            .iter()
            .filter(|(k, v)| from_pprof.get(*k) != Some(v))
            .collect();
        panic!(
            "pprof and folded output of the same run disagree:\nonly in pprof: {only_pprof:#?}\n\
             only in folded: {only_folded:#?}"
        );
    }
    assert!(
        from_pprof.keys().any(|k| k.contains(KERNEL_SUFFIX)),
        "the reader must contribute kernel frames:\n{}",
        ix.show()
    );

    let period = 1_000_000_000 / FREQ as i64;
    assert_eq!(p.period, period, "period = 1e9 / {FREQ} Hz");
    assert_eq!(cpu, samples * period, "cpu nanoseconds = samples x period");
    for s in &p.sample {
        assert_eq!(s.value, [s.value[0], s.value[0] * period], "{s:?}");
        assert!(s.value[0] > 0, "{s:?}");
    }
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (ix.str(t.r#type), ix.str(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    let pt = p.period_type.as_ref().expect("period_type");
    assert_eq!((ix.str(pt.r#type), ix.str(pt.unit)), ("cpu", "nanoseconds"));
    assert_eq!(ix.str(p.default_sample_type), "cpu");

    let (started, finished) = (nanos(r.started), nanos(r.finished));
    assert!(
        p.time_nanos >= started && p.time_nanos <= finished,
        "time_nanos {} is outside the run [{started}, {finished}]",
        p.time_nanos
    );
    let want = (SECONDS * 1e9) as i64;
    assert!(
        (p.duration_nanos - want).abs() <= want / 5,
        "duration_nanos {} is not within 20% of --duration {SECONDS} s",
        p.duration_nanos
    );
    assert!(
        p.time_nanos + p.duration_nanos <= finished,
        "the window [{}, +{}] ends after the profiler exited ({finished})",
        p.time_nanos,
        p.duration_nanos
    );
}

/// Mappings of a process that reads /dev/zero (user and kernel frames):
/// the binary's mapping is its full path with the range and offset of its
/// line in /proc/PID/maps, holds every one of its locations, carries the
/// GNU build ID `readelf -n` prints, and has functions; every file mapping
/// carries its file's build ID; `[kernel.kallsyms]` holds the kernel
/// locations and has the build ID of /sys/kernel/notes. Locations are
/// unique per (mapping, address), functions per (name, system name, file).
#[test]
fn mappings_and_build_ids() {
    let _serial = serial();
    let program = compile("lsw_pp_reader", &reader_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let maps = proc_maps(target.pid());
    let ix = r.index();
    let p = &r.profile;
    let binary = fs::canonicalize(&program.path).unwrap();
    let binary = s(&binary);

    // The binary.
    let bin_maps: Vec<&proto::Mapping> = p
        .mapping
        .iter()
        .filter(|m| ix.str(m.filename) == binary)
        .collect();
    let names: Vec<&str> = p.mapping.iter().map(|m| ix.str(m.filename)).collect();
    assert!(
        !bin_maps.is_empty(),
        "no mapping named {binary}; mappings: {names:?}"
    );
    assert_eq!(names[0], binary, "--pids: the target's executable first");
    let build_id = readelf_build_id(binary);
    assert!(!build_id.is_empty(), "gcc links a build ID by default");
    for m in &bin_maps {
        assert!(
            maps.iter().any(|l| l.path == binary
                && l.start == m.memory_start
                && l.end == m.memory_limit
                && l.offset == m.file_offset),
            "mapping {m:?} is not a line of /proc/PID/maps: {maps:#?}"
        );
        assert_eq!(ix.str(m.build_id), build_id, "{m:?}");
        assert!(m.has_functions, "{binary} is symbolized: {m:?}");
        for l in p.location.iter().filter(|l| l.mapping_id == m.id) {
            assert!(
                (m.memory_start..m.memory_limit).contains(&l.address),
                "location {l:?} is outside its mapping {m:?}"
            );
        }
    }
    let in_read_loop = ix.count(|s| {
        ix.user_stack(s)
            .iter()
            .any(|l| ix.name(l) == "read_loop" && bin_maps.iter().any(|m| m.id == l.mapping_id))
    });
    assert!(
        in_read_loop as f64 >= 0.75 * r.summary.samples as f64,
        "only {in_read_loop} of {} samples pass through read_loop in {binary}:\n{}",
        r.summary.samples,
        ix.show()
    );

    // Every mapping of a file has that file's build ID.
    for m in &p.mapping {
        let name = ix.str(m.filename);
        if name.starts_with('/') {
            assert_eq!(ix.str(m.build_id), readelf_build_id(name), "{name}: {m:?}");
        }
    }

    // The kernel.
    let kernel: Vec<&proto::Mapping> = p
        .mapping
        .iter()
        .filter(|m| ix.str(m.filename) == KERNEL_MAPPING)
        .collect();
    assert_eq!(kernel.len(), 1, "one kernel mapping; mappings: {names:?}");
    let kernel = kernel[0];
    let kernel_id = kernel_build_id();
    assert!(!kernel_id.is_empty());
    assert_eq!(ix.str(kernel.build_id), kernel_id, "{kernel:?}");
    assert!(
        kernel.has_functions,
        "kallsyms names kernel frames: {kernel:?}"
    );
    let kernel_locations: Vec<&proto::Location> = p
        .location
        .iter()
        .filter(|l| l.mapping_id == kernel.id)
        .collect();
    assert!(!kernel_locations.is_empty());
    for l in &kernel_locations {
        assert!(
            (kernel.memory_start..kernel.memory_limit).contains(&l.address)
                && l.address >= 0xffff_8000_0000_0000,
            "kernel location {l:?} outside {kernel:?}"
        );
    }
    assert!(
        kernel_locations
            .iter()
            .any(|l| ix.names(l).iter().any(|n| n.contains("read"))),
        "no kernel function of read(2) among the kernel frames:\n{}",
        ix.show()
    );
    let with_kernel = ix.count(|s| ix.stack(s).iter().any(|l| ix.is_kernel(l)));
    assert!(
        with_kernel as f64 >= 0.5 * r.summary.samples as f64,
        "reading /dev/zero must put kernel frames on most samples ({with_kernel} of {}):\n{}",
        r.summary.samples,
        ix.show()
    );

    // Deduplication.
    let mut seen = HashSet::new();
    for l in p.location.iter().filter(|l| !ix.is_marker(l)) {
        assert!(
            seen.insert((l.mapping_id, l.address)),
            "two locations for mapping {} address {:#x}",
            l.mapping_id,
            l.address
        );
    }
    let mut seen = HashSet::new();
    for f in &p.function {
        assert!(
            seen.insert((f.name, f.system_name, f.filename)),
            "duplicate function {f:?}"
        );
    }
    let mut seen = HashSet::new();
    assert!(
        p.string_table.iter().all(|s| seen.insert(s)),
        "strings must be unique"
    );
}

/// `--pprof-compression gzip`: the file is gzip (1f 8b), `go tool pprof`
/// reads it, and it gunzips to a profile with the summary's sample count.
#[test]
fn gzip_compression() {
    let _serial = serial();
    let program = compile("lsw_pp_gzip", &chain_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &["--pprof-compression", "gzip"]);
    assert_eq!(&r.bytes[..2], [0x1f, 0x8b], "gzip magic");

    let raw = gunzip(&r.bytes);
    let p = proto::Profile::decode(raw.as_slice()).expect("decoding the gunzipped profile");
    check_structure(&p);
    let samples: i64 = p.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(samples as u64, r.summary.samples, "{}", r.out);
    assert!(r.summary.samples >= MIN_SAMPLES, "{}", r.out);

    let text = common::go_pprof(&["-sample_index=samples", "-top", s(&r.path)]);
    assert_eq!(
        header_total(&text) as u64,
        r.summary.samples,
        "`go tool pprof` reads the gzip'd file with every sample:\n{text}"
    );
    let rows = parse_top(&text);
    let hot = row(&rows, "chain_hot", &text);
    assert!(hot.flat >= 0.8 * r.summary.samples as f64, "{text}");
}

/// A function inlined into `outer` (always_inline, -O2 -g): the leaf
/// location has two or more lines, `inner` first at the line of its loop
/// and `outer` last at the line of the inlined call, and `go tool pprof`
/// shows `inner` as its own node.
#[test]
fn inlined_frames() {
    let _serial = serial();
    let source = inline_source();
    let program = compile("lsw_pp_inline", &source, NO_FP);
    let src = source_path(&program);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();
    let loop_line = line_of(&source, "sink += i;");
    let call_line = line_of(&source, "inner(1000000);");

    let inlined = ix.count(|s| {
        let Some(leaf) = ix.user_stack(s).first().copied() else {
            return false;
        };
        let names = ix.names(leaf);
        let lines: Vec<i64> = leaf.line.iter().map(|l| l.line).collect();
        names.len() >= 2
            && names[0] == "inner"
            && names.last() == Some(&"outer")
            && lines[0] == loop_line
            && *lines.last().unwrap() == call_line
    });
    assert!(
        r.summary.samples >= MIN_SAMPLES
            && inlined as f64 >= 0.9 * r.summary.samples as f64,
        "only {inlined} of {} samples end in a location [inner:{loop_line}, .., outer:{call_line}]:\n{}",
        r.summary.samples,
        ix.show()
    );
    let inner = r
        .profile
        .function
        .iter()
        .find(|f| ix.str(f.name) == "inner")
        .unwrap();
    assert_eq!(ix.str(inner.filename), s(&src), "{inner:?}");

    let text = common::go_pprof(&["-sample_index=samples", "-top", s(&r.path)]);
    let rows = parse_top(&text);
    // pprof marks a node that is only ever inlined.
    let inner_row = rows
        .iter()
        .find(|r| r.name == "inner" || r.name == "inner (inline)")
        .unwrap_or_else(|| panic!("no row for inner:\n{text}"));
    let outer_row = row(&rows, "outer", &text);
    assert!(
        inner_row.flat >= 0.9 * r.summary.samples as f64
            && outer_row.cum >= inner_row.flat
            && outer_row.flat <= 0.05 * inner_row.flat,
        "inner must hold the flat samples and outer its cum:\n{text}"
    );
}

/// Recursion 2000 deep, beyond the walker's 1024-frame limit: the
/// truncated samples end (root side) in a location named
/// `[unwind: truncated]` (no mapping, address 0), after exactly 1024 user
/// frames (`hot`, then 1023 `recurse`), and there are as many as the
/// summary's `truncated=` count.
#[test]
fn incomplete_stack_marker() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void recurse(int n) {{
    if (n > 1) recurse(n - 1); else hot();
    sink++;
}}
int main(void) {{ recurse(2000); sink++; return 0; }}
"
    );
    let program = compile("lsw_pp_rec2000", &source, NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();

    let mut marker_ids = BTreeSet::new();
    let marked = ix.count(|s| {
        let stack = ix.stack(s);
        let last = stack.last().unwrap();
        if !(ix.is_marker(last) && ix.name(last) == TRUNCATED) {
            return false;
        }
        marker_ids.insert(last.id);
        let user = ix.user_stack(s);
        assert!(
            stack[..stack.len() - 1].iter().all(|l| !ix.is_marker(l)),
            "the marker must be the only one and the last location: {s:?}"
        );
        assert!(
            user.len() == FRAME_LIMIT
                && ix.name(user[0]) == "hot"
                && user[1..].iter().all(|l| ix.name(l) == "recurse"),
            "a truncated sample must hold hot and 1023 recurse frames, got {} user frames:\n{}",
            user.len(),
            ix.show()
        );
        true
    });
    let truncated = r.truncated();
    assert_eq!(
        marked,
        truncated,
        "samples ending in {TRUNCATED} vs the summary's truncated= count:\n{}\n{}",
        ix.show(),
        r.out
    );
    assert!(
        truncated as f64 >= 0.85 * r.summary.samples as f64 && truncated >= MIN_SAMPLES,
        "only {truncated} of {} samples are truncated:\n{}\n{}",
        r.summary.samples,
        ix.show(),
        r.out
    );
    assert_eq!(marker_ids.len(), 1, "one deduplicated marker location");
    let marker = ix.location(*marker_ids.first().unwrap());
    assert_eq!((marker.mapping_id, marker.address), (0, 0), "{marker:?}");
    let f = ix.function(marker.line[0].function_id);
    assert_eq!(ix.str(f.filename), "", "{f:?}");
}

/// A `-g` build whose own functions all have files, lines and (in `outer`)
/// inlined frames: the binary's mapping says so, `has_functions`,
/// `has_filenames`, `has_line_numbers` and `has_inline_frames` all true.
/// pprof's own symbolizer sets these flags once it has symbolized a mapping
/// at that level; `_start`, which crt1.o brings without DWARF, cannot
/// unset them.
#[test]
fn debug_info_mapping_flags() {
    let _serial = serial();
    let program = compile("lsw_pp_flags", &inline_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();
    let binary = fs::canonicalize(&program.path).unwrap();
    let mappings: Vec<&proto::Mapping> = r
        .profile
        .mapping
        .iter()
        .filter(|m| ix.str(m.filename) == s(&binary))
        .filter(|m| r.profile.location.iter().any(|l| l.mapping_id == m.id))
        .collect();
    assert!(
        !mappings.is_empty(),
        "no mapping of {} with locations",
        binary.display()
    );
    for m in mappings {
        let names: Vec<String> = r
            .profile
            .location
            .iter()
            .filter(|l| l.mapping_id == m.id)
            .map(|l| {
                let f = ix.function(l.line.last().unwrap().function_id);
                format!("{}@{:?}", ix.str(f.name), ix.str(f.filename))
            })
            .collect();
        assert!(
            m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames,
            "{} was symbolized with functions, files, lines and inlined frames: {m:?}\n\
             its locations: {names:?}",
            binary.display()
        );
    }
}

/// Functions carry `start_line`, the line their definition starts on.
#[test]
#[ignore = "not implemented: Function.start_line needs the declaration line (DW_AT_decl_line), which the symbolizer does not report yet"]
fn function_start_line() {
    let _serial = serial();
    let source = chain_source();
    let program = compile("lsw_pp_start", &source, NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let ix = r.index();
    for (name, definition) in [
        ("chain_hot", "void chain_hot(void) {"),
        ("chain_b", "void chain_b(void) {"),
        ("chain_a", "void chain_a(void) {"),
        ("main", "int main(void) {"),
    ] {
        let f = r
            .profile
            .function
            .iter()
            .find(|f| ix.str(f.name) == name)
            .unwrap_or_else(|| panic!("no function {name}"));
        assert_eq!(
            f.start_line,
            line_of(&source, definition),
            "{name}'s start_line: {f:?}"
        );
    }
}
