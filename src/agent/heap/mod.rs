//! The profiler's own heap profile, from jemalloc.
//!
//! The `lightswitch` binary allocates with jemalloc (`tikv-jemallocator`,
//! built with profiling support) and compiles in the configuration
//! [`DEFAULT_MALLOC_CONF`]: heap profiling is enabled but not active, so it
//! costs nothing until it is switched on ([`set_active`]). While active,
//! jemalloc records the stack of one allocation every 2^`lg_prof_sample`
//! bytes on average; [`dump`] turns what is live now into a pprof profile
//! (symbolized in this process by `jemalloc_pprof`, so it reads without the
//! binary at hand) or a flame graph. The configuration can be overridden at
//! start through jemalloc's environment variable [`MALLOC_CONF_ENV`].

use anyhow::{anyhow, Context, Result};
use jemalloc_pprof::{JemallocProfCtl, PROF_CTL};

mod pprof;

/// jemalloc configuration compiled into the binary (`src/main.rs` exports
/// it as the `_rjem_malloc_conf` symbol, a NUL-terminated string): profiling
/// compiled in and enabled, inactive at start, one sample per 512 KiB
/// allocated on average; and a background thread that returns freed pages
/// to the kernel once they have been unused for the decay time, 1 s
/// (`dirty_decay_ms:1000`; jemalloc's default is 10 s) with no second,
/// "muzzy" stage (`muzzy_decay_ms:0`). Without the thread, pages freed by a
/// thread that then goes quiet (the start-up table builds) stay resident for
/// the whole run: about 12 MiB in a whole-machine start with a cold unwind
/// cache. With the 10 s default, what each window's symbolization frees
/// stayed resident across the next window: under process churn at 997 Hz
/// with 1 s windows, VmRSS ran 71-176 MiB (RssAnon 56-106 MiB) against
/// 57-81 MiB (RssAnon 38-71 MiB) with 1 s
/// (docs/decisions/0008-symbols-kept-across-windows.md).
/// One arena (`narenas:1`; the default is four per CPU) and no per-thread
/// caches (`tcache:false`): the window worker frees what it parsed for a
/// window while the main thread allocates, and memory cached per thread or
/// stranded in another arena is not reused by the other; under churn with
/// 1 s windows RssAnon ran 5-6 MiB (about 8%) lower, for about 5% more CPU
/// (A/B runs side by side, docs/decisions/0008-symbols-kept-across-windows.md).
pub const DEFAULT_MALLOC_CONF: &[u8] =
    b"prof:true,prof_active:false,lg_prof_sample:19,background_thread:true,\
      dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1,tcache:false\0";

/// The environment variable jemalloc reads its configuration from at start
/// (it overrides [`DEFAULT_MALLOC_CONF`] option by option).
pub const MALLOC_CONF_ENV: &str = "_RJEM_MALLOC_CONF";

/// Output of [`dump`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapFormat {
    /// gzip'd pprof protobuf, sample type `inuse_space/bytes`.
    Pprof,
    /// SVG flame graph of the bytes in use.
    FlameGraph,
}

fn ctl() -> Result<std::sync::Arc<tokio::sync::Mutex<JemallocProfCtl>>> {
    PROF_CTL.clone().ok_or_else(|| {
        anyhow!(
            "heap profiling is disabled (jemalloc runs without prof:true; check {MALLOC_CONF_ENV})"
        )
    })
}

/// Whether heap profiling is compiled in and enabled (jemalloc's `opt.prof`).
pub fn available() -> bool {
    PROF_CTL.is_some()
}

/// Whether heap sampling is active now (jemalloc's `prof.active`). Blocks
/// while another thread dumps or switches; call it off async executors.
pub fn is_active() -> Result<bool> {
    Ok(ctl()?.blocking_lock().activated())
}

/// Switch heap sampling on or off. Switching it off also discards what was
/// sampled so far (jemalloc's `prof.reset`), so the next profile starts
/// from nothing. Blocks like [`is_active`].
pub fn set_active(active: bool) -> Result<()> {
    let ctl = ctl()?;
    let mut ctl = ctl.blocking_lock();
    if ctl.activated() == active {
        return Ok(());
    }
    let switched = if active {
        ctl.activate()
    } else {
        ctl.deactivate()
    };
    switched.with_context(|| format!("setting jemalloc's prof.active to {active}"))
}

/// The heap profile of this process now: the sampled allocations still
/// live, with their stacks, in `format`. Blocks like [`is_active`]; writes a
/// temporary file (jemalloc's `prof.dump`) in `$TMPDIR`.
///
/// The pprof form's mappings are given their segments' ranges and flags
/// (`src/agent/heap/pprof.rs`), so that pprof keeps the names in it. The stacks
/// are symbolized by the `backtrace` crate, which keeps the parsed DWARF
/// line tables of this binary (and a mapping of its file) in a
/// process-wide cache: about 65 MB of resident memory for the 35 MB
/// release binary, kept for the rest of the run. The cache is dropped after
/// every dump, so a dump costs its memory only while it runs (each dump
/// parses the tables again: about a second more per dump).
pub fn dump(format: HeapFormat) -> Result<Vec<u8>> {
    let ctl = ctl()?;
    let mut ctl = ctl.blocking_lock();
    let dumped = match format {
        HeapFormat::Pprof => ctl.dump_profile().and_then(|profile| {
            let gzip = profile.to_pprof(("inuse_space", "bytes"), ("space", "bytes"), None);
            pprof::repair(&gzip, &profile.mappings)
        }),
        HeapFormat::FlameGraph => ctl.dump_flamegraph(),
    };
    backtrace::clear_symbol_cache();
    dumped.context("dumping jemalloc's heap profile")
}

/// jemalloc's view of the profiler's heap, bytes (its `stats.*` counters,
/// refreshed by advancing `epoch`): what tells live data from memory the
/// allocator holds. `allocated` is what the program's live allocations
/// take; `active` the pages those sit in; `metadata` jemalloc's own
/// bookkeeping; `resident` every page jemalloc has resident (at least
/// active + metadata: the difference is freed memory not yet returned,
/// `dirty_decay_ms`); `retained` address space kept unmapped for reuse (not
/// resident).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeapStats {
    /// `stats.allocated`: bytes in live allocations.
    pub allocated: u64,
    /// `stats.active`: bytes of the pages live allocations sit in.
    pub active: u64,
    /// `stats.metadata`: bytes of jemalloc's own bookkeeping.
    pub metadata: u64,
    /// `stats.resident`: bytes of every page jemalloc holds resident.
    pub resident: u64,
    /// `stats.retained`: bytes of address space kept unmapped for reuse.
    pub retained: u64,
}

/// The current [`HeapStats`]; `None` when jemalloc is not the process's
/// allocator (it then reports nothing allocated: the library's tests) or a
/// counter cannot be read.
pub fn stats() -> Option<HeapStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    let read = |value: tikv_jemalloc_ctl::Result<usize>| value.ok().map(|v| v as u64);
    let stats = HeapStats {
        allocated: read(stats::allocated::read())?,
        active: read(stats::active::read())?,
        metadata: read(stats::metadata::read())?,
        resident: read(stats::resident::read())?,
        retained: read(stats::retained::read())?,
    };
    (stats.allocated > 0).then_some(stats)
}
