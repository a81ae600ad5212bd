//! Where symbols come from besides the objects themselves: separate debug
//! files under the debug directories (`--debug-dirs`), debuginfod servers
//! (`--debuginfod`, `--debuginfod-cache`) and the inflated copies of
//! compressed debug information ([`super::debug_copy`]). The settings are
//! plain data in a run's plan ([`SymbolSettings`], built from the flags by
//! `crate::commands::cli`); at the start of a run they become one
//! [`SymbolContext`] that every symbolizer of the run, and the unwind
//! tables' builders (the debug directories), are given. Nothing of them is
//! process-wide.

use std::path::PathBuf;
use std::sync::Arc;

use super::debug_copy::DebugCopies;
use super::debuginfod::{Debuginfod, DebuginfodStats};
use crate::unwind::identity::DEFAULT_DEBUG_ROOT;

/// The symbol sources a run is told about on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolSettings {
    /// Directories separate debug files are looked up in, in order
    /// (`--debug-dirs`; default [`DEFAULT_DEBUG_ROOT`]).
    pub debug_dirs: Vec<PathBuf>,
    /// debuginfod servers (`--debuginfod`); empty: the space-separated
    /// `DEBUGINFOD_URLS`, and none when that is unset.
    pub debuginfod_urls: Vec<String>,
    /// Where fetched debug files are cached (`--debuginfod-cache`); `None`:
    /// the default of [`super::debuginfod`].
    pub debuginfod_cache: Option<PathBuf>,
}

impl Default for SymbolSettings {
    /// [`DEFAULT_DEBUG_ROOT`], and debuginfod servers from the environment.
    fn default() -> Self {
        SymbolSettings {
            debug_dirs: vec![PathBuf::from(DEFAULT_DEBUG_ROOT)],
            debuginfod_urls: Vec::new(),
            debuginfod_cache: None,
        }
    }
}

/// What a run's symbolizers share: the debug directories, the one
/// debuginfod client (`None` without servers), whose counters the summary
/// and `/metrics` read, and the inflated debug copies (`None`: none are
/// made). Cheap to clone (shared parts).
#[derive(Clone)]
pub struct SymbolContext {
    /// Directories separate debug files are looked up in.
    pub debug_dirs: Arc<[PathBuf]>,
    /// The run's debuginfod client.
    pub debuginfod: Option<Arc<Debuginfod>>,
    /// The run's copies of compressed debug information.
    pub debug_copies: Option<Arc<DebugCopies>>,
}

impl SymbolContext {
    /// The context of `settings`, with debug copies in `copies_dir` (a
    /// run's unwind cache directory's [`super::debug_copy::SUBDIRECTORY`];
    /// `None`: no copies). Sets up the debuginfod client when servers are
    /// given (it removes partial files earlier runs left in its cache).
    pub fn new(settings: &SymbolSettings, copies_dir: Option<PathBuf>) -> Self {
        SymbolContext {
            debug_dirs: settings.debug_dirs.as_slice().into(),
            debuginfod: Debuginfod::new(
                &settings.debuginfod_urls,
                settings.debuginfod_cache.clone(),
            )
            .map(Arc::new),
            debug_copies: copies_dir.map(|dir| Arc::new(DebugCopies::new(dir))),
        }
    }

    /// What the debuginfod client did so far; `None` without servers.
    pub fn debuginfod_stats(&self) -> Option<DebuginfodStats> {
        self.debuginfod.as_ref().map(|d| d.stats())
    }
}

impl std::fmt::Debug for SymbolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymbolContext")
            .field("debug_dirs", &self.debug_dirs)
            .field("debuginfod", &self.debuginfod.is_some())
            .field("debug_copies", &self.debug_copies)
            .finish()
    }
}

impl Default for SymbolContext {
    /// The context of [`SymbolSettings::default`], without debug copies.
    fn default() -> Self {
        SymbolContext::new(&SymbolSettings::default(), None)
    }
}
