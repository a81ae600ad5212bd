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

#[path = "../common/mod.rs"]
mod common;
mod contents;
mod facts;
mod gotool;
mod report;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lightswitch::profile::format::pprof::proto;
use prost::Message;

use common::*;
use facts::*;
use gotool::*;

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
