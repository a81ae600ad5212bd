//! ELF objects as a symbol source: symbolization of each object's
//! addresses (blazesym's ELF source, helped by [`super::elf_file`] where
//! blazesym finds nothing, and by the tables of [`super::object_tables`]),
//! and the cache of parsed objects a continuous [`super::Symbolizer`] keeps
//! between windows, with their tables.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::evict::{Elf as EvictElf, Evict};
use blazesym::symbolize::Symbolizer as BlazeSymbolizer;
use tracing::debug;

use super::blaze::{self, InputKind, ParsedBytes};
use super::debug_copy::DebugCopies;
use super::debuginfod::Debuginfod;
use super::elf_file::ObjectFile;
use super::lines::{file_name, unknown_line, Lines};
use super::object_tables::{ObjectTables, Passes};
use super::settings::SymbolContext;
use super::symbol_source::{Batch, FrameRef, Site, SymbolSource};
use super::{
    MappingSource, KEEP_PARSED_WINDOWS, KEPT_OBJECT_MAX_BYTES, PARSED_OBJECTS_BUDGET_BYTES,
};
use crate::process::ObjectId;
use crate::profile::Line;

/// The files blazesym parsed for one object: their paths (its cache keys:
/// the object as opened, and the separate debug file this module found by
/// build ID), and the tables derived from them so far.
pub(super) struct ParsedObject {
    path: PathBuf,
    debug_file: Option<PathBuf>,
    /// The latest window ([`ElfObjects`]'s count) that brought new
    /// addresses in it.
    last_new: u64,
    /// Rust paths, MiniDebugInfo, dynamic symbols, PLT stubs: built once
    /// while the object stays parsed (with the same debug file).
    tables: Rc<ObjectTables>,
}

impl ParsedObject {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.path.as_path()).chain(self.debug_file.as_deref())
    }
}

/// Names frames in mappings of object files; sites are
/// `(object id, file offset)`. Addresses it cannot name become
/// `object+0xOFFSET`.
pub(super) struct ElfObjects {
    inner: RefCell<BlazeSymbolizer>,
    keep_parsed_objects: bool,
    /// Objects whose parsed data `inner` holds.
    pub(super) parsed: RefCell<HashMap<ObjectId, ParsedObject>>,
    /// What keeping each object symbolized recently costs, bytes of heap
    /// ([`Self::cost_of`]).
    costs: RefCell<HashMap<ObjectId, u64>>,
    /// Windows symbolized so far.
    window: Cell<u64>,
    /// Time a window may spend on objects (see [`Self::set_budget`]).
    budget: Cell<ObjectBudget>,
    /// Where separate debug files are looked up (by build ID, and for
    /// `.gnu_debuglink` names).
    debug_dirs: Vec<PathBuf>,
    /// Where debug files found nowhere on this machine are fetched from.
    debuginfod: Option<Arc<Debuginfod>>,
    /// Inflated copies of compressed debug information (`None`: none made).
    debug_copies: Option<Arc<DebugCopies>>,
    /// When the window being symbolized stops asking debuginfod: its start
    /// plus [`Debuginfod::window_budget`] (set by `symbolize`).
    debuginfod_deadline: Cell<Instant>,
    /// Reads the calling thread's net allocated bytes, around each
    /// object's symbolization ([`crate::util::alloc::thread_net_allocated`]; the
    /// tests give their own).
    pub(super) heap_meter: fn() -> Option<i64>,
}

