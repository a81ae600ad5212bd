//! The libbpf-rs skeleton generated at build time from `src/bpf/profiler.bpf.c`
//! (see `build.rs`), and plain-data views of the record types in `src/bpf/profiler.h`.
#![allow(clippy::all, missing_docs, non_camel_case_types, dead_code)]

include!(concat!(env!("OUT_DIR"), "/profiler.skel.rs"));
