//! Senders: where finished profiles go. One file per backend.

pub mod disk;
