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
//! Each place names come from is a [`sources::SymbolSource`]: the kernel
//! ([`kernel`]), ELF objects (`objects`), the vDSO (`vdso`), and for
//! anonymous executable memory (JIT code) jitdump files (`jitdump`, for
//! processes that mapped one) and perf maps (`perf_map`).
//! Names are demangled here (Rust, then C++ Itanium), keeping the mangled
//! name as the frame's `system_name`. An address nobody can name becomes
//! `object+0xFILE_OFFSET` (or `[kernel.kallsyms]+0xADDR`), never dropped.

mod assembly;
mod cache;
mod cpp_names;
pub mod debug_copy;
pub mod debuginfod;
mod elf_file;
mod jitdump;
pub mod kallsyms;
#[cfg(test)]
mod keep_tests;
pub mod kernel;
mod lines;
mod objects;
mod perf_map;
mod plt;
pub mod source;
mod sources;
mod vdso;

use crate::profile::aggregate::Aggregator;
use crate::profile::Window;
use crate::profile::{unwind_marker_name, FrameKind, Profile, ProfileMapping, Sample};
use assembly::{user_frame_lines, ProfileAssembly};
use cache::LineCache;
pub use lines::demangle;
use lines::{unknown_line, Lines};
use objects::ObjectBudget;
pub use source::MappingSource;
use sources::{FrameRef, Resolved, SymbolSource};
use tracing::debug;

/// Name of the mapping kernel frames belong to (as perf and pprof call it).
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

/// Symbolizes windows of samples, asking its symbol sources (kernel, ELF
/// objects, vDSO, JIT code; see [`sources`]) for the names of each window's
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
/// (process churn). Objects get half a window's length of wall time; those
/// that do not fit wait for a later window.
/// [`Symbolizer::one_shot`] releases each object's data as soon as its
/// addresses are done, so that memory peaks at the largest object, not at
/// all of them, and keeps no lines.
pub struct Symbolizer {
    kernel: kernel::Kallsyms,
    objects: objects::ElfObjects,
    vdso: vdso::Vdso,
    jitdumps: jitdump::JitDumps,
    perf_maps: perf_map::PerfMaps,
    lines: std::cell::RefCell<LineCache>,
    /// Whether this is a continuous symbolizer (keeps parsed data and
    /// lines, limits each window's time on objects).
    continuous: bool,
    /// Windows waiting behind the one being symbolized ([`Self::set_backlog`]).
    backlog: std::cell::Cell<usize>,
    kernel_build_id: Option<String>,
}

