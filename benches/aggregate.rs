//! Aggregation cost (`cargo bench --bench aggregate`): N samples, each with a
//! 30-frame user stack in this benchmark's own executable and an 8-frame
//! kernel stack, added to an `Aggregator` (mapping lookup, call-site
//! adjustment, exact-stack counting), per sample. The samples cycle through
//! 1000 distinct stacks, as a hot program's samples repeat.

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lightswitch::process::ProcessTracker;
use lightswitch::profile::aggregate::Aggregator;

const DISTINCT: usize = 1000;
const USER_FRAMES: usize = 30;
const KERNEL_FRAMES: usize = 8;

fn aggregate(c: &mut Criterion) {
    let text = common::own_text();
    let pool = common::spread(4096, text);
    let stacks: Vec<_> = (0..DISTINCT)
        .map(|s| {
            let user = (0..USER_FRAMES)
                .map(|level| pool[(s * 7 + level * 131) % pool.len()])
                .collect();
            let kernel = (0..KERNEL_FRAMES as u64)
                .map(|level| 0xffff_ffff_8100_0000 + level * 0x40 + (s as u64 % 8))
                .collect();
            common::sample(kernel, user)
        })
        .collect();
    let mut tracker = ProcessTracker::new();
    // Read this process's mappings once, outside the measurement.
    Aggregator::new().add(&stacks[0], &mut tracker);
    let mut group = c.benchmark_group("aggregate");
    for n in [10_000usize, 100_000] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                let mut aggregator = Aggregator::new();
                for sample in stacks.iter().cycle().take(n) {
                    aggregator.add(black_box(sample), &mut tracker);
                }
                aggregator.total()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, aggregate);
criterion_main!(benches);
