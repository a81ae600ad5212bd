//! Processes through their lifetimes, as the BPF walker has to know them:
//! the start-up scan of the processes running when sampling starts, and the
//! process events from BPF (exec, fork, exit, a pc in no known mapping),
//! each keeping what `process_mappings` holds for its pid current. The BPF
//! programs keep a description of their own from exec and fork on
//! (`src/sampling/bpf/process.h`); the descriptions
//! written here, from `/proc/PID/maps`, add what the kernel did not tell
//! them (anonymous code, the vDSO, objects whose tables were not known yet)
//! and carry the exec they were read after.
//!
//! Three narrow interfaces connect this to the other stages: [`WalkerMaps`],
//! the BPF maps that hold the descriptions (the sampler's, which defines it),
//! [`TableSupply`], told which objects described processes map (implemented
//! by the unwind table loader, which builds, caches, loads and evicts their
//! tables), and [`InterpreterSupply`], which looks for an interpreter in a
//! described process (implemented by the interpreter unwinders,
//! `crate::unwind::interp::Interpreters`, which the run owns beside the
//! tracker).

use std::time::{Duration, Instant};

use anyhow::Result;
use rustc_hash::FxHashSet;
use tracing::{debug, warn};

use super::{MappingId, ObjectId, ProcessTracker};
use crate::sampling::records::{ExecMapping, ProcessEvent, RawSample};
use crate::sampling::sampler::WalkerMaps;

/// Object id of the vDSO's table (the same image for every process of a
/// kernel). The tracker never gives it out as an [`ObjectId`].
pub const VDSO_OBJECT_ID: u32 = u32::MAX - 1;

/// The `object_files` key of the vDSO's table (`VDSO_FILE_DEV`,
/// `VDSO_FILE_INODE` in `src/sampling/bpf/profiler.h`): no file has inode 0.
pub const VDSO_FILE_KEY: (u64, u64) = (
    crate::sampling::skel::defines::VDSO_FILE_DEV,
    crate::sampling::skel::defines::VDSO_FILE_INODE,
);

/// Where the objects of described processes are announced: the owner of
/// the unwind tables, which builds and loads one for each.
pub trait TableSupply {
    /// `object` (one of `tracker`'s objects) is mapped by a process just
    /// described to the walker: its table is wanted (not yet by a sample).
    fn object_mapped(&mut self, object: ObjectId, tracker: &ProcessTracker);

    /// The vDSO is mapped by a process just described to the walker;
    /// `image` is its ELF image as read from `/proc/PID/mem`. Its table's
    /// object id is [`VDSO_OBJECT_ID`].
    fn vdso_mapped(&mut self, image: Vec<u8>);

    /// The start-up scan is over: `scan` says which tables the walks of the
    /// processes running at start use.
    fn startup_scanned(&mut self, scan: StartupScan);

    /// Process `pid` has the anonymous executable mapping `range` (start,
    /// end) and the open jitdump file `jitdump`: the object id of a table
    /// of the mapping's JIT code built from the unwinding information read
    /// from that file so far, or `None` when it holds none for that code
    /// (the walker then uses frame pointers there). Never waits for the
    /// file (it is read on a reader thread).
    fn jit_mapped(&mut self, pid: u32, range: (u64, u64), jitdump: &std::fs::File) -> Option<u32>;

    /// Whether the jitdump file `jitdump` of process `pid`, described
    /// before, gained unwinding information since: the process is then
    /// described again, so that its mappings get the new tables. Called
    /// for each of its samples; cheap when nothing changed.
    fn jit_grew(&mut self, pid: u32, jitdump: &std::fs::File) -> bool;

    /// Process `pid` exited: the tables of its JIT code can go.
    fn process_exited(&mut self, pid: u32);
}

/// The interpreter unwinders, as the follower asks them about processes
/// it describes. Process tracking imports nothing of unwinding: the run
/// owns the implementation beside the tracker and passes it in.
pub trait InterpreterSupply {
    /// Look for an interpreter among the objects `tracker` knows `pid`
    /// maps: the entry for the BPF walker's interpreter map when one is
    /// found and supported, else `None` (and nothing is kept of `pid`).
    fn attach(&mut self, pid: u32, tracker: &ProcessTracker) -> Option<Vec<u8>>;