/// Total memory (bytes: their files, which blazesym maps, plus the heap
/// their parsed data was measured to hold) of the objects whose parsed
/// data a continuous [`Symbolizer`] keeps between windows. Issue 18: with
/// a budget of 32 MiB of file sizes, libc (2 MB) was always kept, with its
/// separate debug file's 14 MB of decompressed sections and 10-16 MB of
/// DWARF; measured by what they cost and held to 16 MiB, an agent under
/// churn (1 s windows) ran about 5 MiB lower in RssAnon for the same CPU
/// (docs/performance.md).
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
/// met the budget or not (issue 18).
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
    /// demangled by [`demangle`], not by blazesym), looking for separate
    /// debug files under the process's debug directories
    /// ([`crate::unwind::identity::debug_dirs`]).
    pub fn new() -> Self {
        Self::with_keep(true)
    }

    /// A symbolizer for a single profile: like [`Symbolizer::new`], but
    /// each object's parsed data is dropped once its addresses are
    /// symbolized, and nothing is kept for later profiles.
    pub fn one_shot() -> Self {
        Self::with_keep(false)
    }

    fn with_keep(continuous: bool) -> Self {
        let debug_dirs = crate::unwind::identity::debug_dirs().to_vec();
        let cache_size = if continuous {
            LINE_CACHE_MAX_ADDRESSES
        } else {
            0
        };
        Symbolizer {
            kernel: kernel::Kallsyms::new(continuous),
            objects: objects::ElfObjects::new(debug_dirs, continuous),
            vdso: vdso::Vdso::new(),
            jitdumps: jitdump::JitDumps::default(),
            perf_maps: perf_map::PerfMaps::default(),
            lines: std::cell::RefCell::new(LineCache::new(cache_size)),
            continuous,
            backlog: Default::default(),
            kernel_build_id: kernel::kernel_build_id(),
        }
    }

    /// Tell a continuous symbolizer how many closed windows wait behind the
    /// next one it symbolizes. Its time on objects is then half the
    /// window's length divided by `1 + windows`, and nothing at all from
    /// [`BACKLOG_NO_OBJECTS`] windows on: a worker that fell behind (a
    /// loaded machine, a burst of new objects) catches up by leaving names
    /// for later windows (their frames stay `object+0xOFFSET`) rather than
    /// by dropping whole windows once [`crate::sender::worker::MAX_PENDING_WINDOWS`]
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
        let mut builder = ProfileAssembly::default();
        let mut profile = Profile {
            start_unix_ns: window.start_unix_ns,
            duration_ns: window.duration_ns,
            sample_freq_hz: window.sample_freq_hz,
            ..Default::default()
        };
        // User mappings first, in the order: most sampled stacks first, each
        // from its root (`_start`, in the executable); which one pprof
        // readers present as the profiled binary is the encoder's choice
        // (`format::pprof`, by the profile's targets).
        let mut by_count: Vec<_> = aggregator.stacks().collect();
        by_count.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
        for (key, _) in by_count {
            for m in key.user.iter().rev().filter_map(|f| f.mapping) {
                let _ = builder.mapping(&mut profile, tracker, m);
            }
        }
        let kernel_addrs = aggregator.stacks().flat_map(|(key, _)| key.kernel.iter());
        if let Some((lo, hi)) = kernel_addrs.fold(None, |range: Option<(u64, u64)>, &a| {
            Some(range.map_or((a, a), |(lo, hi)| (lo.min(a), hi.max(a))))
        }) {
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
                let (lines, symbolized) = resolved
                    .lines(FrameRef::Kernel(addr))
                    .cloned()
                    .unwrap_or_else(|| {
                        (vec![unknown_line(kernel::kernel_placeholder(addr))], false)
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
                let (mapping, lines, symbolized) =
                    user_frame_lines(&mut builder, &mut profile, tracker, &resolved, frame);
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

/// Every frame of `aggregator`'s stacks, kernel and user; user frames whose
/// mapping `tracker` does not know are left out.
fn frames_of<'a>(
    aggregator: &'a Aggregator,
    tracker: &'a dyn MappingSource,
) -> impl Iterator<Item = FrameRef<'a>> {
    aggregator.stacks().flat_map(move |(key, _)| {
        let kernel = key.kernel.iter().map(|&a| FrameRef::Kernel(a));
        let user = key.user.iter().filter_map(move |frame| {
            let mapping = tracker.mapping(frame.mapping?)?;
            Some(FrameRef::User {
                address: frame.address,
                mapping,
            })
        });
        kernel.chain(user)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Line;
    use crate::sample::RawSample;
    use std::time::Duration;

    #[test]
    fn demangles_rust_and_cpp_and_keeps_c() {
        assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE"), "foo::bar");
        assert_eq!(demangle("_Z3addii"), "add(int, int)");
        assert_eq!(demangle("main"), "main");
    }

    /// An address `eighths`/8 into the first executable mapping of this
    /// test process whose path satisfies `wanted` (/proc/self/maps).
    pub(super) fn address_in(wanted: impl Fn(&str) -> bool, eighths: u64) -> u64 {
        crate::process::maps::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.executable && wanted(&m.path))
            .map(|m| m.start + (m.end - m.start) / 8 * eighths)
            .unwrap()
    }

    /// The paths of the objects whose parsed data `symbolizer` keeps,
    /// sorted.
    pub(super) fn kept_objects(
        symbolizer: &Symbolizer,
        tracker: &crate::process::ProcessTracker,
    ) -> Vec<String> {
        let mut kept: Vec<String> = symbolizer
            .objects
            .parsed
            .borrow()
            .keys()
            .map(|&object| tracker.object(object).expect("known object").path.clone())
            .collect();
        kept.sort();
        kept
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
            let kept = kept_objects(&symbolizer, tracker);
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

    /// The one-shot profile of one sample of this process with user stack
    /// `stack` (leaf first), in a window of one second.
    fn one_shot_profile(stack: Vec<u64>) -> Profile {
        let mut tracker = crate::process::ProcessTracker::new();
        let mut aggregator = Aggregator::new();
        aggregator.add(
            &RawSample::for_test(std::process::id(), 0, stack),
            &mut tracker,
        );
        let window = Window {
            start_unix_ns: 0,
            duration_ns: 1_000_000_000,
            sample_freq_hz: 99,
        };
        Symbolizer::one_shot().build_profile(&aggregator, &tracker, window)
    }

    /// User frames of `profile` left unnamed.
    fn unnamed_user_frames(profile: &Profile) -> usize {
        profile
            .frames
            .iter()
            .filter(|f| f.kind == FrameKind::User && !f.symbolized)
            .count()
    }

    /// A sample in one of libc's PLT stubs is named `callee@plt` (a
    /// symbol-table lookup alone gives the function before `.plt`).
    #[test]
    fn a_frame_in_a_plt_stub_is_named_after_its_callee() {
        use object::{Object, ObjectSection};
        let libc = crate::process::maps::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.executable && m.path.contains("/libc.so"))
            .unwrap();
        let data = std::fs::read(&libc.path).unwrap();
        let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).unwrap();
        let plt = file.section_by_name(".plt").unwrap();
        let (plt_offset, _) = plt.file_range().unwrap();
        let stubs = plt::PltStubs::of(&file).unwrap();
        // The last stub of `.plt` (the first is the resolver's).
        let stub = plt.address() + plt.size() - 16;
        let callee = stubs.name_of(stub).unwrap().to_string();
        let in_stub = libc.start + (plt_offset + (stub - plt.address()) - libc.file_offset) + 4;
        let profile = one_shot_profile(vec![in_stub, address_in(|p| p.contains("/libc.so"), 3)]);
        let names: Vec<&str> = profile
            .frames
            .iter()
            .flat_map(|f| f.lines.iter().map(|l| l.function.as_ref()))
            .collect();
        assert!(
            names.contains(&format!("{callee}@plt").as_str()),
            "{callee}@plt not in {names:?}"
        );
    }

    #[test]
    fn continuous_symbolizer_leaves_big_objects_for_a_later_window_once_over_budget() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        // The test binary's frame is a return address into this test (the
        // symbolizer looks up the byte before a caller's address): a fixed
        // fraction of its text can fall on a function's first byte, whose
        // previous byte is padding no symbol covers.
        let in_exe = continuous_symbolizer_leaves_big_objects_for_a_later_window_once_over_budget
            as *const () as usize as u64
            + 1;
        assert!(address_in(|p| p == exe, 0) <= in_exe);
        let stack = vec![address_in(|p| p.contains("/libc.so"), 3), in_exe];
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
            unnamed_user_frames(&symbolizer.build_profile(&aggregator, &tracker, window))
        };
        // A window of no length has time for one object only: the kept
        // ones come first (libc; the test binary too if it is small), the
        // other's frame stays unnamed.
        assert_eq!(unnamed(0), 1);
        // The next window (with time) names it.
        assert_eq!(unnamed(1_000_000_000), 0);
    }

    /// The profiler's own executable (here, the test binary) is named from
    /// its symbol table: its full names, without reading its DWARF for
    /// source lines or inlined frames.
    #[test]
    fn the_profilers_own_frames_are_named_without_its_dwarf() {
        let in_exe =
            the_profilers_own_frames_are_named_without_its_dwarf as *const () as usize as u64 + 1;
        let profile = one_shot_profile(vec![in_exe]);
        let own: Vec<&Line> = profile
            .frames
            .iter()
            .filter(|f| f.kind == FrameKind::User)
            .flat_map(|f| &f.lines)
            .collect();
        assert_eq!(own.len(), 1, "{own:?}");
        assert!(
            own[0]
                .function
                .ends_with("::the_profilers_own_frames_are_named_without_its_dwarf"),
            "{own:?}"
        );
        assert_eq!((&own[0].file, own[0].line), (&None, None), "{own:?}");
    }

    #[test]
    fn a_worker_behind_names_no_new_object_until_it_catches_up() {
        let stack = vec![
            address_in(|p| p.contains("/libc.so"), 3),
            address_in(|p| p.contains("/ld-linux"), 3),
        ];
        let pid = std::process::id();
        let mut tracker = crate::process::ProcessTracker::new();
        let mut aggregator = Aggregator::new();
        aggregator.add(&RawSample::for_test(pid, 0, stack), &mut tracker);
        let symbolizer = Symbolizer::new();
        let window = Window {
            start_unix_ns: 0,
            duration_ns: 10_000_000_000,
            sample_freq_hz: 99,
        };
        let unnamed =
            || unnamed_user_frames(&symbolizer.build_profile(&aggregator, &tracker, window));
        assert_eq!(
            symbolizer.object_budget(1_000_000_000),
            ObjectBudget::Time(Duration::from_millis(500))
        );
        symbolizer.set_backlog(1);
        assert_eq!(
            symbolizer.object_budget(1_000_000_000),
            ObjectBudget::Time(Duration::from_millis(250))
        );
        // Two windows waiting: not even one object, however long the window.
        symbolizer.set_backlog(BACKLOG_NO_OBJECTS);
        assert_eq!(
            symbolizer.object_budget(1_000_000_000),
            ObjectBudget::Nothing
        );
        assert_eq!(unnamed(), 2);
        assert_eq!(unnamed(), 2, "unnamed frames are not cached");
        symbolizer.set_backlog(0);
        assert_eq!(unnamed(), 0);
        assert_eq!(
            Symbolizer::one_shot().object_budget(1_000_000_000),
            ObjectBudget::Unlimited
        );
    }
}
