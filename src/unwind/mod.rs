//! Unwind tables: each object's DWARF CFI (`.eh_frame`, else `.debug_frame`)
//! compiled into compact rows the BPF program can search (format:
//! `docs/unwind-tables.md`, C layout in `src/bpf/profiler.h`).

pub mod row;
