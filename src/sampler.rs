//! Sampling: loads the BPF program (`src/bpf/profiler.bpf.c`), opens one
//! software `cpu-clock` perf event per online CPU in frequency mode, attaches
//! the program to each, and turns the records the program writes to its
//! CPU's ring buffer (in the `samples` array of rings) into [`RawSample`]s
//! (the record types live in [`crate::sample`]).
//!
//! Dropping the [`Sampler`] detaches every program and closes every perf event.

use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{
    Link, MapCore, MapFlags, MapHandle, MapType, OpenObject, RingBuffer, RingBufferBuilder,
};
use perf_event_open_sys as perf;
use tracing::{info, warn};

use crate::sample::{RawSample, TimedEvent};
use crate::skel::{ProfilerSkel, ProfilerSkelBuilder};
use crate::unwind::row::RawRow;

mod follow;
mod tables;
pub mod variant;

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
    /// Called once the BPF programs are loaded, before any perf event is
    /// attached (so before any sample can wait in a ring for it): the
    /// symbolizer notes where the programs' JIT code is
    /// (`symbolize::kallsyms::remember_bpf_programs`, 50-200 ms).
    pub after_load: Option<fn()>,
}

/// Unsupported-rule kinds the BPF program counts (`MAX_UNSUPPORTED_KINDS`).
pub const MAX_UNSUPPORTED_KINDS: usize = 16;
const STAT_WALKS_REUSED: u32 = 4;
const STAT_UNSUPPORTED_BASE: u32 = 5;
const STAT_STACK_COPY_SKIPPED: u32 = STAT_UNSUPPORTED_BASE + MAX_UNSUPPORTED_KINDS as u32;

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
}

/// A ring buffer of `bytes` (a power of two) for CPU `cpu`'s samples.
fn create_sample_ring(cpu: u32, bytes: u32) -> Result<MapHandle> {
    let opts = libbpf_rs::libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_rs::libbpf_sys::bpf_map_create_opts>()
            as libbpf_rs::libbpf_sys::size_t,
        ..Default::default()
    };
    MapHandle::create(
        MapType::RingBuf,
        Some(format!("samples_cpu{cpu}")),
        0,
        0,
        bytes,
        &opts,
    )
    .with_context(|| format!("creating a {bytes}-byte ring buffer for CPU {cpu}'s samples"))
}

/// Writer of the `unwind_rows` map (BPF_F_MMAPABLE): each write maps just
/// the pages it covers, copies the rows in and unmaps them. The kernel
/// backs the whole map with memory from its creation; mapping it only
/// while writing keeps those pages out of this process's resident set.
struct MappedRows {
    fd: OwnedFd,
    /// Bytes of the map's value area (rows * 8, rounded up to pages).
    len: usize,
}

const PAGE_SIZE: usize = 4096;

impl MappedRows {
    fn new(fd: std::os::fd::BorrowedFd<'_>, rows: u32) -> Result<Self> {
        Ok(MappedRows {
            fd: fd
                .try_clone_to_owned()
                .context("duplicating the unwind_rows map's fd")?,
            len: (rows as usize * 8).div_ceil(PAGE_SIZE) * PAGE_SIZE,
        })
    }

    fn write(&self, first: u32, rows: &[RawRow]) -> Result<()> {
        let start = first as usize * 8;
        let end = start + rows.len() * 8;
        if end > self.len {
            bail!(
                "rows {first}..{} exceed the unwind_rows map",
                first as usize + rows.len()
            );
        }
        if rows.is_empty() {
            return Ok(());
        }
        let map_start = start / PAGE_SIZE * PAGE_SIZE;
        let map_len = end.div_ceil(PAGE_SIZE) * PAGE_SIZE - map_start;
        // SAFETY: mapping pages [map_start, map_start + map_len) of a BPF
        // array created with BPF_F_MMAPABLE; the kernel checks the range
        // against the map's size, and the mapping is released below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                map_start as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(anyhow!(std::io::Error::last_os_error()))
                .context("mapping the unwind_rows map");
        }
        let base: *mut u8 = base.cast();
        for (i, row) in rows.iter().enumerate() {
            let bytes = row.to_bytes();
            // SAFETY: start - map_start + 8 * (i + 1) <= end - map_start <=
            // map_len: every row lands inside the live mapping.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    base.add(start - map_start + 8 * i),
                    bytes.len(),
                )
            };
        }
        // SAFETY: base/map_len are exactly what mmap returned; nothing
        // refers to the mapping after this.
        unsafe { libc::munmap(base.cast(), map_len) };
        Ok(())
    }
}

/// Size of each CPU's ring buffer in `samples`, bytes: room for a quarter
/// second of samples at 1 KiB each (a 30-frame stack takes 350 bytes, a
/// 1024-frame one 8 KiB) at `freq_hz`, as a power of two between 128 KiB
/// and 64 MiB. User space drains the rings at least every 100 ms, and the
/// BPF program wakes user space early once a ring is a quarter full. Their
/// memory is the kernel's, but user space maps each ring (twice, for
/// wrap-around reads), so it counts twice in the profiler's resident set:
/// small is better.
pub fn samples_ring_bytes_per_cpu(freq_hz: u64) -> u32 {
    let wanted = freq_hz.saturating_mul(1024) / 4;
    wanted.clamp(128 << 10, 64 << 20).next_power_of_two() as u32
}