impl SymbolSource for ElfObjects {
    fn locate(&self, _tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site> {
        match frame {
            FrameRef::User { address, mapping } => Some((
                u64::from(mapping.object?.0),
                mapping.file_offset_of(address),
            )),
            FrameRef::Kernel(_) => None,
        }
    }

    /// Objects whose parsed data is kept ([`ElfObjects::objects_to_keep`])
    /// come first, then the others, most addresses first. Once the budget
    /// ([`ElfObjects::set_budget`]) is spent, the objects still to do are
    /// left out for a later window (at least one object is done in each
    /// window, unless the budget is [`ObjectBudget::Nothing`]): their frames
    /// stay `object+0xOFFSET` in this one (with the
    /// mapping's build ID), so that a loaded machine costs names, not whole
    /// windows (decision 0008: with 1 s windows on a 2-CPU machine at a load
    /// average of 15, parsing one big object took longer than a window).
    /// Debuginfod is asked until [`Debuginfod::window_budget`] after this
    /// call began, whatever the object budget.
    fn symbolize(&self, tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines> {
        let started = Instant::now();
        let budget = self.budget.get();
        if let Some(debuginfod) = &self.debuginfod {
            self.debuginfod_deadline
                .set(started + debuginfod.window_budget());
        }
        let new: HashMap<ObjectId, &BTreeSet<u64>> = batch
            .iter()
            .filter_map(|(&group, offsets)| Some((ObjectId(u32::try_from(group).ok()?), offsets)))
            .collect();
        let mut kept = self.objects_to_keep(tracker, &new);
        let mut order: Vec<(ObjectId, &BTreeSet<u64>)> = new.into_iter().collect();
        order.sort_by_key(|&(object, offsets)| {
            (!kept.contains_key(&object), Reverse(offsets.len()), object)
        });
        let mut lines = HashMap::new();
        let (mut done, mut deferred) = (0, 0);
        for (object, offsets) in order {
            let spent = match budget {
                ObjectBudget::Unlimited => false,
                // At least one object a window, however short the time.
                ObjectBudget::Time(time) => done > 0 && started.elapsed() > time,
                ObjectBudget::Nothing => true,
            };
            if spent {
                deferred += offsets.len();
                continue;
            }
            done += 1;
            let object_started = Instant::now();
            let offsets: Vec<u64> = offsets.iter().copied().collect();
            let keep = kept.contains_key(&object);
            let results = self.symbolize_object(tracker, object, &offsets, keep);
            if keep {
                self.recheck_kept(object, &mut kept);
            }
            let path = tracker.object_path(object).unwrap_or("[unknown]");
            debug!(
                "symbolizer: {path}: {} new addresses in {:?} (kept: {keep}, heap {} KiB)",
                offsets.len(),
                object_started.elapsed(),
                self.costs.borrow().get(&object).copied().unwrap_or(0) >> 10
            );
            let name = file_name(path);
            for (&offset, found) in offsets.iter().zip(results) {
                let entry = match found {
                    Some(found) => (found, true),
                    None => (vec![unknown_line(format!("{name}+0x{offset:x}"))], false),
                };
                lines.insert((u64::from(object.0), offset), entry);
            }
        }
        if deferred > 0 {
            debug!("symbolizer: {deferred} addresses left for later windows (time budget)");
        }
        if self.keep_parsed_objects {
            self.keep_only(&kept);
        }
        self.window.set(self.window.get() + 1);
        lines
    }
}

/// Most objects whose cost ([`ElfObjects::cost_of`]) is remembered; past
/// it, only those kept stay.
const MAX_COSTS: usize = 4096;

/// How much time a window may spend on objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum ObjectBudget {
    /// No limit (one-shot runs).
    #[default]
    Unlimited,
    /// At least one object, then more until this much wall time has passed
    /// since the first began.
    Time(Duration),
    /// No object at all: the window worker is behind.
    Nothing,
}

impl ElfObjects {
    /// An object source looking for separate debug files under
    /// `context`'s debug directories and from its debuginfod client, reading
    /// compressed DWARF from its debug copies; `keep_parsed_objects` keeps
    /// parsed objects between windows (see [`super::Symbolizer`]).
    pub(super) fn new(context: &SymbolContext, keep_parsed_objects: bool) -> Self {
        let debug_dirs = context.debug_dirs.to_vec();
        ElfObjects {
            inner: RefCell::new(blaze::blazesym(&debug_dirs)),
            keep_parsed_objects,
            parsed: Default::default(),
            costs: Default::default(),
            window: Default::default(),
            budget: Default::default(),
            debug_dirs,
            debuginfod: context.debuginfod.clone(),
            debug_copies: context.debug_copies.clone(),
            debuginfod_deadline: Cell::new(Instant::now()),
            heap_meter: crate::util::alloc::thread_net_allocated,
        }
    }

