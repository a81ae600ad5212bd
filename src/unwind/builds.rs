//! Unwind tables are built on background threads, so that sampling never
//! waits: a queue of requests, most wanted first, and the threads that take
//! them (one for any object, one for small objects only), map each object,
//! and build its table or read it from the disk cache.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};

use anyhow::{Context, Result};

use crate::unwind::UnwindTable;

/// Where a table's CFI comes from.
pub(super) enum TableSource {
    /// An object file: `open` reads it (`/proc/self/fd/N`), `path` is where
    /// the process saw it (to find its separate debug file).
    File { open: PathBuf, path: PathBuf },
    /// An in-memory ELF image (the vDSO, read from a process's memory).
    Bytes(Vec<u8>),
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
}

/// Objects up to this size (bytes) also go to a second build thread, which
/// builds nothing bigger: a small program sampled at start does not wait
/// behind a large shared object (librustc_driver, 153 MB, takes seconds).
pub const SMALL_OBJECT_BYTES: u64 = 16 << 20;

/// A table built (or the reason it could not be).
pub(super) struct BuildResult {
    /// The object, as in its [`BuildRequest`].
    pub(super) object_id: u32,
    /// Its name in messages.
    pub(super) name: String,
    /// The table.
    pub(super) table: Result<UnwindTable>,
}

/// Tables waiting to be built, most wanted first: the priority of a
/// request grows with every sample that needed its table before it loaded.
/// Two threads take requests: one takes any, the other only objects of at
/// most [`SMALL_OBJECT_BYTES`].
#[derive(Default)]
pub(super) struct BuildQueue {
    pending: Mutex<PendingBuilds>,
    ready: Condvar,
}

#[derive(Default)]
struct PendingBuilds {
    /// object id -> (priority, arrival order, request)
    requests: HashMap<u32, (u64, u64, BuildRequest)>,
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
        // Wake both threads: the one that waits for small objects may be
        // the only one free, or the only one that must not take this.
        self.ready.notify_all();
    }

    /// Raise the priority of `object_id`'s request, if it is still waiting.
    pub(super) fn bump(&self, object_id: u32) {
        if let Some(entry) = self.lock().requests.get_mut(&object_id) {
            entry.0 += 1;
        }
    }

    /// The most wanted request (highest priority, then oldest) for an
    /// object of at most `max_bytes`, waiting for one; `None` once closed.
    pub(super) fn pop(&self, max_bytes: u64) -> Option<BuildRequest> {
        let mut pending = self.lock();
        loop {
            if pending.closed {
                return None;
            }
            let best = pending
                .requests
                .iter()
                .filter(|(_, (_, _, request))| request.bytes <= max_bytes)
                .max_by_key(|(_, (priority, order, _))| (*priority, std::cmp::Reverse(*order)))
                .map(|(&id, _)| id);
            if let Some(id) = best {
                return pending.requests.remove(&id).map(|(_, _, r)| r);
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

/// Map an object file read-only. Mapping instead of reading keeps the
/// profiler's memory small: only the pages the build touches (ELF headers,
/// notes, `.eh_frame`) become resident, and only until the mapping is
/// dropped, where reading would copy the whole file (153 MB for
/// librustc_driver). As for every mapped file (and for the profiled
/// process itself), truncating the file in place while it is mapped would
/// fault; package managers and linkers replace files instead.
fn map_object(path: &std::path::Path) -> std::io::Result<(std::fs::File, memmap2::Mmap)> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the mapping is private and read-only; see above for the one
    // way it can fault (the file truncated while mapped).
    let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }?;
    Ok((file, map))
}

/// A build thread: builds the tables of objects of at most `max_bytes`
/// from `queue` until it is closed.
pub(super) fn build_worker(
    queue: Arc<BuildQueue>,
    max_bytes: u64,
    results: Sender<BuildResult>,
    cache_dir: Option<PathBuf>,
) {
    while let Some(request) = queue.pop(max_bytes) {
        let table = match request.source {
            TableSource::File { open, path } => map_object(&open)
                .with_context(|| format!("reading {}", path.display()))
                .and_then(|(file, bytes)| {
                    crate::unwind::cached_table_at(cache_dir.as_deref(), &path, &file, &bytes)
                }),
            TableSource::Bytes(bytes) => crate::unwind::cached_table(cache_dir.as_deref(), &bytes),
        };
        let result = BuildResult {
            object_id: request.object_id,
            name: request.name,
            table,
        };
        if results.send(result).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn request(object_id: u32, bytes: u64) -> BuildRequest {
        BuildRequest {
            object_id,
            name: format!("object {object_id}"),
            source: TableSource::Bytes(Vec::new()),
            bytes,
        }
    }

    #[test]
    fn queue_gives_the_small_object_thread_only_small_objects() {
        let queue = BuildQueue::default();
        queue.push(request(1, 150 << 20), 5);
        queue.push(request(2, 20 << 10), 1);
        queue.push(request(3, 30 << 10), 1);
        // Most wanted first; equal priorities in arrival order.
        assert_eq!(queue.pop(SMALL_OBJECT_BYTES).unwrap().object_id, 2);
        queue.bump(3);
        assert_eq!(queue.pop(u64::MAX).unwrap().object_id, 1);
        assert_eq!(queue.pop(u64::MAX).unwrap().object_id, 3);
        // A thread waiting for small objects does not take a big one.
        queue.push(request(4, 150 << 20), 9);
        let queue = Arc::new(queue);
        let small = {
            let queue = queue.clone();
            thread::spawn(move || queue.pop(SMALL_OBJECT_BYTES).map(|r| r.object_id))
        };
        queue.push(request(5, 1 << 20), 0);
        assert_eq!(small.join().unwrap(), Some(5));
        queue.close();
        assert!(queue.pop(u64::MAX).is_none());
    }
}
