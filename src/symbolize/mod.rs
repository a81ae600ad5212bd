//! Symbolization: turns the aggregated stacks of a window into a [`Profile`].
//!
//! User addresses are symbolized per object, in one batch per object, by file
//! offset (blazesym's ELF source with DWARF: line info and inlined functions;
//! DWARF from the object, its `.gnu_debuglink` target or its debug file by
//! build ID under the debug directories, then MiniDebugInfo's
//! `.gnu_debugdata` ([`minidebuginfo`]); see [`objects`]).
//! Kernel addresses are symbolized in one batch from `/proc/kallsyms`.
//! Addresses in a process's `[vdso]` are symbolized in this process's own
//! vDSO, the same image for every 64-bit process of the running kernel
//! (blazesym's process source reads it from memory).
//! Each place names come from is a [`sources::SymbolSource`]: the kernel
//! ([`kernel`]), ELF objects (`objects`), the vDSO (`vdso`), and for
//! anonymous executable memory (JIT code) jitdump files (`jitdump`, for
//! processes that mapped one) and perf maps (`perf_map`).
//! Names are demangled here (Rust, then C++ Itanium), keeping the mangled
//! name as the frame's `system_name`. An address nobody can name becomes
//! `object+0xFILE_OFFSET` (or `[kernel.kallsyms]+0xADDR`), never dropped.

mod assembly;
mod blaze;
mod cache;
mod cpp_names;
pub mod debug_copy;
pub mod debuginfod;
mod elf_file;
mod function_symbols;
mod jit_dump;
pub mod jit_perf_map;
pub mod kallsyms;
#[cfg(test)]
mod keep_tests;
pub mod kernel;
mod lines;
pub mod mapping_source;
pub mod minidebuginfo;
pub mod object_tables;
mod objects;
mod plt;
mod rust_paths;
pub mod settings;
mod symbol_source;
mod vdso;

use std::sync::Arc;

use crate::profile::aggregate::Aggregator;
use crate::profile::Window;
use crate::profile::KERNEL_MAPPING_NAME;
use crate::profile::{unwind_marker_name, FrameKind, Profile, ProfileMapping, Sample};
use assembly::{user_frame, ProfileAssembly};
use cache::LineCache;
pub use lines::demangle;
use lines::{unknown_line, Lines};
pub use mapping_source::MappingSource;
use objects::ObjectBudget;
use symbol_source::{FrameRef, Resolved, SymbolSource};
use tracing::debug;

/// Symbolizes windows of samples, asking its symbol sources (kernel, ELF
/// objects, vDSO, JIT code; see [`symbol_source`]) for the names of each window's
/// frames. [`Symbolizer::new`] keeps the lines of the sites it symbolized
/// (at most [`LINE_CACHE_MAX_ADDRESSES`]) from one window to the next, so
/// that continuous mode only symbolizes addresses it has not seen before
/// (see [`cache`]; JIT code, whose addresses change names, is asked every
/// window). For those, it keeps blazesym's parsed objects (symbol tables,
/// DWARF) that brought new addresses in the latest [`KEEP_PARSED_WINDOWS`]
/// windows: only objects costing at most [`KEPT_OBJECT_MAX_BYTES`] (files
/// mapped plus heap measured), cheapest first while they total at most
/// [`PARSED_OBJECTS_BUDGET_BYTES`];
/// everything else is evicted after each window (also `/proc/kallsyms`,
/// after a window without new kernel addresses), so memory follows the
/// objects still being discovered, not every object that ever came and went
/// (process churn). The tables derived from a kept object (Rust paths,
/// MiniDebugInfo, dynamic symbols, PLT stubs: [`object_tables`]) stay with
/// it and count in its cost. Objects get half a window's length of wall time; those
/// that do not fit wait for a later window.
/// [`Symbolizer::one_shot`] releases each object's data as soon as its
/// addresses are done, so that memory peaks at the largest object, not at
/// all of them, and keeps no lines.
pub struct Symbolizer {
    kernel: kernel::Kallsyms,
    objects: objects::ElfObjects,
    vdso: vdso::Vdso,
    jitdumps: jit_dump::JitDumps,
    perf_maps: jit_perf_map::PerfMaps,
    lines: std::cell::RefCell<LineCache>,
    /// Whether this is a continuous symbolizer (keeps parsed data and
    /// lines, limits each window's time on objects).
    continuous: bool,
    /// Windows waiting behind the one being symbolized ([`Self::set_backlog`]).
    backlog: std::cell::Cell<usize>,
    /// Locations in the latest profile built: the next one's `frames` is
    /// sized for about as many ([`Self::expected_locations`]).
    last_locations: std::cell::Cell<usize>,
    kernel_build_id: Option<String>,
}

