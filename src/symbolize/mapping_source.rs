//! What symbolization reads about mappings and objects, behind one trait, so
//! that a window can be symbolized either straight from the live
//! [`ProcessTracker`] (single-profile runs) or, on a worker thread while
//! sampling goes on, from a [`TrackerSnapshot`] of just the mappings and
//! objects the window's stacks use.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::debug;

use crate::process::jit::{JitFile, JitSlot};
use crate::process::{Mapping, MappingId, ObjectId, ProcessTracker};
use crate::profile::aggregate::Aggregator;

/// Mappings and objects by id, as [`crate::symbolize::Symbolizer::build_profile`]
/// needs them. Every lookup answers `None` for an id the source does not
/// (or no longer) know; the symbolizer leaves such frames unsymbolized.
pub trait MappingSource {
    /// The mapping `id`.
    fn mapping(&self, id: MappingId) -> Option<&Mapping>;
    /// Path of object `id` as the process saw it (for names and messages).
    fn object_path(&self, id: ObjectId) -> Option<&str>;
    /// A path that opens exactly object `id` from the profiler (`/proc/self/fd/N`).
    fn object_open_path(&self, id: ObjectId) -> Option<&Path>;
    /// GNU build ID of object `id`, if it has one.
    fn object_build_id(&self, id: ObjectId) -> Option<&[u8]>;
    /// Process `pid`'s JIT perf map, if the tracker opened one (a regular
    /// file the process controls: read it with [`crate::process::untrusted`]).
    fn perf_map(&self, pid: u32) -> Option<&JitFile>;
    /// Process `pid`'s jitdump file, if the tracker opened one (as
    /// [`Self::perf_map`]).
    fn jitdump(&self, pid: u32) -> Option<&JitFile>;
    /// The container process `pid` ran in, when the tracker knows one.
    fn container_id(&self, pid: u32) -> Option<&Arc<str>>;
}

impl MappingSource for ProcessTracker {
    fn mapping(&self, id: MappingId) -> Option<&Mapping> {
        ProcessTracker::mapping(self, id)
    }
    fn object_path(&self, id: ObjectId) -> Option<&str> {
        Some(&self.object(id)?.path)
    }
    fn object_open_path(&self, id: ObjectId) -> Option<&Path> {
        Some(&self.object(id)?.open_path)
    }
    fn object_build_id(&self, id: ObjectId) -> Option<&[u8]> {
        self.object(id)?.build_id.as_deref()
    }
    fn perf_map(&self, pid: u32) -> Option<&JitFile> {
        ProcessTracker::perf_map(self, pid)?.get()
    }
    fn jitdump(&self, pid: u32) -> Option<&JitFile> {
        ProcessTracker::jitdump(self, pid)?.get()
    }
    fn container_id(&self, pid: u32) -> Option<&Arc<str>> {
        ProcessTracker::container_id(self, pid)
    }
}

/// An object kept readable for symbolization on another thread: its own
/// duplicate of the tracker's file descriptor, so it stays open (and its
/// `/proc/self/fd/N` path stays the same, which keeps blazesym's per-path
/// caches warm from window to window) whatever the tracker does meanwhile.
#[derive(Debug)]
pub struct SnapshotObject {
    path: String,
    open_path: PathBuf,
    build_id: Option<Vec<u8>>,
    _file: Option<File>,
}

/// Objects already duplicated for earlier windows, by id. Kept by the run
/// loop for the whole run (one descriptor per object sampled).
pub type ObjectCache = HashMap<ObjectId, Arc<SnapshotObject>>;

/// The mappings and objects one window's stacks refer to, copied out of the
/// tracker so that the window can be symbolized on another thread.
#[derive(Debug, Default)]
pub struct TrackerSnapshot {
    mappings: HashMap<MappingId, Mapping>,
    objects: HashMap<ObjectId, Arc<SnapshotObject>>,
    /// The open perf maps of the window's processes (shared with the
    /// tracker: each stays open, at the same path, while either holds it).
    perf_maps: HashMap<u32, Arc<JitSlot>>,
    /// The open jitdump files of the window's processes (shared likewise).
    jitdumps: HashMap<u32, Arc<JitSlot>>,
    /// The containers of the window's processes that ran in one.
    containers: HashMap<u32, Arc<str>>,
    missing_samples: u64,
}

