//! What the allocator does for every stage: how much a thread's work kept
//! ([`thread_net_allocated`]) and giving freed pages back to the kernel
//! ([`release_freed`]). The `lightswitch` binary allocates with jemalloc
//! (`src/main.rs`; `crate::agent::heap` has its heap profile); where it is
//! not the global allocator (the library's tests), these read nothing and
//! purge only jemalloc's own empty arenas.

/// Bytes the calling thread has allocated minus those it has freed since it
/// started (jemalloc's `thread.allocated` and `thread.deallocated`; memory
/// freed by another thread counts there). Compare two readings on one thread
/// to learn what the code between them kept. `None` when jemalloc is not
/// the process's allocator (its counters then stay at 0: the library's
/// tests) or the counters cannot be read.
pub fn thread_net_allocated() -> Option<i64> {
    use tikv_jemalloc_ctl::thread::{allocatedp, deallocatedp};
    let allocated = allocatedp::read().ok()?.get();
    let freed = deallocatedp::read().ok()?.get();
    (allocated > 0).then(|| allocated as i64 - freed as i64)
}

/// Return the pages of memory freed so far to the kernel now (jemalloc's
/// `arena.<MALLCTL_ARENAS_ALL>.purge`), rather than after `dirty_decay_ms`.
/// Called between the stages of a window (after the symbolizer's objects,
/// after the profile's assembly, after it is sent), whose transient
/// allocations (a big object's parsed DWARF, hash tables and buffers grown
/// by doubling) would otherwise stay resident while the next stage
/// allocates afresh, stacking into the agent's memory peaks (decision 0010).
/// Costs a few `madvise` calls. Where jemalloc is not the global allocator
/// (the library's tests), it only purges jemalloc's own empty arenas.
pub fn release_freed() {
    // MALLCTL_ARENAS_ALL (jemalloc.h): the mallctl arena index for all arenas.
    const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
    // SAFETY: a NUL-terminated name; `arena.<i>.purge` reads and writes no
    // value, so every pointer is null and the length 0 (any other is EPERM).
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if status != 0 {
        tracing::debug!("jemalloc arena.4096.purge: error {status}");
    }
}
