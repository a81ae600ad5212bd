//! Symbolization: turns the aggregated stacks of a window into a [`Profile`].
//!
//! User addresses are symbolized per object, in one batch per object, by file
//! offset (blazesym's ELF source with DWARF: line info and inlined functions;
//! DWARF from the object, its `.gnu_debuglink` target or its debug file by
//! build ID under the debug directories; see [`objects`]).
//! Kernel addresses are symbolized in one batch from `/proc/kallsyms`.
//! Addresses in a process's `[vdso]` are symbolized in this process's own
//! vDSO, the same image for every 64-bit process of the running kernel
//! (blazesym's process source reads it from memory).
//! Names are demangled here (Rust, then C++ Itanium), keeping the mangled
//! name as the frame's `system_name`. An address nobody can name becomes
//! `object+0xFILE_OFFSET` (or `[kernel.kallsyms]+0xADDR`), never dropped.

mod assembly;
mod cache;
mod elf_file;
pub mod kernel;
mod objects;
pub mod source;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::source::{Kernel, Process, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer as BlazeSymbolizer};
use blazesym::{MaybeDefault, Pid};
use tracing::debug;

use crate::process::ObjectId;
use crate::profile::aggregate::Aggregator;
use crate::profile::Window;
use crate::profile::{unwind_marker_name, FrameKind, Line, Profile, ProfileMapping, Sample};
use assembly::{user_frame_lines, ProfileAssembly};
use cache::{AddressKey, LineCache};
pub use source::MappingSource;

/// Name of the mapping kernel frames belong to (as perf and pprof call it).
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

/// Name of the kernel's virtual shared object in `/proc/PID/maps`.
const VDSO_MAPPING_NAME: &str = "[vdso]";

/// Demangle a Rust (legacy or v0) or C++ (Itanium) symbol name; other names
/// are returned unchanged.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        if let Ok(symbol) = cpp_demangle::Symbol::new(name) {
            if let Ok(d) = symbol.demangle() {
                return d;
            }
        }
    }
    name.to_string()
}

type Lines = (Vec<Line>, bool);

/// Lines of a window's kernel addresses, object file offsets and `[vdso]`
/// offsets.
type SymbolizedAddresses = (
    HashMap<u64, Lines>,
    HashMap<(ObjectId, u64), Lines>,
    HashMap<u64, Lines>,
);

fn source_file(info: &CodeInfo<'_>) -> Arc<str> {
    Arc::from(info.to_path().to_string_lossy().as_ref())
}

fn line_of(name: &str, info: Option<&CodeInfo<'_>>) -> Line {
    Line {
        function: Arc::from(demangle(name)),
        system_name: Arc::from(name),
        file: info.map(source_file),
        line: info.and_then(|i| i.line),
    }
}

fn unknown_line(name: String) -> Line {
    let name: Arc<str> = Arc::from(name);
    Line {
        function: name.clone(),
        system_name: name,
        file: None,
        line: None,
    }
}

/// Lines for one symbolized address, innermost first.
fn lines_of(sym: &Symbolized<'_>) -> Option<Vec<Line>> {
    let Symbolized::Sym(sym) = sym else {
        return None;
    };
    // blazesym reports `f` (the real function, with the code location of its
    // call into the first inlined function) and then the inlined chain
    // outermost first, each with its own location.
    let mut lines = Vec::with_capacity(sym.inlined.len() + 1);
    for inlined in sym.inlined.iter().rev() {
        lines.push(line_of(&inlined.name, inlined.code_info.as_ref()));
    }
    lines.push(line_of(&sym.name, sym.code_info.as_deref()));
    Some(lines)
}

fn file_name(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}

