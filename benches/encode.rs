//! Encoding cost (`cargo bench --bench encode`): pprof (raw and gzip),
//! folded stacks and the SVG flame graph of a profile with N distinct
//! 20-frame stacks over 500 functions, per stack; and the Firefox timeline
//! of a 60 s, 10 kHz, 2-CPU run (1.2 M timed samples over 100 000 distinct
//! stacks of 40 threads), and its OTLP and Perfetto (raw and gzip'd)
//! encodings, per sample.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lightswitch::profile::format::{
    firefox, flamegraph, folded, otlp, perfetto, pprof, Compression,
};
use lightswitch::profile::{Frame, FrameKind, Line, Profile, ProfileMapping, Sample, TimedSample};
use lightswitch::sampling::records::UnwindStatus;

const FUNCTIONS: usize = 500;
const DEPTH: usize = 20;
/// Threads the stacks are spread over (4 processes).
const THREADS: usize = 40;

/// A profile with `n` distinct stacks (distinct in their three leaf frames).
fn profile(n: usize) -> Profile {
    let frames = (0..FUNCTIONS)
        .map(|i| {
            let name: Arc<str> = Arc::from(format!("bench::module_{}::function_{i}", i % 17));
            Frame {
                kind: FrameKind::User,
                address: 0x1000 + 0x40 * i as u64,
                mapping: Some(0),
                lines: vec![Line {
                    function: name.clone(),
                    system_name: name,
                    file: Some(Arc::from(format!("src/module_{}.rs", i % 17))),
                    line: Some(i as u32 + 1),
                }]
                .into(),
                symbolized: true,
            }
        })
        .collect();
    let comm: Arc<str> = Arc::from("bench");
    let samples = (0..n)
        .map(|s| Sample {
            pid: 1000 + (s % 4) as u32,
            tid: 1000 + (s % THREADS) as u32,
            process_comm: comm.clone(),
            thread_comm: comm.clone(),
            frames: (0..DEPTH)
                .map(|level| match level {
                    0 => s % FUNCTIONS,
                    1 => s / FUNCTIONS % FUNCTIONS,
                    2 => s / (FUNCTIONS * FUNCTIONS) % FUNCTIONS,
                    _ => (level * 37) % FUNCTIONS,
                })
                .collect(),
            unwind_status: UnwindStatus::Complete,
            off_cpu_ns: 0,
            count: 1 + (s % 10) as u64,
        })
        .collect();
    Profile {
        start_unix_ns: 1_700_000_000_000_000_000,
        duration_ns: 10_000_000_000,
        sample_freq_hz: 99,
        mappings: vec![ProfileMapping {
            start: 0x1000,
            limit: 0x1000 + 0x40 * FUNCTIONS as u64,
            file_offset: 0,
            filename: "/usr/bin/bench".into(),
            build_id: Some("0123456789abcdef".into()),
        }],
        frames,
        samples,
        timeline: vec![],
        markers: vec![],
        lost: vec![],
        subject: None,
        host: None,
        targets: None,
        ..Default::default()
    }
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    group.sample_size(10);
    for n in [1_000usize, 10_000] {
        let p = profile(n);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("pprof", n), &p, |b, p| {
            b.iter(|| pprof::encode(black_box(p), pprof::Compression::None))
        });
        group.bench_with_input(BenchmarkId::new("pprof-gzip", n), &p, |b, p| {
            b.iter(|| pprof::encode(black_box(p), pprof::Compression::Gzip))
        });
        group.bench_with_input(BenchmarkId::new("folded", n), &p, |b, p| {
            b.iter(|| folded::encode(black_box(p)))
        });
        group.bench_with_input(BenchmarkId::new("flamegraph", n), &p, |b, p| {
            b.iter(|| flamegraph::encode(black_box(p), "bench"))
        });
    }
    group.finish();
}

/// `profile(stacks)` with a timeline of `samples` samples, 2 CPUs at
/// 10 kHz (100 µs apart per CPU, a little jitter), the stacks in turn.
fn timed_profile(stacks: usize, samples: usize) -> Profile {
    let mut p = profile(stacks);
    for s in &mut p.samples {
        s.count = 0;
    }
    p.timeline = (0..samples)
        .map(|i| {
            let stack = (i * 7919) % stacks;
            p.samples[stack].count += 1;
            TimedSample {
                offset_ns: (i / 2) as i64 * 100_000 + (i % 13) as i64 * 97,
                sample: stack as u32,
            }
        })
        .collect();
    p
}

fn encode_firefox(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    group.sample_size(10);
    let samples = 1_200_000;
    let p = timed_profile(100_000, samples);
    group.throughput(Throughput::Elements(samples as u64));
    group.bench_with_input(BenchmarkId::new("firefox", samples), &p, |b, p| {
        b.iter(|| firefox::encode(black_box(p)))
    });
    // OTLP keeps every timestamp too (issue 42): the gzip'd request, as the
    // OTLP sender posts it and `--pprof-compression gzip` writes it.
    let size = otlp::encode(&p, Compression::Gzip).map_or(0, |b| b.len());
    eprintln!("otlp: {samples} samples, 100000 stacks: {size} bytes gzip'd");
    group.bench_with_input(BenchmarkId::new("otlp-gzip", samples), &p, |b, p| {
        b.iter(|| otlp::encode(black_box(p), Compression::Gzip))
    });
    // A Perfetto trace: one packet per sample, stacks interned as they come.
    for (name, compression) in [
        ("perfetto", Compression::None),
        ("perfetto-gzip", Compression::Gzip),
    ] {
        let size = perfetto::encode(&p, compression).map_or(0, |b| b.len());
        eprintln!("{name}: {samples} samples, 100000 stacks: {size} bytes");
        group.bench_with_input(BenchmarkId::new(name, samples), &p, |b, p| {
            b.iter(|| perfetto::encode(black_box(p), compression))
        });
    }
    group.finish();
}

criterion_group!(benches, encode, encode_firefox);
criterion_main!(benches);
