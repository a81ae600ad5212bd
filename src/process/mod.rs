//! Process tracking: which objects each sampled process has mapped where.
//!
//! On a process's first sample its `/proc/PID/maps` is read and every
//! executable file-backed mapping's object is opened through
//! `/proc/PID/map_files/START-END` (falling back to `/proc/PID/root/PATH`),
//! so objects inside containers and deleted binaries stay readable, and a
//! process that exits keeps everything needed to symbolize its samples.
//! Objects are shared by every process that maps them (keyed by device and inode).
//! An address outside every known mapping (e.g. after `dlopen`) triggers a
//! re-read of the maps (see [`ProcessTracker::find_mappings`] for how often).
//! A process's images follow each other in time (images.rs): a sample is
//! resolved through the image the process had when the sample was taken.
//! Process lifetimes (the start-up scan, exec, fork, exit) are followed for
//! the BPF walker in walker.rs; lifetime.rs says when what the tracker
//! knows of exited and exec'd processes can go; container.rs which
//! container each sampled process runs in (`/proc/PID/cgroup`). Objects
//! (objects.rs) are opened, and their ELF identity read, by opener/: in a helper process
//! within a deadline, so that a hung file system never stalls the sampling
//! thread nor the profiler's exit; objects on file systems that can hang
//! are handed on as copies in memory.

mod anon_text;
pub mod container;
mod images;
pub mod jit;
mod lifetime;
pub mod maps;
mod objects;
pub mod opener;
#[cfg(test)]
mod tests;
pub mod untrusted;
pub mod walker;

use rustc_hash::FxHashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use maps::MapsEntry;

/// Shortest time between two re-reads of one process's maps for addresses
/// in no known mapping, when the samples that have them were taken before
/// the last read (a re-read cannot help them, unless something was unmapped).
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);
/// Shortest time between two re-reads of one process's maps otherwise.
pub const MIN_REREAD_INTERVAL: Duration = Duration::from_millis(5);

/// How long after a process's exit was noticed (CLOCK_MONOTONIC ns) a
/// sample of its pid is still taken as its own. The exit event comes from
/// early in the kernel's exit path, which then closes files and releases
/// the address space while still being sampled (with its user registers:
/// the program counter in `_exit`); the pid is only free again once the
/// process is reaped, and the kernel hands out pids in a cycle, so reusing
/// one this soon means going through all of `pid_max` in that time.
/// Retirement waits out the grace too ([`ProcessTracker::retire_exited`]).
pub const EXIT_GRACE_NS: u64 = 50_000_000;

pub use images::ExecClock;

/// Identity of an object file in the [`ProcessTracker`]: never reused
/// within a run (an object retired and opened again gets a new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u32);

/// Identity of a mapping in the [`ProcessTracker`]: never reused within a
/// run (until 2^32 mappings have been seen).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingId(pub u32);

/// A user frame: an address, and the mapping it fell in (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UserFrame {
    /// The mapping containing `address`; `None` when no mapping of the process contains it.
    pub mapping: Option<MappingId>,
    /// Absolute address in the process (call site for non-leaf frames).
    pub address: u64,
}

/// An executable object file (executable, shared library) some process mapped.
#[derive(Debug)]
pub struct ObjectFile {
    /// Path as the first process that mapped it saw it.
    pub path: String,
    /// A path that opens this exact file from the profiler (`/proc/self/fd/N`).
    pub open_path: PathBuf,
    /// GNU build ID (`.note.gnu.build-id`), if the object has one.
    pub build_id: Option<Vec<u8>>,
    /// Executable `PT_LOAD` segments as `(p_offset, p_vaddr, p_filesz)`,
    /// from the ELF program headers; empty when the file is not a readable ELF.
    pub load_segments: LoadSegments,
    /// The open file (keeps deleted and container objects readable).
    pub file: File,
    /// Its size when opened, bytes.
    pub bytes: u64,
    /// `(dev, inode)` as `/proc/PID/maps` shows them (dev: major << 32 | minor).
    pub file_key: (u64, u64),
}

impl ObjectFile {
    /// The object's virtual address (as in its ELF headers and CFI) for file
    /// offset `offset` of an executable mapping, through the executable
    /// `PT_LOAD` segment that mapping comes from. A mapping starts at the
    /// segment's offset rounded down to a page, which may lie in the file
    /// range of the previous segment (lld's layout), so the segment's range
    /// is taken from its page-aligned start. Without a matching segment,
    /// vaddr = offset (the usual layout of text).
    pub fn vaddr_of_offset(&self, offset: u64) -> u64 {
        const PAGE: u64 = 4096;
        self.load_segments
            .iter()
            .find(|(off, _, size)| off & !(PAGE - 1) <= offset && offset < off + size)
            .map_or(offset, |(off, vaddr, _)| {
                offset.wrapping_sub(*off).wrapping_add(*vaddr)
            })
    }
}