/// Symbolizes windows of samples. [`Symbolizer::new`] keeps the lines of
/// the addresses it symbolized (at most [`LINE_CACHE_MAX_ADDRESSES`]) from
/// one window to the next, so that continuous mode only symbolizes
/// addresses it has not seen before (see [`cache`]). For those, it keeps
/// blazesym's parsed objects (symbol tables, DWARF) that brought new
/// addresses in the latest [`KEEP_PARSED_WINDOWS`] windows: only objects of
/// at most [`KEPT_OBJECT_MAX_BYTES`], smallest first while their files total
/// at most [`PARSED_OBJECTS_BUDGET_BYTES`]; everything else is evicted after
/// each window (also `/proc/kallsyms`, after a window without new kernel
/// addresses), so memory follows the objects still being discovered, not
/// every object that ever came and went (process churn).
/// [`Symbolizer::one_shot`] releases each object's data as soon as its
/// addresses are done, so that memory peaks at the largest object, not at
/// all of them.
pub struct Symbolizer {
    inner: std::cell::RefCell<BlazeSymbolizer>,
    /// Holds the parsed `/proc/kallsyms` while windows bring new kernel
    /// addresses.
    kernel: std::cell::RefCell<Option<BlazeSymbolizer>>,
    keep_parsed_objects: bool,
    lines: std::cell::RefCell<LineCache>,
    /// Objects whose parsed data `inner` holds.
    parsed: std::cell::RefCell<HashMap<ObjectId, objects::ParsedObject>>,
    /// Windows symbolized so far.
    window: std::cell::Cell<u64>,
    kernel_build_id: Option<String>,
    /// Where separate debug files are looked up (by build ID, and for
    /// `.gnu_debuglink` names).
    debug_dirs: Vec<PathBuf>,
}

/// Total size (bytes) of the object files whose parsed data a continuous
/// [`Symbolizer`] keeps between windows.
pub const PARSED_OBJECTS_BUDGET_BYTES: u64 = 32 << 20;

/// Largest object file (bytes) whose parsed data a continuous [`Symbolizer`]
/// keeps between windows. Bigger ones (the agent's own binary, 35 MB with
/// 22 MB of DWARF; libpython, 23 MB; rustc's libraries, 150-200 MB) are
/// parsed again for every window that brings new addresses in them and
/// dropped right after, so that what stays between windows does not depend
/// on which big programs happened to run: with all-or-nothing keeping, an
/// agent's RssAnon between windows flipped between 15 and 40 MiB as the
/// window's objects met the budget or not (issue 18).
pub const KEPT_OBJECT_MAX_BYTES: u64 = 16 << 20;

/// Windows after the latest one that brought new addresses in an object
/// for which a continuous [`Symbolizer`] may keep its parsed data (while
/// addresses still come in, parsing it again for each would cost more
/// than keeping it).
pub const KEEP_PARSED_WINDOWS: u64 = 10;

