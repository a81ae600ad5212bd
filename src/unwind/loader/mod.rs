//! Keeps the BPF walker supplied with unwind tables: builds the tables of
//! the objects described processes map (on background threads, so sampling
//! never waits; through the disk cache), loads them into the walker's maps
//! (`unwind_rows`, `unwind_pages`, `loaded_objects`) and evicts them.
//! Which processes map which objects is [`crate::process::walker::ProcessFollower`]'s
//! to say: it follows process lifetimes and tells this loader through
//! [`TableSupply`].
//!
//! Tables are keyed by object and shared by every process mapping it. Their
//! rows live in one array map sized by the memory budget
//! (`--max-unwind-info-mb`); each object gets a contiguous range. When a
//! table does not fit, the least recently sampled objects are evicted (and
//! counted) until it does.

use rustc_hash::{FxHashMap, FxHashSet};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use tracing::{debug, info, warn};

use crate::process::walker::{StartupScan, TableSupply, VDSO_OBJECT_ID};
use crate::process::UserFrame;
use crate::process::{ObjectId, ProcessTracker};
use crate::sampling::records::RawSample;
use crate::sampling::sampler::Sampler;
use crate::sampling::unwind_row::{Page, PAGE_BITS};
use crate::unwind::build_queue::{
    start_workers, BuildQueue, BuildRequest, BuildResult, Stage, TableSource,
};
use crate::unwind::early::WantedPages;
use crate::unwind::jit::{BuiltTable, JitTables};
use crate::unwind::row_ranges::RowAllocator;

pub use crate::unwind::build_queue::SMALL_OBJECT_BYTES;

mod rows;

enum TableState {
    Building(Building),
    Loaded {
        /// Row ranges `(first, count)` in `unwind_rows`: the pages loaded
        /// ahead of the table, then the rest (ranges are never empty).
        ranges: Vec<(u32, u32)>,
        pages: Vec<Page>,
    },
    /// Removed to make room; rebuilt when sampled again.
    Evicted,
    /// Could not be built or loaded; the walker falls back to frame pointers.
    Failed,
}

/// A table being built, and the pages of it sent ahead ([`super::early`]).
#[derive(Default)]
struct Building {
    /// Pages samples wait on, for the build thread.
    wanted: Arc<WantedPages>,
    /// Every page asked for so far.
    asked: FxHashSet<u32>,
    /// Pages loaded ahead of the table: their row ranges in `unwind_rows`.
    early: Vec<EarlyRows>,
}

/// Rows loaded ahead of a table; they stay when the table is loaded (its
/// other pages go into a range of their own).
struct EarlyRows {
    base: u32,
    rows: u32,
    pages: Vec<Page>,
}

struct ObjectTable {
    state: TableState,
    last_used: u64,
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
    /// Writes of rows into the walker's maps: whole tables and pages sent
    /// ahead of them. A walk waiting for rows ([`crate::unwind::deferred`])
    /// looks again when this changes.
    pub row_writes: u64,
}

/// Supplies the BPF walker with unwind tables.
pub struct UnwindLoader {
    capacity_rows: u32,
    allocator: RowAllocator,
    tables: FxHashMap<u32, ObjectTable>,
    /// From the end of the start-up scan until the tables of the processes
    /// running at start are all in.
    startup: Option<StartupScan>,
    clock: u64,
    queue: Arc<BuildQueue>,
    /// Whether requests go to the cache threads first (there is a cache).
    lookup_first: bool,
    results: Receiver<BuildResult>,
    stats: UnwindLoaderStats,
    /// Tables of JIT code from jitdump files ([`crate::unwind::jit`]).
    jit: JitTables,
    /// JIT tables built, to be loaded.
    jit_built: Vec<BuiltTable>,
    /// JIT table ids replaced or of exited processes, to be unloaded.
    jit_retired: Vec<u32>,
}

impl Drop for UnwindLoader {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl UnwindLoader {
    /// A loader for a walker whose `unwind_rows` map holds `capacity_rows`
    /// rows. Tables are cached on disk under `cache_dir` when given; an
    /// object without CFI gets it from its separate debug file under
    /// `debug_dirs` (`--debug-dirs`). Starts the cache and build threads
    /// (see [`SMALL_OBJECT_BYTES`]).
    pub fn new(
        capacity_rows: u32,
        cache_dir: Option<PathBuf>,
        debug_dirs: &[PathBuf],
    ) -> Result<Self> {
        let queue = Arc::new(BuildQueue::default());
        let (result_tx, result_rx) = mpsc::channel();
        let lookup_first = cache_dir.is_some();
        start_workers(&queue, &result_tx, cache_dir, debug_dirs.into())?;
        Ok(UnwindLoader {
            capacity_rows,
            allocator: RowAllocator::new(capacity_rows),
            tables: FxHashMap::default(),
            startup: None,
            clock: 0,
            queue,
            lookup_first,
            results: result_rx,
            stats: UnwindLoaderStats::default(),
            jit: JitTables::default(),
            jit_built: Vec::new(),
            jit_retired: Vec::new(),
        })
    }

