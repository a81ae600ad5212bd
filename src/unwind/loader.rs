//! Keeps the BPF walker supplied: describes each sampled process's
//! executable mappings to it (`process_mappings` map) and loads the unwind
//! tables of the objects they map (`unwind_rows`, `unwind_pages`,
//! `loaded_objects`), built on background threads so sampling never waits.
//!
//! Tables are keyed by object and shared by every process mapping it. Their
//! rows live in one array map sized by the memory budget
//! (`--max-unwind-info-mb`); each object gets a contiguous range. When a
//! table does not fit, the least recently sampled objects are evicted (and
//! counted) until it does. Process events from BPF (exec, exit, a pc in an
//! unknown mapping) keep the descriptions current without rescanning /proc.

use rustc_hash::{FxHashMap, FxHashSet};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread;

use anyhow::{Context, Result};
use tracing::{debug, info, warn};

use crate::process::{ObjectId, ProcessTracker};
use crate::profile::aggregate::UserFrame;
use crate::sample::RawSample;
use crate::sampler::Sampler;
use crate::unwind::builds::{build_worker, BuildQueue, BuildRequest, BuildResult, TableSource};
use crate::unwind::row::Page;
use crate::unwind::UnwindTable;

mod describe;

/// Object id of the vDSO's table (the same image for every process of a kernel).
pub const VDSO_OBJECT_ID: u32 = u32::MAX - 1;

pub use crate::unwind::builds::SMALL_OBJECT_BYTES;

enum TableState {
    Building,
    Loaded {
        base: u32,
        rows: u32,
        pages: Vec<Page>,
    },
    /// Removed to make room; rebuilt when sampled again.
    Evicted,
    /// Could not be built or loaded; the walker falls back to frame pointers.
    Failed,
}

struct ObjectTable {
    state: TableState,
    last_used: u64,
}

/// The tables the start-up scan asked for.
struct StartupWatch {
    /// When sampling started.
    started: std::time::Instant,
    /// Processes described by the scan.
    processes: usize,
    /// Objects whose tables their walks use.
    objects: FxHashSet<u32>,
}

/// Counters of the table manager.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnwindLoaderStats {
    /// Tables built (or read from the disk cache) and loaded.
    pub tables_loaded: u64,
    /// Tables that could not be built (no CFI is not a failure: that table is empty).
    pub build_failures: u64,
    /// Tables evicted to stay within the budget.
    pub evictions: u64,
    /// Rows currently loaded.
    pub rows_loaded: u64,
    /// Processes currently described to the walker.
    pub processes: u64,
}

/// First-fit allocator of row ranges in the `unwind_rows` map.
#[derive(Debug)]
struct RowAllocator {
    /// Free ranges `(start, len)`, sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
}

impl RowAllocator {
    fn new(capacity: u32) -> Self {
        RowAllocator {
            free: vec![(0, capacity)],
        }
    }

