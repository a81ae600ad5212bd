//! Following processes in the kernel: the exec, fork and exit
//! programs (`src/sampling/bpf/process.h`) and the maps
//! user space shares with them: descriptions (`process_mappings`), the
//! latest exec of each process (`exec_times`) and the objects whose tables
//! user space knows, by file (`object_files`).

use anyhow::{Context, Result};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle};

use super::variant::ProgramVariant;
use super::Sampler;
use crate::sampling::records::{process_info_value, ExecMapping, ExecTime};
use crate::sampling::skel::{types, ProfilerSkel};

/// The walker's maps of processes and object files, as process lifetimes
/// write and read them (`process_mappings`, `exec_times`, `object_files` in
/// `src/sampling/bpf/state.h` and `process.h`). Implemented by [`Sampler`]; the process walker
/// ([`crate::process::walker`]) writes through it.
pub trait WalkerMaps {
    /// Describe `pid`'s executable mappings (sorted by start; at most
    /// [`crate::sampling::records::MAX_PROCESS_MAPPINGS`], the rest are dropped) to
    /// the walker, as read after the exec `exec_id` ([`ExecTime::exec_id`];
    /// 0: no exec of it was seen, the walker then does not check).
    /// Errors: the map update failed.
    fn set_process(&self, pid: u32, mappings: &[ExecMapping], exec_id: u64) -> Result<()>;

    /// Forget `pid` in the walker (it exited). Missing pids are fine.
    fn remove_process(&self, pid: u32);

    /// The latest exec of `pid` the exec program saw, if any.
    fn latest_exec(&self, pid: u32) -> Option<ExecTime>;

    /// Tell the exec and mmap programs that the file `(dev, inode)` (as
    /// `/proc/PID/maps` shows them) is the object whose table is
    /// `object_id`, with executable segments `(p_offset, p_vaddr,
    /// p_filesz)` (at most 4 are kept). Errors: the map update failed.
    fn set_object_file(
        &self,
        dev: u64,
        inode: u64,
        object_id: u32,
        segments: &[(u64, u64, u64)],
    ) -> Result<()>;

    /// The pids the walker holds a description of, in no order (also
    /// those the exec and fork programs described on their own).
    fn described_pids(&self) -> Vec<u32>;

    /// Tell the exec and mmap programs to forget the file `(dev, inode)`
    /// (its object was retired). Files not known are fine.
    fn remove_object_file(&self, dev: u64, inode: u64);

    /// Give the interpreter walker `pid`'s entry (the bytes of `struct
    /// python_proc`, [`crate::unwind::interp`]), or take it away (`None`).
    /// Errors: the map update failed.
    fn set_interpreter(&self, _pid: u32, _entry: Option<&[u8]>) -> Result<()> {
        Ok(())
    }
}

/// Attach the programs that follow processes: exec, exit and fork.
pub(super) fn attach_tracking(
    skel: &ProfilerSkel<'_>,
    variant: ProgramVariant,
) -> Result<Vec<Link>> {
    let links = vec![
        variant
            .exec(&skel.progs)
            .attach()
            .context("attaching to tp_btf/sched_process_exec")?,
        skel.progs
            .on_exit
            .attach()
            .context("attaching to tp_btf/sched_process_exit")?,
        skel.progs
            .on_fork
            .attach()
            .context("attaching to tp_btf/sched_process_fork")?,
    ];
    Ok(links)
}

/// Generations user space gives descriptions stay below the BPF programs'
/// (`BPF_GENERATION_BASE`).
const USER_GENERATIONS: u32 = crate::sampling::skel::defines::BPF_GENERATION_BASE as u32;

impl Sampler<'_> {
    /// A lookup of the latest exec's time of a pid that outlives this
    /// borrow (its own handle on the `exec_times` map), for the process
    /// tracker ([`crate::process::ProcessTracker::set_exec_clock`]).
    pub fn exec_clock(&self) -> Result<impl Fn(u32) -> Option<u64>> {
        let map = MapHandle::try_from(&self.skel.maps.exec_times)
            .context("opening the exec_times map")?;
        Ok(move |pid: u32| {
            let bytes = map.lookup(&pid.to_ne_bytes(), MapFlags::ANY).ok()??;
            ExecTime::parse(&bytes).map(|t| t.timestamp_ns)
        })
    }
}

/// The descriptions of processes and the object files the walker knows,
/// written and read by [`crate::process::walker::ProcessFollower`].
impl WalkerMaps for Sampler<'_> {
    fn set_process(&self, pid: u32, mappings: &[ExecMapping], exec_id: u64) -> Result<()> {
        let generation = self.mapping_generation.get() % (USER_GENERATIONS - 1) + 1;
        self.mapping_generation.set(generation);
        let value = process_info_value(mappings, generation, exec_id);
        self.skel
            .maps
            .process_mappings
            .update(&pid.to_ne_bytes(), &value, MapFlags::ANY)
            .with_context(|| format!("describing pid {pid} to the walker"))
    }

    fn remove_process(&self, pid: u32) {
        let _ = self.skel.maps.process_mappings.delete(&pid.to_ne_bytes());
        let _ = self.skel.maps.python_procs.delete(&pid.to_ne_bytes());
    }

    fn set_interpreter(&self, pid: u32, entry: Option<&[u8]>) -> Result<()> {
        let map = &self.skel.maps.python_procs;
        if entry.is_some() && self.variant != super::ProgramVariant::BpfLoop {
            anyhow::bail!(
                "Python frames need the bpf_loop BPF programs (Linux 5.17 or later); this run \
                 loads the {} programs: Python processes get native frames only",
                self.variant.name()
            );
        }
        match entry {
            Some(value) => map
                .update(&pid.to_ne_bytes(), value, MapFlags::ANY)
                .with_context(|| format!("giving pid {pid} to the Python walker")),
            None => {
                let _ = map.delete(&pid.to_ne_bytes());
                Ok(())
            }
        }
    }

    fn latest_exec(&self, pid: u32) -> Option<ExecTime> {
        let bytes = self
            .skel
            .maps
            .exec_times
            .lookup(&pid.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        ExecTime::parse(&bytes)
    }

    fn set_object_file(
        &self,
        dev: u64,
        inode: u64,
        object_id: u32,
        segments: &[(u64, u64, u64)],
    ) -> Result<()> {
        let key = types::file_key { dev, inode };
        let mut value = types::object_file {
            object_id,
            ..Default::default()
        };
        for (slot, &(offset, vaddr, size)) in value.segments.iter_mut().zip(segments) {
            slot.offset_lo = offset & !4095;
            slot.offset_hi = offset + size;
            slot.vaddr_delta = vaddr.wrapping_sub(offset);
            value.segment_count += 1;
        }
        // SAFETY: both are Plain (see crate::sampling::skel): integers only, no padding.
        let (key, value) = unsafe { (plain::as_bytes(&key), plain::as_bytes(&value)) };
        self.skel
            .maps
            .object_files
            .update(key, value, MapFlags::ANY)
            .context("registering an object's file with the walker")
    }

    fn described_pids(&self) -> Vec<u32> {
        self.skel
            .maps
            .process_mappings
            .keys()
            .filter_map(|key| Some(u32::from_ne_bytes(key.get(..4)?.try_into().ok()?)))
            .collect()
    }

    fn remove_object_file(&self, dev: u64, inode: u64) {
        let key = types::file_key { dev, inode };
        // SAFETY: Plain (see crate::sampling::skel): integers only, no padding.
        let key = unsafe { plain::as_bytes(&key) };
        let _ = self.skel.maps.object_files.delete(key);
    }
}
