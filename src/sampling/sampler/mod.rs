//! Sampling: loads the BPF program (`src/sampling/bpf/profiler.bpf.c`), opens one
//! software `cpu-clock` perf event per online CPU in frequency mode, attaches
//! the program to each, and turns the records the program writes to its
//! CPU's ring buffer (in the `samples` array of rings) into [`RawSample`]s
//! (the record types live in [`crate::sampling::records`]).
//!
//! Dropping the [`Sampler`] detaches every program and closes every perf event.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, OpenObject, RingBuffer, RingBufferBuilder};
use tracing::{info, warn};

use crate::sampling::records::{RawSample, TimedEvent};
use crate::sampling::skel::{defines, types::stat_index, ProfilerSkel, ProfilerSkelBuilder};

mod events;
mod follow;
pub mod off_cpu;
mod rows;
mod tables;
pub mod variant;

use events::{attach_cpu_events, install_sample_rings};
pub use events::{online_cpus, samples_ring_bytes_per_cpu};
pub use follow::WalkerMaps;
use rows::MappedRows;
pub use tables::RowLookup;
use variant::ProgramVariant;

/// What to sample.
#[derive(Debug, Clone, Default)]
pub struct SamplerConfig {
    /// Samples per second per CPU, Hz.
    pub sample_freq_hz: u64,
    /// Only these processes (thread group ids); empty means every process.
    pub pids: Vec<u32>,
    /// A process never to sample (the profiler itself with --exclude-self).
    pub exclude_pid: Option<u32>,
    /// Print libbpf debug output and the verifier log.
    pub libbpf_debug: bool,
    /// Capacity of the `unwind_rows` map, rows (8 bytes each): the unwind-table memory budget.
    pub max_unwind_rows: u32,
    /// Also sample every process a process in `pids` creates, from its
    /// first instruction (`record`: fork and clone are followed inside the
    /// BPF program; exec keeps the pid). Needs a non-empty `pids`.
    pub follow_children: bool,
    /// Record off-CPU waits of at least this many ns (`--off-cpu`,
    /// [`off_cpu`]); `None`: cpu-clock samples only.
    pub off_cpu_min_ns: Option<u64>,
    /// Called once the BPF programs are loaded, before any perf event is
    /// attached (so before any sample can wait in a ring for it): the
    /// symbolizer notes where the programs' JIT code is
    /// (`symbolize::kallsyms::remember_bpf_programs`, 50-200 ms).
    pub after_load: Option<fn()>,
}

/// Unsupported-rule kinds the BPF program counts (`MAX_UNSUPPORTED_KINDS`:
/// the counters between `STAT_UNSUPPORTED_BASE` and the next one).
pub const MAX_UNSUPPORTED_KINDS: usize = (STAT_STACK_COPY_SKIPPED - STAT_UNSUPPORTED_BASE) as usize;
// The indices of the `stats` map: `enum stat_index`, as the skeleton generates it.
const STAT_SAMPLES: u32 = stat_index::STAT_SAMPLES.0;
const STAT_LOST_RINGBUF: u32 = stat_index::STAT_LOST_RINGBUF.0;
const STAT_KERNEL_STACK_ERROR: u32 = stat_index::STAT_KERNEL_STACK_ERROR.0;
const STAT_EVENTS_LOST: u32 = stat_index::STAT_EVENTS_LOST.0;
const STAT_WALKS_REUSED: u32 = stat_index::STAT_WALKS_REUSED.0;
const STAT_UNSUPPORTED_BASE: u32 = stat_index::STAT_UNSUPPORTED_BASE.0;
const STAT_STACK_COPY_SKIPPED: u32 = stat_index::STAT_STACK_COPY_SKIPPED.0;
const STAT_OFF_CPU_WAITS: u32 = stat_index::STAT_OFF_CPU_WAITS.0;
const STAT_OFF_CPU_SHORT: u32 = stat_index::STAT_OFF_CPU_SHORT.0;
const STAT_OFF_CPU_SHORT_NS: u32 = stat_index::STAT_OFF_CPU_SHORT_NS.0;
const STAT_OFF_CPU_UNTRACKED: u32 = stat_index::STAT_OFF_CPU_UNTRACKED.0;
const STAT_SAMPLES_BUSY: u32 = stat_index::STAT_SAMPLES_BUSY.0;

