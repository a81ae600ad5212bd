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

/// Symbolizes windows of samples. [`Symbolizer::new`] keeps blazesym's
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
    inner: std::cell::RefCell<BlazeSymbolizer>,
    keep_parsed_objects: bool,
    /// Objects whose parsed data `inner` holds.
    parsed: std::cell::RefCell<HashMap<ObjectId, objects::ParsedObject>>,
    kernel_build_id: Option<String>,
    /// Where separate debug files are looked up (by build ID, and for
    /// `.gnu_debuglink` names).
    debug_dirs: Vec<PathBuf>,
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
        let debug_dirs = crate::unwind::identity::debug_dirs().to_vec();
        Symbolizer {
            inner: std::cell::RefCell::new(Self::blazesym(&debug_dirs)),
            keep_parsed_objects: true,
            parsed: Default::default(),
            kernel_build_id: kernel::kernel_build_id(),
            debug_dirs,
        }
    }

    /// A symbolizer for a single profile: like [`Symbolizer::new`], but
    /// each object's parsed data is dropped once its addresses are
    /// symbolized.
    pub fn one_shot() -> Self {
        Symbolizer {
            keep_parsed_objects: false,
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

    fn symbolize_kernel(&self, addrs: &[u64]) -> HashMap<u64, Lines> {
        if addrs.is_empty() {
            // blazesym would read all of /proc/kallsyms (~100 ms) first.
            return HashMap::new();
        }
        let source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            kaslr_offset: Some(0),
            debug_syms: false,
            ..Default::default()
        });
        let inner = self.inner.borrow();
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

    /// Symbolize every stack in `aggregator` and build the window's profile.
    /// `tracker` must be the one the aggregator resolved mappings with (or a
    /// [`source::TrackerSnapshot`] of it taken for this aggregator).
    pub fn build_profile<S: MappingSource + ?Sized>(
        &self,
        aggregator: &Aggregator,
        tracker: &S,
        window: Window,
    ) -> Profile {
        // 1. The unique addresses to symbolize.
        let (kernel_addrs, object_offsets, vdso_offsets) = unique_addresses(aggregator, tracker);

        // 2. Symbolize them in batches.
        let kernel_addrs: Vec<u64> = kernel_addrs.into_iter().collect();
        let kernel_lines = self.symbolize_kernel(&kernel_addrs);
        let mut user_lines: HashMap<(ObjectId, u64), Lines> = HashMap::new();
        let kept = self.objects_to_keep(tracker, &object_offsets);
        for (object, offsets) in &object_offsets {
            let offsets: Vec<u64> = offsets.iter().copied().collect();
            let keep = kept.contains_key(object);
            let results = self.symbolize_object(tracker, *object, &offsets, keep);
            let name = file_name(tracker.object_path(*object).unwrap_or("[unknown]"));
            for (offset, lines) in offsets.iter().zip(results) {
                let entry = match lines {
                    Some(lines) => (lines, true),
                    None => (vec![unknown_line(format!("{name}+0x{offset:x}"))], false),
                };
                user_lines.insert((*object, *offset), entry);
            }
        }
        if self.keep_parsed_objects {
            self.keep_only(&kept);
        }
        let vdso_lines = self.symbolize_vdso(&vdso_offsets.into_iter().collect::<Vec<_>>());

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
