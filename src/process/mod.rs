//! Process tracking: which objects each sampled process has mapped where.
//!
//! On a process's first sample its `/proc/PID/maps` is read and every
//! executable file-backed mapping's object is opened through
//! `/proc/PID/map_files/START-END` (falling back to `/proc/PID/root/PATH`),
//! so objects inside containers and deleted binaries stay readable, and a
//! process that exits keeps everything needed to symbolize its samples.
//! Objects are shared by every process that maps them (keyed by device and inode).
//! An address outside every known mapping (e.g. after `dlopen`) triggers a
//! re-read of the maps, at most once per [`REFRESH_INTERVAL`] per process.

pub mod maps;

use std::collections::HashSet;

use rustc_hash::FxHashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::debug;

use maps::MapsEntry;

/// Shortest time between two re-reads of one process's maps.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);

/// Index of an object file in [`ProcessTracker::objects`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectId(pub u32);

/// Identity of a mapping in the [`ProcessTracker`]: never reused within a
/// run (until 2^32 mappings have been seen).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingId(pub u32);

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

/// The executable `PT_LOAD` program headers of an ELF file and its GNU
/// build ID (a `.note.gnu.build-id`-style note: owner `GNU`, type 3; other
/// owners' type-3 notes, such as SystemTap's, are not build IDs). Reads
/// only the headers and notes, not the whole file.
pub fn elf_identity(file: &File) -> object::read::Result<(LoadSegments, Option<Vec<u8>>)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::read::{Object, ReadCache};
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<object::Endianness, _>::parse(&cache)?;
    let endian = elf.endian();
    let segments = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| {
            ph.p_type(endian) == object::elf::PT_LOAD
                && ph.p_flags(endian).0 & object::elf::PF_X.0 != 0
        })
        .map(|ph| (ph.p_offset(endian), ph.p_vaddr(endian), ph.p_filesz(endian)))
        .collect();
    let build_id = elf.build_id()?.map(<[u8]>::to_vec);
    Ok((segments, build_id))
}

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
    pub fn load_bias(&self, id: MappingId) -> u64 {
        let m = self.mapping(id);
        match m.object {
            Some(o) => m
                .start
                .wrapping_sub(self.object(o).vaddr_of_offset(m.file_offset)),
            None => m.start,
        }
    }

    /// Executable mappings of `pid` known so far, sorted by start address.
    pub fn process_mappings(&self, pid: u32) -> &[MappingId] {
        self.processes.get(&pid).map_or(&[], |p| &p.mappings)
    }

    /// Forget `pid`'s mapping list (after exec); the next lookup re-reads
    /// `/proc/PID/maps`. Mappings already seen stay valid for symbolization
    /// (until [`Self::retire_exited`] drops them once the process has exited).
    pub fn forget_process(&mut self, pid: u32) {
        if let Some(process) = self.processes.remove(&pid) {
            let now = crate::timefmt::monotonic_ns();
            self.orphans
                .extend(process.all.into_iter().map(|id| (now, id)));
        }
    }

    /// Note that `pid` exited at `now_mono_ns` (CLOCK_MONOTONIC). Its
    /// mappings stay: samples taken before the exit may still be in the
    /// ring buffer or in windows not yet symbolized.
    pub fn process_exited(&mut self, pid: u32, now_mono_ns: u64) {
        if let Some(process) = self.processes.get_mut(&pid) {
            process.exited_at_ns.get_or_insert(now_mono_ns);
        }
    }

    /// Drop what is known of processes that exited before `before_mono_ns`
    /// (and of mappings replaced by an exec before then): the caller
    /// promises that no sample still to be symbolized refers to them, i.e.
    /// every window open at that time has been handed over. Keeps the
    /// tracker's memory flat under process churn. Returns how many
    /// processes were dropped.
    pub fn retire_exited(&mut self, before_mono_ns: u64) -> usize {
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, p)| p.exited_at_ns.is_some_and(|t| t < before_mono_ns))
            .map(|(&pid, _)| pid)
            .collect();
        let mut dropped = Vec::new();
        for pid in &gone {
            if let Some(process) = self.processes.remove(pid) {
                dropped.extend(process.all);
            }
        }
        self.orphans.retain(|&(at, id)| {
            let keep = at >= before_mono_ns;
            if !keep {
                dropped.push(id);
            }
            keep
        });
        // A mapping interned again for a live process (an exec of the same
        // image, a reused pid) stays.
        let live: HashSet<MappingId> = self
            .processes
            .values()
            .flat_map(|p| p.all.iter().copied())
            .collect();
        dropped.retain(|id| !live.contains(id));
        for id in dropped {
            if let Some(m) = self.mappings.remove(&id) {
                let key = (m.pid, m.start, m.end, m.file_offset);
                if self.mapping_index.get(&key) == Some(&id) {
                    self.mapping_index.remove(&key);
                }
            }
        }
        gone.len()
    }

    /// Re-read `pid`'s maps now (a new mapping was reported), unless they
    /// were read within [`REFRESH_INTERVAL`].
    pub fn refresh_process(&mut self, pid: u32) {
        let due = self
            .processes
            .get(&pid)
            .and_then(|p| p.last_read)
            .is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL);
        if due {
            self.read_process(pid);
        }
    }
}