    /// Whether an interpreter was found in `pid`.
    fn knows(&self, pid: u32) -> bool;

    /// Whether `pid`'s interpreter could not be read yet and it is time to
    /// look at it again (cheap: asked at every sample).
    fn retry_due(&self, pid: u32) -> bool;

    /// `pid` exec'd (or its walker entry could not be written): forget
    /// its interpreter.
    fn forget(&mut self, pid: u32);
}

/// What the start-up scan described.
#[derive(Debug)]
pub struct StartupScan {
    /// When sampling started.
    pub started: Instant,
    /// Processes described by the scan with at least one table.
    pub processes: usize,
    /// Table object ids (tracker [`ObjectId`]s and [`VDSO_OBJECT_ID`]) their
    /// walks use.
    pub objects: FxHashSet<u32>,
}

/// Follows processes for the walker: which ones are described, which
/// objects' files the exec and mmap programs know, and the start-up scan.
#[derive(Debug, Default)]
pub struct ProcessFollower {
    /// Processes described to the walker from `/proc/PID/maps`.
    described: FxHashSet<u32>,
    /// Objects whose files the exec and mmap programs know (`object_files`).
    registered_files: FxHashSet<u32>,
    /// Processes the start-up scan has still to describe (popped from the end).
    to_scan: Vec<u32>,
    /// What the start-up scan described so far, until it is over.
    startup: Option<StartupScan>,
    /// When [`Self::sweep_descriptions`] last looked.
    last_sweep: Option<Instant>,
}

/// Shortest time between two sweeps of the walker's descriptions
/// ([`ProcessFollower::sweep_descriptions`]).
pub const DESCRIPTION_SWEEP: Duration = Duration::from_secs(5);

impl ProcessFollower {
    /// A follower that has described nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Processes currently described to the walker.
    pub fn described(&self) -> usize {
        self.described.len()
    }

    /// `pids` left `/proc` without an exit event
    /// ([`ProcessTracker::notice_vanished`]): the walker forgets them, as
    /// after an exit event.
    pub fn processes_vanished(
        &mut self,
        pids: &[u32],
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
    ) {
        for &pid in pids {
            walker.remove_process(pid);
            tables.process_exited(pid);
            self.described.remove(&pid);
        }
    }

    /// Remove the walker's descriptions of processes no longer in `/proc`,
    /// at most once per [`DESCRIPTION_SWEEP`]; returns how many. The exec
    /// and fork programs describe processes user space never heard of, and
    /// only an exit event removed them: with exit events lost, the map of
    /// descriptions (8,192) filled up under churn, after which no process
    /// could be described and every attempt logged a warning (decision 0008:
    /// 170,000 lines, 23 MB of stderr, in 10 minutes).
    pub fn sweep_descriptions(&mut self, walker: &impl WalkerMaps) -> usize {
        if self
            .last_sweep
            .is_some_and(|t| t.elapsed() < DESCRIPTION_SWEEP)
        {
            return 0;
        }
        self.last_sweep = Some(Instant::now());
        let mut removed = 0;
        for pid in walker.described_pids() {
            if std::fs::symlink_metadata(format!("/proc/{pid}")).is_err() {
                walker.remove_process(pid);
                self.described.remove(&pid);
                removed += 1;
            }
        }
        removed
    }

    /// `retired` objects ([`ProcessTracker::take_retired_objects`]) are
    /// gone from the tracker: the walker forgets the files of those it was
    /// told of, then they are closed (so their inodes can be reused only
    /// once no BPF program describes them).
    pub fn objects_retired(
        &mut self,
        retired: Vec<(ObjectId, super::ObjectFile)>,
        walker: &impl WalkerMaps,
    ) {
        for (id, file) in retired {
            if self.registered_files.remove(&id.0) {
                let (dev, inode) = file.file_key;
                walker.remove_object_file(dev, inode);
            }
        }
    }

