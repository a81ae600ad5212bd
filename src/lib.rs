//! lightswitch: a standalone eBPF CPU profiler for Linux.
//!
//! The top-level modules are the pipeline's stages, in the order data flows
//! (`docs/architecture.md` has the table of stage, folder, key type and doc
//! page):
//!
//! 1. [`sampling`]: the BPF program on perf events, its loader
//!    ([`sampling::sampler::Sampler`]), pre-flight checks, and the records it
//!    reports ([`sampling::records::RawSample`]).
//! 2. [`unwind`]: unwind tables built from each object's CFI, loaded into the
//!    BPF walker, and the walks user space finishes.
//! 3. [`process`]: processes, their mappings and the objects they map.
//! 4. [`symbolize`]: addresses to function names, files and lines.
//! 5. [`profile`]: the format-neutral [`profile::Profile`], exact-stack
//!    aggregation, windows, and the encoders and decoders of
//!    [`profile::format`].
//! 6. [`output`]: profile files, the sudo hand-over, and the senders.
//! 7. [`agent`]: one profiling run ([`agent::run`]), the on-demand HTTP API
//!    ([`agent::api`]), the HTTP plumbing and web page both servers share.
//! 8. [`collector`]: `lightswitch collector`, the receiving server.
//! 9. [`commands`]: the command line ([`commands::cli`], which alone sees
//!    clap and builds each command's plan), `record`, `report` and `diff`.
//!
//! [`util`] holds what every stage shares (panic containment, time and text
//! formatting, the HTTP header names between sender and collector).

#![deny(missing_docs)]

// In the order data flows (rustfmt keeps the order of separate groups).
pub mod sampling;

pub mod unwind;

pub mod process;

pub mod symbolize;

pub mod profile;

pub mod output;

pub mod agent;

pub mod collector;

pub mod commands;

pub mod util;
