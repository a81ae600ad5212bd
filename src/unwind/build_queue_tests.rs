//! Tests of [`super`] (`unwind/builds.rs`).

use super::*;
use std::thread;

fn request(object_id: u32, bytes: u64) -> BuildRequest {
    BuildRequest {
        object_id,
        name: format!("object {object_id}"),
        source: TableSource::Bytes(Vec::new()),
        bytes,
        queued: Instant::now(),
        stage: Stage::Build(None),
        wanted: Arc::default(),
    }
}

fn small(_: u64, r: &BuildRequest) -> bool {
    r.bytes <= SMALL_OBJECT_BYTES
}

#[test]
fn queue_gives_the_small_object_thread_only_small_objects() {
    let id = |popped: Option<Popped>| popped.map(|(_, _, r)| r.object_id);
    let queue = BuildQueue::default();
    queue.push(request(1, 150 << 20), 5);
    queue.push(request(2, 20 << 10), 1);
    queue.push(request(3, 30 << 10), 1);
    // Most wanted first; equal priorities in arrival order.
    assert_eq!(id(queue.pop(small)), Some(2));
    queue.bump(3);
    assert_eq!(
        queue.pop(|_, _| true).map(|(p, _, r)| (p, r.object_id)),
        Some((5, 1))
    );
    assert_eq!(
        queue.pop(|_, _| true).map(|(p, _, r)| (p, r.object_id)),
        Some((2, 3))
    );
    // A thread waiting for small objects does not take a big one.
    queue.push(request(4, 150 << 20), 9);
    let queue = Arc::new(queue);
    let waiting = {
        let queue = queue.clone();
        thread::spawn(move || id(queue.pop(small)))
    };
    queue.push(request(5, 1 << 20), 0);
    assert_eq!(waiting.join().unwrap(), Some(5));
    queue.close();
    assert!(queue.pop(|_, _| true).is_none());
}

#[test]
fn one_build_thread_waits_for_tables_samples_need() {
    let (any, sampled) = (BUILD_THREADS[0].1, BUILD_THREADS[1].1);
    let queue = BuildQueue::default();
    // Found by a scan, not sampled: only the thread for any object takes it.
    queue.push(request(1, 150 << 20), 0);
    queue.push(request(2, 150 << 20), 0);
    assert_eq!(
        queue.pop(|p, r| any.takes(p, r)).map(|e| e.2.object_id),
        Some(1)
    );
    let queue = Arc::new(queue);
    let waiting = {
        let queue = queue.clone();
        thread::spawn(move || queue.pop(|p, r| sampled.takes(p, r)).map(|e| e.2.object_id))
    };
    // A sample needs object 2: the reserved thread takes it.
    queue.bump(2);
    assert_eq!(waiting.join().unwrap(), Some(2));
    // Lookups are the cache threads' alone.
    let lookup = BuildRequest {
        stage: Stage::Lookup,
        ..request(3, 0)
    };
    assert!(!any.takes(9, &lookup) && Worker::Cache.takes(0, &lookup));
    assert!(!Worker::Cache.takes(9, &request(4, 0)));
}

/// `bytes` with its build-ID note's type changed, so it has none.
fn without_build_id(mut bytes: Vec<u8>) -> Option<Vec<u8>> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(&*bytes).ok()?;
    let (offset, _) = file.section_by_name(".note.gnu.build-id")?.file_range()?;
    // n_namesz, n_descsz, n_type: NT_GNU_BUILD_ID (3) becomes 0x7f.
    bytes[offset as usize + 8] = 0x7f;
    Some(bytes)
}