/// Counters the BPF program keeps (per-CPU `stats` map, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfStats {
    /// Samples of wanted tasks that reached the program.
    pub samples: u64,
    /// Samples their CPU's ring buffer had no room for (lost).
    pub lost: u64,
    /// Samples whose kernel stack could not be read.
    pub kernel_stack_errors: u64,
    /// Process events the events ring buffer had no room for.
    pub events_lost: u64,
    /// User walks that took their callers from their CPU's previous walk
    /// instead of walking them (docs/unwind-tables.md).
    pub walks_reused: u64,
    /// Walks stopped by an unsupported CFI rule, by kind (docs/unwind-tables.md).
    pub unsupported: [u64; MAX_UNSUPPORTED_KINDS],
    /// Walks stopped for want of a table or mapping that went without a
    /// stack copy (no room in their CPU's ring, or the stack unreadable):
    /// user space could not walk them on ([`crate::unwind::deferred`]).
    pub stack_copies_skipped: u64,
    /// Off-CPU waits of wanted threads that were recorded (`--off-cpu`).
    pub off_cpu_waits: u64,
    /// Off-CPU waits left out for being shorter than `--off-cpu-min`.
    pub off_cpu_short: u64,
    /// Their total length, ns.
    pub off_cpu_short_ns: u64,
    /// Off-CPU waits left out: a thread's task storage could not be made,
    /// or the map of waits waiting for their system call's return was full
    /// ([`off_cpu::PENDING_WAITS`]).
    pub off_cpu_untracked: u64,
    /// cpu-clock samples skipped because they interrupted an off-CPU walk
    /// on their CPU (which holds the CPU's scratch space).
    pub samples_busy: u64,
}

/// The loaded and attached BPF program with its perf events.
pub struct Sampler<'obj> {
    skel: ProfilerSkel<'obj>,
    // One link per perf event; dropping a link detaches the program and
    // closes its perf event.
    links: RefCell<Vec<Link>>,
    cpus: usize,
    /// One ring buffer per CPU online at start, in the `samples` array at
    /// that CPU's id.
    sample_rings: Vec<MapHandle>,
    /// The CPUs of `sample_rings`, in the same order: the CPUs sampled.
    ring_cpus: Vec<u32>,
    /// The `unwind_rows` array, mapped into this process (BPF_F_MMAPABLE).
    rows: MappedRows,
    /// The last `process_info.generation` written: every description of a
    /// process gets a new one, so the walker never reuses a walk made under
    /// other mappings.
    mapping_generation: Cell<u32>,
    /// How many of `links` follow processes (exec, fork, mmap, exit): they
    /// come first and stay attached while sampling is paused.
    tracking_links: usize,
    /// The build of the programs loaded ([`variant::choose_variant`]).
    variant: ProgramVariant,
    /// Whether the off-CPU programs are loaded (`--off-cpu`): they attach
    /// and detach with the perf events.
    off_cpu: bool,
}

