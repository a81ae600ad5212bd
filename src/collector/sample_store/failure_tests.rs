//! Tests of the store when writes fail (a full disk, injected through
//! [`health::fail_writes_after`]) and when a window comes twice: a failed
//! request leaves nothing behind, later requests do not depend on it, and
//! a re-sent window is stored once, across restarts too.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::assemble::Assembler;
use super::health::{fail_writes_after, heal_writes, is_transient};
use super::identity::{content_hash, WindowId};
use super::query::Selection;
use super::writer::{Batch, Ingested};
use super::*;
use crate::profile::format::folded;
use crate::profile::{Frame, FrameKind, Line, Profile};
use crate::util::files::PROFILE_MODE;

const S: u64 = 1_000_000_000;
const T0: u64 = 1_714_564_800 * S;

/// The folded tests' profile with its function names suffixed by `tag`, so
/// that each tag brings stacks (and stack-table entries) of its own.
fn profile(tag: &str) -> Profile {
    let mut p = folded::tests::sample_profile();
    let renamed = |f: &Frame| Frame {
        lines: (f.lines.iter())
            .map(|l| Line {
                function: Arc::from(format!("{}_{tag}", l.function)),
                ..l.clone()
            })
            .collect(),
        ..f.clone()
    };
    p.frames = p.frames.iter().map(renamed).collect();
    assert!(p.frames.iter().any(|f| f.kind == FrameKind::User));
    p
}

/// `n` samples 1 ms apart from `start`, cycling through `p`'s stacks.
fn times(p: &Profile, start: u64, n: u32) -> Vec<(u64, u32)> {
    let stacks = p.samples.len() as u32;
    (0..n)
        .map(|i| (start + u64::from(i) * 1_000_000 + 7, i % stacks))
        .collect()
}

/// Store windows of `hosts` (one batch each) as one request with an
/// identity from `tag`.
fn request(store: &SampleStore, tag: &str, hosts: &[&str], start: u64, n: u32) -> Result<Ingested> {
    let p = profile(tag);
    let batches = (hosts.iter())
        .map(|host| Batch {
            host,
            window: (start, start + S),
            profile: &p,
            times: times(&p, start, n),
            waits: Vec::new(),
        })
        .collect();
    let windows: Vec<_> = hosts.iter().map(|h| (*h, start, start + S)).collect();
    let id = WindowId::of(&windows, content_hash(tag.as_bytes()));
    store.ingest_request(batches, Some(id))
}

/// Every stored sample as (folded stack, time) -> count, read back through
/// the store's queries (a stack id without its table entry would not
/// read back).
fn contents(store: &SampleStore) -> BTreeMap<(String, u64), u64> {
    let all = Selection {
        from: 0,
        to: u64::MAX,
        ..Default::default()
    };
    let blocks = store.blocks_for(&all);
    let mut assembler = Assembler::new(true);
    let scanned = store.scan(&all, &blocks, &mut assembler);
    assert_eq!(scanned.skipped, 0, "a block did not read back");
    let p = assembler.finish(scanned.span.map_or(0, |s| s.0), 0, &scanned);
    let mut out = BTreeMap::new();
    for t in &p.timeline {
        let stack = folded::encode(&Profile {
            samples: vec![crate::profile::Sample {
                count: 1,
                ..p.samples[t.sample as usize].clone()
            }],
            ..p.clone()
        });
        let time = p.start_unix_ns.wrapping_add_signed(t.offset_ns);
        *out.entry((stack, time)).or_default() += 1;
    }
    out
}

/// The files under the store's directory (names relative to it).
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_failed_request_leaves_nothing_and_later_ones_do_not_depend_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
    request(&store, "acked", &["web-1"], T0, 300).unwrap();
    let acknowledged = contents(&store);
    let on_disk = files(dir.path());
    let table = store.dict.read().unwrap().mark();
    // Fail at each write of a request of two hosts (a stack-table segment,
    // then a block per host): the first write, the second, the third.
    for ok_writes in 0..3 {
        fail_writes_after(ok_writes);
        let err = request(&store, "failed", &["web-1", "web-2"], T0 + S, 200).unwrap_err();
        heal_writes();
        assert!(is_transient(&err), "{err:#}");
        assert_eq!(files(dir.path()), on_disk, "after {ok_writes} good writes");
        assert_eq!(contents(&store), acknowledged);
        assert_eq!(store.dict.read().unwrap().mark(), table);
        // Nothing is left in memory that is not on disk: persisting now
        // writes nothing.
        store.dict.write().unwrap().persist().unwrap();
        assert_eq!(files(dir.path()), on_disk);
        assert_eq!(store.stats.samples_stored.load(Ordering::Relaxed), 300);
    }
    assert!(store.health.is_failing());
    assert_eq!(store.health.unavailable.load(Ordering::Relaxed), 3);
    // Room again: new stacks go in, and the failed request sent again too.
    request(&store, "later", &["web-2"], T0 + 2 * S, 100).unwrap();
    assert!(!store.health.is_failing());
    let resent = request(&store, "failed", &["web-1", "web-2"], T0 + S, 200).unwrap();
    assert_eq!((resent.samples, resent.duplicate), (400, false));
    let want = contents(&store);
    assert_eq!(want.values().sum::<u64>(), 300 + 100 + 400);
    // Reopened from disk: every entry every block refers to is there.
    let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
    assert_eq!(contents(&store), want);
    // Sent once more after the restart: answered as stored, not stored.
    let again = request(&store, "failed", &["web-1", "web-2"], T0 + S, 200).unwrap();
    assert!(again.duplicate);
    assert_eq!(contents(&store), want);
    assert_eq!(store.stats.duplicates.load(Ordering::Relaxed), 1);
}

#[test]
fn a_request_cut_short_by_a_crash_is_removed_at_start_up_and_stored_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
        request(&store, "kept", &["web-1"], T0, 50).unwrap();
        request(&store, "torn", &["web-1", "web-2"], T0 + S, 50).unwrap();
    }
    // As if the collector died after renaming the first block of "torn"
    // and before the second: remove web-2's block.
    let blocks = dir.path().join(STORE_DIR).join("blocks");
    let web2 = files(&blocks.join("web-2"));
    assert_eq!(web2.len(), 1);
    fs::remove_file(blocks.join("web-2").join(&web2[0])).unwrap();
    let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
    assert_eq!(store.block_count(), 1);
    assert_eq!(store.stats.incomplete_removed.load(Ordering::Relaxed), 1);
    assert_eq!(contents(&store).values().sum::<u64>(), 50);
    // The sender never had an answer and sends it again: stored whole.
    let resent = request(&store, "torn", &["web-1", "web-2"], T0 + S, 50).unwrap();
    assert!(!resent.duplicate);
    assert_eq!(contents(&store).values().sum::<u64>(), 150);
}
