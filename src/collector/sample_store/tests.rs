//! Tests of the sample store: exact ranges across windows, filters, the
//! stack table across restarts, damaged files, retention.

use std::fs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::assemble::Assembler;
use super::query::Selection;
use super::retention::Retention;
use super::timeline::Density;
use super::writer::Batch;
use super::*;
use crate::collector::archive::Storage;
use crate::profile::format::folded;
use crate::profile::Profile;
use crate::util::files::PROFILE_MODE;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_714_564_800 * S;

/// The folded tests' profile (several stacks, kernel frames, an unwind marker).
fn profile() -> Profile {
    folded::tests::sample_profile()
}

/// Store one window `[start, start + 1 s)` of `host` whose samples are
/// spread 1 ms apart from `start`, cycling through the profile's stacks.
fn store_window(store: &SampleStore, host: &str, start: u64, n: u32) -> Vec<(u64, u32)> {
    let p = profile();
    let stacks = p.samples.len() as u32;
    let times: Vec<(u64, u32)> = (0..n)
        .map(|i| (start + u64::from(i) * 1_000_000 + 7, i % stacks))
        .collect();
    let batch = Batch {
        host,
        window: (start, start + S),
        profile: &p,
        times: times.clone(),
        waits: Vec::new(),
    };
    let done = store.ingest(batch).unwrap();
    assert_eq!(done.samples, u64::from(n));
    times
}

fn select(from: u64, to: u64) -> Selection {
    Selection {
        from,
        to,
        ..Default::default()
    }
}

fn merged(store: &SampleStore, selection: &Selection) -> (Profile, query::Scanned) {
    let blocks = store.blocks_for(selection);
    let mut assembler = Assembler::new(true);
    let scanned = store.scan(selection, &blocks, &mut assembler);
    let (start, _) = scanned.span.unwrap_or((selection.from, 0));
    (assembler.finish(start, 0, &scanned), scanned)
}

#[test]
fn exact_ranges_across_windows_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let expected: Vec<(u64, u32)> = {
        let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
        let mut all = store_window(&store, "web-1", T0, 900);
        all.extend(store_window(&store, "web-1", T0 + S, 900));
        all.extend(store_window(&store, "web-2", T0 + S, 10));
        all
    };
    // Reopened: the stack table and the blocks come back from disk.
    let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
    assert_eq!(store.block_count(), 3);
    // 20 ms across the edge of the first two windows of web-1.
    let (from, to) = (T0 + 890_000_000, T0 + S + 10_000_000);
    let want: Vec<u64> = expected
        .iter()
        .map(|e| e.0)
        .filter(|&t| (from..to).contains(&t))
        .collect();
    let (p, scanned) = merged(&store, &select(from, to));
    assert_eq!(scanned.samples, want.len() as u64);
    assert_eq!(scanned.windows, 3);
    assert_eq!(p.total_samples(), want.len() as u64);
    let mut got: Vec<u64> = p
        .timeline
        .iter()
        .map(|t| p.start_unix_ns.wrapping_add_signed(t.offset_ns))
        .collect();
    got.sort_unstable();
    let mut want = want;
    want.sort_unstable();
    assert_eq!(got, want);
    // The stacks are the profile's (folded output of the same stacks).
    let (whole, _) = merged(&store, &select(T0, T0 + S));
    let original = profile();
    let lines = |text: String| {
        let mut l: Vec<String> = text
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
            .collect();
        l.sort();
        l.dedup();
        l
    };
    assert_eq!(
        lines(folded::encode(&whole)),
        lines(folded::encode(&original))
    );
    // Filters: host, and a pid the profile does not have.
    let mut only = select(0, u64::MAX);
    only.host = Some("web-2".into());
    assert_eq!(merged(&store, &only).1.samples, 10);
    only.pid = Some(999_999);
    assert_eq!(merged(&store, &only).1.samples, 0);
    // The timeline's counts add up to the samples of the range.
    let mut density = Density::new(from, 1_000_000, 20);
    store.scan(
        &select(from, to),
        &store.blocks_for(&select(from, to)),
        &mut density,
    );
    let timeline = density.finish(to);
    let total: u64 = timeline.hosts.iter().map(|h| h.total).sum();
    let cells: u64 = timeline
        .hosts
        .iter()
        .flat_map(|h| &h.processes)
        .flat_map(|p| &p.threads)
        .flat_map(|t| &t.counts)
        .map(|c| c.1)
        .sum();
    assert_eq!((total, cells), (scanned.samples, scanned.samples));
}

#[test]
fn damaged_and_partial_files_are_skipped_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
        store_window(&store, "h", T0, 100);
        store_window(&store, "h", T0 + S, 100);
    }
    let blocks_dir = dir.path().join(STORE_DIR).join("blocks/h/2024-05-01");
    let mut files: Vec<_> = fs::read_dir(&blocks_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    // A torn block (cut short), and a temporary file a crash left behind.
    let bytes = fs::read(&files[1]).unwrap();
    fs::write(&files[1], &bytes[..bytes.len() / 2]).unwrap();
    fs::write(blocks_dir.join(".tmp-crashed"), &bytes[..10]).unwrap();
    // A torn stack-table segment after the good ones.
    fs::write(
        dir.path().join(STORE_DIR).join("stacks/9999999999.seg"),
        b"torn",
    )
    .unwrap();
    let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
    assert_eq!(store.block_count(), 2);
    let (p, scanned) = merged(&store, &select(0, u64::MAX));
    assert_eq!((scanned.samples, scanned.skipped), (100, 1));
    assert_eq!(p.total_samples(), 100);
    assert_eq!(store.stats.blocks_skipped.load(Ordering::Relaxed), 1);
    // New windows still go in after the torn segment.
    store_window(&store, "h", T0 + 2 * S, 5);
    let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
    assert_eq!(merged(&store, &select(T0 + 2 * S, u64::MAX)).1.samples, 5);
}

#[test]
fn retention_deletes_the_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SampleStore::open(dir.path(), PROFILE_MODE).unwrap());
    let archive = Storage::open(dir.path(), PROFILE_MODE).unwrap();
    for i in 0..5 {
        store_window(&store, "h", T0 + i * S, 100);
    }
    let now = T0 + 5 * S;
    // By age: windows whose last sample is older than 2.5 s.
    let age = Retention {
        max_age_ns: Some(2 * S + S / 2),
        max_bytes: None,
    };
    let deleted = store.enforce(age, &archive, now);
    assert_eq!(deleted.by_age, 3);
    assert_eq!(store.block_count(), 2);
    assert_eq!(merged(&store, &select(0, T0 + 3 * S)).1.samples, 0);
    // By size: down to one block's worth plus the stack table.
    let one = store.blocks(0, u64::MAX, None)[1].bytes;
    let table = store.disk_bytes()
        - store
            .blocks(0, u64::MAX, None)
            .iter()
            .map(|b| b.bytes)
            .sum::<u64>();
    let size = Retention {
        max_age_ns: None,
        max_bytes: Some(table + one),
    };
    let deleted = store.enforce(size, &archive, now);
    assert_eq!((deleted.by_age, deleted.by_size), (0, 1));
    let left = store.blocks(0, u64::MAX, None);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].first_time, T0 + 4 * S + 7);
    assert_eq!(store.stats.deleted_by_age.load(Ordering::Relaxed), 3);
}