/// Total memory (bytes: their files, which blazesym maps, plus the heap
/// their parsed data was measured to hold, plus that of their derived
/// tables, [`object_tables`]) of the objects whose parsed
/// data a continuous [`Symbolizer`] keeps between windows. Issue 18: with
/// a budget of 32 MiB of file sizes, libc (2 MB) was always kept, with its
/// separate debug file's 14 MB of decompressed sections and 10-16 MB of
/// DWARF; measured by what they cost and held to 16 MiB, an agent under
/// churn (1 s windows) ran about 5 MiB lower in RssAnon for the same CPU
/// (docs/decisions/0008-symbols-kept-across-windows.md).
pub const PARSED_OBJECTS_BUDGET_BYTES: u64 = 16 << 20;

/// Largest cost (as [`PARSED_OBJECTS_BUDGET_BYTES`] counts it) of an
/// object whose parsed data a continuous [`Symbolizer`] keeps between
/// windows. Costlier ones (the agent's own binary, 42 MB, of which only
/// the symbol table is read; libpython, 23 MB; libc with its debug file,
/// about 30 MB; rustc's libraries, 150-200 MB) are parsed again for every
/// window that brings new addresses in them and dropped right after, so
/// that what stays between windows does not depend on which big programs
/// happened to run: with all-or-nothing keeping, an agent's RssAnon
/// between windows flipped between 15 and 40 MiB as the window's objects
/// met the budget or not (decision 0008).
pub const KEPT_OBJECT_MAX_BYTES: u64 = 8 << 20;

/// Windows after the latest one that brought new addresses in an object
/// for which a continuous [`Symbolizer`] may keep its parsed data (while
/// addresses still come in, parsing it again for each would cost more
/// than keeping it).
pub const KEEP_PARSED_WINDOWS: u64 = 10;

/// Most sites (kernel addresses, object file offsets, vDSO offsets) whose
/// lines a continuous [`Symbolizer`] keeps between windows; past it, those
/// unused for the longest are dropped. Each costs about 350 bytes with its
/// share of the (interned) strings: about 10 MiB when full (heap profile).
/// Issue 18: under `mixed` churn with Rust builds on the machine, 1 s
/// windows still brought about 1,000 new addresses each after two minutes.
pub const LINE_CACHE_MAX_ADDRESSES: usize = 28_000;