/// Log (info) how long loading took and what the verifier processed per
/// program (named as in the `bpf_loop` variant, whichever is loaded).
fn log_load_report(
    skel: &ProfilerSkel<'_>,
    variant: ProgramVariant,
    load_time: Duration,
    off_cpu: bool,
) {
    let p = &skel.progs;
    let mut loaded = vec![
        ("on_cpu_sample", variant.sampler(p).as_fd()),
        ("walk_user_stack", variant.walker(p).as_fd()),
        ("on_exec", variant.exec(p).as_fd()),
        ("on_exit", p.on_exit.as_fd()),
    ];
    if variant == ProgramVariant::BpfLoop {
        loaded.push(("walk_python", p.walk_python.as_fd()));
    }
    if off_cpu {
        loaded.push(("off_cpu_resume", p.off_cpu_resume.as_fd()));
        loaded.push(("walk_user_stack_off_cpu", p.walk_user_stack_off_cpu.as_fd()));
        loaded.push(("walk_python_off_cpu", p.walk_python_off_cpu.as_fd()));
    }
    let programs = crate::sampling::bpf_info::verified_programs(&loaded);
    info!(
        "BPF program on kernel {}: {} variant; {}",
        crate::sampling::preflight::kernel_release(),
        variant.name(),
        crate::sampling::bpf_info::load_report(load_time, &programs)
    );
}

