//! lightswitch: a standalone eBPF CPU profiler for Linux.
//!
//! The pipeline (see `docs/architecture.md`): [`sampler`] (BPF program on perf events,
//! ring buffer of [`sample::RawSample`]s) -> [`process`] (mappings and
//! objects) -> [`profile::aggregate`] (exact stacks) -> [`symbolize`]
//! (blazesym) -> [`profile::Profile`] -> [`format`] encoders -> [`sender`]s.
//! [`run`] drives one profiling run; [`cli`] parses the command line and
//! builds the stages' config structs; [`server`] answers on-demand profile,
//! heap ([`heap`]) and metrics requests over HTTP (`--listen`);
//! [`collector`] receives profiles from [`sender::remote`] ([`wire`] names
//! the headers between them); [`files`] writes every file atomically;
//! [`text`] words the summaries.

#![deny(missing_docs)]

pub mod bpf_info;
pub mod cli;
pub mod collector;
pub mod compare;
pub mod files;
pub mod format;
pub mod guard;
pub mod heap;
pub mod httpd;
pub mod interp;
pub mod preflight;
pub mod process;
pub mod profile;
pub mod record;
pub mod run;
pub mod sample;
pub mod sampler;
pub mod sender;
pub mod server;
mod skel;
pub mod sudo;
pub mod symbolize;
pub mod text;
pub mod timefmt;
pub mod unwind;
pub mod web;
pub mod wire;