    /// Start the start-up scan: every process in `/proc` (or only `pids`,
    /// when not empty) is to be described to the walker and its tables
    /// queued, a few at a time by [`Self::continue_scan`], so that the
    /// caller keeps draining samples meanwhile.
    pub fn scan_processes(&mut self, pids: &[u32], sampling_started: Instant) {
        let all: Vec<u32> = if pids.is_empty() {
            std::fs::read_dir("/proc")
                .map(|dir| {
                    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            pids.to_vec()
        };
        self.to_scan = all;
        self.to_scan.reverse();
        self.startup = Some(StartupScan {
            started: sampling_started,
            processes: 0,
            objects: FxHashSet::default(),
        });
    }

    /// Go on with the start-up scan for at most about `budget`. When it is
    /// over, `tables` hears which tables it asked for. Returns whether
    /// processes remain to be scanned.
    pub fn continue_scan(
        &mut self,
        tracker: &mut ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
        interpreters: &mut impl InterpreterSupply,
        budget: Duration,
    ) -> bool {
        let started = Instant::now();
        while started.elapsed() < budget {
            let Some(pid) = self.to_scan.pop() else {
                break;
            };
            if !self.described.contains(&pid) {
                let objects = self.describe(pid, tracker, walker, tables, interpreters);
                if let Some(scan) = self.startup.as_mut() {
                    scan.processes += usize::from(!objects.is_empty());
                    scan.objects.extend(objects);
                }
            }
        }
        if self.to_scan.is_empty() {
            if let Some(scan) = self.startup.take() {
                tables.startup_scanned(scan);
            }
        }
        !self.to_scan.is_empty()
    }

    /// Account for one sample: its process is described to the walker at
    /// its first sample (kernel threads never are); an interpreter that
    /// could not be read yet is looked at again when its time has come.
    pub fn on_sample(
        &mut self,
        sample: &RawSample,
        tracker: &mut ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
        interpreters: &mut impl InterpreterSupply,
    ) {
        if sample.kernel_thread {
            return;
        }
        if !self.described.contains(&sample.pid) {
            self.describe(sample.pid, tracker, walker, tables, interpreters);
        } else if interpreters.retry_due(sample.pid) {
            // Its interpreter could not be read yet, and it maps nothing
            // more that would have it looked at again.
            attach_interpreter(sample.pid, tracker, walker, interpreters);
        } else if let Some(dump) = tracker.jitdump(sample.pid).and_then(|s| s.get()) {
            if tables.jit_grew(sample.pid, &dump.file) {
                self.describe(sample.pid, tracker, walker, tables, interpreters);
            }
        }
    }

    /// React to a process event from BPF: an exit forgets the process in
    /// the walker (the tracker keeps its mappings for a while, see
    /// [`ProcessTracker::retire_exited`]); an exec or a pc in no known
    /// mapping has a described process read and described again; a fork or
    /// a new mapping reported by the kernel goes to the tracker.
    pub fn on_event(
        &mut self,
        event: ProcessEvent,
        tracker: &mut ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
        interpreters: &mut impl InterpreterSupply,
    ) {
        match event {
            ProcessEvent::Exit { pid } => {
                walker.remove_process(pid);
                tables.process_exited(pid);
                self.described.remove(&pid);
                tracker.process_exited(pid, crate::util::timefmt::monotonic_ns());
            }
            ProcessEvent::Exec { pid, timestamp_ns } => {
                tracker.process_exec(pid, timestamp_ns);
                // Its interpreter (if any) went with its old image.
                interpreters.forget(pid);
                let _ = walker.set_interpreter(pid, None);
                // Its JIT code went with its old image.
                tables.process_exited(pid);
                // The exec program described the new image. A process
                // described here before is read again now (for what the
                // kernel did not tell: the vDSO, anonymous code); any other
                // is read at its first sample, so that the execs of
                // processes never sampled cost no read of /proc.
                if self.described.remove(&pid) {
                    tracker.refresh_process(pid);
                    self.describe(pid, tracker, walker, tables, interpreters);
                }
            }
            ProcessEvent::Fork {
                pid,
                parent,
                timestamp_ns,
            } => {
                // The walker already has the parent's description for it;
                // its first sample has it read like any new process.
                tracker.process_forked(pid, parent, timestamp_ns);
            }
            ProcessEvent::Mapping {
                pid,
                start,
                end,
                file_offset,
                object,
                timestamp_ns,
            } => {
                if object == VDSO_OBJECT_ID {
                    tracker.add_vdso_mapping(pid, timestamp_ns, start..end);
                } else {
                    tracker.add_mapping(
                        pid,
                        timestamp_ns,
                        start..end,
                        file_offset,
                        ObjectId(object),
                    );
                    // An interpreter loaded after the description (ld.so
                    // maps libpython after exec: `record -- python3 ...`), or
                    // one whose memory could not be read yet: look again.
                    if self.described.contains(&pid) && !interpreters.knows(pid) {
                        attach_interpreter(pid, tracker, walker, interpreters);
                    }
                }
            }
            ProcessEvent::UnknownMapping { pid, address } => {
                debug!("pid {pid}: pc {address:#x} in no known mapping, re-reading its maps");
                tracker.refresh_process(pid);
                self.describe(pid, tracker, walker, tables, interpreters);
            }
        }
    }

    /// Queue the table of `object` (one of `tracker`'s) if it is new, and
    /// tell the exec and mmap programs about its file, so that a process
    /// mapping it is described with its table at once.
    fn supply_object(
        &mut self,
        object: ObjectId,
        tracker: &ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
    ) {
        let Some(file) = tracker.object(object) else {
            return;
        };
        tables.object_mapped(object, tracker);
        if self.registered_files.insert(object.0) {
            let (dev, inode) = file.file_key;
            if let Err(err) = walker.set_object_file(dev, inode, object.0, &file.load_segments) {
                debug!("{}: {err:#}", file.path);
            }
        }
    }

    /// Have the file at `path` known before any process maps it: its
    /// object in `tracker`, its table queued, its file told to the exec and
    /// mmap programs. For `lightswitch record`, whose command's first
    /// instructions (in its executable and in ld.so) are then walked with
    /// their tables. A file that cannot be opened is left out (with a
    /// debug line naming it and why, from
    /// [`ProcessTracker::intern_file`]): the command only loses this head
    /// start.
    pub fn preload_file(
        &mut self,
        path: &std::path::Path,
        tracker: &mut ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
    ) {
        if let Some(object) = tracker.intern_file(path) {
            self.supply_object(object, tracker, walker, tables);
        }
    }

    /// How the walker unwinds through mapping `id` of `pid` (`None` if the
    /// tracker no longer holds it). Queues the table of an object not seen
    /// before and tells the exec and mmap programs about its file.
    fn exec_mapping(
        &mut self,
        pid: u32,
        id: MappingId,
        tracker: &ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
    ) -> Option<ExecMapping> {
        let m = tracker.mapping(id)?;
        let frame_pointers = ExecMapping {
            start: m.start,
            end: m.end,
            bias: m.start,
            object_id: 0,
            frame_pointers: true,
        };
        if let Some(object) = m.object.filter(|&o| tracker.object(o).is_some()) {
            self.supply_object(object, tracker, walker, tables);
            return Some(ExecMapping {
                start: m.start,
                end: m.end,
                bias: tracker.load_bias(id).unwrap_or(m.start),
                object_id: object.0,
                frame_pointers: false,
            });
        }
        if m.name == "[vdso]" {
            match read_vdso(pid, m.start, m.end) {
                Ok((bytes, first_vaddr)) => {
                    let image = (0, first_vaddr, bytes.len() as u64);
                    tables.vdso_mapped(bytes);
                    // The exec and mmap programs describe a process's vDSO
                    // with its table from then on.
                    if self.registered_files.insert(VDSO_OBJECT_ID) {
                        let (dev, inode) = VDSO_FILE_KEY;
                        if let Err(err) =
                            walker.set_object_file(dev, inode, VDSO_OBJECT_ID, &[image])
                        {
                            debug!("[vdso]: {err:#}");
                        }
                    }
                    return Some(ExecMapping {
                        start: m.start,
                        end: m.end,
                        bias: m.start.wrapping_sub(first_vaddr),
                        object_id: VDSO_OBJECT_ID,
                        frame_pointers: false,
                    });
                }
                Err(err) => debug!("pid {pid}: cannot read the vDSO: {err:#}"),
            }
        } else if let Some(dump) = tracker.jitdump(pid).and_then(|s| s.get()) {
            if let Some(object_id) = tables.jit_mapped(pid, (m.start, m.end), &dump.file) {
                return Some(ExecMapping {
                    object_id,
                    frame_pointers: false,
                    ..frame_pointers
                });
            }
        }
        Some(frame_pointers)
    }

    /// Describe `pid`'s mappings to the walker (queuing their tables), as
    /// the tracker has them for its current image, tagged with the exec
    /// they belong to. Nothing is written when the tracker's image is older
    /// than the latest exec (the BPF exec program's description stands).
    /// Returns the objects whose tables the walker uses for it.
    fn describe(
        &mut self,
        pid: u32,
        tracker: &mut ProcessTracker,
        walker: &impl WalkerMaps,
        tables: &mut impl TableSupply,
        interpreters: &mut impl InterpreterSupply,
    ) -> Vec<u32> {
        tracker.ensure_process(pid);
        let exec = walker.latest_exec(pid);
        if exec.is_some_and(|e| tracker.image_since(pid) != Some(e.timestamp_ns)) {
            return Vec::new();
        }
        let ids: Vec<MappingId> = tracker.process_mappings(pid).to_vec();
        if ids.is_empty() {
            return Vec::new();
        }
        let mappings: Vec<ExecMapping> = ids
            .iter()
            .filter_map(|&id| self.exec_mapping(pid, id, tracker, walker, tables))
            .collect();
        let exec_id = exec.map_or(0, |e| e.exec_id);
        match walker.set_process(pid, &mappings, exec_id) {
            Ok(()) => {
                self.described.insert(pid);
                attach_interpreter(pid, tracker, walker, interpreters);
                if exec.is_none() && walker.latest_exec(pid).is_some() {
                    // It exec'd meanwhile, and this unchecked description
                    // may have replaced the exec program's: read again.
                    tracker.refresh_process(pid);
                    return self.describe(pid, tracker, walker, tables, interpreters);
                }
                mappings
                    .iter()
                    .filter(|m| !m.frame_pointers)
                    .map(|m| m.object_id)
                    .collect()
            }
            Err(err) => {
                warn!("{err:#}");
                Vec::new()
            }
        }
    }
}

/// Look for an interpreter in `pid`'s objects ([`InterpreterSupply::attach`])
/// and give the BPF walker its entry, or take a stale one away.
fn attach_interpreter(
    pid: u32,
    tracker: &ProcessTracker,
    walker: &impl WalkerMaps,
    interpreters: &mut impl InterpreterSupply,
) {
    let entry = interpreters.attach(pid, tracker);
    if let Err(err) = walker.set_interpreter(pid, entry.as_deref()) {
        // Native frames only for it (one line per run).
        interpreters.forget(pid);
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| warn!("pid {pid}: {err:#}"));
    }
}

/// Read the vDSO image of `pid` (`/proc/PID/mem` at its mapping) and the
/// vaddr its first byte corresponds to.
fn read_vdso(pid: u32, start: u64, end: u64) -> Result<(Vec<u8>, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    mem.seek(SeekFrom::Start(start))?;
    let mut bytes = vec![0u8; (end - start) as usize];
    mem.read_exact(&mut bytes)?;
    let first_vaddr = first_load_vaddr(&bytes)?;
    Ok((bytes, first_vaddr))
}

/// The lowest `p_vaddr` of an ELF image's `PT_LOAD` segments: the virtual
/// address its first byte corresponds to (for the vDSO, an ELF shared
/// object the kernel maps whole). Errors: not a 64-bit ELF image, or one
/// without a `PT_LOAD` segment.
fn first_load_vaddr(elf_bytes: &[u8]) -> Result<u64> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let elf = ElfFile64::<object::Endianness>::parse(elf_bytes)?;
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .map(|ph| ph.p_vaddr(endian))
        .min()
        .ok_or_else(|| anyhow::anyhow!("no PT_LOAD segment"))
}

#[cfg(test)]
#[path = "walker_tests.rs"]
mod tests;
