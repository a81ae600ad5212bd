//! Sampling, the first stage: the BPF program (`src/sampling/bpf/`) that
//! samples stacks on perf events and walks them with unwind tables, and
//! what user space needs to run it.
//!
//! - [`sampler`]: loads and attaches the program ([`sampler::Sampler`]),
//!   reads its ring buffer and counters, fills its maps.
//! - [`preflight`]: checks the machine can run it, before anything is loaded.
//! - [`records`]: the records the program reports ([`records::RawSample`],
//!   process events) and the mapping descriptions user space gives it.
//! - [`unwind_row`]: the unwind row and page layouts the walker reads.
//! - [`bpf_info`]: what the kernel reports of the loaded programs
//!   (verifier instruction counts).

pub mod bpf_info;
pub mod preflight;
pub mod records;
pub mod sampler;
pub(crate) mod skel;
pub mod unwind_row;
