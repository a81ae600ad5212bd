//! How long the tracker keeps what it knows of a process: exits, execs and
//! pid reuse put mappings on a retirement schedule, and
//! [`ProcessTracker::retire_exited`] drops them once no window still to be
//! symbolized can refer to them.
//!
//! The rule that makes this safe whatever the order in which events and
//! samples are drained: mappings are only dropped when both the moment they
//! were given up (exit or exec noticed, CLOCK_MONOTONIC) and the timestamp
//! of the latest sample resolved through them are before the caller's
//! cut-off, the earliest timestamp any open window can hold
//! ([`crate::profile::window::Windows::open_since_ns`]). A sample of a pid
//! taken after its process's exit was noticed is never resolved through the
//! exited process ([`ProcessTracker::find_mappings`]).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

use super::{MappingId, ProcessTracker};

impl ProcessTracker {
    /// Note that `pid` exited, noticed at `now_mono_ns` (CLOCK_MONOTONIC).
    /// Its mappings stay: samples taken before the exit may still be in the
    /// ring buffer or in windows not yet symbolized.
    pub fn process_exited(&mut self, pid: u32, now_mono_ns: u64) {
        if let Some(process) = self.processes.get_mut(&pid) {
            process.exited_at_ns.get_or_insert(now_mono_ns);
        }
    }

    /// Drop what is known of processes that exited, and of mappings given up
    /// by an exec or a pid reuse, before `before_mono_ns`, when no sample
    /// taken at or after that time was resolved through them. The caller
    /// passes the earliest sample timestamp an open window (or request) can
    /// hold: every window holding an earlier sample has been handed over.
    /// Processes known only by a failed read of their maps go too (a later
    /// sample reads them again). Keeps the tracker's memory flat under
    /// process churn. Returns how many exited processes were dropped.
    pub fn retire_exited(&mut self, before_mono_ns: u64) -> usize {
        let due = |exited: Option<u64>, last_sample: u64| {
            exited.is_some_and(|t| t < before_mono_ns) && last_sample < before_mono_ns
        };
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| due(p.exited_at_ns, p.last_sample_ns))
            .map(|(&pid, _)| pid)
            .collect();
        self.prune_earlier_images(before_mono_ns);
        let mut dropped = Vec::new();
        for pid in &gone {
            if let Some(process) = self.processes.remove(pid) {
                dropped.extend(process.all);
            }
        }
        self.processes.retain(|_, p| {
            !(p.all.is_empty() && p.earlier.is_empty() && p.last_sample_ns < before_mono_ns)
        });
        self.orphans.retain(|&(at, id)| {
            let keep = at >= before_mono_ns;
            if !keep {
                dropped.push(id);
            }
            keep
        });
        // A mapping interned again for a live process (an exec of the same
        // image, a reused pid), or given up again later, stays.
        let kept: HashSet<MappingId> = self
            .processes
            .values()
            .flat_map(|p| p.all.iter().copied())
            .chain(self.orphans.iter().map(|&(_, id)| id))
            .collect();
        dropped.retain(|id| !kept.contains(id));
        for id in dropped {
            if let Some(m) = self.mappings.remove(&id) {
                let key = (m.pid, m.start, m.end, m.file_offset);
                if self.mapping_index.get(&key) == Some(&id) {
                    self.mapping_index.remove(&key);
                }
            }
        }
        shrink_after_burst(&mut self.mappings);
        shrink_after_burst(&mut self.mapping_index);
        shrink_after_burst(&mut self.processes);
        if self.orphans.capacity() > SHRINK_MIN_CAPACITY
            && self.orphans.len() < self.orphans.capacity() / 4
        {
            self.orphans.shrink_to(self.orphans.len() * 2);
        }
        gone.len()
    }
}

/// Smallest table (slots) [`shrink_after_burst`] shrinks (and smallest
/// capacity of the orphaned-mappings list that shrinks likewise).
const SHRINK_MIN_CAPACITY: usize = 4096;

/// Give back the memory of a table that a burst grew (a start-up scan, a
/// build starting hundreds of processes at once): a hash table keeps its
/// largest capacity otherwise. Once fewer than a quarter of at least
/// [`SHRINK_MIN_CAPACITY`] slots are used, it shrinks to twice its entries.
/// Issue 18: under churn from Rust builds, the tracker's two mapping tables
/// held 16.6 MB of slots (heap profile) for a fraction as many mappings.
fn shrink_after_burst<K: Eq + Hash, V, S: BuildHasher>(table: &mut HashMap<K, V, S>) {
    if table.capacity() > SHRINK_MIN_CAPACITY && table.len() < table.capacity() / 4 {
        table.shrink_to(table.len() * 2);
    }
}
