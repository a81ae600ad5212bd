//! Unwind tables are built on background threads, so that sampling never
//! waits: a queue of requests, most wanted first, and the threads that take
//! them. With a disk cache, a request first goes to a cache thread, which
//! reads the object's cached table (two threads, so that one large table
//! read does not hold up the next, and no read waits behind a build); only
//! a miss goes on to the build threads ([`BUILD_THREADS`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tracing::debug;

use crate::unwind::cache::{self, CacheError};
use crate::unwind::early::{EarlySink, WantedPages};
use crate::unwind::stat_keys;
use crate::unwind::{ObjectKey, UnwindTable};

/// Where a table's CFI comes from.
pub(super) enum TableSource {
    /// An object file: `open` reads it (`/proc/self/fd/N`), `path` is where
    /// the process saw it (to find its separate debug file).
    File { open: PathBuf, path: PathBuf },
    /// An in-memory ELF image (the vDSO, read from a process's memory).
    Bytes(Vec<u8>),
}

/// Where a request is on its way to a table.
pub(super) enum Stage {
    /// Its cached table is to be read (only with a cache directory).
    Lookup,
    /// It is to be built, and stored in the cache as `Some` says (`None`:
    /// there is no cache).
    Build(Option<Store>),
}

/// Where a built table goes in the cache.
pub(super) enum Store {
    /// Under this key, whose entry was unusable for this reason.
    Key(ObjectKey, CacheError),
    /// Under the key found after the build: a file without a build ID
    /// whose content hash is not remembered ([`super::stat_keys`]), built
    /// without a lookup so that hashing it does not delay the build.
    KeyAfterBuild,
}

/// One table to build.
pub(super) struct BuildRequest {
    /// The object (tracker id, or [`crate::process::walker::VDSO_OBJECT_ID`]).
    pub(super) object_id: u32,
    /// Its name in messages.
    pub(super) name: String,
    /// Where its CFI comes from.
    pub(super) source: TableSource,
    /// Size of the object, bytes (file size, or the in-memory image's).
    pub(super) bytes: u64,
    /// When it was queued, for the timings in [`BuildResult`].
    pub(super) queued: Instant,
    /// Cache lookup or build.
    pub(super) stage: Stage,
    /// Pages samples wait on, built and sent ahead of the full table
    /// ([`super::early`]).
    pub(super) wanted: Arc<WantedPages>,
}

/// Objects up to this size (bytes) also go to a fourth build thread, which
/// builds nothing bigger: a small program sampled at start does not wait
/// behind large shared objects (librustc_driver, 153 MB, and libLLVM take
/// hundreds of milliseconds each).
pub const SMALL_OBJECT_BYTES: u64 = 16 << 20;

/// Threads reading cached tables.
const CACHE_THREADS: usize = 2;

/// What a thread takes from the queue.
#[derive(Clone, Copy)]
enum Worker {
    /// Cache lookups.
    Cache,
    /// Builds of objects of at most `max_bytes`, whose priority is at least
    /// `min_priority` (1: needed by a sample).
    Build { max_bytes: u64, min_priority: u64 },
}

impl Worker {
    /// Whether this thread takes `request`, queued with `priority`.
    fn takes(self, priority: u64, request: &BuildRequest) -> bool {
        match (self, &request.stage) {
            (Worker::Cache, Stage::Lookup) => true,
            (
                Worker::Build {
                    max_bytes,
                    min_priority,
                },
                Stage::Build(_),
            ) => request.bytes <= max_bytes && priority >= min_priority,
            _ => false,
        }
    }
}

