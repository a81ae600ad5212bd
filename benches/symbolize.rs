//! Symbolization cost (`cargo bench --bench symbolize`): N distinct
//! addresses turned into a profile by `Symbolizer::build_profile`, per
//! address. Sources: this benchmark's own executable (DWARF line tables and
//! inlined functions), libc (symbol tables only on a stripped distribution
//! libc) and the kernel (`/proc/kallsyms`; needs root to see addresses).
//! Cold: a new symbolizer each iteration (objects parsed again); warm: one
//! symbolizer reused (blazesym's caches filled).
//! `window/minidebuginfo`: continuous mode's steady state, one window of
//! [`WINDOW_ADDRESSES`] addresses the line cache does not hold, all in a
//! shared library stripped the Fedora way (named from its MiniDebugInfo),
//! timed in this thread's CPU time per window.

mod common;

use std::fmt::Write;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lightswitch::process::ProcessTracker;
use lightswitch::profile::aggregate::Aggregator;
use lightswitch::profile::Window;
use lightswitch::symbolize::Symbolizer;

/// `n` addresses of kernel functions from `/proc/kallsyms` (empty when
/// the addresses are hidden from this user).
fn kernel_addresses(n: usize) -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let all: Vec<u64> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            (addr != 0 && (kind == "t" || kind == "T")).then_some(addr + 1)
        })
        .collect();
    if all.len() < n {
        return Vec::new();
    }
    let step = all.len() / n;
    all.iter().step_by(step).take(n).copied().collect()
}

const WINDOW: Window = Window {
    start_unix_ns: 0,
    duration_ns: 1_000_000_000,
    sample_freq_hz: 99,
    off_cpu: false,
};

fn symbolize(c: &mut Criterion) {
    let mut group = c.benchmark_group("symbolize");
    group.sample_size(10);
    let libc = common::executable_mapping(|p| p.contains("/libc.so"));
    for n in [1_000usize, 10_000] {
        let mut inputs: Vec<(&str, Vec<_>)> = vec![(
            "exe",
            common::spread(n, common::own_text())
                .into_iter()
                .map(|a| common::sample(Vec::new(), vec![a]))
                .collect(),
        )];
        if let Some(libc) = libc {
            inputs.push((
                "libc",
                common::spread(n, libc)
                    .into_iter()
                    .map(|a| common::sample(Vec::new(), vec![a]))
                    .collect(),
            ));
        }
        let kernel = kernel_addresses(n);
        if !kernel.is_empty() {
            inputs.push((
                "kernel",
                kernel
                    .into_iter()
                    .map(|a| common::sample(vec![a], Vec::new()))
                    .collect(),
            ));
        }
        for (source, samples) in inputs {
            let mut tracker = ProcessTracker::new();
            let mut aggregator = Aggregator::new();
            for s in &samples {
                aggregator.add(s, &mut tracker);
            }
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::new(format!("{source}/cold"), n), &n, |b, _| {
                b.iter(|| Symbolizer::new().build_profile(black_box(&aggregator), &tracker, WINDOW))
            });
            let warm = Symbolizer::new();
            group.bench_with_input(BenchmarkId::new(format!("{source}/warm"), n), &n, |b, _| {
                b.iter(|| warm.build_profile(black_box(&aggregator), &tracker, WINDOW))
            });
        }
    }
    group.finish();
}

/// New addresses in each window of `window/minidebuginfo`.
const WINDOW_ADDRESSES: u64 = 64;

/// Static functions of the MiniDebugInfo library: its text (about 160 KB)
/// holds more distinct addresses than the line cache keeps
/// (`LINE_CACHE_MAX_ADDRESSES`), so that cycling through them, every
/// window brings addresses the cache no longer holds.
const MDI_FUNCTIONS: usize = 4000;

/// What Fedora's find-debuginfo does to an ELF file (tests/debug_info.rs
/// runs it too).
const FEDORA_RECIPE: &str = include_str!("../scripts/fedora-minidebuginfo.sh");

/// Build in `dir` a shared library of [`MDI_FUNCTIONS`] static functions,
/// strip it the Fedora way ([`FEDORA_RECIPE`]; its debug file removed, so
/// that names come from `.gnu_debugdata`) and load it into this process.
/// Its path, or `None` when gcc, binutils or xz are missing.
fn load_minidebuginfo_library(dir: &Path) -> Option<PathBuf> {
    let mut source = String::new();
    for i in 0..MDI_FUNCTIONS {
        let _ = writeln!(
            source,
            "__attribute__((used, noipa)) static unsigned long f{i}(unsigned long x) \
             {{ for (int k = 0; k < {}; k++) x = x * {} + k; return x; }}",
            i % 7 + 1,
            2 * i + 3
        );
    }
    let (c, library) = (dir.join("mdi.c"), dir.join("libbench_mdi.so"));
    std::fs::write(&c, source).ok()?;
    let ran = |cmd: &mut Command| cmd.status().is_ok_and(|s| s.success());
    let built = ran(Command::new("gcc")
        .args(["-O2", "-g", "-fPIC", "-shared", "-Wl,--build-id=sha1", "-o"])
        .arg(&library)
        .arg(&c))
        && ran(Command::new("sh")
            .args(["-c", FEDORA_RECIPE, "fedora"])
            .arg(&library));
    let debug_file = dir.join("libbench_mdi.so.debug");
    if !built || std::fs::remove_file(debug_file).is_err() {
        return None;
    }
    let path = std::ffi::CString::new(library.to_str()?).ok()?;
    // SAFETY: the library has no constructors; it stays loaded until exit.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW) };
    (!handle.is_null()).then_some(library)
}

/// This thread's CPU time so far.
fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Continuous mode's steady state in a MiniDebugInfo object: one
/// symbolizer, each window [`WINDOW_ADDRESSES`] addresses not seen for
/// long (a prime stride through the library's text).
fn window_minidebuginfo(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(library) = load_minidebuginfo_library(dir.path()) else {
        eprintln!("window/minidebuginfo skipped: gcc, binutils or xz missing");
        return;
    };
    let (start, end) = common::executable_mapping(|p| Path::new(p) == library)
        .expect("the library's text mapping");
    let symbolizer = Symbolizer::new();
    let mut tracker = ProcessTracker::new();
    let mut next = 0u64;
    let mut window = |tracker: &mut ProcessTracker| {
        let mut aggregator = Aggregator::new();
        for _ in 0..WINDOW_ADDRESSES {
            let address = start + next * 7919 % (end - start);
            next += 1;
            aggregator.add(&common::sample(Vec::new(), vec![address]), tracker);
        }
        aggregator
    };
    let first = symbolizer.build_profile(&window(&mut tracker), &tracker, WINDOW);
    let named = first.frames.iter().filter(|f| f.symbolized).count();
    assert!(named as u64 > WINDOW_ADDRESSES / 2, "{named} frames named");
    let mut group = c.benchmark_group("window");
    group.sample_size(10);
    group.bench_function("minidebuginfo", |b| {
        b.iter_custom(|windows| {
            let mut cpu = Duration::ZERO;
            for _ in 0..windows {
                let aggregator = window(&mut tracker);
                let before = thread_cpu_time();
                black_box(symbolizer.build_profile(&aggregator, &tracker, WINDOW));
                cpu += thread_cpu_time() - before;
            }
            cpu
        })
    });
    group.finish();
}

criterion_group!(benches, symbolize, window_minidebuginfo);
criterion_main!(benches);
