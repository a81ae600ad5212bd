//! The commands: [`cli`] parses the command line with clap and builds one
//! plan per command (the only module that sees clap); [`record`] runs a
//! command under the profiler; [`compare`] reads saved profiles back for
//! `report` and `diff`.

pub mod cli;
pub mod compare;
pub mod record;
