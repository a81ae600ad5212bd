//! The vDSO as a symbol source: addresses in a process's `[vdso]` are named
//! in this process's own vDSO, the same image for every 64-bit process of
//! the running kernel (blazesym's process source reads it from memory).

use std::collections::HashMap;

use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Symbolizer as BlazeSymbolizer};
use blazesym::Pid;
use tracing::debug;

use super::lines::{lines_of, Lines};
use super::symbol_source::{Batch, FrameRef, Site, SymbolSource};
use super::MappingSource;

/// Name of the kernel's virtual shared object in `/proc/PID/maps`.
pub(super) const VDSO_MAPPING_NAME: &str = "[vdso]";

/// Names frames in `[vdso]` mappings; sites are `(0, offset in the vDSO)`.
pub(super) struct Vdso {
    inner: BlazeSymbolizer,
}

impl Vdso {
    /// A vDSO source with its own blazesym symbolizer (symbols only).
    pub(super) fn new() -> Self {
        Vdso {
            inner: BlazeSymbolizer::builder().enable_demangling(false).build(),
        }
    }
}

impl SymbolSource for Vdso {
    fn locate(&self, _tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site> {
        match frame {
            FrameRef::User { address, mapping }
                if mapping.object.is_none() && mapping.name == VDSO_MAPPING_NAME =>
            {
                Some((0, mapping.file_offset_of(address)))
            }
            _ => None,
        }
    }

    /// Offsets are found at the same offsets in this process's own vDSO
    /// (`/proc/self/maps`); those it cannot name are left out.
    fn symbolize(&self, _tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines> {
        if batch.is_empty() {
            return HashMap::new();
        }
        let offsets: Vec<u64> = batch.values().flatten().copied().collect();
        let own = match crate::process::maps::read_maps(std::process::id()) {
            Ok(entries) => entries.into_iter().find(|e| e.path == VDSO_MAPPING_NAME),
            Err(err) => {
                debug!("reading this process's maps for its vDSO: {err}");
                None
            }
        };
        let Some(own) = own else {
            return HashMap::new();
        };
        let addrs: Vec<u64> = offsets.iter().map(|o| own.start + o).collect();
        let mut source = Process::new(Pid::Slf);
        source.debug_syms = false;
        source.perf_map = false;
        let results = match self
            .inner
            .symbolize(&Source::Process(source), Input::AbsAddr(&addrs))
        {
            Ok(r) => r,
            Err(err) => {
                debug!("vDSO symbolization failed: {err}");
                return HashMap::new();
            }
        };
        offsets
            .iter()
            .zip(&results)
            .filter(|(&offset, _)| own.start + offset < own.end)
            .filter_map(|(&offset, sym)| Some(((0, offset), (lines_of(sym)?, true))))
            .collect()
    }
}
