//! Encoders: pure functions from a [`crate::profile::Profile`] to bytes. One file per format.

pub mod firefox;
pub mod flamegraph;
pub mod folded;
pub mod pprof;