    /// The inflated copy of `file`'s compressed debug information, when the
    /// run makes copies ([`DebugCopies::uncompressed_copy`]).
    fn uncompressed_copy(&self, file: &Path) -> Option<PathBuf> {
        self.debug_copies.as_ref()?.uncompressed_copy(file)
    }

    /// Set the time the next windows may spend on objects.
    pub(super) fn set_budget(&self, budget: ObjectBudget) {
        self.budget.set(budget);
    }

    /// Lines for each of `offsets` in `object`, its parsed data kept for
    /// later windows when `keep` ([`Self::objects_to_keep`]). Two passes: DWARF gives
    /// source lines, inlined functions and names; the symbol table supplies
    /// the full path where DWARF built with line tables only (Rust's
    /// `line-tables-only`) names a function without its module, and names
    /// functions that have no DWARF at all. DWARF comes from the object,
    /// its `.gnu_debuglink` target, or the debug file found by its build ID
    /// under the debug directories or fetched from a debuginfod server
    /// (addressed there by virtual address). Without a debug file,
    /// functions DWARF does not name are looked up in the object's
    /// MiniDebugInfo ([`super::minidebuginfo`]) before its symbol tables.
    /// Objects without section headers are named from their dynamic symbol
    /// table (found through `PT_DYNAMIC`). These tables, Rust paths and PLT
    /// stub names ([`ObjectTables::complete`]) are built once for a kept
    /// object and kept with it; otherwise for this batch only.
    fn symbolize_object(
        &self,
        tracker: &dyn MappingSource,
        object: ObjectId,
        offsets: &[u64],
        keep: bool,
    ) -> Vec<Option<Vec<Line>>> {
        let Some(path) = tracker.object_open_path(object) else {
            return vec![None; offsets.len()];
        };
        let heap_before = (self.heap_meter)();
        let file = ObjectFile::open(path);
        let own = is_own_executable(path);
        let debug_file = if own {
            None
        } else {
            file.as_ref()
                .and_then(|f| {
                    f.debug_file_by_build_id(&self.debug_dirs)
                        .or_else(|| self.remote_debug_file(tracker, object, f))
                })
                .map(|d| self.uncompressed_copy(&d).unwrap_or(d))
                // An object with compressed DWARF of its own (`gcc -gz`).
                .or_else(|| self.uncompressed_copy(path))
        };
        let kept_guard;
        let (kept, tables): (Option<&BlazeSymbolizer>, _) = if keep {
            let tables = self.note_parsed(object, path, debug_file.clone());
            kept_guard = self.inner.borrow();
            (Some(&kept_guard), tables)
        } else {
            (None, Rc::default())
        };
        let (dirs, meter) = (self.debug_dirs.as_slice(), self.heap_meter);
        let mut parsed = ParsedBytes::default();
        let file_offsets: (&Path, InputKind, &[u64]) = (path, InputKind::FileOffset, offsets);
        let symbols = blaze::symbolize(kept, dirs, meter, &mut parsed, false, file_offsets);
        let vaddrs: Vec<Option<u64>> = offsets
            .iter()
            .map(|&o| file.as_ref()?.virtual_address(o))
            .collect();
        // The virtual addresses of the offsets that have one.
        let known: Vec<u64> = vaddrs.iter().flatten().copied().collect();
        let mut debug: Vec<Option<Vec<Line>>> = match &debug_file {
            // The profiler's own frames: the symbol table's names suffice.
            _ if own => symbols.clone(),
            Some(debug_path) => {
                let virtual_addresses = (debug_path.as_path(), InputKind::VirtOffset, &known[..]);
                let mut results =
                    blaze::symbolize(kept, dirs, meter, &mut parsed, true, virtual_addresses)
                        .into_iter();
                vaddrs
                    .iter()
                    .map(|v| v.and_then(|_| results.next().flatten()))
                    .collect()
            }
            None => blaze::symbolize(kept, dirs, meter, &mut parsed, true, file_offsets),
        };
        debug.resize(offsets.len(), None);
        if keep {
            if let Some((before, after)) = heap_before.zip((self.heap_meter)()) {
                self.note_cost(object, after.saturating_sub(before), true);
            }
        } else if heap_before.is_some() {
            self.note_cost(object, parsed.estimate(), false);
        }
        tables.complete(Passes {
            path,
            dwarf_path: debug_file.as_deref().unwrap_or(path),
            file: file.as_ref(),
            own,
            has_debug_file: debug_file.is_some(),
            vaddrs: &vaddrs,
            symbols,
            debug,
        })
    }