#[derive(Debug, Default)]
struct ProcessMaps {
    /// Sorted by start address.
    mappings: Vec<MappingId>,
    /// `(start, end)` of each of `mappings`, in the same order: what
    /// lookups search, without touching the mapping table.
    ranges: Vec<(u64, u64)>,
    /// Every mapping interned for this process (older reads included).
    all: Vec<MappingId>,
    last_read: Option<Instant>,
    /// When it exited (CLOCK_MONOTONIC ns), once known.
    exited_at_ns: Option<u64>,
}

/// Counters of what the tracker could not do.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TrackerStats {
    /// Processes whose maps could not be read (usually: exited before the first read).
    pub maps_unreadable: u64,
    /// Executable file mappings whose object could not be opened.
    pub objects_unopenable: u64,
}

/// Knows the executable mappings of every process seen in a sample.
#[derive(Debug, Default)]
pub struct ProcessTracker {
    processes: FxHashMap<u32, ProcessMaps>,
    mappings: FxHashMap<MappingId, Mapping>,
    next_mapping: u32,
    /// Mappings of processes that exec'd, with when (CLOCK_MONOTONIC ns):
    /// retired like an exited process's.
    orphans: Vec<(u64, MappingId)>,
    mapping_index: FxHashMap<(u32, u64, u64, u64), MappingId>,
    objects: Vec<ObjectFile>,
    object_index: FxHashMap<(u64, u64), ObjectId>,
    stats: TrackerStats,
}