impl TrackerSnapshot {
    /// Add what `later` (the snapshot of a window closed after this one's)
    /// holds, for a window that absorbed its successor
    /// ([`crate::profile::window::ClosedWindow::absorb`]). Mappings and
    /// objects are keyed by their run-wide ids; a process's perf map or
    /// jitdump is `later`'s where both have one.
    pub fn absorb(&mut self, later: TrackerSnapshot) {
        self.mappings.extend(later.mappings);
        self.objects.extend(later.objects);
        self.perf_maps.extend(later.perf_maps);
        self.jitdumps.extend(later.jitdumps);
        self.containers.extend(later.containers);
        self.missing_samples += later.missing_samples;
    }

    /// Copy what `aggregator`'s stacks need from `tracker`. Objects are
    /// taken from `cache` or duplicated into it (if duplicating a descriptor
    /// fails, the tracker's own path is used). A mapping the tracker no
    /// longer holds (retired) is left out: its frames stay unsymbolized and
    /// their samples are counted in [`Self::missing_samples`].
    pub fn capture(
        aggregator: &Aggregator,
        tracker: &ProcessTracker,
        cache: &mut ObjectCache,
    ) -> Self {
        let mut snapshot = TrackerSnapshot::default();
        for (key, _) in aggregator.stacks() {
            let opened = |slot: Option<&Arc<JitSlot>>| slot.filter(|s| s.get().is_some()).cloned();
            if let Some(perf_map) = opened(tracker.perf_map(key.pid)) {
                snapshot.perf_maps.insert(key.pid, perf_map);
            }
            if let Some(jitdump) = opened(tracker.jitdump(key.pid)) {
                snapshot.jitdumps.insert(key.pid, jitdump);
            }
            if let Some(id) = tracker.container_id(key.pid) {
                snapshot.containers.insert(key.pid, id.clone());
            }
        }
        let mut missing = HashSet::new();
        for id in aggregator.user_frames().filter_map(|f| f.mapping) {
            if snapshot.mappings.contains_key(&id) || missing.contains(&id) {
                continue;
            }
            let Some(mapping) = tracker.mapping(id) else {
                missing.insert(id);
                continue;
            };
            if let Some(object) = mapping.object {
                let entry = match cache.entry(object) {
                    Entry::Occupied(e) => Some(e.get().clone()),
                    Entry::Vacant(v) => {
                        duplicate(tracker, object).map(|dup| v.insert(Arc::new(dup)).clone())
                    }
                };
                if let Some(entry) = entry {
                    snapshot.objects.insert(object, entry);
                }
            }
            snapshot.mappings.insert(id, mapping.clone());
        }
        if !missing.is_empty() {
            snapshot.missing_samples = aggregator
                .stacks()
                .filter(|(key, _)| {
                    key.user()
                        .any(|f| f.mapping.is_some_and(|m| missing.contains(&m)))
                })
                .map(|(_, count)| count)
                .sum();
        }
        // Objects no window in flight uses go (with their descriptors), so
        // the cache does not grow with every object ever sampled.
        cache.retain(|id, object| {
            snapshot.objects.contains_key(id) || Arc::strong_count(object) > 1
        });
        snapshot
    }

    /// Samples with a user frame whose mapping the tracker had already
    /// retired when the snapshot was taken (each such frame is left
    /// unsymbolized).
    pub fn missing_samples(&self) -> u64 {
        self.missing_samples
    }
}

fn duplicate(tracker: &ProcessTracker, id: ObjectId) -> Option<SnapshotObject> {
    let object = tracker.object(id)?;
    let (open_path, file) = match object.file.try_clone() {
        Ok(file) => (
            PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
            Some(file),
        ),
        Err(err) => {
            debug!("{}: cannot duplicate its descriptor: {err}", object.path);
            (object.open_path.clone(), None)
        }
    };
    Some(SnapshotObject {
        path: object.path.clone(),
        open_path,
        build_id: object.build_id.clone(),
        _file: file,
    })
}

impl MappingSource for TrackerSnapshot {
    fn mapping(&self, id: MappingId) -> Option<&Mapping> {
        self.mappings.get(&id)
    }
    fn object_path(&self, id: ObjectId) -> Option<&str> {
        Some(&self.objects.get(&id)?.path)
    }
    fn object_open_path(&self, id: ObjectId) -> Option<&Path> {
        Some(&self.objects.get(&id)?.open_path)
    }
    fn object_build_id(&self, id: ObjectId) -> Option<&[u8]> {
        self.objects.get(&id)?.build_id.as_deref()
    }
    fn perf_map(&self, pid: u32) -> Option<&JitFile> {
        self.perf_maps.get(&pid)?.get()
    }
    fn jitdump(&self, pid: u32) -> Option<&JitFile> {
        self.jitdumps.get(&pid)?.get()
    }
    fn container_id(&self, pid: u32) -> Option<&Arc<str>> {
        self.containers.get(&pid)
    }
}