    /// The debug file of `object` (opened as `file`) from debuginfod, when
    /// a server is set and the object's debug information is nowhere on
    /// this machine, asked for only until the window's debuginfod deadline.
    fn remote_debug_file(
        &self,
        tracker: &dyn MappingSource,
        object: ObjectId,
        file: &ObjectFile,
    ) -> Option<PathBuf> {
        let debuginfod = self.debuginfod.as_ref()?;
        let real_path = Path::new(tracker.object_path(object)?);
        let id = file.build_id_without_local_debug_info(real_path, &self.debug_dirs)?;
        debuginfod.debuginfo(&id, self.debuginfod_deadline.get())
    }

    /// After symbolizing `object`, one of the `kept`: its cost is now
    /// measured (its debug file found, the heap its parsing took), which
    /// for an object seen for the first time was only its file's size when
    /// [`Self::objects_to_keep`] chose it. If it costs more than
    /// [`KEPT_OBJECT_MAX_BYTES`], or `kept` would cost more than
    /// [`PARSED_OBJECTS_BUDGET_BYTES`] with it, its parsed data goes now
    /// rather than at the window's end, so that a window bringing many new
    /// objects (the first one, which symbolizes everything the machine ran
    /// since start) holds at most the budget plus the object being
    /// symbolized (decision 0008: 4 to 31 MB allocated, RssFile 12 to 47 MiB).
    fn recheck_kept(&self, object: ObjectId, kept: &mut HashMap<ObjectId, u64>) {
        let cost = {
            let parsed = self.parsed.borrow();
            parsed
                .get(&object)
                .and_then(|p| self.cost_of_parsed(object, p))
        };
        let others: u64 = kept
            .iter()
            .filter(|(&o, _)| o != object)
            .map(|(_, c)| c)
            .sum();
        match cost {
            Some(cost)
                if cost <= KEPT_OBJECT_MAX_BYTES
                    && others + cost <= PARSED_OBJECTS_BUDGET_BYTES =>
            {
                kept.insert(object, cost);
            }
            _ => {
                kept.remove(&object);
                let dropped = self.parsed.borrow_mut().remove(&object);
                for old in dropped.iter().flat_map(ParsedObject::paths) {
                    self.evict_unless_in_use(old);
                }
            }
        }
    }

    /// Drop blazesym's data for `path` unless an object still parsed is
    /// reached through it.
    fn evict_unless_in_use(&self, path: &Path) {
        let in_use = self
            .parsed
            .borrow()
            .values()
            .any(|p| p.paths().any(|p| p == path));
        if !in_use {
            self.evict(path);
        }
    }