/// The build threads: one for any object, two only for tables samples are
/// waiting on (a build cannot be interrupted, so without them a table found
/// by the start-up scan that nothing samples, a 42 MB `cargo`, could hold
/// up librustc_driver for hundreds of milliseconds; two, because `rustc`
/// samples two large objects at once, librustc_driver and libLLVM, and the
/// one built second would get no early pages until the first is done), and
/// one for small objects only.
const BUILD_THREADS: [(&str, Worker); 4] = [
    (
        "unwind-tables",
        Worker::Build {
            max_bytes: u64::MAX,
            min_priority: 0,
        },
    ),
    (
        "unwind-sampled",
        Worker::Build {
            max_bytes: u64::MAX,
            min_priority: 1,
        },
    ),
    (
        "unwind-sampled",
        Worker::Build {
            max_bytes: u64::MAX,
            min_priority: 1,
        },
    ),
    (
        "unwind-small",
        Worker::Build {
            max_bytes: SMALL_OBJECT_BYTES,
            min_priority: 0,
        },
    ),
];

/// A table built (or the reason it could not be).
pub(super) struct BuildResult {
    /// The object, as in its [`BuildRequest`].
    pub(super) object_id: u32,
    /// Its name in messages.
    pub(super) name: String,
    /// The table.
    pub(super) table: Result<UnwindTable>,
    /// From queuing to the thread that produced `table` taking the request
    /// (a cache lookup that missed included).
    pub(super) waited: Duration,
    /// That thread's work: reading the cached table, or building (and
    /// storing) it, mapping the file and finding its key included.
    pub(super) took: Duration,
    /// Whether `table` was read from the cache (else built).
    pub(super) from_cache: bool,
    /// Whether `table` holds only the pages samples wait on, sent ahead of
    /// the full table (which follows).
    pub(super) early: bool,
}

/// A request with its priority and arrival order.
pub(super) type Popped = (u64, u64, BuildRequest);

/// Tables waiting to be read or built, most wanted first: the priority of a
/// request grows with every sample that needed its table before it loaded.
#[derive(Default)]
pub(super) struct BuildQueue {
    pending: Mutex<PendingBuilds>,
    ready: Condvar,
}

#[derive(Default)]
struct PendingBuilds {
    /// object id -> (priority, arrival order, request)
    requests: HashMap<u32, Popped>,
    arrivals: u64,
    closed: bool,
}

impl BuildQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, PendingBuilds> {
        // A panic while holding the lock leaves plain data behind: keep going.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue `request` with a starting `priority`.
    pub(super) fn push(&self, request: BuildRequest, priority: u64) {
        let mut pending = self.lock();
        pending.arrivals += 1;
        let order = pending.arrivals;
        pending
            .requests
            .insert(request.object_id, (priority, order, request));
        // Wake every thread: only some may take this request.
        self.ready.notify_all();
    }

    /// Queue again a request taken by [`Self::pop`] (a cache miss, for the
    /// build threads), keeping its priority and place in arrival order.
    fn requeue(&self, popped: Popped) {
        // A newer request for the same object (queued again after an
        // eviction while this one was being looked up) is kept.
        let id = popped.2.object_id;
        self.lock().requests.entry(id).or_insert(popped);
        self.ready.notify_all();
    }

    /// Raise the priority of `object_id`'s request, if it is still waiting.
    /// The first bump wakes the threads that take only sampled objects.
    pub(super) fn bump(&self, object_id: u32) {
        if let Some(entry) = self.lock().requests.get_mut(&object_id) {
            entry.0 += 1;
            if entry.0 == 1 {
                self.ready.notify_all();
            }
        }
    }