/// Executable `PT_LOAD` segments of an ELF file, as
/// `(p_offset, p_vaddr, p_filesz)`.
pub type LoadSegments = Vec<(u64, u64, u64)>;

/// An executable mapping of one process: `[start, end)` backed by `object`
/// (or by nothing: anonymous/JIT memory, `[vdso]`) from `file_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Process that has this mapping.
    pub pid: u32,
    /// First address (inclusive).
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// File offset of `start`, bytes.
    pub file_offset: u64,
    /// Path or special name from `/proc/PID/maps` (`[vdso]`, `[anon]` for anonymous).
    pub name: String,
    /// The object backing it, if it is a file we could open.
    pub object: Option<ObjectId>,
    /// Why its file was given up, if it was (opener/); its frames name
    /// that.
    pub object_given_up: Option<GivenUp>,
}

/// Why a mapped object was given up for the run (opener/).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GivenUp {
    /// Opening it, reading its ELF identity or copying it passed its
    /// deadline, or it was not tried while its file system was stuck.
    TimedOut,
    /// On a file system that can hang, and too large to copy
    /// ([`opener::MAX_COPY_BYTES`]).
    TooLarge,
}

impl Mapping {
    /// File offset of `addr`, an address inside this mapping.
    pub fn file_offset_of(&self, addr: u64) -> u64 {
        addr - self.start + self.file_offset
    }
}

impl ProcessTracker {
    /// The load bias of mapping `id`: object vaddr = address - bias
    /// (wrapping). For mappings without an object, the mapping's start.
    /// `None` if `id` was retired ([`Self::retire_exited`]).
    pub fn load_bias(&self, id: MappingId) -> Option<u64> {
        let m = self.mapping(id)?;
        Some(match m.object.and_then(|o| self.object(o)) {
            Some(object) => m.start.wrapping_sub(object.vaddr_of_offset(m.file_offset)),
            None => m.start,
        })
    }

    /// When `pid`'s current image began (its exec or fork as followed,
    /// CLOCK_MONOTONIC ns; 0: before the profiler could tell); `None` for
    /// a process not known.
    pub fn image_since(&self, pid: u32) -> Option<u64> {
        self.processes.get(&pid).map(|p| p.since_ns)
    }

    /// Executable mappings of `pid` known so far, sorted by start address.
    pub fn process_mappings(&self, pid: u32) -> &[MappingId] {
        self.processes.get(&pid).map_or(&[], |p| &p.mappings)
    }

    /// Where the JIT perf map of `pid` is once opened (it had one when its
    /// maps were read; the open happens on a reader thread, so it may not be
    /// there yet, or ever).
    pub fn perf_map(&self, pid: u32) -> Option<&Arc<jit::JitSlot>> {
        Some(&self.processes.get(&pid)?.perf_map)
    }

    /// Where the jitdump file of `pid` is once opened (it had mapped one
    /// when its maps were read), as [`Self::perf_map`].
    pub fn jitdump(&self, pid: u32) -> Option<&Arc<jit::JitSlot>> {
        Some(&self.processes.get(&pid)?.jitdump)
    }

    /// Re-read `pid`'s maps now (a new mapping was reported), unless they
    /// were read within [`MIN_REREAD_INTERVAL`].
    pub fn refresh_process(&mut self, pid: u32) {
        let now = crate::util::timefmt::monotonic_ns();
        let due = self
            .processes
            .get(&pid)
            .and_then(|p| p.last_read_ns)
            .is_none_or(|t| now.saturating_sub(t) >= MIN_REREAD_INTERVAL.as_nanos() as u64);
        if due {
            self.read_process(pid);
        }
    }
}

/// A mapping the tracker holds, and whether a sample was resolved through
/// it: the mappings a window can refer to ([`ProcessTracker::trim_departed`]
/// keeps only these of a gone process).
#[derive(Debug)]
struct Held {
    mapping: Mapping,
    sampled: bool,
}