/// Online CPUs, from `/sys/devices/system/cpu/online` (a range list such as `0-3,6`).
pub fn online_cpus() -> Result<Vec<u32>> {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    parse_cpu_list(text.trim()).with_context(|| format!("parsing {path}: {text:?}"))
}

fn parse_cpu_list(text: &str) -> Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>()?..=b.parse::<u32>()?),
            None => cpus.push(part.parse()?),
        }
    }
    Ok(cpus)
}

fn open_cpu_clock_event(cpu: u32, freq_hz: u64) -> Result<OwnedFd> {
    let mut attr = perf::bindings::perf_event_attr {
        size: std::mem::size_of::<perf::bindings::perf_event_attr>() as u32,
        type_: perf::bindings::PERF_TYPE_SOFTWARE,
        config: perf::bindings::PERF_COUNT_SW_CPU_CLOCK as u64,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_freq = freq_hz;
    attr.set_freq(1);
    // SAFETY: attr is a valid, fully initialised perf_event_attr that outlives the call.
    let fd = unsafe {
        perf::perf_event_open(
            &mut attr,
            -1,
            cpu as i32,
            -1,
            perf::bindings::PERF_FLAG_FD_CLOEXEC as _,
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(anyhow!(err)).with_context(|| {
            format!("perf_event_open(cpu-clock, cpu {cpu}, {freq_hz} Hz) failed (needs CAP_PERFMON or root)")
        });
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Open a cpu-clock perf event at `freq_hz` on each of `cpus` and attach the
/// sampling program to it.
fn attach_cpu_events(
    skel: &ProfilerSkel<'_>,
    variant: ProgramVariant,
    cpus: &[u32],
    freq_hz: u64,
) -> Result<Vec<Link>> {
    let mut links = Vec::new();
    for &cpu in cpus {
        let fd = open_cpu_clock_event(cpu, freq_hz)?;
        let link = variant
            .sampler(&skel.progs)
            .attach_perf_event(fd.as_raw_fd())
            .with_context(|| format!("attaching the BPF program to the perf event of cpu {cpu}"))?;
        // libbpf's perf-event link closes the perf event fd when it is
        // destroyed, so the link now owns it.
        let _ = fd.into_raw_fd();
        links.push(link);
    }
    Ok(links)
}

/// Log (info) how long loading took and what the verifier processed per
/// program (named as in the `bpf_loop` variant, whichever is loaded).
fn log_load_report(skel: &ProfilerSkel<'_>, variant: ProgramVariant, load_time: Duration) {
    let p = &skel.progs;
    let programs = crate::bpf_info::verified_programs(&[
        ("on_cpu_sample", variant.sampler(p).as_fd()),
        ("walk_user_stack", variant.walker(p).as_fd()),
        ("on_exec", variant.exec(p).as_fd()),
        ("on_exit", p.on_exit.as_fd()),
    ]);
    info!(
        "BPF program on kernel {}: {} variant; {}",
        crate::preflight::kernel_release(),
        variant.name(),
        crate::bpf_info::load_report(load_time, &programs)
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
        log_load_report(&skel, variant, load_started.elapsed());
        let mut sample_rings = Vec::with_capacity(online.len());
        for &cpu in &online {
            let ring = create_sample_ring(cpu, ring_bytes)?;
            skel.maps
                .samples
                .update(
                    &cpu.to_ne_bytes(),
                    &ring.as_fd().as_raw_fd().to_ne_bytes(),
                    MapFlags::ANY,
                )
                .with_context(|| format!("installing the samples ring buffer of CPU {cpu}"))?;
            sample_rings.push(ring);
        }
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
        let rows = MappedRows::new(skel.maps.unwind_rows.as_fd(), config.max_unwind_rows)?;
        Ok(Sampler {
            skel,
            cpus: links.len() - tracking_links,
            tracking_links,
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

    /// Stop sampling for now: close every perf event (exec and exit
    /// tracking stay attached; maps and unwind tables stay loaded).
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
        let events = attach_cpu_events(&self.skel, self.variant, &self.ring_cpus, freq_hz)?;
        self.links.borrow_mut().extend(events);
        Ok(())
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
        self.stat(1)
    }

    /// Read and sum the per-CPU `stats` map.
    pub fn stats(&self) -> Result<BpfStats> {
        let read = |index: u32| self.stat(index);
        let mut unsupported = [0u64; MAX_UNSUPPORTED_KINDS];
        for (kind, slot) in unsupported.iter_mut().enumerate() {
            *slot = read(STAT_UNSUPPORTED_BASE + kind as u32)?;
        }
        Ok(BpfStats {
            samples: read(0)?,
            lost: read(1)?,
            kernel_stack_errors: read(2)?,
            events_lost: read(3)?,
            walks_reused: read(STAT_WALKS_REUSED)?,
            unsupported,
            stack_copies_skipped: read(STAT_STACK_COPY_SKIPPED)?,
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
    let consumed_at = crate::timefmt::monotonic_ns();
    ring.consume()
        .context("draining the samples ring buffers")?;
    Ok(consumed_at)
}

#[cfg(test)]
mod tests;