    /// The most wanted request (highest priority, then oldest) that `takes`
    /// accepts, with its priority and arrival order, waiting for one;
    /// `None` once closed.
    pub(super) fn pop(&self, takes: impl Fn(u64, &BuildRequest) -> bool) -> Option<Popped> {
        let mut pending = self.lock();
        loop {
            if pending.closed {
                return None;
            }
            let best = pending
                .requests
                .iter()
                .filter(|(_, (priority, _, request))| takes(*priority, request))
                .max_by_key(|(_, (priority, order, _))| (*priority, std::cmp::Reverse(*order)))
                .map(|(&id, _)| id);
            if let Some(id) = best {
                return pending.requests.remove(&id);
            }
            pending = self.ready.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stop: the threads waiting in [`Self::pop`] get `None`.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// Start the threads that take `queue`'s requests and send their tables to
/// `results`: cache threads when there is a `cache_dir`, build threads.
/// Requests must then start at [`Stage::Lookup`] exactly when `cache_dir`
/// is given. Separate debug files are looked up under `debug_dirs`.
pub(super) fn start_workers(
    queue: &Arc<BuildQueue>,
    results: &Sender<BuildResult>,
    cache_dir: Option<PathBuf>,
    debug_dirs: Arc<[PathBuf]>,
) -> Result<()> {
    let mut workers: Vec<(&str, Worker)> = Vec::new();
    if cache_dir.is_some() {
        workers.extend(std::iter::repeat_n(
            ("unwind-cache", Worker::Cache),
            CACHE_THREADS,
        ));
    }
    workers.extend(BUILD_THREADS);
    for (name, worker) in workers {
        let (queue, results, cache_dir) = (queue.clone(), results.clone(), cache_dir.clone());
        let debug_dirs = debug_dirs.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || match worker {
                Worker::Cache => cache_worker(&queue, &results, cache_dir.as_deref()),
                Worker::Build { .. } => {
                    build_worker(&queue, worker, &results, cache_dir.as_deref(), &debug_dirs)
                }
            })
            .with_context(|| format!("starting the {name} thread"))?;
    }
    Ok(())
}

/// Map an object file read-only. Mapping instead of reading keeps the
/// profiler's memory small: only the pages the build touches (ELF headers,
/// notes, `.eh_frame`) become resident, and only until the mapping is
/// dropped, where reading would copy the whole file (153 MB for
/// librustc_driver). As for every mapped file (and for the profiled
/// process itself), truncating the file in place while it is mapped would
/// fault; package managers and linkers replace files instead.
fn map_object(path: &Path) -> std::io::Result<(std::fs::File, memmap2::Mmap)> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the mapping is private and read-only; see above for the one
    // way it can fault (the file truncated while mapped).
    let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }?;
    Ok((file, map))
}

/// The cache key of `source`'s object to look up in `dir`: its build ID,
/// else for a file the content hash remembered for it
/// ([`super::stat_keys`]), else `None` (the file is to be built first).
fn lookup_key(dir: &Path, source: &TableSource) -> Result<Option<ObjectKey>> {
    Ok(match source {
        TableSource::File { open, path } => {
            let (file, bytes) =
                map_object(open).with_context(|| format!("reading {}", path.display()))?;
            ObjectKey::by_build_id(&bytes).or_else(|| stat_keys::find(dir, &file.metadata().ok()?))
        }
        TableSource::Bytes(bytes) => Some(ObjectKey::for_object(bytes)),
    })
}

/// A cache thread: reads the cached tables of `queue`'s lookups; a miss
/// goes back to the queue, with its priority, for the build threads.
fn cache_worker(queue: &BuildQueue, results: &Sender<BuildResult>, cache_dir: Option<&Path>) {
    let Some(dir) = cache_dir else { return };
    while let Some((priority, order, mut request)) = queue.pop(|p, r| Worker::Cache.takes(p, r)) {
        let started = Instant::now();
        let lookup = lookup_key(dir, &request.source).map(|key| {
            key.map(|key| {
                let found = cache::load(dir, &key);
                (key, found)
            })
        });
        let table = match lookup {
            Ok(None) => {
                request.stage = Stage::Build(Some(Store::KeyAfterBuild));
                queue.requeue((priority, order, request));
                continue;
            }
            Ok(Some((key, Err(reason)))) => {
                request.stage = Stage::Build(Some(Store::Key(key, reason)));
                queue.requeue((priority, order, request));
                continue;
            }
            Ok(Some((key, Ok(table)))) => {
                debug!("unwind table {key}: {:?}", cache::CacheOutcome::Hit);
                Ok(table)
            }
            Err(err) => Err(err),
        };
        if !send(results, request, table, started, true) {
            return;
        }
    }
}

