//! Calls into blazesym for one object's addresses ([`super::objects`]),
//! bounded in memory for objects whose parsed data is not kept.
//!
//! blazesym parses DWARF one compilation unit at a time, on demand, and
//! keeps what it parsed for as long as its symbolizer lives: a batch of
//! addresses spread over an object costs the functions and line tables of
//! every unit the batch touches, at once. For an object that is dropped
//! right after its batch anyway, [`symbolize_dwarf`] takes the batch in
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
/// kept ([`symbolize_dwarf`]).
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

/// The heap blazesym's parsed data took, bytes, summed over the
/// symbolizers this module created (each measured just before it was
/// dropped by `heap_meter`, [`crate::heap::thread_net_allocated`]): what
/// keeping the object parsed would cost, over-counted by the units that
/// several runs parsed. 0 when the meter reads nothing.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct ParsedBytes(pub i64);

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

/// The symbol-table names of `addrs` in `path`, through `kept` (the
/// continuous symbolizer's, whose parsed data stays) or else a symbolizer
/// of its own, dropped on return.
pub(super) fn symbolize_symbols(
    kept: Option<&BlazeSymbolizer>,
    debug_dirs: &[PathBuf],
    heap_meter: fn() -> Option<i64>,
    parsed: &mut ParsedBytes,
    (path, kind, addrs): (&Path, InputKind, &[u64]),
) -> Vec<Option<Vec<Line>>> {
    match kept {
        Some(kept) => call(kept, path, false, kind, addrs)
            .iter()
            .map(lines_of)
            .collect(),
        None => {
            let before = heap_meter();
            let own = blazesym(debug_dirs);
            let lines = call(&own, path, false, kind, addrs)
                .iter()
                .map(lines_of)
                .collect();
            parsed.add(before, heap_meter());
            lines
        }
    }
}

/// The DWARF lines (names, inlined functions, source locations) of each of
/// `addrs` (sorted) in `path`, in order: through `kept` when given;
/// otherwise in runs of [`DWARF_CHUNK_ADDRESSES`], each with its own
/// symbolizer, when `path` has DWARF (without it, blazesym falls back to the
/// symbol table, which a run would parse again for nothing).
pub(super) fn symbolize_dwarf(
    kept: Option<&BlazeSymbolizer>,
    debug_dirs: &[PathBuf],
    heap_meter: fn() -> Option<i64>,
    parsed: &mut ParsedBytes,
    (path, kind, addrs): (&Path, InputKind, &[u64]),
) -> Vec<Option<Vec<Line>>> {
    if let Some(kept) = kept {
        return call(kept, path, true, kind, addrs)
            .iter()
            .map(lines_of)
            .collect();
    }
    let chunk = if ObjectFile::open(path).is_some_and(|f| f.has_dwarf()) {
        DWARF_CHUNK_ADDRESSES
    } else {
        addrs.len().max(1)
    };
    let mut lines = Vec::with_capacity(addrs.len());
    for run in addrs.chunks(chunk) {
        let before = heap_meter();
        let own = blazesym(debug_dirs);
        let found = call(&own, path, true, kind, run);
        parsed.add(before, heap_meter());
        // blazesym answers every input address, in order; a failed call
        // answers none.
        lines.extend(found.iter().map(lines_of));
        lines.resize(lines.len() + run.len() - found.len(), None);
    }
    lines
}

impl ParsedBytes {
    fn add(&mut self, before: Option<i64>, after: Option<i64>) {
        if let Some((before, after)) = before.zip(after) {
            self.0 += (after - before).max(0);
        }
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
        let meter = crate::heap::thread_net_allocated;
        let in_runs = symbolize_dwarf(
            None,
            &[],
            meter,
            &mut parsed,
            (&exe, InputKind::FileOffset, &offsets),
        );
        assert_eq!(in_runs.len(), offsets.len());
        assert!(expected.iter().filter(|l| l.is_some()).count() > offsets.len() / 2);
        assert_eq!(in_runs, expected);
    }
}