#[derive(Debug, Default)]
struct ProcessMaps {
    /// Sorted by start address.
    mappings: Vec<MappingId>,
    /// `(start, end)` of each of `mappings`, in the same order: what
    /// lookups search, without touching the mapping table.
    ranges: Vec<(u64, u64)>,
    /// Every mapping interned for this process's current image (older reads included).
    all: Vec<MappingId>,
    /// When its maps were last read (CLOCK_MONOTONIC ns).
    last_read_ns: Option<u64>,
    /// When its current image began (its exec or fork, CLOCK_MONOTONIC
    /// ns; 0: before the profiler could tell).
    since_ns: u64,
    /// Its earlier images, oldest first.
    earlier: Vec<images::Image>,
    /// When its exit was noticed (CLOCK_MONOTONIC ns), once it was.
    /// Samples of its pid are its own until [`EXIT_GRACE_NS`] after that
    /// ([`ProcessMaps::gone_after_ns`]).
    exited_at_ns: Option<u64>,
    /// Timestamp (CLOCK_MONOTONIC ns, the samples' clock) of the latest
    /// sample resolved through these mappings: no window holding a sample
    /// taken after it refers to them.
    last_sample_ns: u64,
    /// Its JIT perf map, opened on a reader thread when its maps showed
    /// executable anonymous memory and the map existed.
    perf_map: Arc<jit::JitSlot>,
    /// Its jitdump file, opened on a reader thread when its maps showed it.
    jitdump: Arc<jit::JitSlot>,
    /// The container it runs in, once read (at its first sample).
    container: container::Container,
}

impl ProcessMaps {
    /// When samples of this pid stop being this process's: [`EXIT_GRACE_NS`]
    /// after its exit was noticed; `None` while it has not exited.
    fn gone_after_ns(&self) -> Option<u64> {
        self.exited_at_ns.map(|t| t.saturating_add(EXIT_GRACE_NS))
    }
}

/// Counters of what the tracker could not do.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TrackerStats {
    /// Reads of a process's maps that failed (usually: it had exited).
    pub maps_unreadable: u64,
    /// Executable file mappings whose object could not be opened.
    pub objects_unopenable: u64,
    /// Objects given up for the run: their open or ELF identity read passed
    /// its deadline, or was not tried on a hung file system (opener/).
    pub objects_timed_out: u64,
    /// Objects given up for the run: on a file system that can hang, and
    /// too large to copy (opener/).
    pub objects_too_large: u64,
}

/// Knows the executable mappings of every process seen in a sample.
#[derive(Debug, Default)]
pub struct ProcessTracker {
    processes: FxHashMap<u32, ProcessMaps>,
    mappings: FxHashMap<MappingId, Held>,
    next_mapping: u32,
    /// Mappings of processes that exec'd, with when (CLOCK_MONOTONIC ns):
    /// retired like an exited process's.
    orphans: Vec<(u64, MappingId)>,
    /// Reused buffer of one sample's mappings, to be marked sampled.
    sampled_scratch: Vec<MappingId>,
    mapping_index: FxHashMap<(u32, u64, u64, u64), MappingId>,
    objects: FxHashMap<ObjectId, ObjectFile>,
    next_object: u32,
    object_index: FxHashMap<(u64, u64), ObjectId>,
    /// Objects no held mapping refers to, with the retirement cut-off at
    /// which that was first seen (lifetime.rs retires them after a grace).
    unused_objects: FxHashMap<ObjectId, u64>,
    /// When [`Self::notice_vanished`] last looked (CLOCK_MONOTONIC ns).
    last_vanished_sweep_ns: u64,
    /// Objects retired by the latest retirement, not yet taken.
    retired_objects: Vec<(ObjectId, ObjectFile)>,
    stats: TrackerStats,
    exec_clock: ExecClock,
    /// Containers of processes forgotten or replaced while windows holding
    /// their samples may be open, by pid, with the time they went
    /// (CLOCK_MONOTONIC ns): retired like orphaned mappings.
    departed_containers: container::Departed,
    /// Opens objects off this thread, within [`opener::OPEN_DEADLINE`].
    opener: opener::Opener,
    /// Objects (`(dev, inode)`) given up for the run, and why.
    given_up: FxHashMap<(u64, u64), GivenUp>,
    /// The pids the latest [`Self::retire_exited`] dropped, not yet taken.
    retired_pids: Vec<u32>,
}

