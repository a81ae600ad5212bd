//! Describing processes to the walker: what `process_mappings` holds for
//! each pid, kept current by the process events from BPF (exec, fork, exit,
//! a pc in no known mapping). The BPF programs keep a description of their
//! own from exec and fork on (`src/bpf/profiler.bpf.c`, "Following
//! processes"); the descriptions written here, from `/proc/PID/maps`, add
//! what the kernel did not tell them (anonymous code, the vDSO, objects
//! whose tables were not known yet) and carry the exec they were read after.

use anyhow::Result;
use tracing::{debug, warn};

use super::{file_source, UnwindLoader, VDSO_OBJECT_ID};
use crate::process::{MappingId, ObjectId, ProcessTracker};
use crate::sample::{ExecMapping, ProcessEvent};
use crate::sampler::Sampler;
use crate::unwind::builds::TableSource;

impl UnwindLoader {
    /// React to a process event from BPF.
    pub fn on_event(
        &mut self,
        event: ProcessEvent,
        tracker: &mut ProcessTracker,
        sampler: &Sampler<'_>,
    ) {
        match event {
            ProcessEvent::Exit { pid } => {
                sampler.remove_process(pid);
                self.described.remove(&pid);
                tracker.process_exited(pid, crate::timefmt::monotonic_ns());
            }
            ProcessEvent::Exec { pid, timestamp_ns } => {
                tracker.process_exec(pid, timestamp_ns);
                // The exec program described the new image. A process
                // described here before is read again now (for what the
                // kernel did not tell: the vDSO, anonymous code); any other
                // is read at its first sample, so that the execs of
                // processes never sampled cost no read of /proc.
                if self.described.remove(&pid) {
                    tracker.refresh_process(pid);
                    self.describe(pid, tracker, sampler);
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
                tracker.add_mapping(pid, timestamp_ns, start..end, file_offset, ObjectId(object));
            }
            ProcessEvent::UnknownMapping { pid, address } => {
                debug!("pid {pid}: pc {address:#x} in no known mapping, re-reading its maps");
                tracker.refresh_process(pid);
                self.describe(pid, tracker, sampler);
            }
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
        sampler: &Sampler<'_>,
    ) -> Option<ExecMapping> {
        let m = tracker.mapping(id)?;
        let frame_pointers = ExecMapping {
            start: m.start,
            end: m.end,
            bias: m.start,
            object_id: 0,
            frame_pointers: true,
        };
        if let Some((object, source)) = m.object.and_then(|o| Some((o, file_source(tracker, o)?))) {
            if !self.tables.contains_key(&object.0) {
                self.request(object.0, tracker, source, 0);
            }
            if self.registered_files.insert(object.0) {
                if let Some(file) = tracker.object(object) {
                    let (dev, inode) = file.file_key;
                    if let Err(err) =
                        sampler.set_object_file(dev, inode, object.0, &file.load_segments)
                    {
                        debug!("{}: {err:#}", file.path);
                    }
                }
            }
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
                    if !self.tables.contains_key(&VDSO_OBJECT_ID) {
                        self.request(VDSO_OBJECT_ID, tracker, TableSource::Bytes(bytes), 0);
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
        }
        Some(frame_pointers)
    }

    /// Describe `pid`'s mappings to the walker (queuing their tables), as
    /// the tracker has them for its current image, tagged with the exec
    /// they belong to. Nothing is written when the tracker's image is older
    /// than the latest exec (the BPF exec program's description stands).
    /// Returns the objects whose tables the walker uses for it.
    pub(super) fn describe(
        &mut self,
        pid: u32,
        tracker: &mut ProcessTracker,
        sampler: &Sampler<'_>,
    ) -> Vec<u32> {
        tracker.ensure_process(pid);
        let exec = sampler.latest_exec(pid);
        if exec.is_some_and(|e| tracker.image_since(pid) != Some(e.timestamp_ns)) {
            return Vec::new();
        }
        let ids: Vec<MappingId> = tracker.process_mappings(pid).to_vec();
        if ids.is_empty() {
            return Vec::new();
        }
        let mappings: Vec<ExecMapping> = ids
            .iter()
            .filter_map(|&id| self.exec_mapping(pid, id, tracker, sampler))
            .collect();
        let exec_id = exec.map_or(0, |e| e.exec_id);
        match sampler.set_process(pid, &mappings, exec_id) {
            Ok(()) => {
                self.described.insert(pid);
                if exec.is_none() && sampler.latest_exec(pid).is_some() {
                    // It exec'd meanwhile, and this unchecked description
                    // may have replaced the exec program's: read again.
                    tracker.refresh_process(pid);
                    return self.describe(pid, tracker, sampler);
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

/// Read the vDSO image of `pid` (`/proc/PID/mem` at its mapping) and the
/// vaddr its first byte corresponds to.
fn read_vdso(pid: u32, start: u64, end: u64) -> Result<(Vec<u8>, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
    mem.seek(SeekFrom::Start(start))?;
    let mut bytes = vec![0u8; (end - start) as usize];
    mem.read_exact(&mut bytes)?;
    let first_vaddr = crate::unwind::first_load_vaddr(&bytes)?;
    Ok((bytes, first_vaddr))
}
