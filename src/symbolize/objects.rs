//! Symbolization of one object's addresses (blazesym's ELF source, helped
//! by [`super::elf_file`] where blazesym finds nothing), and the cache of
//! parsed objects a continuous [`Symbolizer`] keeps between windows.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::evict::{Elf as EvictElf, Evict};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolizer as BlazeSymbolizer};
use tracing::debug;

use super::cache::{AddressKey, LineCache};
use super::elf_file::ObjectFile;
use super::{
    demangle, file_name, line_of, lines_of, unknown_line, Lines, MappingSource, Symbolizer,
    KEEP_PARSED_WINDOWS, KEPT_OBJECT_MAX_BYTES, PARSED_OBJECTS_BUDGET_BYTES,
};
use crate::process::ObjectId;
use crate::profile::Line;

/// The files blazesym parsed for one object: their paths (its cache keys:
/// the object as opened, and the separate debug file this module found by
/// build ID).
pub(super) struct ParsedObject {
    path: PathBuf,
    debug_file: Option<PathBuf>,
    /// File size of the object, bytes.
    size: u64,
    /// The latest window ([`Symbolizer`]'s count) that brought new
    /// addresses in it.
    last_new: u64,
}

impl ParsedObject {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.path.as_path()).chain(self.debug_file.as_deref())
    }
}

impl Symbolizer {
    /// Lines for each of `offsets` in `object`, its parsed data kept for
    /// later windows when `keep` ([`Self::objects_to_keep`]). Two passes: DWARF gives
    /// source lines, inlined functions and names; the symbol table supplies
    /// the full path where DWARF built with line tables only (Rust's
    /// `line-tables-only`) names a function without its module, and names
    /// functions that have no DWARF at all. DWARF comes from the object,
    /// its `.gnu_debuglink` target, or the debug file found by its build ID
    /// under the debug directories (addressed there by virtual address).
    /// Objects without section headers are named from their dynamic symbol
    /// table (found through `PT_DYNAMIC`).
    pub(super) fn symbolize_object<S: MappingSource + ?Sized>(
        &self,
        tracker: &S,
        object: ObjectId,
        offsets: &[u64],
        keep: bool,
    ) -> Vec<Option<Vec<Line>>> {
        let Some(path) = tracker.object_open_path(object) else {
            return vec![None; offsets.len()];
        };
        let file = ObjectFile::open(path);
        let debug_file = file
            .as_ref()
            .and_then(|f| f.debug_file_by_build_id(&self.debug_dirs));
        let fresh;
        let kept;
        let inner: &BlazeSymbolizer = if keep {
            self.note_parsed(object, path, debug_file.clone());
            kept = self.inner.borrow();
            &kept
        } else {
            fresh = Self::blazesym(&self.debug_dirs);
            &fresh
        };
        let symbolize = |path: &Path, debug_syms: bool, input: Input<&[u64]>| {
            let mut elf = Elf::new(path);
            elf.debug_syms = debug_syms;
            inner
                .symbolize(&Source::Elf(elf), input)
                .unwrap_or_else(|err| {
                    debug!(
                        "{}: symbolization (debug info: {debug_syms}) failed: {err}",
                        path.display()
                    );
                    Vec::new()
                })
        };
        let symbols = symbolize(path, false, Input::FileOffset(offsets));
        let vaddrs: Vec<Option<u64>> = offsets
            .iter()
            .map(|&o| file.as_ref()?.virtual_address(o))
            .collect();
        let mut debug: Vec<Option<Vec<Line>>> = match &debug_file {
            Some(debug_path) => {
                let known: Vec<u64> = vaddrs.iter().flatten().copied().collect();
                let mut results = symbolize(debug_path, true, Input::VirtOffset(&known))
                    .into_iter()
                    .map(|sym| lines_of(&sym));
                vaddrs
                    .iter()
                    .map(|v| v.and_then(|_| results.next().flatten()))
                    .collect()
            }
            None => symbolize(path, true, Input::FileOffset(offsets))
                .iter()
                .map(lines_of)
                .collect(),
        };
        debug.resize(offsets.len(), None);
        let dynamic = file.as_ref().and_then(ObjectFile::dynamic_symbols);
        debug
            .into_iter()
            .enumerate()
            .map(|(i, mut lines)| {
                let symbol = symbols.get(i).and_then(|s| s.as_sym());
                match (&mut lines, symbol) {
                    (Some(lines), Some(symbol)) => {
                        // Only where DWARF's name is the short form of the
                        // same function (`hot` for `unwind_test::hot`): other
                        // toolchains' symbol names carry their own decorations
                        // (Go's `.abi0`) that DWARF rightly leaves out.
                        let full = demangle(&symbol.name);
                        if let Some(outer) = lines.last_mut() {
                            if full.ends_with(&format!("::{}", outer.function)) {
                                outer.function = Arc::from(full);
                                outer.system_name = Arc::from(symbol.name.as_ref());
                            }
                        }
                    }
                    (None, Some(symbol)) => lines = Some(vec![line_of(&symbol.name, None)]),
                    (None, None) => {
                        let name = dynamic
                            .as_ref()
                            .zip(vaddrs[i])
                            .and_then(|(d, v)| d.name_of(v));
                        lines = name.map(|name| vec![line_of(name, None)]);
                    }
                    _ => {}
                }
                lines
            })
            .collect()
    }