/// Windows waiting behind the one being symbolized from which a continuous
/// [`Symbolizer`] spends no time on objects at all ([`Symbolizer::set_backlog`]).
pub const BACKLOG_NO_OBJECTS: usize = 2;

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer with line info and inlined functions enabled (names are
    /// demangled by [`demangle`], not by blazesym), with the default
    /// symbol settings ([`settings::SymbolContext::default`]).
    pub fn new() -> Self {
        Self::with_context(&settings::SymbolContext::default())
    }

    /// [`Symbolizer::new`] with a run's symbol sources: separate debug
    /// files under `context`'s debug directories, its debuginfod client and
    /// debug copies.
    pub fn with_context(context: &settings::SymbolContext) -> Self {
        Self::with_keep(context, true)
    }

    /// A symbolizer for a single profile: like [`Symbolizer::with_context`],
    /// but each object's parsed data is dropped once its addresses are
    /// symbolized, and nothing is kept for later profiles.
    pub fn one_shot(context: &settings::SymbolContext) -> Self {
        Self::with_keep(context, false)
    }

    fn with_keep(context: &settings::SymbolContext, continuous: bool) -> Self {
        let cache_size = if continuous {
            LINE_CACHE_MAX_ADDRESSES
        } else {
            0
        };
        Symbolizer {
            kernel: kernel::Kallsyms::new(continuous),
            objects: objects::ElfObjects::new(context, continuous),
            vdso: vdso::Vdso::new(),
            jitdumps: jit_dump::JitDumps::default(),
            perf_maps: jit_perf_map::PerfMaps::default(),
            lines: std::cell::RefCell::new(LineCache::new(cache_size)),
            continuous,
            backlog: Default::default(),
            last_locations: Default::default(),
            kernel_build_id: kernel::kernel_build_id(),
        }
    }

    /// Tell a continuous symbolizer how many closed windows wait behind the
    /// next one it symbolizes. Its time on objects is then half the
    /// window's length divided by `1 + windows`, and nothing at all from
    /// [`BACKLOG_NO_OBJECTS`] windows on: a worker that fell behind (a
    /// loaded machine, a burst of new objects) catches up by leaving names
    /// for later windows (their frames stay `object+0xOFFSET`) rather than
    /// by dropping whole windows once [`crate::output::sender::worker::MAX_PENDING_WINDOWS`]
    /// are waiting.
    pub fn set_backlog(&self, windows: usize) {
        self.backlog.set(windows);
    }

    /// The time the next window may spend on objects, for a window of
    /// `window_ns` nanoseconds: unlimited for a one-shot symbolizer.
    fn object_budget(&self, window_ns: u64) -> ObjectBudget {
        let backlog = self.backlog.get();
        if !self.continuous {
            ObjectBudget::Unlimited
        } else if backlog >= BACKLOG_NO_OBJECTS {
            ObjectBudget::Nothing
        } else {
            ObjectBudget::Time(
                std::time::Duration::from_nanos(window_ns) / 2 / (1 + backlog as u32),
            )
        }
    }

    /// The symbol sources, in the order they are asked which frames are
    /// theirs.
    fn sources(&self) -> [&dyn SymbolSource; 5] {
        [
            &self.kernel,
            &self.objects,
            &self.vdso,
            &self.jitdumps,
            &self.perf_maps,
        ]
    }

    /// Symbolize every stack in `aggregator` and build the window's profile:
    /// stack `i` of [`Aggregator::stacks`] becomes `samples[i]`, which is
    /// what the indices of the aggregator's timeline refer to. The timeline
    /// itself is left to the caller ([`Aggregator::take_timeline`] into
    /// [`Profile::timeline`]), who owns the aggregator.
    /// `tracker` must be the one the aggregator resolved mappings with (or a
    /// [`source::TrackerSnapshot`] of it taken for this aggregator).
    pub fn build_profile(
        &self,
        aggregator: &Aggregator,
        tracker: &dyn MappingSource,
        window: Window,
    ) -> Profile {
        // 1. Every source names its frames not in the lines cache, in one
        // batch per window, within the object budget (continuous mode).
        let sources = self.sources();
        self.objects
            .set_budget(self.object_budget(window.duration_ns));
        let mut cache = self.lines.borrow_mut();
        let resolved = Resolved::resolve(
            &sources,
            tracker,
            frames_of(aggregator, tracker),
            &mut cache,
        );
        // Objects not kept were parsed and dropped: their pages go back
        // before the profile is assembled (alloc::release_freed).
        crate::util::alloc::release_freed();
        let stats = cache.end_window();
        drop(cache);
        debug!(
            "symbolizer: {} sites, {} new; cache holds {} sites, {} strings",
            stats.hits + stats.misses,
            stats.misses,
            stats.entries,
            stats.strings
        );

        // 2. Assemble mappings, frames and samples.
        let locations = self.expected_locations(aggregator);
        let mut builder = ProfileAssembly::new(aggregator.user_frames().len());
        let mut profile = Profile {
            start_unix_ns: window.start_unix_ns,
            duration_ns: window.duration_ns,
            sample_freq_hz: window.sample_freq_hz,
            off_cpu: window.off_cpu,
            samples: Vec::with_capacity(aggregator.stack_count()),
            frames: Vec::with_capacity(locations),
            ..Default::default()
        };
        // User mappings first, in the order: most sampled stacks first, each
        // from its root (`_start`, in the executable); which one pprof
        // readers present as the profiled binary is the encoder's choice
        // (`format::pprof`, by the profile's targets).
        let mut by_count: Vec<_> = aggregator.stacks().collect();
        by_count.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
        for (key, _) in by_count {
            for m in key.user().rev().filter_map(|f| f.mapping) {
                let _ = builder.mapping(tracker, m);
            }
        }
        let kernel_addrs = aggregator.kernel_stacks().flatten();
        if let Some((lo, hi)) = kernel_addrs.fold(None, |range: Option<(u64, u64)>, &a| {
            Some(range.map_or((a, a), |(lo, hi)| (lo.min(a), hi.max(a))))
        }) {
            builder.kernel_mapping = Some(builder.add_mapping(ProfileMapping {
                start: lo,
                limit: hi + 1,
                file_offset: 0,
                filename: KERNEL_MAPPING_NAME.to_string(),
                build_id: self.kernel_build_id.clone(),
            }));
        }
        for (key, count) in aggregator.stacks() {
            let mut frames = Vec::with_capacity(key.kernel.len() + key.user().len() + 1);
            for &addr in key.kernel.iter() {
                frames.push(kernel_frame(&mut builder, &mut profile, &resolved, addr));
            }
            for frame in key.user_indexed() {
                frames.push(user_frame(
                    &mut builder,
                    &mut profile,
                    tracker,
                    &resolved,
                    frame,
                ));
            }
            if key.user_status.is_incomplete() {
                let status = key.user_status;
                let location = (FrameKind::UnwindMarker, None, 0);
                frames.push(builder.frame(&mut profile, location, Some(status), || {
                    (vec![unknown_line(unwind_marker_name(status))].into(), false)
                }));
            }
            profile.samples.push(Sample {
                pid: key.pid,
                tid: key.tid,
                process_comm: Arc::clone(key.process_comm),
                thread_comm: Arc::clone(key.thread_comm),
                frames,
                unwind_status: key.user_status,
                count,
                off_cpu_ns: key.off_cpu_ns,
            });
        }
        for s in &profile.samples {
            if let Some(id) = tracker.container_id(s.pid) {
                profile
                    .containers
                    .entry(s.pid)
                    .or_insert_with(|| id.clone());
            }
        }
        self.last_locations.set(profile.frames.len());
        builder.finish(&mut profile);
        profile
    }

    /// How many locations the profile of `aggregator`'s window will hold,
    /// to size its tables: the previous window's count and an eighth, or
    /// for the first window a fourth of its frame references (stacks share
    /// most of their frames: a 10 s window under churn held 370,000 frame
    /// references and 67,000 locations).
    fn expected_locations(&self, aggregator: &Aggregator) -> usize {
        match self.last_locations.get() {
            0 => {
                aggregator
                    .stacks()
                    .map(|(k, _)| k.kernel.len() + k.user().len())
                    .sum::<usize>()
                    / 4
            }
            last => last + last / 8,
        }
    }
}