#[test]
fn a_file_without_build_id_is_built_then_keyed_and_found_by_its_identity() {
    let Some(bytes) = std::fs::read("/lib/x86_64-linux-gnu/libm.so.6")
        .ok()
        .and_then(without_build_id)
    else {
        eprintln!("skipped: no libm.so.6 with a build ID");
        return;
    };
    let (cache_dir, objects) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let path = objects.path().join("libm-no-build-id.so");
    std::fs::write(&path, &bytes).expect("write");
    let source = TableSource::File {
        open: path.clone(),
        path,
    };
    // Not hashed before its build: nothing to look up.
    assert!(lookup_key(cache_dir.path(), &source)
        .expect("readable")
        .is_none());
    let (tx, _rx) = std::sync::mpsc::channel();
    let request = request(1, 0);
    let early = Early {
        request: &request,
        results: &tx,
        started: Instant::now(),
    };
    let store = Some((cache_dir.path(), Store::KeyAfterBuild));
    let built = build(&source, store, &early, &[]).expect("built");
    assert_eq!(built, crate::unwind::build_table(&bytes).expect("direct"));
    // Now keyed by its content hash, found through its identity.
    let key = ObjectKey::ContentHash(xxhash_rust::xxh3::xxh3_128(&bytes));
    let found = lookup_key(cache_dir.path(), &source).expect("readable");
    assert_eq!(found.as_ref(), Some(&key));
    assert_eq!(cache::load(cache_dir.path(), &key).expect("stored"), built);
}

#[test]
fn a_cached_table_is_read_while_the_build_threads_are_busy_and_a_miss_is_built() {
    let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let Ok(libc) = std::fs::read(path) else {
        eprintln!("skipped: {} is absent", path.display());
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let libc_table = crate::unwind::build_table(&libc).expect("libc's table");
    cache::store(dir.path(), &ObjectKey::for_object(&libc), &libc_table).expect("stored");
    let queue = Arc::new(BuildQueue::default());
    let (tx, rx) = std::sync::mpsc::channel();
    // Only cache threads: a lookup that hits is answered by them alone.
    let cache_threads: Vec<_> = (0..CACHE_THREADS)
        .map(|_| {
            let (queue, tx, dir) = (queue.clone(), tx.clone(), dir.path().to_owned());
            thread::spawn(move || cache_worker(&queue, &tx, Some(&dir)))
        })
        .collect();
    let lookup = |object_id, bytes: Vec<u8>| BuildRequest {
        stage: Stage::Lookup,
        source: TableSource::Bytes(bytes),
        ..request(object_id, 0)
    };
    queue.push(lookup(1, libc.clone()), 0);
    let hit = rx.recv().expect("a result");
    assert_eq!((hit.object_id, hit.from_cache), (1, true));
    assert_eq!(hit.table.expect("the cached table"), libc_table);
    // A miss (another object) goes back to the queue to be built.
    let Ok(other) = std::fs::read("/lib/x86_64-linux-gnu/libm.so.6") else {
        eprintln!("skipped the miss: libm.so.6 is absent");
        return;
    };
    let other_key = ObjectKey::for_object(&other);
    queue.push(lookup(2, other), 7);
    let (priority, order, missed) = queue
        .pop(|_, r| matches!(r.stage, Stage::Build(_)))
        .expect("the miss, for a build thread");
    // Its priority and place among arrivals are kept.
    assert_eq!((priority, order, missed.object_id), (7, 2, 2));
    let Stage::Build(Some(Store::Key(key, CacheError::Missing))) = &missed.stage else {
        panic!("a miss carries its key and reason");
    };
    assert_eq!(key, &other_key);
    let TableSource::Bytes(bytes) = &missed.source else {
        unreachable!()
    };
    let direct = crate::unwind::build_table(bytes).expect("direct build");
    // A sample waits on the table's last page: it is sent ahead.
    let waited_on = direct.pages().last().expect("pages").page;
    missed.wanted.add(waited_on);
    let early = Early {
        request: &missed,
        results: &tx,
        started: Instant::now(),
    };
    let built = build(
        &missed.source,
        Some((dir.path(), Store::Key(key.clone(), CacheError::Missing))),
        &early,
        &[],
    )
    .expect("built");
    assert_eq!(built, direct);
    let ahead = rx.try_recv().expect("the early pages");
    assert!(ahead.early && ahead.object_id == 2);
    let ahead = ahead.table.expect("early pages");
    assert_eq!(ahead.pages().len(), 1);
    assert_eq!(ahead.pages()[0].page, waited_on);
    assert_eq!(cache::load(dir.path(), key).expect("stored"), built);
    queue.close();
    for t in cache_threads {
        t.join().expect("cache thread");
    }
}