impl ProcessTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// All objects opened so far, indexed by [`ObjectId`].
    pub fn objects(&self) -> &[ObjectFile] {
        &self.objects
    }

    /// One object.
    pub fn object(&self, id: ObjectId) -> &ObjectFile {
        &self.objects[id.0 as usize]
    }

    /// One mapping. Panics if `id` was retired ([`Self::retire_exited`]),
    /// which only a caller breaking that method's promise can cause.
    pub fn mapping(&self, id: MappingId) -> &Mapping {
        &self.mappings[&id]
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

    /// The mapping of `pid` containing `addr`. Reads the process's maps on
    /// first use, and again (rate-limited) when `addr` is in no known mapping.
    pub fn find_mapping(&mut self, pid: u32, addr: u64) -> Option<MappingId> {
        if let Some(id) = self.lookup(pid, addr) {
            return Some(id);
        }
        let due = match self.processes.get(&pid).and_then(|p| p.last_read) {
            None => true,
            Some(t) => t.elapsed() >= REFRESH_INTERVAL,
        };
        if due {
            self.read_process(pid);
            return self.lookup(pid, addr);
        }
        None
    }

    /// [`Self::find_mapping`] for `count` addresses at once (`addr(i)` is
    /// the i-th; `found(i, mapping)` receives its mapping), with one process
    /// lookup for all of them and the previous address's mapping tried
    /// first (consecutive frames are often in the same object).
    pub fn find_mappings(
        &mut self,
        pid: u32,
        count: usize,
        addr: impl Fn(usize) -> u64,
        mut found: impl FnMut(usize, Option<MappingId>),
    ) {
        let complete = self.lookup_all(pid, count, &addr, &mut found);
        let due = match self.processes.get(&pid).and_then(|p| p.last_read) {
            None => true,
            Some(t) => t.elapsed() >= REFRESH_INTERVAL,
        };
        if !complete && due {
            self.read_process(pid);
            self.lookup_all(pid, count, &addr, &mut found);
        }
    }

    /// Whether every address was found.
    fn lookup_all(
        &self,
        pid: u32,
        count: usize,
        addr: &impl Fn(usize) -> u64,
        found: &mut impl FnMut(usize, Option<MappingId>),
    ) -> bool {
        let Some(process) = self.processes.get(&pid) else {
            (0..count).for_each(|i| found(i, None));
            return count == 0;
        };
        let mut complete = true;
        let mut previous: Option<usize> = None;
        for i in 0..count {
            let a = addr(i);
            let hit = previous
                .filter(|&p| {
                    let (start, end) = process.ranges[p];
                    start <= a && a < end
                })
                .or_else(|| {
                    let p = process
                        .ranges
                        .partition_point(|&(start, _)| start <= a)
                        .checked_sub(1)?;
                    (a < process.ranges[p].1).then_some(p)
                });
            if hit.is_some() {
                previous = hit;
            } else {
                complete = false;
            }
            found(i, hit.map(|p| process.mappings[p]));
        }
        complete
    }

    /// Make sure `pid`'s maps have been read once (no-op after the first time).
    pub fn ensure_process(&mut self, pid: u32) {
        if !self.processes.contains_key(&pid) {
            self.read_process(pid);
        }
    }

    fn lookup(&self, pid: u32, addr: u64) -> Option<MappingId> {
        let process = self.processes.get(&pid)?;
        let idx = process
            .ranges
            .partition_point(|&(start, _)| start <= addr)
            .checked_sub(1)?;
        let (_, end) = *process.ranges.get(idx)?;
        (addr < end).then(|| process.mappings.get(idx).copied())?
    }

    fn read_process(&mut self, pid: u32) {
        let entries = match maps::read_maps(pid) {
            Ok(entries) => entries,
            Err(err) => {
                debug!("pid {pid}: {err:#}");
                let process = self.processes.entry(pid).or_default();
                if process.last_read.is_none() {
                    self.stats.maps_unreadable += 1;
                }
                process.last_read = Some(Instant::now());
                return;
            }
        };
        let mut ids = Vec::new();
        for entry in entries.iter().filter(|e| e.executable) {
            ids.push(self.intern_mapping(pid, entry));
        }
        ids.sort_by_key(|id| self.mappings[id].start);
        let ranges = ids
            .iter()
            .map(|id| (self.mappings[id].start, self.mappings[id].end))
            .collect();
        let process = self.processes.entry(pid).or_default();
        if let Some(exited) = process.exited_at_ns.take() {
            // The pid was reused: the old process's mappings retire on its
            // own schedule.
            self.orphans.extend(
                std::mem::take(&mut process.all)
                    .into_iter()
                    .map(|id| (exited, id)),
            );
        }
        for id in &ids {
            if !process.all.contains(id) {
                process.all.push(*id);
            }
        }
        process.ranges = ranges;
        process.mappings = ids;
        process.last_read = Some(Instant::now());
    }

    fn intern_mapping(&mut self, pid: u32, entry: &MapsEntry) -> MappingId {
        let key = (pid, entry.start, entry.end, entry.file_offset);
        if let Some(&id) = self.mapping_index.get(&key) {
            if self.mappings.get(&id).is_some_and(|m| m.name == entry.path) {
                return id;
            }
        }
        let object = if entry.is_file_backed() {
            self.intern_object(pid, entry)
        } else {
            None
        };
        let name = if entry.path.is_empty() {
            "[anon]".to_string()
        } else {
            entry.path.clone()
        };
        let id = MappingId(self.next_mapping);
        self.next_mapping = self.next_mapping.wrapping_add(1);
        self.mappings.insert(
            id,
            Mapping {
                pid,
                start: entry.start,
                end: entry.end,
                file_offset: entry.file_offset,
                name,
                object,
            },
        );
        self.mapping_index.insert(key, id);
        id
    }

    fn intern_object(&mut self, pid: u32, entry: &MapsEntry) -> Option<ObjectId> {
        if let Some(&id) = self.object_index.get(&(entry.dev, entry.inode)) {
            return Some(id);
        }
        let via_map_files = format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end);
        let via_root = format!("/proc/{pid}/root{}", entry.path);
        let file = match File::open(&via_map_files).or_else(|_| File::open(&via_root)) {
            Ok(file) => file,
            Err(err) => {
                debug!("pid {pid}: cannot open {}: {err}", entry.path);
                self.stats.objects_unopenable += 1;
                return None;
            }
        };
        let open_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let (load_segments, build_id) = elf_identity(&file).unwrap_or_else(|err| {
            debug!("{}: not a readable ELF file: {err}", entry.path);
            (Vec::new(), None)
        });
        let id = ObjectId(self.objects.len() as u32);
        self.objects.push(ObjectFile {
            path: entry.path.clone(),
            open_path,
            build_id,
            load_segments,
            file,
        });
        self.object_index.insert((entry.dev, entry.inode), id);
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_own_code_mapping_and_object() {
        let mut tracker = ProcessTracker::new();
        let pid = std::process::id();
        let addr = finds_own_code_mapping_and_object as *const () as usize as u64;
        let id = tracker.find_mapping(pid, addr).expect("own code is mapped");
        let mapping = tracker.mapping(id).clone();
        assert!(mapping.start <= addr && addr < mapping.end);
        let object = tracker.object(mapping.object.expect("test binary is a file"));
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        assert_eq!(object.path, exe.to_string_lossy());
        assert!(object.open_path.exists());
        // Our own function's vaddr, through the load bias, is in the symbol table.
        let vaddr = addr.wrapping_sub(tracker.load_bias(id));
        assert!(vaddr < addr, "a PIE test binary is loaded above its vaddrs");
        assert!(!object.load_segments.is_empty());
        assert_eq!(tracker.process_count(), 1);
    }

    #[test]
    fn exited_processes_are_retired_only_after_the_promise_point() {
        let mut tracker = ProcessTracker::new();
        let pid = std::process::id();
        let addr =
            exited_processes_are_retired_only_after_the_promise_point as *const () as usize as u64;
        let id = tracker.find_mapping(pid, addr).expect("own code is mapped");
        let held = tracker.mapping_count();
        assert!(held > 0);
        // Not exited: nothing goes.
        assert_eq!(tracker.retire_exited(u64::MAX), 0);
        // An exec of the same image keeps the ids that are mapped again.
        let before_exec = tracker.process_mappings(pid).to_vec();
        tracker.forget_process(pid);
        assert_eq!(tracker.find_mapping(pid, addr), Some(id));
        assert_eq!(tracker.retire_exited(u64::MAX), 0);
        assert_eq!(tracker.process_mappings(pid), &before_exec[..]);
        assert_eq!(tracker.mapping_count(), held);
        tracker.process_exited(pid, 1_000);
        // Windows open since before the exit may still refer to it.
        assert_eq!(tracker.retire_exited(1_000), 0);
        assert_eq!(tracker.mapping(id).pid, pid);
        assert_eq!(tracker.retire_exited(1_001), 1);
        assert_eq!(tracker.mapping_count(), 0);
        assert_eq!(tracker.process_count(), 0);
        // A later sample of the same pid reads its maps afresh, with new ids.
        let again = tracker.find_mapping(pid, addr).expect("read again");
        assert_ne!(again, id);
        assert_eq!(tracker.mapping_count(), held);
    }

    #[test]
    fn unknown_address_and_missing_process_are_none() {
        let mut tracker = ProcessTracker::new();
        assert_eq!(tracker.find_mapping(std::process::id(), 8), None);
        assert_eq!(tracker.find_mapping(u32::MAX - 1, 0x400000), None);
        assert_eq!(tracker.stats().maps_unreadable, 1);
    }
}