    /// Current counters.
    pub fn stats(&self) -> UnwindLoaderStats {
        self.stats
    }

    /// Log, once, when the scan is over and every table it asked for is
    /// loaded or failed: the time from the start of sampling until every
    /// process running at start is walked by its tables.
    fn report_startup(&mut self) {
        let Some(watch) = &self.startup else {
            return;
        };
        let mut failed = 0;
        for object in &watch.objects {
            match self.tables.get(object).map(|t| &t.state) {
                Some(TableState::Building(_)) => return,
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
    /// ([`crate::profile::aggregate::resolve`]): mark the objects on its
    /// stack as recently used (re-queuing evicted tables, queuing the
    /// tables of objects not seen before).
    pub fn on_sample(
        &mut self,
        sample: &RawSample,
        frames: &[UserFrame],
        tracker: &ProcessTracker,
    ) {
        if sample.kernel_thread {
            return;
        }
        self.clock += 1;
        let mut previous = None;
        for frame in frames {
            let Some((mapping, m)) = frame
                .mapping
                .and_then(|id| Some((id, tracker.mapping(id)?)))
            else {
                continue;
            };
            // Consecutive frames are often in the same mapping.
            let first_in_mapping = previous != Some(mapping);
            previous = Some(mapping);
            let Some(object) = m.object else {
                // JIT code with a table: keep it from being evicted first.
                let jit = self.jit.object_of(m.pid, m.start);
                if let Some(t) = jit.and_then(|id| self.tables.get_mut(&id)) {
                    t.last_used = self.clock;
                }
                continue;
            };
            if first_in_mapping {
                self.mark_used(object, tracker);
            }
            if let Some(TableState::Building(building)) =
                self.tables.get_mut(&object.0).map(|t| &mut t.state)
            {
                // The walk needs this frame's rows (its address is a call
                // site for all but the leaf, so the return address's page
                // too): ask for them ahead of the table.
                let vaddr = tracker
                    .load_bias(mapping)
                    .map(|bias| frame.address.wrapping_sub(bias));
                for vaddr in vaddr.into_iter().flat_map(|v| [v, v.wrapping_add(1)]) {
                    if let Ok(page) = u32::try_from(vaddr >> PAGE_BITS) {
                        if building.asked.insert(page) {
                            building.wanted.add(page);
                        }
                    }
                }
            }
        }
    }

    /// Mark `object` as used by the current sample: re-queue its evicted
    /// table, queue its table if never asked for, raise the priority of
    /// its build.
    fn mark_used(&mut self, object: ObjectId, tracker: &ProcessTracker) {
        let now = self.clock;
        match self.tables.get_mut(&object.0) {
            Some(t) => {
                t.last_used = now;
                match t.state {
                    TableState::Building(_) => self.queue.bump(object.0),
                    TableState::Evicted => self.request_file(object, tracker, 1),
                    TableState::Loaded { .. } | TableState::Failed => {}
                }
            }
            None => self.request_file(object, tracker, 1),
        }
    }

    /// Queue a build of the table of `object`, one of `tracker`'s object
    /// files, with a starting `priority` (0: found by a scan, 1: needed by a
    /// sample). Nothing for an object the tracker does not hold.
    fn request_file(&mut self, object: ObjectId, tracker: &ProcessTracker, priority: u64) {
        let Some(file) = tracker.object(object) else {
            return;
        };
        let source = TableSource::File {
            open: file.open_path.clone(),
            path: PathBuf::from(&file.path),
        };
        self.request(object.0, file.path.clone(), source, file.bytes, priority);
    }

    /// Queue a build of `object_id`'s table, named `name` in messages, from
    /// `source` of `bytes` bytes (for a file, its size when the tracker
    /// opened it: a stat here could wait on a hung file system) with a
    /// starting `priority` (see [`Self::request_file`]).
    fn request(
        &mut self,
        object_id: u32,
        name: String,
        source: TableSource,
        bytes: u64,
        priority: u64,
    ) {
        let wanted = Arc::new(WantedPages::default());
        self.tables.insert(
            object_id,
            ObjectTable {
                state: TableState::Building(Building {
                    wanted: wanted.clone(),
                    asked: FxHashSet::default(),
                    early: Vec::new(),
                }),
                last_used: self.clock,
            },
        );
        if bytes > SMALL_OBJECT_BYTES {
            debug!("{name}: table of a {bytes}-byte object queued (priority {priority})");
        }
        self.queue.push(
            BuildRequest {
                object_id,
                name,
                source,
                bytes,
                queued: Instant::now(),
                stage: if self.lookup_first {
                    Stage::Lookup
                } else {
                    Stage::Build(None)
                },
                wanted,
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
            .any(|t| matches!(t.state, TableState::Building(_)))
    }

    /// Load the tables the background threads have finished, and the JIT
    /// tables built; unload retired JIT tables. Call often.
    pub fn load_ready_tables(&mut self, sampler: &Sampler<'_>) {
        for (object_id, name, table) in std::mem::take(&mut self.jit_built) {
            if let Err(err) = self.load(object_id, &name, &table, sampler) {
                warn!("{name}: cannot load its unwind table: {err:#}");
                self.set_state(object_id, TableState::Failed);
            }
        }
        for object_id in std::mem::take(&mut self.jit_retired) {
            self.unload(object_id, sampler);
            self.tables.remove(&object_id);
        }
        while let Ok(result) = self.results.try_recv() {
            if result.early {
                if let Ok(table) = &result.table {
                    debug!(
                        "{}: {} pages sent ahead {} ms into its build",
                        result.name,
                        table.pages().len(),
                        result.took.as_millis()
                    );
                    self.load_early(result.object_id, &result.name, table, sampler);
                }
                continue;
            }
            match result.table {
                Ok(table) => {
                    debug!(
                        "{}: table ready: {} ms queued, {} ms to {}",
                        result.name,
                        result.waited.as_millis(),
                        result.took.as_millis(),
                        if result.from_cache {
                            "read from the cache"
                        } else {
                            "build"
                        }
                    );
                    if let Err(err) = self.load(result.object_id, &result.name, &table, sampler) {
                        warn!("{}: cannot load its unwind table: {err:#}", result.name);
                        self.drop_early(result.object_id, sampler);
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
                    self.drop_early(result.object_id, sampler);
                    if let Err(err) = sampler.set_object_loaded(result.object_id, true) {
                        warn!("{err:#}");
                    }
                    self.set_state(result.object_id, TableState::Failed);
                }
            }
        }
        self.report_startup();
    }
}

/// Tables are asked for by [`crate::process::walker::ProcessFollower`] as it
/// describes processes (at a lower priority than tables samples need).
impl TableSupply for UnwindLoader {
    fn object_mapped(&mut self, object: ObjectId, tracker: &ProcessTracker) {
        if !self.tables.contains_key(&object.0) {
            self.request_file(object, tracker, 0);
        }
    }

    fn vdso_mapped(&mut self, image: Vec<u8>) {
        if !self.tables.contains_key(&VDSO_OBJECT_ID) {
            let (name, bytes) = ("[vdso]".to_string(), image.len() as u64);
            self.request(VDSO_OBJECT_ID, name, TableSource::Bytes(image), bytes, 0);
        }
    }

    fn startup_scanned(&mut self, scan: StartupScan) {
        self.startup = Some(scan);
        self.report_startup();
    }

    fn jit_mapped(&mut self, pid: u32, range: (u64, u64), jitdump: &std::fs::File) -> Option<u32> {
        let built = self.jit_built.len();
        let id = self.jit.mapping_table(
            pid,
            range,
            jitdump,
            &mut self.jit_built,
            &mut self.jit_retired,
        )?;
        for &(object_id, _, _) in &self.jit_built[built..] {
            self.tables.insert(
                object_id,
                ObjectTable {
                    state: TableState::Building(Building::default()),
                    last_used: self.clock,
                },
            );
        }
        Some(id)
    }

    fn jit_grew(&mut self, pid: u32, jitdump: &std::fs::File) -> bool {
        let tables = &self.tables;
        let evicted = |id| {
            tables
                .get(&id)
                .is_some_and(|t| matches!(t.state, TableState::Evicted))
        };
        self.jit.grew(pid, jitdump, evicted, &mut self.jit_retired)
    }

    fn process_exited(&mut self, pid: u32) {
        self.jit.process_exited(pid, &mut self.jit_retired);
    }
}
