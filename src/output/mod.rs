//! Output: where finished profiles go.
//!
//! - [`sudo`]: under sudo, files and directories are handed to the user
//!   who started lightswitch.
//! - [`sender`]: the destinations of a run's windows (disk, OTLP,
//!   Pyroscope, a lightswitch collector) and the queue in front of them.

pub mod sender;
pub mod sudo;
