//! The collector's sample store on a real recording (`bash
//! bench/collector/run.sh` records a whole-machine 10 kHz run as OTLP and
//! runs this with `LIGHTSWITCH_BENCH_OTLP` naming it; without it this bench
//! says so and measures nothing).
//!
//! 1. Storage (printed once): the recording cut into 10 s windows, each
//!    encoded as `--sender otlp` sends it (gzip'd OTLP, its own dictionary),
//!    replayed one after the other, shifted in time, until one hour is
//!    stored; bytes on disk per sample, and the ingest rate of that hour.
//! 2. With `LIGHTSWITCH_BENCH_COLLECTOR_URL`, instead of 1 and 3: the users' case
//!    against a running collector ([`users_case`]).
//! 3. Ingest (criterion, per sample): one 1 s and one 10 s window request
//!    into a store that already holds the recording (the steady state: its
//!    stacks known), decoding, stack table and durable block write included.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use lightswitch::collector::ingest::store_otlp;
use lightswitch::collector::sample_store::SampleStore;
use lightswitch::profile::format::otlp::proto::collector::ExportProfilesServiceRequest;
use lightswitch::profile::format::{otlp, Compression};
use lightswitch::profile::{Profile, TimedSample};
use prost::Message;

#[path = "store_replay/users_case.rs"]
mod users_case;

/// One second, ns.
const S: u64 = 1_000_000_000;
/// What one request may inflate to (the collector's default).
const MAX_DECODED: usize = 64 << 20;

/// The samples of `p` in `[offset, offset + len)` (ns after its start) as a
/// profile of that window holding only the frames and mappings they use.
fn window(p: &Profile, offset: u64, len: u64) -> Profile {
    let (lo, hi) = (offset as i64, (offset + len) as i64);
    let timed: Vec<TimedSample> = p
        .timeline
        .iter()
        .filter(|t| (lo..hi).contains(&{ t.offset_ns }))
        .copied()
        .collect();
    let mut sample_map = HashMap::new();
    let mut frame_map = HashMap::new();
    let mut mapping_map = HashMap::new();
    let mut out = Profile {
        start_unix_ns: p.start_unix_ns + offset,
        duration_ns: len,
        sample_freq_hz: p.sample_freq_hz,
        host: p.host.clone(),
        ..Default::default()
    };
    for t in &timed {
        let next = out.samples.len() as u32;
        let index = *sample_map.entry(t.sample).or_insert_with(|| {
            let mut s = p.samples[t.sample as usize].clone();
            s.count = 0;
            s.frames = s
                .frames
                .iter()
                .map(|&f| {
                    *frame_map.entry(f).or_insert_with(|| {
                        let mut frame = p.frames[f].clone();
                        frame.mapping = frame.mapping.map(|m| {
                            *mapping_map.entry(m).or_insert_with(|| {
                                out.mappings.push(p.mappings[m].clone());
                                out.mappings.len() - 1
                            })
                        });
                        out.frames.push(frame);
                        out.frames.len() - 1
                    })
                })
                .collect();
            out.samples.push(s);
            next
        });
        out.samples[index as usize].count += 1;
        out.timeline.push(TimedSample {
            offset_ns: { t.offset_ns } - lo,
            sample: index,
        });
    }
    out
}

/// The recording's windows of `len` ns, as raw request bytes and their samples.
fn requests(p: &Profile, len: u64) -> Vec<(Vec<u8>, u64)> {
    (0..p.duration_ns.div_ceil(len))
        .map(|k| {
            let w = window(p, k * len, len);
            let n = w.total_samples();
            (otlp::encode(&w, Compression::None).expect("encoding"), n)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Request `raw` with every time moved `shift` ns later, gzip'd as the
/// sender sends it.
fn shifted(raw: &[u8], shift: u64) -> Vec<u8> {
    let mut request = ExportProfilesServiceRequest::decode(raw).expect("a request");
    for p in request
        .resource_profiles
        .iter_mut()
        .flat_map(|r| &mut r.scope_profiles)
        .flat_map(|s| &mut s.profiles)
    {
        p.time_unix_nano += shift;
        for s in &mut p.samples {
            for t in &mut s.timestamps_unix_nano {
                *t += shift;
            }
        }
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&request.encode_to_vec()).expect("gzip");
    gz.finish().expect("gzip")
}

/// Fill a store with one hour of the recording in 10 s windows; print its
/// size per sample and the ingest rate.
fn one_hour(p: &Profile) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SampleStore::open(dir.path(), 0o600).expect("store");
    let copies = (3600 * S).div_ceil(p.duration_ns);
    let (mut samples, mut busy, mut sent) = (0u64, Duration::ZERO, 0u64);
    let windows = requests(p, 10 * S);
    for c in 0..copies {
        for (raw, n) in &windows {
            let body = shifted(raw, c * p.duration_ns);
            let started = Instant::now();
            store_otlp(&store, &body, MAX_DECODED, "bench").expect("ingest");
            busy += started.elapsed();
            samples += n;
            sent += body.len() as u64;
        }
    }
    let bytes = store.disk_bytes();
    println!(
        "one hour ({copies} copies of a {:.1} s recording, 10 s windows): {samples} samples, \
         {bytes} bytes on disk = {:.3} bytes/sample ({:.3} in blocks); requests {:.1} bytes/sample \
         gzip'd; ingest {:.0} samples/s ({:.1} s busy)",
        p.duration_ns as f64 / 1e9,
        bytes as f64 / samples as f64,
        store
            .blocks(0, u64::MAX, None)
            .iter()
            .map(|b| b.bytes)
            .sum::<u64>() as f64
            / samples as f64,
        sent as f64 / samples as f64,
        samples as f64 / busy.as_secs_f64(),
        busy.as_secs_f64(),
    );
}

fn main() {
    let Ok(path) = std::env::var("LIGHTSWITCH_BENCH_OTLP") else {
        eprintln!(
            "collector_store: set LIGHTSWITCH_BENCH_OTLP to an OTLP recording \
             (bash bench/collector/run.sh records one); nothing measured"
        );
        return;
    };
    let bytes = std::fs::read(&path).expect("reading the recording");
    let p = otlp::read::decode(&bytes).expect("decoding the recording");
    assert!(!p.timeline.is_empty(), "the recording has no sample times");
    if let Ok(url) = std::env::var("LIGHTSWITCH_BENCH_COLLECTOR_URL") {
        let pid = std::env::var("LIGHTSWITCH_BENCH_COLLECTOR_PID")
            .ok()
            .and_then(|p| p.parse().ok())
            .expect("LIGHTSWITCH_BENCH_COLLECTOR_PID: the collector's pid");
        users_case::run(&p, &url, pid);
        return;
    }
    if std::env::var_os("LIGHTSWITCH_BENCH_SKIP_HOUR").is_none() {
        one_hour(&p);
    }
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("collector_ingest");
    group.sample_size(10);
    for len in [S, 10 * S] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SampleStore::open(dir.path(), 0o600).expect("store");
        for (raw, _) in requests(&p, 10 * S) {
            store_otlp(&store, &shifted(&raw, 0), MAX_DECODED, "bench").expect("warming");
        }
        let (raw, n) = requests(&p, len).swap_remove(0);
        let body = shifted(&raw, 3600 * S);
        group.throughput(Throughput::Elements(n));
        group.bench_with_input(
            BenchmarkId::new("otlp_window_s", len / S),
            &body,
            |b, body| b.iter(|| store_otlp(&store, body, MAX_DECODED, "bench").expect("ingest")),
        );
    }
    group.finish();
    c.final_summary();
}