    /// Records that blazesym now holds parsed data for `object`, opened at
    /// `path` (with `debug_file`); data it held for the same object under
    /// other paths is evicted (unless another object is reached through
    /// them). Returns the object's tables: those built before, unless its
    /// debug file changed (found, or fetched, since).
    fn note_parsed(
        &self,
        object: ObjectId,
        path: &Path,
        debug_file: Option<PathBuf>,
    ) -> Rc<ObjectTables> {
        let tables = match self.parsed.borrow().get(&object) {
            Some(p) if p.debug_file == debug_file => Rc::clone(&p.tables),
            Some(_) => Rc::default(),
            None => {
                // Measured from here on, as blazesym parses it afresh.
                self.costs.borrow_mut().remove(&object);
                Rc::default()
            }
        };
        let previous = self.parsed.borrow_mut().insert(
            object,
            ParsedObject {
                path: path.to_path_buf(),
                debug_file,
                last_new: self.window.get(),
                tables: Rc::clone(&tables),
            },
        );
        for old in previous.iter().flat_map(ParsedObject::paths) {
            self.evict_unless_in_use(old);
        }
        tables
    }

    /// Record that symbolizing addresses of `object` left `bytes` more heap
    /// allocated than before (its parsed data while blazesym holds it, with
    /// the lines found). For a kept object (`kept`) this adds to what it
    /// cost before, as blazesym parses DWARF units on demand; otherwise it
    /// is what parsing it costs at once.
    fn note_cost(&self, object: ObjectId, bytes: i64, kept: bool) {
        let bytes = bytes.max(0) as u64;
        let mut costs = self.costs.borrow_mut();
        let cost = costs.entry(object).or_insert(0);
        *cost = if kept { *cost + bytes } else { bytes };
    }

    /// The memory (bytes) keeping `object`'s parsed data costs: the files
    /// blazesym maps (`paths`: the object as opened, and its separate debug
    /// file once known), whose pages read count in RssFile while it is
    /// kept, plus the heap it costs as measured
    /// ([`crate::util::alloc::thread_net_allocated`] around its symbolization;
    /// nothing before it was measured or where jemalloc's counters are not
    /// available). File size alone was a poor guide: libc (2 MB) with its
    /// separate debug file held 14 MB of decompressed sections and 10-16 MB
    /// of parsed DWARF (decision 0008); heap alone, too: the agent's own binary
    /// (42 MB, line tables only) costs little heap but its mapped DWARF
    /// pages raised RssFile by 40-70 MiB once it was kept.
    fn cost_of<'p>(
        &self,
        object: ObjectId,
        paths: impl IntoIterator<Item = &'p Path>,
    ) -> Option<u64> {
        let mut files = 0;
        for path in paths {
            files += std::fs::metadata(path).ok()?.len();
        }
        Some(files + self.costs.borrow().get(&object).copied().unwrap_or(0))
    }

    /// [`Self::cost_of`] a parsed object `p` (`object`), with the heap its
    /// tables hold ([`ObjectTables::heap_bytes`]).
    fn cost_of_parsed(&self, object: ObjectId, p: &ParsedObject) -> Option<u64> {
        Some(self.cost_of(object, p.paths())? + p.tables.heap_bytes())
    }

    /// Drop blazesym's data for `path` (a file it opened before).
    fn evict(&self, path: &Path) {
        if let Err(err) = self
            .inner
            .borrow_mut()
            .evict(&Evict::Elf(EvictElf::new(path)))
        {
            debug!("symbolizer: evicting {}: {err}", path.display());
        }
    }

