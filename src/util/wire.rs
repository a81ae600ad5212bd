//! The HTTP protocol between the remote sender ([`crate::output::sender::remote`])
//! and `lightswitch collector` ([`crate::collector`]): the headers that go
//! with a pushed profile and with a merge's answer. The body is gzip'd pprof
//! with the pprof MIME type of [`crate::profile::format::ProfileFormat::mime_type`].

/// Request header naming the host the profile comes from.
pub const HOST_HEADER: &str = "X-Lightswitch-Host";
/// Request header with the window's start: ns since the Unix epoch, or an
/// RFC 3339 time.
pub const WINDOW_START_HEADER: &str = "X-Lightswitch-Window-Start";
/// Request header with the window's end, like [`WINDOW_START_HEADER`].
pub const WINDOW_END_HEADER: &str = "X-Lightswitch-Window-End";
/// Request header with the number of samples in the profile.
pub const SAMPLES_HEADER: &str = "X-Lightswitch-Samples";
/// Response header of a merge: how many stored profiles it merged.
pub const MERGED_PROFILES_HEADER: &str = "X-Lightswitch-Merged-Profiles";
/// Response header of a merge: the off-CPU waits (`--off-cpu`) in it
/// (`X-Lightswitch-Samples` counts on-CPU samples only).
pub const OFF_CPU_WAITS_HEADER: &str = "X-Lightswitch-Off-Cpu-Waits";
/// Response header of a merge: stored profiles that could not be read or
/// decoded and were left out.
pub const SKIPPED_PROFILES_HEADER: &str = "X-Lightswitch-Skipped-Profiles";
/// Response header of a differential flame graph: samples in the base range
/// (`X-Lightswitch-Samples` gives the new range's).
pub const BASE_SAMPLES_HEADER: &str = "X-Lightswitch-Base-Samples";