impl<'obj> Sampler<'obj> {
    /// Load the BPF program with `config` baked in, open a cpu-clock perf event
    /// on every online CPU and attach the program to each. Errors name the
    /// step that failed (load/verifier, perf_event_open, attach).
    pub fn start(
        config: &SamplerConfig,
        object: &'obj mut MaybeUninit<OpenObject>,
    ) -> Result<Self> {
        if config.max_unwind_rows == 0 {
            bail!("the unwind-table budget must hold at least one row");
        }
        let choice = variant::choose_variant()?;
        if choice.reason.starts_with("forced") {
            warn!(
                "loading the {} BPF programs: {}",
                choice.variant.name(),
                choice.reason
            );
        } else {
            info!(
                "loading the {} BPF programs: {}",
                choice.variant.name(),
                choice.reason
            );
        }
        let variant = choice.variant;
        let mut builder = ProfilerSkelBuilder::default();
        builder.obj_builder.debug(config.libbpf_debug);
        let mut open = builder.open(object).context("opening the BPF object")?;
        variant.select(&mut open.progs);
        ProgramVariant::shape_maps(&mut open.maps)?;
        {
            let rodata = open
                .maps
                .rodata_data
                .as_deref_mut()
                .ok_or_else(|| anyhow!("BPF object has no .rodata section"))?;
            rodata.filter_pids = !config.pids.is_empty();
            rodata.exclude_pid = config.exclude_pid.unwrap_or(0);
            rodata.follow_children = config.follow_children;
        }
        let online = online_cpus()?;
        let ring_bytes = samples_ring_bytes_per_cpu(config.sample_freq_hz);
        let ring_slots = online.iter().max().map_or(1, |&cpu| cpu + 1);
        open.maps
            .samples
            .set_max_entries(ring_slots)
            .context("sizing the samples ring buffer array")?;
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.samples_wakeup_bytes = u64::from(ring_bytes / 4);
        }
        open.maps
            .unwind_rows
            .set_max_entries(config.max_unwind_rows)
            .context("sizing the unwind_rows map")?;
        off_cpu::configure(&mut open, config.off_cpu_min_ns, variant)?;
        if config.libbpf_debug {
            // Level 2: the verifier log of every instruction, even on success.
            for prog in variant.open_sampling(&mut open.progs) {
                prog.set_log_level(2);
            }
        }
        let load_started = Instant::now();
        let skel = open
            .load()
            .context("loading the BPF program (the verifier rejected it, or BTF/CAP_BPF is missing; rerun with --libbpf-debug)")?;
        let off_cpu = config.off_cpu_min_ns.is_some();
        log_load_report(&skel, variant, load_started.elapsed(), off_cpu);
        let sample_rings = install_sample_rings(&skel, &online, ring_bytes)?;
        for pid in &config.pids {
            skel.maps
                .target_pids
                .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .with_context(|| format!("adding pid {pid} to the target_pids map"))?;
        }
        let walker_fd = variant.walker(&skel.progs).as_fd().as_raw_fd();
        skel.maps
            .walker_programs
            .update(&0u32.to_ne_bytes(), &walker_fd.to_ne_bytes(), MapFlags::ANY)
            .context("installing the stack walker for tail calls")?;
        if variant == ProgramVariant::BpfLoop {
            // The Python walker (src/sampling/bpf/python.h) steps with bpf_loop: the
            // compat variant leaves its slot empty and sends native stacks.
            let python_fd = skel.progs.walk_python.as_fd().as_raw_fd();
            skel.maps
                .walker_programs
                .update(
                    &(defines::PYTHON_PROGRAM_SLOT as u32).to_ne_bytes(),
                    &python_fd.to_ne_bytes(),
                    MapFlags::ANY,
                )
                .context("installing the Python walker for tail calls")?;
        }
        if off_cpu {
            off_cpu::install_walker(&skel)?;
        }
        if let Some(after_load) = config.after_load {
            after_load();
        }
        let mut links = follow::attach_tracking(&skel, variant)?;
        let tracking_links = links.len();
        links.extend(attach_cpu_events(
            &skel,
            variant,
            &online,
            config.sample_freq_hz,
        )?);
        let cpus = links.len() - tracking_links;
        if off_cpu {
            links.extend(off_cpu::attach(&skel)?);
        }
        let rows = MappedRows::new(skel.maps.unwind_rows.as_fd(), config.max_unwind_rows)?;
        Ok(Sampler {
            skel,
            cpus,
            tracking_links,
            off_cpu,
            sample_rings,
            ring_cpus: online,
            rows,
            links: RefCell::new(links),
            mapping_generation: Cell::new(0),
            variant,
        })
    }

    /// The build of the BPF programs this sampler loaded.
    pub fn variant(&self) -> ProgramVariant {
        self.variant
    }

    /// Detach the program from every perf event: no new samples arrive after this.
    pub fn detach(&self) {
        self.links.borrow_mut().clear();
    }

    /// Stop sampling for now: close every perf event and detach the
    /// off-CPU programs (exec and exit tracking stay attached; maps and
    /// unwind tables stay loaded).
    /// [`Sampler::resume`] opens them again.
    pub fn pause(&self) {
        self.links.borrow_mut().truncate(self.tracking_links);
    }

    /// Sample again after [`Sampler::pause`], at `freq_hz` per CPU: open
    /// one perf event per online CPU and attach the program. Does nothing
    /// if sampling is already on.
    pub fn resume(&self, freq_hz: u64) -> Result<()> {
        if self.links.borrow().len() > self.tracking_links {
            return Ok(());
        }
        // A CPU that came online after start has no ring buffer: its
        // samples could not be sent, so it is not sampled.
        if let Ok(online) = online_cpus() {
            let missing: Vec<u32> = online
                .into_iter()
                .filter(|cpu| !self.ring_cpus.contains(cpu))
                .collect();
            if !missing.is_empty() {
                warn!("CPUs {missing:?} came online after start and are not sampled (restart to include them)");
            }
        }
        let mut events = attach_cpu_events(&self.skel, self.variant, &self.ring_cpus, freq_hz)?;
        if self.off_cpu {
            events.extend(off_cpu::attach(&self.skel)?);
        }
        self.links.borrow_mut().extend(events);
        Ok(())
    }

    /// Whether the off-CPU programs are loaded (`--off-cpu`).
    pub fn records_off_cpu(&self) -> bool {
        self.off_cpu
    }

    /// Number of perf events (one per online CPU) the program is attached to.
    pub fn attached_cpus(&self) -> usize {
        self.cpus
    }

    /// Build a reader of the ring buffers (every CPU's samples, and the
    /// events): each sample record is parsed into a [`RawSample`] and
    /// appended to `samples` (records that do not parse are counted in
    /// `malformed`); each process event is appended to `events`. Records of
    /// different CPUs arrive in no particular order.
    pub fn ring_buffer(
        &self,
        samples: Rc<RefCell<Vec<RawSample>>>,
        events: Rc<RefCell<Vec<TimedEvent>>>,
        malformed: Rc<RefCell<u64>>,
    ) -> Result<RingBuffer<'_>> {
        let mut builder = RingBufferBuilder::new();
        for ring in &self.sample_rings {
            let samples = samples.clone();
            let malformed = malformed.clone();
            builder.add(ring, move |data: &[u8]| {
                match RawSample::parse(data) {
                    Ok(sample) => samples.borrow_mut().push(sample),
                    Err(_) => *malformed.borrow_mut() += 1,
                }
                0
            })?;
        }
        builder.add(&self.skel.maps.events, move |data: &[u8]| {
            if let Some(event) = TimedEvent::parse(data) {
                events.borrow_mut().push(event);
            }
            0
        })?;
        Ok(builder.build()?)
    }

    /// One counter of the per-CPU `stats` map, summed over the CPUs.
    fn stat(&self, index: u32) -> Result<u64> {
        let values = self
            .skel
            .maps
            .stats
            .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)?
            .unwrap_or_default();
        Ok(values
            .iter()
            .filter_map(|v| Some(u64::from_ne_bytes(v.get(..8)?.try_into().ok()?)))
            .sum())
    }

    /// Samples lost so far ([`BpfStats::lost`]) alone: one map lookup.
    pub fn lost(&self) -> Result<u64> {
        self.stat(STAT_LOST_RINGBUF)
    }

    /// Read and sum the per-CPU `stats` map.
    pub fn stats(&self) -> Result<BpfStats> {
        let read = |index: u32| self.stat(index);
        let mut unsupported = [0u64; MAX_UNSUPPORTED_KINDS];
        for (kind, slot) in unsupported.iter_mut().enumerate() {
            *slot = read(STAT_UNSUPPORTED_BASE + kind as u32)?;
        }
        Ok(BpfStats {
            samples: read(STAT_SAMPLES)?,
            lost: read(STAT_LOST_RINGBUF)?,
            kernel_stack_errors: read(STAT_KERNEL_STACK_ERROR)?,
            events_lost: read(STAT_EVENTS_LOST)?,
            walks_reused: read(STAT_WALKS_REUSED)?,
            unsupported,
            stack_copies_skipped: read(STAT_STACK_COPY_SKIPPED)?,
            off_cpu_waits: read(STAT_OFF_CPU_WAITS)?,
            off_cpu_short: read(STAT_OFF_CPU_SHORT)?,
            off_cpu_short_ns: read(STAT_OFF_CPU_SHORT_NS)?,
            off_cpu_untracked: read(STAT_OFF_CPU_UNTRACKED)?,
            samples_busy: read(STAT_SAMPLES_BUSY)?,
        })
    }
}

/// Wait up to `timeout` for a wake-up from any of `ring`'s ring buffers,
/// then take every record in all of them. The BPF program wakes user space
/// only once a quarter of a CPU's ring ([`samples_ring_bytes_per_cpu`]) is
/// waiting, so most records are read here after the timeout rather than on
/// a wake-up; callers poll at least every 100 ms.
/// A signal arriving during the wait (e.g. the SIGINT that stops the run)
/// is not an error: the caller checks its stop flag after every poll.
/// Returns when the rings were consumed (CLOCK_MONOTONIC ns, read just
/// before): every record written before it has been taken.
pub fn poll(ring: &RingBuffer<'_>, timeout: Duration) -> Result<u64> {
    match ring.poll(timeout) {
        Err(err) if err.kind() == libbpf_rs::ErrorKind::Interrupted => {}
        other => other.context("polling the samples ring buffers")?,
    }
    let consumed_at = crate::util::timefmt::monotonic_ns();
    ring.consume()
        .context("draining the samples ring buffers")?;
    Ok(consumed_at)
}

#[cfg(test)]
mod tests;