/// The index in `profile.frames` of the kernel frame at `addr`: its lines
/// from `resolved`, else a placeholder naming the address.
fn kernel_frame(
    builder: &mut ProfileAssembly,
    profile: &mut Profile,
    resolved: &Resolved<'_>,
    addr: u64,
) -> usize {
    let lines = || {
        resolved
            .lines(FrameRef::Kernel(addr))
            .cloned()
            .unwrap_or_else(|| {
                let placeholder = unknown_line(kernel::kernel_placeholder(addr));
                (vec![placeholder].into(), false)
            })
    };
    let location = (FrameKind::Kernel, builder.kernel_mapping, addr);
    builder.frame(profile, location, None, lines)
}

/// Every distinct frame of `aggregator`'s stacks, kernel and user (kernel
/// addresses once per distinct kernel stack); user frames whose mapping
/// `tracker` does not know are left out.
fn frames_of<'a>(
    aggregator: &'a Aggregator,
    tracker: &'a dyn MappingSource,
) -> impl Iterator<Item = FrameRef<'a>> {
    let kernel = aggregator
        .kernel_stacks()
        .flatten()
        .map(|&a| FrameRef::Kernel(a));
    let user = aggregator.user_frames().filter_map(move |frame| {
        let mapping = tracker.mapping(frame.mapping?)?;
        Some(FrameRef::User {
            address: frame.address,
            mapping,
        })
    });
    kernel.chain(user)
}

#[cfg(test)]
mod tests;