/// Most addresses (kernel addresses, object file offsets) whose lines a
/// continuous [`Symbolizer`] keeps between windows; past it, those unused
/// for the longest are dropped. Each costs about 350 bytes with its share
/// of the (interned) strings: about 10 MiB when full (heap profile). Issue
/// 18: under `mixed` churn with Rust builds on the machine, 1 s windows
/// still brought about 1,000 new addresses each after two minutes.
pub const LINE_CACHE_MAX_ADDRESSES: usize = 28_000;

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with line info and inlined functions enabled (names are
    /// demangled by [`demangle`], not by blazesym), looking for separate
    /// debug files under the process's debug directories
    /// ([`crate::unwind::identity::debug_dirs`]).
    pub fn new() -> Self {
        let debug_dirs = crate::unwind::identity::debug_dirs().to_vec();
        Symbolizer {
            inner: std::cell::RefCell::new(Self::blazesym(&debug_dirs)),
            kernel: Default::default(),
            keep_parsed_objects: true,
            lines: std::cell::RefCell::new(LineCache::new(LINE_CACHE_MAX_ADDRESSES)),
            parsed: Default::default(),
            window: Default::default(),
            kernel_build_id: kernel::kernel_build_id(),
            debug_dirs,
        }
    }

    /// A symbolizer for a single profile: like [`Symbolizer::new`], but
    /// each object's parsed data is dropped once its addresses are
    /// symbolized, and nothing is kept for later profiles.
    pub fn one_shot() -> Self {
        Symbolizer {
            keep_parsed_objects: false,
            lines: std::cell::RefCell::new(LineCache::new(0)),
            ..Self::new()
        }
    }

    fn blazesym(debug_dirs: &[PathBuf]) -> BlazeSymbolizer {
        BlazeSymbolizer::builder()
            .set_debug_dirs(Some(debug_dirs))
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .build()
    }

    /// Lines for kernel addresses `addrs`, from `/proc/kallsyms` (parsed
    /// once and kept while windows bring new kernel addresses: 7.5 MiB).
    fn symbolize_kernel(&self, addrs: &[u64]) -> HashMap<u64, Lines> {
        let mut kernel = self.kernel.borrow_mut();
        if addrs.is_empty() || !self.keep_parsed_objects {
            // blazesym would read all of /proc/kallsyms (~100 ms) first.
            *kernel = None;
            if addrs.is_empty() {
                return HashMap::new();
            }
        }
        let source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            kaslr_offset: Some(0),
            debug_syms: false,
            ..Default::default()
        });
        let inner = kernel.get_or_insert_with(|| Self::blazesym(&self.debug_dirs));
        let results = match inner.symbolize(&source, Input::AbsAddr(addrs)) {
            Ok(r) => r,
            Err(err) => {
                debug!("kernel symbolization failed: {err}");
                Vec::new()
            }
        };
        addrs
            .iter()
            .enumerate()
            .map(|(i, &addr)| {
                let lines = results.get(i).and_then(lines_of);
                let entry = match lines {
                    Some(lines) => (lines, true),
                    None => (
                        vec![unknown_line(format!("{KERNEL_MAPPING_NAME}+0x{addr:x}"))],
                        false,
                    ),
                };
                (addr, entry)
            })
            .collect()
    }

    /// Lines for each of `offsets` (bytes from the start of a process's
    /// `[vdso]` mapping), found at the same offsets in this process's own
    /// vDSO (`/proc/self/maps`). Offsets it cannot name are left out.
    fn symbolize_vdso(&self, offsets: &[u64]) -> HashMap<u64, Lines> {
        if offsets.is_empty() {
            return HashMap::new();
        }
        let own = match crate::process::maps::read_maps(std::process::id()) {
            Ok(entries) => entries.into_iter().find(|e| e.path == VDSO_MAPPING_NAME),
            Err(err) => {
                debug!("reading this process's maps for its vDSO: {err}");
                None
            }
        };
        let Some(own) = own else {
            return HashMap::new();
        };
        let addrs: Vec<u64> = offsets.iter().map(|o| own.start + o).collect();
        let mut source = Process::new(Pid::Slf);
        source.debug_syms = false;
        source.perf_map = false;
        let inner = self.inner.borrow();
        let results = match inner.symbolize(&Source::Process(source), Input::AbsAddr(&addrs)) {
            Ok(r) => r,
            Err(err) => {
                debug!("vDSO symbolization failed: {err}");
                return HashMap::new();
            }
        };
        offsets
            .iter()
            .zip(&results)
            .filter(|(&offset, _)| own.start + offset < own.end)
            .filter_map(|(&offset, sym)| Some((offset, (lines_of(sym)?, true))))
            .collect()
    }

    /// Lines for a window's unique addresses: kernel addresses, file
    /// offsets per object, `[vdso]` offsets. Addresses the cache holds are
    /// taken from it; the others are symbolized (per object, see
    /// [`Self::objects_to_keep`], within `budget`: see
    /// [`Self::symbolize_new_in_objects`]) and stored in it.
    fn symbolize_addresses<S: MappingSource + ?Sized>(
        &self,
        tracker: &S,
        kernel_addrs: &[u64],
        object_offsets: &HashMap<ObjectId, BTreeSet<u64>>,
        vdso_offsets: &BTreeSet<u64>,
        budget: Option<std::time::Duration>,
    ) -> SymbolizedAddresses {
        let mut cache = self.lines.borrow_mut();
        let mut kernel_lines = HashMap::new();
        let mut kernel_new = Vec::new();
        for &addr in kernel_addrs {
            match cache.get(AddressKey::Kernel(addr)) {
                Some(lines) => {
                    kernel_lines.insert(addr, lines);
                }
                None => kernel_new.push(addr),
            }
        }
        for (addr, lines) in self.symbolize_kernel(&kernel_new) {
            kernel_lines.insert(addr, cache.insert(AddressKey::Kernel(addr), lines));
        }

        let mut user_lines: HashMap<(ObjectId, u64), Lines> = HashMap::new();
        let mut object_new: HashMap<ObjectId, Vec<u64>> = HashMap::new();
        for (&object, offsets) in object_offsets {
            for &offset in offsets {
                match cache.get(AddressKey::Object(object, offset)) {
                    Some(lines) => {
                        user_lines.insert((object, offset), lines);
                    }
                    None => object_new.entry(object).or_default().push(offset),
                }
            }
        }
        let deferred = self.symbolize_new_in_objects(
            tracker,
            &mut cache,
            &object_new,
            budget,
            &mut user_lines,
        );

        let mut vdso_lines = HashMap::new();
        let mut vdso_new = Vec::new();
        for &offset in vdso_offsets {
            match cache.get(AddressKey::Vdso(offset)) {
                Some(lines) => {
                    vdso_lines.insert(offset, lines);
                }
                None => vdso_new.push(offset),
            }
        }
        for (offset, lines) in self.symbolize_vdso(&vdso_new) {
            vdso_lines.insert(offset, cache.insert(AddressKey::Vdso(offset), lines));
        }

        let stats = cache.end_window();
        self.window.set(self.window.get() + 1);
        debug!(
            "symbolizer: {} addresses, {} new ({} in {} objects, {} in the kernel), \
             {deferred} left for later windows; cache holds {} addresses, {} strings",
            stats.hits + stats.misses,
            stats.misses,
            object_new.values().map(Vec::len).sum::<usize>(),
            object_new.len(),
            kernel_new.len(),
            stats.entries,
            stats.strings
        );
        (kernel_lines, user_lines, vdso_lines)
    }

    /// Symbolize every stack in `aggregator` and build the window's profile.
    /// `tracker` must be the one the aggregator resolved mappings with (or a
    /// [`source::TrackerSnapshot`] of it taken for this aggregator).
    pub fn build_profile<S: MappingSource + ?Sized>(
        &self,
        aggregator: &Aggregator,
        tracker: &S,
        window: Window,
    ) -> Profile {
        // 1. The unique addresses, 2. their lines.
        let (kernel_addrs, object_offsets, vdso_offsets) = unique_addresses(aggregator, tracker);
        let kernel_addrs: Vec<u64> = kernel_addrs.into_iter().collect();
        let (kernel_lines, user_lines, vdso_lines) = self.symbolize_addresses(
            tracker,
            &kernel_addrs,
            &object_offsets,
            &vdso_offsets,
            self.keep_parsed_objects
                .then(|| std::time::Duration::from_nanos(window.duration_ns) / 2),
        );

        // 3. Assemble mappings, frames and samples.
        let mut builder = ProfileAssembly::default();
        let mut profile = Profile {
            start_unix_ns: window.start_unix_ns,
            duration_ns: window.duration_ns,
            sample_freq_hz: window.sample_freq_hz,
            ..Default::default()
        };
        // User mappings first, in the order: most sampled stacks first, each
        // from its root. pprof readers present the first mapping as the
        // profiled binary, and a stack's root (`_start`) is in the executable.
        let mut by_count: Vec<_> = aggregator.stacks().collect();
        by_count.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
        for (key, _) in by_count {
            for m in key.user.iter().rev().filter_map(|f| f.mapping) {
                let _ = builder.mapping(&mut profile, tracker, m);
            }
        }
        if let (Some(&lo), Some(&hi)) = (kernel_addrs.first(), kernel_addrs.last()) {
            builder.kernel_mapping = Some(profile.mappings.len());
            profile.mappings.push(ProfileMapping {
                start: lo,
                limit: hi + 1,
                file_offset: 0,
                filename: KERNEL_MAPPING_NAME.to_string(),
                build_id: self.kernel_build_id.clone(),
            });
        }
        for (key, count) in aggregator.stacks() {
            let mut frames = Vec::with_capacity(key.kernel.len() + key.user.len() + 1);
            for &addr in key.kernel.iter() {
                let (lines, symbolized) = kernel_lines.get(&addr).cloned().unwrap_or_else(|| {
                    let name = format!("{KERNEL_MAPPING_NAME}+0x{addr:x}");
                    (vec![unknown_line(name)], false)
                });
                frames.push(builder.frame(
                    &mut profile,
                    FrameKind::Kernel,
                    addr,
                    builder.kernel_mapping,
                    lines,
                    symbolized,
                ));
            }
            for frame in key.user.iter() {
                let (mapping, lines, symbolized) = user_frame_lines(
                    &mut builder,
                    &mut profile,
                    tracker,
                    &user_lines,
                    &vdso_lines,
                    frame,
                );
                frames.push(builder.frame(
                    &mut profile,
                    FrameKind::User,
                    frame.address,
                    mapping,
                    lines,
                    symbolized,
                ));
            }
            if key.user_status.is_incomplete() {
                let lines = vec![unknown_line(unwind_marker_name(key.user_status))];
                frames.push(builder.frame(
                    &mut profile,
                    FrameKind::UnwindMarker,
                    0,
                    None,
                    lines,
                    false,
                ));
            }
            profile.samples.push(Sample {
                pid: key.pid,
                tid: key.tid,
                process_comm: key.process_comm.clone(),
                thread_comm: key.thread_comm.clone(),
                frames,
                unwind_status: key.user_status,
                count,
            });
        }
        profile
    }
}