/// A build thread: builds the tables of `queue`'s requests that `worker`
/// takes until it is closed, storing them in `cache_dir`.
fn build_worker(
    queue: &BuildQueue,
    worker: Worker,
    results: &Sender<BuildResult>,
    cache_dir: Option<&Path>,
    debug_dirs: &[PathBuf],
) {
    while let Some((_, _, mut request)) = queue.pop(|p, r| worker.takes(p, r)) {
        let started = Instant::now();
        let missed = match std::mem::replace(&mut request.stage, Stage::Build(None)) {
            Stage::Build(missed) => missed,
            Stage::Lookup => None,
        };
        let early = Early {
            request: &request,
            results,
            started,
        };
        let table = build(&request.source, cache_dir.zip(missed), &early, debug_dirs);
        if !send(results, request, table, started, false) {
            return;
        }
    }
}

/// `source`'s table, built; stored in the cache directory when `store`
/// holds it, as its [`Store`] says.
fn build(
    source: &TableSource,
    store: Option<(&Path, Store)>,
    early: &dyn EarlySink,
    debug_dirs: &[PathBuf],
) -> Result<UnwindTable> {
    let mapped;
    let (elf, path): (&[u8], Option<&Path>) = match source {
        TableSource::File { open, path } => {
            mapped = map_object(open).with_context(|| format!("reading {}", path.display()))?;
            (&mapped.1, Some(path))
        }
        TableSource::Bytes(bytes) => (bytes, None),
    };
    let build = || crate::unwind::cfi::build_table_early(path, elf, early, debug_dirs);
    let Some((dir, store)) = store else {
        return Ok(build()?);
    };
    let (key, reason, table) = match store {
        Store::Key(key, reason) => (key, reason, None),
        Store::KeyAfterBuild => {
            let table = build()?;
            let key = match source {
                TableSource::File { open, path } => {
                    let file = std::fs::File::open(open)
                        .with_context(|| format!("reading {}", path.display()))?;
                    let key = crate::unwind::object_key_at(&file, elf);
                    if let Err(err) = file
                        .metadata()
                        .and_then(|meta| stat_keys::remember(dir, &meta, &key))
                    {
                        debug!("cannot remember the key {key}: {err}");
                    }
                    key
                }
                TableSource::Bytes(bytes) => ObjectKey::for_object(bytes),
            };
            (key, CacheError::Missing, Some(table))
        }
    };
    let (table, outcome) = match table {
        Some(table) => cache::build_and_store(dir, &key, reason, || {
            Ok::<_, crate::unwind::BuildError>(table)
        })?,
        None => cache::build_and_store(dir, &key, reason, build)?,
    };
    debug!("unwind table {key}: {outcome:?}");
    Ok(table)
}

/// Send `request`'s `table`, produced by work that began at `started`, to
/// `results`. False when nobody receives any more.
fn send(
    results: &Sender<BuildResult>,
    request: BuildRequest,
    table: Result<UnwindTable>,
    started: Instant,
    from_cache: bool,
) -> bool {
    let result = BuildResult {
        object_id: request.object_id,
        name: request.name,
        table,
        waited: started.duration_since(request.queued),
        took: started.elapsed(),
        from_cache,
        early: false,
    };
    results.send(result).is_ok()
}

/// Sends the pages a build's request waits on ahead of its table.
struct Early<'r> {
    request: &'r BuildRequest,
    results: &'r Sender<BuildResult>,
    /// When the build began.
    started: Instant,
}

impl EarlySink for Early<'_> {
    fn wanted(&self) -> Vec<u32> {
        self.request.wanted.take()
    }

    fn publish(&self, pages: UnwindTable) {
        // A closed channel ends the build thread after this build.
        let _ = self.results.send(BuildResult {
            object_id: self.request.object_id,
            name: self.request.name.clone(),
            table: Ok(pages),
            waited: self.started.duration_since(self.request.queued),
            took: self.started.elapsed(),
            from_cache: false,
            early: true,
        });
    }
}

#[cfg(test)]
#[path = "build_queue_tests.rs"]
mod tests;