    fn allocate(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    fn release(&mut self, start: u32, len: u32) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the next, then the previous range.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

/// Supplies the BPF walker with process descriptions and unwind tables.
pub struct UnwindLoader {
    capacity_rows: u32,
    allocator: RowAllocator,
    tables: FxHashMap<u32, ObjectTable>,
    described: FxHashSet<u32>,
    /// Objects whose files the exec and mmap programs know (`object_files`).
    registered_files: FxHashSet<u32>,
    /// Processes the start-up scan has still to describe (popped from the end).
    to_scan: Vec<u32>,
    /// Until the tables of the processes running at start are all in.
    startup: Option<StartupWatch>,
    clock: u64,
    queue: Arc<BuildQueue>,
    results: Receiver<BuildResult>,
    stats: UnwindLoaderStats,
}

impl Drop for UnwindLoader {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl UnwindLoader {
    /// A loader for a walker whose `unwind_rows` map holds `capacity_rows`
    /// rows. Tables are cached on disk under `cache_dir` when given.
    /// Starts the two background build threads (see [`SMALL_OBJECT_BYTES`]).
    pub fn new(capacity_rows: u32, cache_dir: Option<PathBuf>) -> Result<Self> {
        let queue = Arc::new(BuildQueue::default());
        let (result_tx, result_rx) = mpsc::channel();
        for (name, max_bytes) in [
            ("unwind-tables", u64::MAX),
            ("unwind-small", SMALL_OBJECT_BYTES),
        ] {
            let (queue, results, cache_dir) = (queue.clone(), result_tx.clone(), cache_dir.clone());
            thread::Builder::new()
                .name(name.into())
                .spawn(move || build_worker(queue, max_bytes, results, cache_dir))
                .with_context(|| format!("starting the {name} thread"))?;
        }
        Ok(UnwindLoader {
            capacity_rows,
            allocator: RowAllocator::new(capacity_rows),
            tables: FxHashMap::default(),
            described: FxHashSet::default(),
            registered_files: FxHashSet::default(),
            to_scan: Vec::new(),
            startup: None,
            clock: 0,
            queue,
            results: result_rx,
            stats: UnwindLoaderStats::default(),
        })
    }

    /// Current counters.
    pub fn stats(&self) -> UnwindLoaderStats {
        UnwindLoaderStats {
            processes: self.described.len() as u64,
            ..self.stats
        }
    }

    /// Start the start-up scan: every process in `/proc` (or only `pids`,
    /// when not empty) is to be described to the walker and its tables
    /// queued, a few at a time by [`Self::continue_scan`], so that the
    /// caller keeps draining samples meanwhile.
    pub fn scan_processes(&mut self, pids: &[u32], sampling_started: std::time::Instant) {
        let all: Vec<u32> = if pids.is_empty() {
            std::fs::read_dir("/proc")
                .map(|dir| {
                    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            pids.to_vec()
        };
        self.to_scan = all;
        self.to_scan.reverse();
        self.startup = Some(StartupWatch {
            started: sampling_started,
            processes: 0,
            objects: FxHashSet::default(),
        });
    }

    /// Go on with the start-up scan for at most about `budget`. Returns
    /// whether processes remain to be scanned.
    pub fn continue_scan(
        &mut self,
        tracker: &mut ProcessTracker,
        sampler: &Sampler<'_>,
        budget: std::time::Duration,
    ) -> bool {
        let started = std::time::Instant::now();
        while started.elapsed() < budget {
            let Some(pid) = self.to_scan.pop() else {
                break;
            };
            if !self.described.contains(&pid) {
                let objects = self.describe(pid, tracker, sampler);
                if let Some(watch) = self.startup.as_mut() {
                    watch.processes += usize::from(!objects.is_empty());
                    watch.objects.extend(objects);
                }
            }
        }
        self.report_startup();
        !self.to_scan.is_empty()
    }

    /// Log, once, when the scan is over and every table it asked for is
    /// loaded or failed: the time from the start of sampling until every
    /// process running at start is walked by its tables.
    fn report_startup(&mut self) {
        let Some(watch) = &self.startup else {
            return;
        };
        if !self.to_scan.is_empty() {
            return;
        }
        let mut failed = 0;
        for object in &watch.objects {
            match self.tables.get(object).map(|t| &t.state) {
                Some(TableState::Building) => return,
                Some(TableState::Failed) => failed += 1,
                _ => {}
            }
        }
        info!(
            "start-up: unwind tables of the {} objects of the {} processes running at start are ready after {} ms ({failed} without a table)",
            watch.objects.len(),
            watch.processes,
            watch.started.elapsed().as_millis()
        );
        self.startup = None;
    }

    /// Account for one sample whose user frames `frames` are resolved
    /// ([`crate::profile::aggregate::resolve`]): describe its process if
    /// new, and mark the objects on its stack as recently used (re-queuing
    /// evicted tables).
    pub fn on_sample(
        &mut self,
        sample: &RawSample,
        frames: &[UserFrame],
        tracker: &mut ProcessTracker,
        sampler: &Sampler<'_>,
    ) {
        if sample.kernel_thread {
            return;
        }
        if !self.described.contains(&sample.pid) {
            self.describe(sample.pid, tracker, sampler);
        }
        self.clock += 1;
        let mut previous = None;
        for frame in frames {
            // Consecutive frames are often in the same mapping.
            if frame.mapping.is_none() || frame.mapping == previous {
                continue;
            }
            previous = frame.mapping;
            let Some(object) = frame.mapping.and_then(|m| tracker.mapping(m)?.object) else {
                continue;
            };
            let now = self.clock;
            match self.tables.get_mut(&object.0) {
                Some(t) => {
                    t.last_used = now;
                    match t.state {
                        TableState::Building => self.queue.bump(object.0),
                        TableState::Evicted => {
                            if let Some(source) = file_source(tracker, object) {
                                self.request(object.0, tracker, source, 1)
                            }
                        }
                        TableState::Loaded { .. } | TableState::Failed => {}
                    }
                }
                None => {
                    if let Some(source) = file_source(tracker, object) {
                        self.request(object.0, tracker, source, 1)
                    }
                }
            }
        }
    }

    /// Queue a build of `object_id`'s table with a starting `priority`
    /// (0: found by a scan, 1: needed by a sample).
    fn request(
        &mut self,
        object_id: u32,
        tracker: &ProcessTracker,
        source: TableSource,
        priority: u64,
    ) {
        let name = if object_id == VDSO_OBJECT_ID {
            "[vdso]".to_string()
        } else {
            tracker
                .object(ObjectId(object_id))
                .map_or_else(|| format!("object {object_id}"), |o| o.path.clone())
        };
        self.tables.insert(
            object_id,
            ObjectTable {
                state: TableState::Building,
                last_used: self.clock,
            },
        );
        let bytes = match &source {
            TableSource::File { open, .. } => std::fs::metadata(open).map_or(0, |m| m.len()),
            TableSource::Bytes(image) => image.len() as u64,
        };
        self.queue.push(
            BuildRequest {
                object_id,
                name,
                source,
                bytes,
            },
            priority,
        );
    }

    /// Whether a table is being built: the caller should then call
    /// [`Self::load_ready_tables`] soon (within milliseconds, not its usual
    /// poll period), since samples needing it are walked by frame pointers
    /// and counted as `no_table` until it is loaded.
    pub fn builds_pending(&self) -> bool {
        self.tables
            .values()
            .any(|t| matches!(t.state, TableState::Building))
    }

    /// Load the tables the background threads have finished. Call often.
    pub fn load_ready_tables(&mut self, sampler: &Sampler<'_>) {
        while let Ok(result) = self.results.try_recv() {
            match result.table {
                Ok(table) => {
                    if let Err(err) = self.load(result.object_id, &result.name, &table, sampler) {
                        warn!("{}: cannot load its unwind table: {err:#}", result.name);
                        self.set_state(result.object_id, TableState::Failed);
                    }
                }
                Err(err) => {
                    // Walks through this object fall back to frame pointers:
                    // an object marked loaded without pages has no CFI rows.
                    debug!(
                        "{}: no unwind table, frame pointers will be used: {err:#}",
                        result.name
                    );
                    self.stats.build_failures += 1;
                    if let Err(err) = sampler.set_object_loaded(result.object_id, true) {
                        warn!("{err:#}");
                    }
                    self.set_state(result.object_id, TableState::Failed);
                }
            }
        }
        self.report_startup();
    }

    fn set_state(&mut self, object_id: u32, state: TableState) {
        if let Some(t) = self.tables.get_mut(&object_id) {
            t.state = state;
        }
    }

    fn load(
        &mut self,
        object_id: u32,
        name: &str,
        table: &UnwindTable,
        sampler: &Sampler<'_>,
    ) -> Result<()> {
        let rows = table.rows().len() as u32;
        if rows > self.capacity_rows {
            anyhow::bail!(
                "its {rows} rows exceed the whole unwind-table budget of {} rows (raise --max-unwind-info-mb)",
                self.capacity_rows
            );
        }
        let base = loop {
            if rows == 0 {
                break 0;
            }
            if let Some(base) = self.allocator.allocate(rows) {
                break base;
            }
            if !self.evict_least_recently_used(object_id, sampler) {
                anyhow::bail!("no room for {rows} rows even after eviction");
            }
        };
        sampler.write_rows(base, table.rows())?;
        sampler.insert_pages(object_id, table.pages(), base)?;
        sampler.set_object_loaded(object_id, true)?;
        debug!(
            "{name}: loaded {rows} rows in {} pages at row {base}",
            table.pages().len()
        );
        self.stats.tables_loaded += 1;
        self.stats.rows_loaded += u64::from(rows);
        self.set_state(
            object_id,
            TableState::Loaded {
                base,
                rows,
                pages: table.pages().to_vec(),
            },
        );
        Ok(())
    }

    /// Evict the least recently used loaded table other than `keep`. False if none.
    fn evict_least_recently_used(&mut self, keep: u32, sampler: &Sampler<'_>) -> bool {
        let victim = self
            .tables
            .iter()
            .filter(|(&id, t)| id != keep && matches!(t.state, TableState::Loaded { .. }))
            .min_by_key(|(_, t)| t.last_used)
            .map(|(&id, _)| id);
        let Some(id) = victim else { return false };
        let Some(table) = self.tables.get_mut(&id) else {
            return false;
        };
        if let TableState::Loaded { base, rows, pages } =
            std::mem::replace(&mut table.state, TableState::Evicted)
        {
            let _ = sampler.set_object_loaded(id, false);
            sampler.remove_pages(id, &pages);
            if rows > 0 {
                self.allocator.release(base, rows);
            }
            self.stats.rows_loaded -= u64::from(rows);
        }
        self.stats.evictions += 1;
        true
    }
}

fn file_source(tracker: &ProcessTracker, object: ObjectId) -> Option<TableSource> {
    let file = tracker.object(object)?;
    Some(TableSource::File {
        open: file.open_path.clone(),
        path: PathBuf::from(&file.path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_first_fit_and_coalescing() {
        let mut a = RowAllocator::new(100);
        assert_eq!(a.allocate(40), Some(0));
        assert_eq!(a.allocate(40), Some(40));
        assert_eq!(a.allocate(40), None);
        a.release(0, 40);
        assert_eq!(a.allocate(30), Some(0));
        a.release(40, 40);
        // Free: [30, 100) after merging [30,40) + [40,80) + [80,100).
        assert_eq!(a.free, vec![(30, 70)]);
        a.release(0, 30);
        assert_eq!(a.free, vec![(0, 100)]);
    }
}
