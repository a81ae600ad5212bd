//! Calls into blazesym for one object's addresses ([`super::objects`]),
//! bounded in memory for objects whose parsed data is not kept.
//!
//! blazesym parses DWARF one compilation unit at a time, on demand, and
//! keeps what it parsed for as long as its symbolizer lives: a batch of
//! addresses spread over an object costs the functions and line tables of
//! every unit the batch touches, at once. For an object that is dropped
//! right after its batch anyway, [`symbolize`] takes the batch in
//! runs of [`DWARF_CHUNK_ADDRESSES`] neighbouring addresses, each with a
//! symbolizer of its own dropped at the end of the run, so that the peak is
//! the units of one run, not of the whole batch. Issue 18: libpython built
//! with `-g` (23 MB, 9 MB of `.debug_info`) took 12-14 MiB of heap at once
//! for a 10 s window's 700-2,400 new addresses, the largest share of the
//! agent's memory spikes at window close; in runs of 64, 3-4 MiB at most,
//! for more time on that object (2,347 addresses: 110 -> 127 ms; 1,119:
//! 75 -> 135 ms), as units that runs share are parsed once per run.

use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer as BlazeSymbolizer};
use tracing::debug;

use super::elf_file::ObjectFile;
use super::lines::lines_of;
use crate::profile::Line;

/// Addresses (sorted, as the symbolizer's batches are) symbolized by one
/// short-lived blazesym symbolizer when an object's parsed data is not
/// kept ([`symbolize`]).
pub const DWARF_CHUNK_ADDRESSES: usize = 64;

/// What a batch's addresses are to blazesym.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InputKind {
    /// Offsets in the object file (`Input::FileOffset`).
    FileOffset,
    /// The object's own virtual addresses (`Input::VirtOffset`), for a
    /// separate debug file.
    VirtOffset,
}

impl InputKind {
    fn input(self, addrs: &[u64]) -> Input<&[u64]> {
        match self {
            InputKind::FileOffset => Input::FileOffset(addrs),
            InputKind::VirtOffset => Input::VirtOffset(addrs),
        }
    }
}

/// The heap blazesym's parsed data took, bytes, over the symbolizers this
/// module created for one object (each read by `heap_meter`,
/// [`crate::util::alloc::thread_net_allocated`], after its call, with the call's
/// results still held): an estimate of what keeping the object parsed
/// would cost ([`Self::estimate`]). Nothing is counted when the meter reads
/// nothing.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct ParsedBytes {
    /// Sum over every symbolizer.
    total: i64,
    /// DWARF calls counted (each run of [`symbolize`], or its one call).
    runs: i64,
    /// The smallest run's bytes: each run pays the same fixed part
    /// (ELF headers, symbol table, the DWARF units' index) again.
    smallest_run: i64,
}

/// A blazesym symbolizer with line info and inlined functions enabled
/// (names are demangled by [`super::demangle`], not by blazesym), following
/// `.gnu_debuglink` under `debug_dirs`.
pub(super) fn blazesym(debug_dirs: &[PathBuf]) -> BlazeSymbolizer {
    BlazeSymbolizer::builder()
        .set_debug_dirs(Some(debug_dirs))
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(false)
        .build()
}

/// One blazesym call for `addrs` of the file at `path` (its DWARF when
/// `debug_syms`, else its symbol tables only); failures are logged and give
/// no symbols.
fn call<'s>(
    symbolizer: &'s BlazeSymbolizer,
    path: &Path,
    debug_syms: bool,
    kind: InputKind,
    addrs: &[u64],
) -> Vec<Symbolized<'s>> {
    let mut elf = Elf::new(path);
    elf.debug_syms = debug_syms;
    symbolizer
        .symbolize(&Source::Elf(elf), kind.input(addrs))
        .unwrap_or_else(|err| {
            debug!(
                "{}: symbolization (debug info: {debug_syms}) failed: {err}",
                path.display()
            );
            Vec::new()
        })
}

