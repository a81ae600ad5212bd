//! The metric families that are not the agent's own counters: the text
//! format's writer ([`family`]) and the process-wide counts (memory, the
//! files profiled processes control, debuginfod, MiniDebugInfo, the
//! symbolizer's derived tables).

use std::fmt::Write;

use crate::agent::heap::HeapStats;
use crate::symbolize::debuginfod::DebuginfodStats;
use crate::symbolize::minidebuginfo::MiniDebugInfoStats;
use crate::symbolize::object_tables::TableBuilds;

/// One metric family: `# HELP`, `# TYPE` and a line per label set (`""`
/// for none; labels are written `key="value"` without braces).
pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str, series: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in series {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// The debuginfod client's counts (`stats`: none when no server is set,
/// and then no family): what it fetched, found cached, could not get, and
/// what its limits cut (`DEBUGINFOD_TIMEOUT`, `DEBUGINFOD_MAXSIZE`, the
/// window's debuginfod budget), and what a stop cut.
pub(super) fn render_debuginfod(out: &mut String, stats: Option<DebuginfodStats>) {
    let Some(d) = stats else {
        return;
    };
    family(
        out,
        "lightswitch_debuginfod_total",
        "counter",
        "Debuginfod: debug files fetched, found in the cache, build IDs no server could serve, \
         requests ended by their deadline, requests refused or cut over the size cap, build IDs \
         left for a later window because the window's debuginfod budget was spent, requests cut \
         or not started because the run was stopping.",
        &[
            ("outcome=\"fetched\"", d.fetched),
            ("outcome=\"cached\"", d.cached),
            ("outcome=\"failed\"", d.failed),
            ("outcome=\"timed_out\"", d.timed_out),
            ("outcome=\"too_large\"", d.too_large),
            ("outcome=\"skipped\"", d.skipped),
            ("outcome=\"cancelled\"", d.cancelled),
        ],
    );
}

/// MiniDebugInfo sections (`.gnu_debugdata`) read, and skipped as corrupt
/// or too large.
pub(super) fn render_minidebuginfo(out: &mut String, m: MiniDebugInfoStats) {
    family(
        out,
        "lightswitch_minidebuginfo_total",
        "counter",
        "MiniDebugInfo (.gnu_debugdata) sections decompressed and read, skipped as corrupt, \
         skipped because their index announced more than the size read.",
        &[
            ("outcome=\"read\"", m.read),
            ("outcome=\"corrupt\"", m.corrupt),
            ("outcome=\"too_large\"", m.too_large),
        ],
    );
}

/// The symbolizer's tables derived from objects, built: once per object
/// while its parsed data is kept, so a count that keeps growing with the
/// same objects means they are not kept (over the parsed-object budget).
pub(super) fn render_symbol_tables(out: &mut String, b: TableBuilds) {
    family(
        out,
        "lightswitch_symbol_tables_built_total",
        "counter",
        "Symbol tables the symbolizer derived from objects, by kind: Rust paths (DWARF and \
         .symtab), dynamic symbols of objects without section headers, MiniDebugInfo \
         (.gnu_debugdata inflated), PLT stub names (dynamic relocations).",
        &[
            ("table=\"rust_paths\"", b.rust_paths),
            ("table=\"dynamic_symbols\"", b.dynamic_symbols),
            ("table=\"minidebuginfo\"", b.minidebuginfo),
            ("table=\"plt\"", b.plt),
        ],
    );
}

/// What was refused or cut reading files profiled processes control
/// ([`crate::process::untrusted::counters`]).
pub(super) fn render_jit_files(out: &mut String) {
    let c = crate::process::untrusted::counters();
    family(
        out,
        "lightswitch_jit_files_total",
        "counter",
        "Perf maps and jitdump files, which profiled processes control: files refused (not a regular \
         file, a symlink, another user's), reads past their deadline or not started (every reader \
         busy), names cut to 4 KiB, entries dropped for a full budget, oversized jitdump records \
         skipped.",
        &[
            ("kind=\"files_refused\"", c.files_refused),
            ("kind=\"reads_timed_out\"", c.reads_timed_out),
            ("kind=\"reads_refused\"", c.reads_refused),
            ("kind=\"names_cut\"", c.names_cut),
            ("kind=\"entries_dropped\"", c.entries_dropped),
            ("kind=\"records_skipped\"", c.records_skipped),
        ],
    );
    family(
        out,
        "lightswitch_jit_file_bytes_unread_total",
        "counter",
        "Bytes of perf maps and jitdump files past their per-file read budget, left unread.",
        &[("", c.bytes_unread)],
    );
}

/// Objects of profiled processes given up on a hung file system, or
/// copied from one that can hang ([`crate::process::opener::counters`]).
pub(super) fn render_objects_given_up(out: &mut String) {
    let c = crate::process::opener::counters();
    family(
        out,
        "lightswitch_objects_given_up_total",
        "counter",
        "Mapped objects given up for the run: opening one, reading its ELF headers or copying it \
         passed its deadline (timed_out), it was not tried while a helper stuck on its file \
         system had not ended (not_tried), or it was too large to copy from a file system that \
         can hang (too_large). Their frames are named [read timed out: NAME] or [too large to \
         copy: NAME].",
        &[
            ("reason=\"timed_out\"", c.timed_out),
            ("reason=\"not_tried\"", c.not_tried),
            ("reason=\"too_large\"", c.too_large),
        ],
    );
    family(
        out,
        "lightswitch_objects_copied_total",
        "counter",
        "Mapped objects on a file system that can hang (FUSE, NFS, CIFS, 9p, ...) copied into \
         memory, so that no later read goes to that file system.",
        &[("", c.copied)],
    );
    family(
        out,
        "lightswitch_object_readers_stuck",
        "gauge",
        "Opener helper processes left behind past their deadline that have not ended (at most 8).",
        &[("", c.stuck_now)],
    );
}

/// Python frames shown as `[python: unknown]` and frames with no
/// eval-loop frame to go at ([`crate::unwind::interp::frame_counters`]);
/// Python processes by verdict ([`crate::unwind::interp::verdicts`]).
pub(super) fn render_python(out: &mut String) {
    let (unknown, unplaced) = crate::unwind::interp::frame_counters();
    family(
        out,
        "lightswitch_python_frames_total",
        "counter",
        "Python frames the BPF walker recorded that were shown as [python: unknown] (code object \
         unreadable, or freed and reused: its guard did not match), or dropped because the \
         sample's native stack had no eval-loop frame to put them at.",
        &[
            ("kind=\"unknown\"", unknown),
            ("kind=\"unplaced\"", unplaced),
        ],
    );
    let v = crate::unwind::interp::verdicts();
    family(
        out,
        "lightswitch_python_processes_total",
        "counter",
        "Processes found running a Python interpreter, by verdict: walked, unsupported (a version, \
         build or interpreter not walked: its stacks carry one [python: unsupported ...] frame), \
         unreadable (its memory could not be read in several looks over about 5 s).",
        &[
            ("verdict=\"walked\"", v.walked),
            ("verdict=\"unsupported\"", v.unsupported),
            ("verdict=\"unreadable\"", v.unreadable),
        ],
    );
}

/// The profiler process's own memory: `rss_bytes` its resident memory,
/// `heap` jemalloc's counters; a family only for what was read.
pub(super) fn render_process(out: &mut String, rss_bytes: Option<u64>, heap: Option<HeapStats>) {
    if let Some(rss) = rss_bytes {
        family(
            out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size of the profiler, bytes.",
            &[("", rss)],
        );
    }
    if let Some(heap) = heap {
        family(
            out,
            "lightswitch_heap_bytes",
            "gauge",
            "The profiler's heap as jemalloc counts it, bytes: live allocations, the pages they sit in, \
             jemalloc's metadata, all its resident pages, address space retained unmapped.",
            &[
                ("kind=\"allocated\"", heap.allocated),
                ("kind=\"active\"", heap.active),
                ("kind=\"metadata\"", heap.metadata),
                ("kind=\"resident\"", heap.resident),
                ("kind=\"retained\"", heap.retained),
            ],
        );
    }
}