    /// Symbolize the addresses of `new` (offsets by object, none in
    /// `cache`) into `user_lines` and `cache`. Objects whose parsed data is
    /// kept ([`Self::objects_to_keep`]) come first, then the others, most
    /// new addresses first. Once `budget` (wall time, half the window in
    /// continuous mode) is spent, the objects still to do are left for a
    /// later window (at least one object is done in each window): their
    /// frames stay `object+0xOFFSET` in this one (with the
    /// mapping's build ID), so that a loaded machine costs names, not whole
    /// windows (issue 18: with 1 s windows on a 2-CPU machine at a load
    /// average of 15, parsing one big object took longer than a window).
    /// Returns how many addresses were left.
    pub(super) fn symbolize_new_in_objects<S: MappingSource + ?Sized>(
        &self,
        tracker: &S,
        cache: &mut LineCache,
        new: &HashMap<ObjectId, Vec<u64>>,
        budget: Option<Duration>,
        user_lines: &mut HashMap<(ObjectId, u64), Lines>,
    ) -> usize {
        let started = Instant::now();
        let kept = self.objects_to_keep(tracker, new);
        let mut order: Vec<(&ObjectId, &Vec<u64>)> = new.iter().collect();
        order.sort_by_key(|&(object, offsets)| {
            (!kept.contains_key(object), Reverse(offsets.len()), *object)
        });
        let mut deferred = 0;
        let mut done = 0;
        for (&object, offsets) in order {
            let keep = kept.contains_key(&object);
            // At least one object a window, however short the budget.
            if done > 0 && budget.is_some_and(|b| started.elapsed() > b) {
                deferred += offsets.len();
                continue;
            }
            done += 1;
            let object_started = Instant::now();
            let results = self.symbolize_object(tracker, object, offsets, keep);
            let path = tracker.object_path(object).unwrap_or("[unknown]");
            debug!(
                "symbolizer: {path}: {} new addresses in {:?} (kept: {keep})",
                offsets.len(),
                object_started.elapsed()
            );
            let name = file_name(path);
            for (&offset, lines) in offsets.iter().zip(results) {
                let entry = match lines {
                    Some(lines) => (lines, true),
                    None => (vec![unknown_line(format!("{name}+0x{offset:x}"))], false),
                };
                let lines = cache.insert(AddressKey::Object(object, offset), entry);
                user_lines.insert((object, offset), lines);
            }
        }
        if self.keep_parsed_objects {
            self.keep_only(&kept);
        }
        deferred
    }

    /// Records that blazesym now holds parsed data for `object`, opened at
    /// `path` (with `debug_file`); data it held for the same object under
    /// other paths is evicted (unless another object is reached through
    /// them).
    fn note_parsed(&self, object: ObjectId, path: &Path, debug_file: Option<PathBuf>) {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        let previous = self.parsed.borrow_mut().insert(
            object,
            ParsedObject {
                path: path.to_path_buf(),
                debug_file,
                size,
                last_new: self.window.get(),
            },
        );
        let Some(previous) = previous else {
            return;
        };
        for old in previous.paths() {
            let in_use = self
                .parsed
                .borrow()
                .values()
                .any(|p| p.paths().any(|p| p == old));
            if !in_use {
                self.evict(old);
            }
        }
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
    /// file sizes: of those with new addresses in this window (`new`) or in
    /// one of the [`KEEP_PARSED_WINDOWS`] before, the ones of at most
    /// [`KEPT_OBJECT_MAX_BYTES`], smallest first while they total at most
    /// [`PARSED_OBJECTS_BUDGET_BYTES`]. The others are symbolized one at a
    /// time, each with its parsed data dropped as soon as its addresses are
    /// done, as in one-shot runs: memory peaks at the largest object, not at
    /// the sum of them (issue 18: 600-775 MB of objects in one window while
    /// Rust builds ran on the machine).
    pub(super) fn objects_to_keep<S: MappingSource + ?Sized, V>(
        &self,
        tracker: &S,
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
            .map(|(&object, p)| (object, p.size))
            .collect::<Vec<_>>();
        let fresh = new.keys().filter_map(|&object| {
            let size = std::fs::metadata(tracker.object_open_path(object)?)
                .ok()?
                .len();
            Some((object, size))
        });
        let mut candidates: Vec<(ObjectId, u64)> = recent
            .into_iter()
            .chain(fresh)
            .filter(|&(_, size)| size <= KEPT_OBJECT_MAX_BYTES)
            .collect();
        candidates.sort_by_key(|&(object, size)| (size, object));
        candidates.dedup_by_key(|&mut (object, _)| object);
        let mut total = 0;
        let mut keep = HashMap::new();
        for (object, size) in candidates {
            if total + size <= PARSED_OBJECTS_BUDGET_BYTES {
                total += size;
                keep.insert(object, size);
            }
        }
        keep
    }

    /// After a window: keep the parsed data of the objects
    /// [`Self::objects_to_keep`] chose (`keep`) and evict everything else.
    /// When nothing is kept, blazesym starts afresh, which also drops what
    /// it holds for `.gnu_debuglink` targets (cached under their own paths,
    /// which eviction by object path does not reach).
    pub(super) fn keep_only<V>(&self, keep: &HashMap<ObjectId, V>) {
        let mut parsed = self.parsed.borrow_mut();
        if keep.is_empty() {
            if !parsed.is_empty() {
                *self.inner.borrow_mut() = Self::blazesym(&self.debug_dirs);
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
