//! The agent: one profiling run, one-shot or continuous, and what it serves
//! while it runs.
//!
//! - [`run`]: the run from pre-flight to summary ([`run::RunPlan`]).
//! - [`api`]: the HTTP API of `--listen` (on-demand profiles, metrics,
//!   heap profile).
//! - [`http`]: the accept loop, tokens and responses that the agent's API
//!   and the collector share.
//! - [`page`]: the web page and the endpoints it reads, on both servers.
//! - [`heap`]: the profiler's own heap profile, from jemalloc.

pub mod api;
pub mod heap;
pub mod http;
pub mod page;
pub mod run;