    /// Which objects keep their parsed data after this window, with their
    /// costs ([`Self::cost_of`]): of those with new addresses in this window
    /// (`new`) or in one of the [`KEEP_PARSED_WINDOWS`] before, the ones
    /// costing at most [`KEPT_OBJECT_MAX_BYTES`], cheapest first while they
    /// total at most [`PARSED_OBJECTS_BUDGET_BYTES`]. The others are symbolized one at a
    /// time, each with its parsed data dropped as soon as its addresses are
    /// done, as in one-shot runs: memory peaks at the largest object, not at
    /// the sum of them (decision 0008: 600-775 MB of objects in one window while
    /// Rust builds ran on the machine).
    fn objects_to_keep<V>(
        &self,
        tracker: &dyn MappingSource,
        new: &HashMap<ObjectId, V>,
    ) -> HashMap<ObjectId, u64> {
        if !self.keep_parsed_objects {
            return HashMap::new();
        }
        let window = self.window.get();
        let recent = self
            .parsed
            .borrow()
            .iter()
            .filter(|(_, p)| p.last_new + KEEP_PARSED_WINDOWS >= window)
            .map(|(&object, p)| (object, self.cost_of_parsed(object, p)))
            .collect::<Vec<_>>();
        let fresh = new.keys().map(|&object| {
            (
                object,
                self.cost_of(object, tracker.object_open_path(object)),
            )
        });
        let mut candidates: Vec<(ObjectId, u64)> = recent
            .into_iter()
            .chain(fresh)
            .filter_map(|(object, cost)| Some((object, cost?)))
            .filter(|&(_, cost)| cost <= KEPT_OBJECT_MAX_BYTES)
            .collect();
        candidates.sort_by_key(|&(object, cost)| (cost, object));
        candidates.dedup_by_key(|&mut (object, _)| object);
        let mut total = 0;
        let mut keep = HashMap::new();
        for (object, cost) in candidates {
            if total + cost <= PARSED_OBJECTS_BUDGET_BYTES {
                total += cost;
                keep.insert(object, cost);
            }
        }
        keep
    }

    /// After a window: keep the parsed data of the objects
    /// [`Self::objects_to_keep`] chose (`keep`) and evict everything else.
    /// When nothing is kept, blazesym starts afresh, which also drops what
    /// it holds for `.gnu_debuglink` targets (cached under their own paths,
    /// which eviction by object path does not reach).
    fn keep_only<V>(&self, keep: &HashMap<ObjectId, V>) {
        let mut costs = self.costs.borrow_mut();
        if costs.len() > MAX_COSTS {
            costs.retain(|object, _| keep.contains_key(object));
        }
        drop(costs);
        let mut parsed = self.parsed.borrow_mut();
        if keep.is_empty() {
            if !parsed.is_empty() {
                *self.inner.borrow_mut() = blaze::blazesym(&self.debug_dirs);
                parsed.clear();
            }
            return;
        }
        let (keep, drop): (HashMap<_, _>, HashMap<_, _>) = parsed
            .drain()
            .partition(|(object, _)| keep.contains_key(object));
        for old in drop.values().flat_map(ParsedObject::paths) {
            // A path a kept object is also reached through stays.
            if !keep.values().any(|p| p.paths().any(|p| p == old)) {
                self.evict(old);
            }
        }
        *parsed = keep;
    }
}

/// Whether `path` is the file this process runs (`/proc/self/exe`: same
/// device and inode). The profiler's own executable is named from its
/// symbol table only, without reading its DWARF: every whole-machine
/// profile samples the profiler, and its line tables (22 MB, kept for the
/// heap profile's source lines) took about 21 MB of heap and 26 MiB of
/// mapped debug sections for 0.2 s whenever a window brought new addresses
/// in it, above all the first window, the agent's memory peak (decision 0008).
/// Its frames keep their full names, without file:line or inlined frames.
fn is_own_executable(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    static OWN: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let identity = |m: std::fs::Metadata| (m.dev(), m.ino());
    let own = OWN.get_or_init(|| std::fs::metadata("/proc/self/exe").ok().map(identity));
    own.is_some() && std::fs::metadata(path).ok().map(identity) == *own
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_executable_is_known_by_device_and_inode() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(is_own_executable(&exe));
        assert!(is_own_executable(Path::new("/proc/self/exe")));
        let libc = crate::process::maps::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.path.contains("/libc.so"))
            .unwrap();
        assert!(!is_own_executable(Path::new(&libc.path)));
        assert!(!is_own_executable(Path::new("/nonexistent/lightswitch")));
    }
}
