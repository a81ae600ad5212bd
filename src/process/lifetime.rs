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

use super::{MappingId, ObjectFile, ObjectId, ProcessTracker};

impl ProcessTracker {
    /// Note that `pid` exited, noticed at `now_mono_ns` (CLOCK_MONOTONIC).
    /// Its mappings stay: samples taken before the exit may still be in the
    /// ring buffer or in windows not yet symbolized.
    pub fn process_exited(&mut self, pid: u32, now_mono_ns: u64) {
        if let Some(process) = self.processes.get_mut(&pid) {
            process.exited_at_ns.get_or_insert(now_mono_ns);
        }
    }

    /// Note as exited (at `now_mono_ns`) the processes no longer in
    /// `/proc` whose exit the tracker was not told of, at most once per
    /// [`VANISHED_SWEEP_NS`]; returns their pids (for
    /// [`super::walker::ProcessFollower::processes_vanished`]). The exit
    /// event comes only for processes described to the walker, and is lost
    /// when the events ring buffer is full: without this, such a process's
    /// mappings (and their objects) stayed for the whole run (decision 0008:
    /// the walker's map of descriptions filled up under churn, after which
    /// no new process was described and none of their exits reported). A
    /// pid reused since passes for the process the tracker knows; its exit
    /// is caught later.
    pub fn notice_vanished(&mut self, now_mono_ns: u64) -> Vec<u32> {
        if now_mono_ns.saturating_sub(self.last_vanished_sweep_ns) < VANISHED_SWEEP_NS {
            return Vec::new();
        }
        self.last_vanished_sweep_ns = now_mono_ns;
        let mut vanished = Vec::new();
        for (&pid, process) in &mut self.processes {
            if process.exited_at_ns.is_none()
                && std::fs::symlink_metadata(format!("/proc/{pid}")).is_err()
            {
                process.exited_at_ns = Some(now_mono_ns);
                vanished.push(pid);
            }
        }
        vanished
    }

    /// Drop what is known of processes that exited (more than
    /// [`super::EXIT_GRACE_NS`] before `before_mono_ns`), and of mappings
    /// given up by an exec or a pid reuse before it, when no sample
    /// taken at or after that time was resolved through them. The caller
    /// passes the earliest sample timestamp an open window (or request) can
    /// hold: every window holding an earlier sample has been handed over.
    /// Processes known only by a failed read of their maps go too (a later
    /// sample reads them again). Keeps the tracker's memory flat under
    /// process churn. Returns how many exited processes were dropped.
    pub fn retire_exited(&mut self, before_mono_ns: u64) -> usize {
        let due = |gone: Option<u64>, last_sample: u64| {
            gone.is_some_and(|t| t < before_mono_ns) && last_sample < before_mono_ns
        };
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| due(p.gone_after_ns(), p.last_sample_ns))
            .map(|(&pid, _)| pid)
            .collect();
        self.prune_earlier_images(before_mono_ns);
        let mut dropped = Vec::new();
        self.retired_pids.clear();
        for pid in &gone {
            if let Some(process) = self.processes.remove(pid) {
                self.retired_pids.push(*pid);
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
        self.drop_mappings(dropped);
        self.retire_unused_objects(before_mono_ns);
        self.retire_departed_containers(before_mono_ns);
        gone.len()
    }

    /// Forget now what no window can refer to of processes gone (their exit
    /// noticed, and the grace after it over) before `drained_before_ns`,
    /// and of mappings given up by an exec or a pid reuse before it: every
    /// sample taken before that time (CLOCK_MONOTONIC ns) has been drained
    /// and resolved, the caller promises (the time the ring buffers were
    /// last consumed, less a slack, and no earlier than any sample still
    /// held back). The process's description goes, and so do the mappings
    /// no sample was resolved through; the sampled ones become orphans and
    /// retire with the windows holding them ([`Self::retire_exited`]).
    /// Processes with a JIT perf map or jitdump file wait for that:
    /// symbolizing their window reads the file by pid. Issue 18: under
    /// churn, a 10 s window's close freed thousands of exited processes'
    /// descriptions and unsampled mappings, a third of the window's
    /// memory. Returns how many processes were forgotten.
    pub fn trim_departed(&mut self, drained_before_ns: u64) -> usize {
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| {
                p.gone_after_ns().is_some_and(|t| t < drained_before_ns)
                    && p.perf_map.get().is_none()
                    && p.jitdump.get().is_none()
            })
            .map(|(&pid, _)| pid)
            .collect();
        let mut dropped = Vec::new();
        for pid in &gone {
            let Some(mut process) = self.processes.remove(pid) else {
                continue;
            };
            let at = process
                .exited_at_ns
                .unwrap_or(0)
                .max(process.last_sample_ns);
            process.container_departs(*pid, at, &mut self.departed_containers);
            for id in process.all {
                if self.mappings.get(&id).is_some_and(|h| h.sampled) {
                    self.orphans.push((at, id));
                } else {
                    dropped.push(id);
                }
            }
        }
        let mappings = &self.mappings;
        self.orphans.retain(|&(at, id)| {
            let keep = at >= drained_before_ns || mappings.get(&id).is_some_and(|h| h.sampled);
            if !keep {
                dropped.push(id);
            }
            keep
        });
        self.drop_mappings(dropped);
        gone.len()
    }

