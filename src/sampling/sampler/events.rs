//! The perf events and rings sampling runs on: one software `cpu-clock`
//! event per online CPU in frequency mode, each with the sampling program
//! attached, and one ring buffer of sample records per CPU.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use anyhow::{anyhow, Context, Result};
use libbpf_rs::{Link, MapCore, MapFlags, MapHandle, MapType};
use perf_event_open_sys as perf;

use super::variant::ProgramVariant;
use crate::sampling::skel::ProfilerSkel;

// Bytes of user stack in the largest stack-copy record, the BPF side's
// `STACK_COPY_LARGE_BYTES` (`src/sampling/bpf/profiler.h`): 96 KiB.
use crate::sampling::skel::defines::STACK_COPY_LARGE_BYTES;

/// Size of each CPU's ring buffer in `samples`, bytes: room for a quarter
/// second of samples at 1 KiB each (a 30-frame stack takes 350 bytes, a
/// 1024-frame one 8 KiB) at `freq_hz`, as a power of two between 256 KiB
/// and 64 MiB. The floor is the least power of two over twice the largest
/// stack-copy record, because the BPF program sends a copy only while the
/// ring stays less than half full with it: with 128 KiB rings (below
/// 513 Hz) a stack deeper than 32 KiB was never copied whole or split.
/// User space drains the rings at least every 100 ms, and the BPF program
/// wakes user space early once a ring is a quarter full. Their memory is
/// the kernel's, but user space maps each ring (twice, for wrap-around
/// reads), and the pages it has read count in the profiler's resident set:
/// small is better.
pub fn samples_ring_bytes_per_cpu(freq_hz: u64) -> u32 {
    let wanted = freq_hz.saturating_mul(1024) / 4;
    let floor = (2 * STACK_COPY_LARGE_BYTES).next_power_of_two();
    wanted.clamp(floor, 64 << 20).next_power_of_two() as u32
}

/// Online CPUs, from `/sys/devices/system/cpu/online` (a range list such as `0-3,6`).
pub fn online_cpus() -> Result<Vec<u32>> {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    parse_cpu_list(text.trim()).with_context(|| format!("parsing {path}: {text:?}"))
}

/// CPU numbers of a kernel range list (`0-3,6`). Errors: a part that is
/// not a number or a range of numbers.
pub(super) fn parse_cpu_list(text: &str) -> Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>()?..=b.parse::<u32>()?),
            None => cpus.push(part.parse()?),
        }
    }
    Ok(cpus)
}

/// A cpu-clock perf event on `cpu` sampling at `freq_hz` (frequency mode,
/// every process). Errors name the CPU and the privilege it needs.
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
pub(super) fn attach_cpu_events(
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

/// A ring of `bytes` for each CPU of `online`, created and installed in
/// the `samples` array of `skel` (indexed by CPU); in `online`'s order.
pub(super) fn install_sample_rings(
    skel: &ProfilerSkel<'_>,
    online: &[u32],
    bytes: u32,
) -> Result<Vec<MapHandle>> {
    let mut sample_rings = Vec::with_capacity(online.len());
    for &cpu in online {
        let ring = create_sample_ring(cpu, bytes)?;
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
    Ok(sample_rings)
}