/// The lines of each of `addrs` (sorted) in `path`, in order: from its
/// DWARF (names, inlined functions, source locations) when `debug_syms`,
/// else from its symbol tables. Through `kept` (the continuous
/// symbolizer's, whose parsed data stays) when given; otherwise with
/// symbolizers of its own, dropped before returning: for DWARF, one per run
/// of [`DWARF_CHUNK_ADDRESSES`] when `path` has DWARF of its own; else one
/// call for all (symbol-table names, which runs would parse again for
/// nothing; DWARF blazesym finds through `.gnu_debuglink` alone is then
/// parsed whole).
pub(super) fn symbolize(
    kept: Option<&BlazeSymbolizer>,
    debug_dirs: &[PathBuf],
    heap_meter: fn() -> Option<i64>,
    parsed: &mut ParsedBytes,
    debug_syms: bool,
    (path, kind, addrs): (&Path, InputKind, &[u64]),
) -> Vec<Option<Vec<Line>>> {
    if let Some(kept) = kept {
        return call(kept, path, debug_syms, kind, addrs)
            .iter()
            .map(lines_of)
            .collect();
    }
    let in_runs = debug_syms && ObjectFile::open(path).is_some_and(|f| f.has_dwarf());
    let run_length = if in_runs {
        DWARF_CHUNK_ADDRESSES
    } else {
        addrs.len().max(1)
    };
    let mut lines = Vec::with_capacity(addrs.len());
    for run in addrs.chunks(run_length) {
        let before = heap_meter();
        let own = blazesym(debug_dirs);
        let found = call(&own, path, debug_syms, kind, run);
        parsed.add(before, heap_meter(), debug_syms);
        // blazesym answers every input address, in order; a failed call
        // answers none.
        let start = lines.len();
        lines.extend(found.iter().take(run.len()).map(lines_of));
        lines.resize(start + run.len(), None);
    }
    lines
}

impl ParsedBytes {
    fn add(&mut self, before: Option<i64>, after: Option<i64>, run: bool) {
        let Some((before, after)) = before.zip(after) else {
            return;
        };
        let bytes = (after - before).max(0);
        self.total += bytes;
        if run {
            self.smallest_run = if self.runs == 0 {
                bytes
            } else {
                self.smallest_run.min(bytes)
            };
            self.runs += 1;
        }
    }

    /// What keeping the object parsed would cost, bytes: the total, less
    /// the fixed part every run after the first paid again (taken as the
    /// smallest run). Units that several runs parsed still count more than
    /// once; without this correction, the estimate grew with the batch
    /// (2,400 addresses are 38 runs) and decided keeping by the window's
    /// number of new addresses rather than by the object.
    pub(super) fn estimate(&self) -> i64 {
        self.total - (self.runs - 1).max(0) * self.smallest_run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The addresses of this test binary's own functions (it has DWARF:
    /// tests build with debug info), and of libc's, as file offsets.
    fn offsets_in(path: &str, count: usize) -> Vec<u64> {
        let maps = crate::process::maps::read_maps(std::process::id()).unwrap();
        let m = maps
            .iter()
            .find(|m| m.path == path && m.executable)
            .unwrap();
        let step = ((m.end - m.start) / count as u64).max(1);
        (0..count as u64)
            .map(|i| m.file_offset + i * step)
            .collect()
    }

    /// Runs of [`DWARF_CHUNK_ADDRESSES`] give each address the same lines
    /// as one call for the whole batch.
    #[test]
    fn runs_answer_as_one_call_does() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert!(ObjectFile::open(&exe).unwrap().has_dwarf());
        let offsets = offsets_in(exe.to_str().unwrap(), 5 * DWARF_CHUNK_ADDRESSES + 7);
        let whole = blazesym(&[]);
        let expected: Vec<_> = call(&whole, &exe, true, InputKind::FileOffset, &offsets)
            .iter()
            .map(lines_of)
            .collect();
        let mut parsed = ParsedBytes::default();
        let meter = crate::util::alloc::thread_net_allocated;
        let in_runs = symbolize(
            None,
            &[],
            meter,
            &mut parsed,
            true,
            (&exe, InputKind::FileOffset, &offsets),
        );
        assert_eq!(in_runs.len(), offsets.len());
        assert!(expected.iter().filter(|l| l.is_some()).count() > offsets.len() / 2);
        assert_eq!(in_runs, expected);
    }

    /// Each run after the first pays the fixed part again: counted once.
    #[test]
    fn the_estimate_counts_the_fixed_part_of_runs_once() {
        let mut parsed = ParsedBytes::default();
        assert_eq!(parsed.estimate(), 0);
        parsed.add(Some(1000), Some(1100), false);
        for bytes in [50, 30, 40] {
            parsed.add(Some(0), Some(bytes), true);
        }
        parsed.add(None, Some(5000), true);
        assert_eq!(parsed.estimate(), 100 + 120 - 2 * 30);
    }
}