    /// Remove `dropped` from the mapping tables, except those a held
    /// process or orphan still has: a mapping interned again for a live
    /// process (an exec of the same image, a reused pid), or given up again
    /// later, stays.
    fn drop_mappings(&mut self, mut dropped: Vec<MappingId>) {
        if !dropped.is_empty() {
            let kept: HashSet<MappingId> = self
                .processes
                .values()
                .flat_map(|p| p.all.iter().copied())
                .chain(self.orphans.iter().map(|&(_, id)| id))
                .collect();
            dropped.retain(|id| !kept.contains(id));
        }
        for id in dropped {
            if let Some(m) = self.mappings.remove(&id).map(|h| h.mapping) {
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
    }

    /// The objects the latest [`Self::retire_exited`] retired, still open:
    /// the caller tells the walker to forget their files
    /// ([`super::walker::ProcessFollower::objects_retired`]) before they are
    /// closed, so that no inode the kernel reuses for another file is
    /// described with their tables. Those not taken are closed at the next
    /// retirement.
    pub fn take_retired_objects(&mut self) -> Vec<(ObjectId, ObjectFile)> {
        std::mem::take(&mut self.retired_objects)
    }

    /// The pids the latest [`Self::retire_exited`] dropped: what the
    /// caller kept of them beside the tracker (their interpreters) can go.
    /// Those not taken are forgotten at the next retirement.
    pub fn take_retired_pids(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.retired_pids)
    }

    /// Close and forget the objects no held mapping has referred to for
    /// [`OBJECT_GRACE_NS`] of retirement cut-offs (`now_mono_ns`: this
    /// one). Issue 18: every object ever mapped by a sampled process kept
    /// its entry and an open descriptor for the whole run, so a build
    /// machine (every test binary and build script a new file) grew both
    /// without bound, and deleted files stayed on disk. The grace keeps an
    /// object that processes map again and again (a program started in a
    /// loop) under one id, so that its unwind table and parsed symbols
    /// are not built again for a new one.
    fn retire_unused_objects(&mut self, now_mono_ns: u64) {
        let used: HashSet<ObjectId> = self
            .mappings
            .values()
            .filter_map(|h| h.mapping.object)
            .collect();
        let unused = &mut self.unused_objects;
        unused.retain(|id, _| !used.contains(id));
        let mut gone = Vec::new();
        for &id in self.objects.keys().filter(|id| !used.contains(id)) {
            let since = *unused.entry(id).or_insert(now_mono_ns);
            if now_mono_ns.saturating_sub(since) >= OBJECT_GRACE_NS {
                gone.push(id);
            }
        }
        // Those the caller did not take since the last retirement close now.
        self.retired_objects.clear();
        for id in gone {
            unused.remove(&id);
            if let Some(object) = self.objects.remove(&id) {
                if self.object_index.get(&object.file_key) == Some(&id) {
                    self.object_index.remove(&object.file_key);
                }
                self.retired_objects.push((id, object));
            }
        }
        shrink_after_burst(&mut self.objects);
        shrink_after_burst(&mut self.object_index);
        shrink_after_burst(&mut self.unused_objects);
    }
}

/// Shortest time between two looks for processes that vanished unnoticed
/// ([`ProcessTracker::notice_vanished`]), ns.
pub const VANISHED_SWEEP_NS: u64 = 5_000_000_000;

/// How long an object stays after the last mapping of it was retired, ns
/// (of the retirement cut-off's clock, CLOCK_MONOTONIC).
pub(super) const OBJECT_GRACE_NS: u64 = 60_000_000_000;

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
