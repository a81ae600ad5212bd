//! The libbpf-rs skeleton generated at build time from `src/sampling/bpf/profiler.bpf.c`
//! (see `build.rs`), the numbers its headers `#define` ([`defines`]), and
//! plain-data views of the record types in `src/sampling/bpf/profiler.h`.
#![allow(clippy::all, missing_docs, non_camel_case_types, dead_code)]

include!(concat!(env!("OUT_DIR"), "/profiler.skel.rs"));

/// The numbers `src/sampling/bpf/profiler.h`, `arch_x86_64.h` and
/// `python.h` `#define` (page bits, copy sizes, ucontext offsets, limits,
/// the Python walker's slot and flags), as `u64` constants of
/// the same names, generated from the headers by `build.rs`: user space
/// never writes one of them again.
pub mod defines {
    include!(concat!(env!("OUT_DIR"), "/bpf_defines.rs"));
}

// SAFETY: these generated types mirror the records of src/sampling/bpf/profiler.h:
// repr(C), integers and integer arrays only, with every padding byte an
// explicit field, so any byte string of their size is a valid value and every
// byte of a value is initialized.
unsafe impl plain::Plain for types::sample_header {}
unsafe impl plain::Plain for types::process_event {}
unsafe impl plain::Plain for types::process_info {}
unsafe impl plain::Plain for types::exec_mapping {}
unsafe impl plain::Plain for types::exec_time {}
unsafe impl plain::Plain for types::file_key {}
unsafe impl plain::Plain for types::object_file {}
unsafe impl plain::Plain for types::stack_copy {}