impl ProcessTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Start the object opener's helper now (opener/), so that the first
    /// object opened does not wait for its start-up.
    pub fn start_opener(&mut self) {
        self.opener.start();
    }

    /// One object; `None` for an id this tracker never gave out or has
    /// retired ([`Self::retire_exited`]).
    pub fn object(&self, id: ObjectId) -> Option<&ObjectFile> {
        self.objects.get(&id)
    }

    /// Objects currently held, each with an open file descriptor.
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// One mapping; `None` once `id` has been retired
    /// ([`Self::retire_exited`]).
    pub fn mapping(&self, id: MappingId) -> Option<&Mapping> {
        self.mappings.get(&id).map(|held| &held.mapping)
    }

    /// Mappings currently held (for memory accounting).
    pub fn mapping_count(&self) -> usize {
        self.mappings.len()
    }

    /// What could not be read or opened so far.
    pub fn stats(&self) -> TrackerStats {
        self.stats
    }

    /// Number of distinct processes seen.
    pub fn process_count(&self) -> usize {
        self.processes.len()
    }

    /// Make sure `pid`'s maps have been read once for its current image (a
    /// process known only from events, a fork or an exec, is read now).
    pub fn ensure_process(&mut self, pid: u32) {
        if self
            .processes
            .get(&pid)
            .is_none_or(|p| p.last_read_ns.is_none())
        {
            self.read_process(pid);
        }
    }

    /// Take `entries` (a read of `/proc/PID/maps`) as `pid`'s maps from now
    /// on: its executable mappings are interned (objects opened). If the
    /// process known under `pid` had exited, this is a new process with the
    /// same pid, and the old one's mappings retire on their own schedule.
    pub fn apply_maps(&mut self, pid: u32, entries: &[MapsEntry]) {
        let mut found: Vec<(u64, u64, MappingId)> = entries
            .iter()
            .filter(|e| e.executable)
            .map(|e| (e.start, e.end, self.intern_mapping(pid, e, entries)))
            .collect();
        found.sort_unstable_by_key(|&(start, _, _)| start);
        let process = self.processes.entry(pid).or_default();
        if let Some(exited) = process.exited_at_ns.take() {
            process.earlier.clear();
            process.since_ns = 0;
            let at = exited.max(process.last_sample_ns);
            self.orphans.extend(
                std::mem::take(&mut process.all)
                    .into_iter()
                    .map(|id| (at, id)),
            );
            process.last_sample_ns = 0;
            process.perf_map = Arc::default();
            process.jitdump = Arc::default();
            process.container_departs(pid, at, &mut self.departed_containers);
        }
        if jit::has_anonymous_code(entries) {
            // On a reader thread: a FIFO or a file on FUSE never stalls this one.
            process
                .perf_map
                .open_later(move || jit::JitFile::perf_map(pid));
            if let Some(path) = jit::jitdump_path(pid, entries) {
                process
                    .jitdump
                    .open_later(move || jit::JitFile::open(path, pid));
            }
        }
        for &(_, _, id) in &found {
            if !process.all.contains(&id) {
                process.all.push(id);
            }
        }
        process.ranges = found.iter().map(|&(start, end, _)| (start, end)).collect();
        process.mappings = found.iter().map(|&(_, _, id)| id).collect();
        process.last_read_ns = Some(crate::util::timefmt::monotonic_ns());
    }

    /// The mapping of `entry`, one of `entries` (`pid`'s maps as read):
    /// anonymous code that is a file's text moved there is that file's
    /// (anon_text.rs).
    fn intern_mapping(&mut self, pid: u32, entry: &MapsEntry, entries: &[MapsEntry]) -> MappingId {
        let key = (pid, entry.start, entry.end, entry.file_offset);
        if let Some(&id) = self.mapping_index.get(&key) {
            if self
                .mappings
                .get(&id)
                .is_some_and(|h| h.mapping.name == entry.path)
            {
                return id;
            }
        }
        let object = if entry.is_file_backed() {
            self.intern_object(pid, entry)
        } else if entry.path.is_empty() {
            if let Some((object, offset)) = self.anonymous_text(pid, entry, entries) {
                let name = self.objects[&object].path.clone();
                return self.intern(pid, entry.start, entry.end, offset, name, Some(object));
            }
            None
        } else {
            None
        };
        let name = if entry.path.is_empty() {
            "[anon]".to_string()
        } else {
            entry.path.clone()
        };
        let id = self.intern(pid, entry.start, entry.end, entry.file_offset, name, object);
        if object.is_none() {
            if let Some(&why) = self.given_up.get(&(entry.dev, entry.inode)) {
                if let Some(held) = self.mappings.get_mut(&id) {
                    held.mapping.object_given_up = Some(why);
                }
            }
        }
        id
    }

    /// The id of `pid`'s mapping `[start, end)` from `file_offset` named
    /// `name`: the one interned before if it is the same, else a new one.
    fn intern(
        &mut self,
        pid: u32,
        start: u64,
        end: u64,
        file_offset: u64,
        name: String,
        object: Option<ObjectId>,
    ) -> MappingId {
        if let Some(object) = object {
            // Mapped again: its grace starts over once it is unused again.
            self.unused_objects.remove(&object);
        }
        let key = (pid, start, end, file_offset);
        if let Some(&id) = self.mapping_index.get(&key) {
            if self
                .mappings
                .get(&id)
                .is_some_and(|h| h.mapping.name == name)
            {
                return id;
            }
        }
        let id = MappingId(self.next_mapping);
        self.next_mapping = self.next_mapping.wrapping_add(1);
        self.mappings.insert(
            id,
            Held {
                mapping: Mapping {
                    pid,
                    start,
                    end,
                    file_offset,
                    name,
                    object,
                    object_given_up: None,
                },
                sampled: false,
            },
        );
        self.mapping_index.insert(key, id);
        id
    }
}