/// The unique addresses of `aggregator`'s stacks, as symbolization batches
/// them: kernel addresses, file offsets per object, and offsets in `[vdso]`
/// mappings. Frames whose mapping `tracker` does not know are left out.
type UniqueAddresses = (
    BTreeSet<u64>,
    HashMap<ObjectId, BTreeSet<u64>>,
    BTreeSet<u64>,
);

fn unique_addresses<S: MappingSource + ?Sized>(
    aggregator: &Aggregator,
    tracker: &S,
) -> UniqueAddresses {
    let mut kernel_addrs = BTreeSet::new();
    let mut object_offsets: HashMap<ObjectId, BTreeSet<u64>> = HashMap::new();
    let mut vdso_offsets = BTreeSet::new();
    for (key, _) in aggregator.stacks() {
        kernel_addrs.extend(key.kernel.iter().copied());
        for frame in key.user.iter() {
            let Some(mapping) = frame.mapping.and_then(|m| tracker.mapping(m)) else {
                continue;
            };
            let offset = mapping.file_offset_of(frame.address);
            match mapping.object {
                Some(object) => {
                    object_offsets.entry(object).or_default().insert(offset);
                }
                None if mapping.name == VDSO_MAPPING_NAME => {
                    vdso_offsets.insert(offset);
                }
                None => {}
            }
        }
    }
    (kernel_addrs, object_offsets, vdso_offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::RawSample;

    #[test]
    fn demangles_rust_and_cpp_and_keeps_c() {
        assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE"), "foo::bar");
        assert_eq!(demangle("_Z3addii"), "add(int, int)");
        assert_eq!(demangle("main"), "main");
    }

    /// An address `eighths`/8 into the first executable mapping of this
    /// test process whose path satisfies `wanted` (/proc/self/maps).
    fn address_in(wanted: impl Fn(&str) -> bool, eighths: u64) -> u64 {
        crate::process::maps::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.executable && wanted(&m.path))
            .map(|m| m.start + (m.end - m.start) / 8 * eighths)
            .unwrap()
    }

    #[test]
    fn continuous_symbolizer_keeps_lines_and_only_the_objects_of_new_addresses() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        let in_exe = address_in(|p| p == exe, 4);
        let in_ld = address_in(|p| p.contains("/ld-linux"), 4);
        let in_libc = address_in(|p| p.contains("/libc.so"), 4);
        let elsewhere_in_libc = address_in(|p| p.contains("/libc.so"), 5);
        let pid = std::process::id();
        let mut tracker = crate::process::ProcessTracker::new();
        let window = Window {
            start_unix_ns: 0,
            duration_ns: 1_000_000_000,
            sample_freq_hz: 99,
        };
        let symbolizer = Symbolizer::new();
        let symbolize = |tracker: &mut crate::process::ProcessTracker, stacks: &[Vec<u64>]| {
            let mut aggregator = Aggregator::new();
            for stack in stacks {
                aggregator.add(&RawSample::for_test(pid, 0, stack.clone()), tracker);
            }
            let profile = symbolizer.build_profile(&aggregator, &*tracker, window);
            assert!(profile.samples.iter().all(|s| s.frames.len() >= 3));
            let mut kept: Vec<String> = symbolizer
                .parsed
                .borrow()
                .keys()
                .map(|&object| tracker.object(object).expect("known object").path.clone())
                .collect();
            kept.sort();
            let names: Vec<Vec<Line>> = profile.frames.iter().map(|f| f.lines.clone()).collect();
            (kept, names)
        };
        let (both, names) = symbolize(&mut tracker, &[vec![in_libc, in_ld, in_exe]]);
        // libc and ld.so are kept; the test binary only if it is small.
        let exe_is_small = std::fs::metadata(&exe).unwrap().len() <= KEPT_OBJECT_MAX_BYTES;
        assert_eq!(both.len(), 2 + usize::from(exe_is_small), "{both:?}");
        assert_eq!(both.contains(&exe), exe_is_small, "{both:?}");
        // The same addresses again: answered from the cache; the parsed
        // objects stay for KEEP_PARSED_WINDOWS windows, then go.
        for _ in 0..KEEP_PARSED_WINDOWS {
            let (kept, names_again) = symbolize(&mut tracker, &[vec![in_libc, in_ld, in_exe]]);
            assert_eq!(kept, both);
            assert_eq!(names_again, names);
        }
        let (none, names_again) = symbolize(&mut tracker, &[vec![in_libc, in_ld, in_exe]]);
        assert!(none.is_empty(), "{none:?}");
        assert_eq!(names_again, names);
        // A new address in libc: only libc is parsed (and kept).
        let (libc_only, _) = symbolize(&mut tracker, &[vec![elsewhere_in_libc, in_ld, in_exe]]);
        assert_eq!(libc_only.len(), 1);
        assert!(libc_only[0].contains("/libc.so"), "{libc_only:?}");
        // The one-shot symbolizer names the same frames.
        let mut aggregator = Aggregator::new();
        aggregator.add(
            &RawSample::for_test(pid, 0, vec![in_libc, in_ld, in_exe]),
            &mut tracker,
        );
        let fresh = Symbolizer::one_shot().build_profile(&aggregator, &tracker, window);
        let fresh: Vec<Vec<Line>> = fresh.frames.iter().map(|f| f.lines.clone()).collect();
        assert_eq!(fresh, names);
    }

    #[test]
    fn continuous_symbolizer_leaves_big_objects_for_a_later_window_once_over_budget() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        let stack = vec![
            address_in(|p| p.contains("/libc.so"), 3),
            address_in(|p| p == exe, 3),
        ];
        let pid = std::process::id();
        let mut tracker = crate::process::ProcessTracker::new();
        let mut aggregator = Aggregator::new();
        aggregator.add(&RawSample::for_test(pid, 0, stack), &mut tracker);
        let symbolizer = Symbolizer::new();
        let unnamed = |duration_ns: u64| {
            let window = Window {
                start_unix_ns: 0,
                duration_ns,
                sample_freq_hz: 99,
            };
            let profile = symbolizer.build_profile(&aggregator, &tracker, window);
            profile
                .frames
                .iter()
                .filter(|f| f.kind == FrameKind::User && !f.symbolized)
                .count()
        };
        // A window of no length has time for one object only: the kept
        // ones come first (libc; the test binary too if it is small), the
        // other's frame stays unnamed.
        assert_eq!(unnamed(0), 1);
        // The next window (with time) names it.
        assert_eq!(unnamed(1_000_000_000), 0);
    }
}
