//! Symbolization cost (`cargo bench --bench symbolize`): N distinct
//! addresses turned into a profile by `Symbolizer::build_profile`, per
//! address. Sources: this benchmark's own executable (DWARF line tables and
//! inlined functions), libc (symbol tables only on a stripped distribution
//! libc) and the kernel (`/proc/kallsyms`; needs root to see addresses).
//! Cold: a new symbolizer each iteration (objects parsed again); warm: one
//! symbolizer reused (blazesym's caches filled).

mod common;

use std::hint::black_box;

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

criterion_group!(benches, symbolize);
criterion_main!(benches);
