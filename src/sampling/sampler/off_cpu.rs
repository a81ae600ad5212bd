//! Off-CPU waits (`--off-cpu`): the BPF side is `src/sampling/bpf/off_cpu.h`. A
//! `tp_btf/sched_switch` program notes when a wanted thread leaves its CPU
//! and, when it gets it back after at least the minimum, takes its kernel
//! stack; a `tp_btf/sys_exit` program, which runs in the thread itself when
//! the system call it waited in returns, walks its user stack and sends one
//! record with both stacks and the wait's length in ns (and, for a CPython
//! the walker knows, its Python frames: `walk_python_off_cpu`). Waits that
//! end otherwise (preemptions) are sent with the kernel stack and user pc.
//! Both attach by BTF id: no kprobes, no fentry, no tracefs.
//!
//! Without `--off-cpu` the programs are not loaded, and their map holds
//! one entry: the option costs nothing unless asked for.

use std::os::fd::{AsFd, AsRawFd};

use anyhow::{anyhow, Context, Result};
use libbpf_rs::{Link, MapCore, MapFlags};

use crate::sampling::skel::{defines, OpenProfilerSkel, ProfilerSkel};

/// Waits that can wait at once for their system call to return (entries
/// of `off_cpu_pending`, 1 KiB each, allocated as used).
pub const PENDING_WAITS: u32 = 4096;

/// Set up the off-CPU programs of `open` before load: with
/// `min_ns` (the shortest wait recorded, ns), size their map and set the
/// minimum; with `None`, load none of them.
pub(super) fn configure(
    open: &mut OpenProfilerSkel<'_>,
    min_ns: Option<u64>,
    variant: super::ProgramVariant,
) -> Result<()> {
    if min_ns.is_some() && variant != super::ProgramVariant::BpfLoop {
        anyhow::bail!(
            "--off-cpu needs the bpf_loop BPF programs (Linux 5.17 or later); this run loads \
             the {} programs (kernel {}), which have no off-CPU walker",
            variant.name(),
            crate::sampling::preflight::kernel_release()
        );
    }
    let Some(min_ns) = min_ns else {
        open.progs.off_cpu_switch.set_autoload(false);
        open.progs.off_cpu_resume.set_autoload(false);
        open.progs.walk_user_stack_off_cpu.set_autoload(false);
        open.progs.walk_python_off_cpu.set_autoload(false);
        // The task-storage map needs Linux 5.11; creating it unused would
        // fail the whole load on 5.10 with EINVAL.
        open.maps
            .off_cpu_starts
            .set_autocreate(false)
            .context("leaving the off_cpu_starts task-storage map uncreated")?;
        return Ok(());
    };
    open.maps
        .off_cpu_pending
        .set_max_entries(PENDING_WAITS)
        .context("sizing the off_cpu_pending map")?;
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .ok_or_else(|| anyhow!("BPF object has no .rodata section"))?;
    rodata.off_cpu_min_ns = min_ns;
    Ok(())
}

/// After load: put the off-CPU walker (slot 0) and its Python walker
/// (slot `PYTHON_PROGRAM_SLOT`, as `walk_python` in `walker_programs`;
/// src/sampling/bpf/python.h) in their program array.
pub(super) fn install_walker(skel: &ProfilerSkel<'_>) -> Result<()> {
    let walkers = [
        (0u32, skel.progs.walk_user_stack_off_cpu.as_fd(), "stack"),
        (
            defines::PYTHON_PROGRAM_SLOT as u32,
            skel.progs.walk_python_off_cpu.as_fd(),
            "Python",
        ),
    ];
    for (slot, prog, what) in walkers {
        let fd = prog.as_raw_fd();
        skel.maps
            .off_cpu_walkers
            .update(&slot.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("installing the off-CPU {what} walker for tail calls"))?;
    }
    Ok(())
}

/// Attach the off-CPU programs: the system-call exit first, so that every
/// wait noted from then on can be sent.
pub(super) fn attach(skel: &ProfilerSkel<'_>) -> Result<Vec<Link>> {
    let resume = skel
        .progs
        .off_cpu_resume
        .attach()
        .context("attaching to tp_btf/sys_exit")?;
    let switch = skel
        .progs
        .off_cpu_switch
        .attach()
        .context("attaching to tp_btf/sched_switch")?;
    Ok(vec![resume, switch])
}

/// What `--off-cpu` recorded and left out over a run (the BPF program's
/// counters, [`super::BpfStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffCpuCounts {
    /// Waits recorded (at least `--off-cpu-min`).
    pub waits: u64,
    /// Waits left out for being shorter than `--off-cpu-min`.
    pub short: u64,
    /// Their total length, ns.
    pub short_ns: u64,
    /// Waits left out: a thread's storage could not be made, or the map of
    /// waits waiting for their system call's return was full.
    pub untracked: u64,
}

impl OffCpuCounts {
    /// The off-CPU counters of `stats`.
    pub fn from_stats(stats: &super::BpfStats) -> Self {
        OffCpuCounts {
            waits: stats.off_cpu_waits,
            short: stats.off_cpu_short,
            short_ns: stats.off_cpu_short_ns,
            untracked: stats.off_cpu_untracked,
        }
    }
}

impl std::fmt::Display for OffCpuCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "off-CPU: {} recorded; left out: {} shorter than --off-cpu-min ({:.6} s), {}",
            crate::util::text::plural(self.waits, "wait", "waits"),
            crate::util::text::plural(self.short, "wait", "waits"),
            self.short_ns as f64 / 1e9,
            crate::util::text::plural(self.untracked, "wait untracked", "waits untracked"),
        )
    }
}
