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
pub mod debuginfod;
mod elf_file;
mod jitdump;
pub mod kernel;
mod lines;
mod objects;
mod perf_map;
pub mod source;
mod sources;
mod vdso;

use crate::profile::aggregate::Aggregator;
use crate::profile::Window;
use crate::profile::{unwind_marker_name, FrameKind, Profile, ProfileMapping, Sample};
use assembly::{user_frame_lines, ProfileAssembly};
pub use lines::demangle;
use lines::{unknown_line, Lines};
pub use source::MappingSource;
use sources::{FrameRef, Resolved, SymbolSource};

/// Name of the mapping kernel frames belong to (as perf and pprof call it).
pub const KERNEL_MAPPING_NAME: &str = "[kernel.kallsyms]";

/// Symbolizes windows of samples, asking its symbol sources (kernel, ELF
/// objects, vDSO; see [`sources`]) for the names of each window's frames.
/// [`Symbolizer::new`] keeps blazesym's
/// parsed objects (symbol tables, DWARF) from one window to the next, which
/// spares continuous mode from parsing them again every window. Only the
/// objects the latest window used are kept, only those of at most
/// [`KEPT_OBJECT_MAX_BYTES`], and only while their files total at most
/// [`PARSED_OBJECTS_BUDGET_BYTES`]; everything else is evicted
/// after each window, so memory follows the working set of objects, not
/// every object that ever came and went (process churn).
/// [`Symbolizer::one_shot`] releases each object's data as soon as its
/// addresses are done, so that memory peaks at the largest object, not at
/// all of them.
pub struct Symbolizer {
    kernel: kernel::Kallsyms,
    objects: objects::ElfObjects,
    vdso: vdso::Vdso,
    jitdumps: jitdump::JitDumps,
    perf_maps: perf_map::PerfMaps,
    kernel_build_id: Option<String>,
}

/// Total size (bytes) of the object files whose parsed data a continuous
/// [`Symbolizer`] keeps between windows.
pub const PARSED_OBJECTS_BUDGET_BYTES: u64 = 64 << 20;

/// Largest object file (bytes) whose parsed data a continuous [`Symbolizer`]
/// keeps between windows. Bigger ones (the agent's own binary, 35 MB with
/// 22 MB of DWARF; rustc's libraries, 150-200 MB) are parsed again for every
/// window that needs them and dropped right after, so that what stays
/// between windows does not depend on which big programs happened to run:
/// with all-or-nothing keeping, an agent's RssAnon between windows flipped
/// between 15 and 40 MiB as the window's objects met the budget or not
/// (issue 18).
pub const KEPT_OBJECT_MAX_BYTES: u64 = 32 << 20;

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
    /// symbolized.
    pub fn one_shot() -> Self {
        Self::with_keep(false)
    }

    fn with_keep(keep_parsed_objects: bool) -> Self {
        let debug_dirs = crate::unwind::identity::debug_dirs().to_vec();
        Symbolizer {
            kernel: kernel::Kallsyms::new(),
            objects: objects::ElfObjects::new(debug_dirs, keep_parsed_objects),
            vdso: vdso::Vdso::new(),
            jitdumps: jitdump::JitDumps::default(),
            perf_maps: perf_map::PerfMaps::default(),
            kernel_build_id: kernel::kernel_build_id(),
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

    /// Symbolize every stack in `aggregator` and build the window's profile.
    /// `tracker` must be the one the aggregator resolved mappings with (or a
    /// [`source::TrackerSnapshot`] of it taken for this aggregator).
    pub fn build_profile(
        &self,
        aggregator: &Aggregator,
        tracker: &dyn MappingSource,
        window: Window,
    ) -> Profile {
        // 1. Every source names its frames, in one batch per window.
        let sources = self.sources();
        let resolved = Resolved::resolve(&sources, tracker, frames_of(aggregator, tracker));

        // 2. Assemble mappings, frames and samples.
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
    use crate::sample::RawSample;

    #[test]
    fn demangles_rust_and_cpp_and_keeps_c() {
        assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE"), "foo::bar");
        assert_eq!(demangle("_Z3addii"), "add(int, int)");
        assert_eq!(demangle("main"), "main");
    }

    /// An address in the middle of the first executable mapping of this
    /// test process whose path satisfies `wanted` (/proc/self/maps).
    fn address_in(wanted: impl Fn(&str) -> bool) -> u64 {
        crate::process::maps::read_maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.executable && wanted(&m.path))
            .map(|m| m.start + (m.end - m.start) / 2)
            .unwrap()
    }

    #[test]
    fn continuous_symbolizer_keeps_only_the_latest_windows_objects() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let exe = exe.to_string_lossy().into_owned();
        let in_exe = address_in(|p| p == exe);
        let in_libc = address_in(|p| p.contains("/libc.so"));
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
                .objects
                .parsed
                .borrow()
                .keys()
                .map(|&object| tracker.object(object).expect("known object").path.clone())
                .collect();
            kept.sort();
            kept
        };
        let both = symbolize(&mut tracker, &[vec![in_libc, in_exe]]);
        assert_eq!(both.len(), 2, "{both:?}");
        let libc_only = symbolize(&mut tracker, &[vec![in_libc]]);
        assert_eq!(libc_only.len(), 1);
        assert!(libc_only[0].contains("/libc.so"), "{libc_only:?}");
        // The evicted executable is parsed again when a window needs it.
        assert_eq!(symbolize(&mut tracker, &[vec![in_exe, in_libc]]), both);
    }
}
