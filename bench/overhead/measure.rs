//! What the harness reads from the running system: a process's CPU time and
//! memory (`/proc/PID/...`), the run time of its BPF programs (`fdinfo` of
//! its BPF program descriptors, filled in while `kernel.bpf_stats_enabled` is
//! 1), sysctls, and the kernel's throttling messages (`/dev/kmsg`).

use std::collections::HashSet;
use std::fs;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Mutex;

use anyhow::{Context, Result};

/// CPU time of a process, read from `/proc`.
#[derive(Debug, Clone)]
pub struct CpuTime {
    /// Sum over its live threads of the time on CPU (`/proc/PID/task/TID/schedstat`
    /// field 1: user + system), ns.
    pub threads_ns: u64,
    /// The live thread ids `threads_ns` covers.
    pub tids: Vec<u32>,
    /// user + system time of the whole process including exited threads
    /// (`/proc/PID/stat` fields 14 and 15), ns (clock-tick resolution).
    pub process_ns: u64,
}

/// Read `pid`'s CPU time.
pub fn cpu_time(pid: u32) -> Result<CpuTime> {
    let mut threads_ns = 0;
    let mut tids = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/task")).with_context(|| format!("pid {pid}"))? {
        let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A thread may exit between the listing and the read.
        if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")) {
            threads_ns += text
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0);
            tids.push(tid);
        }
    }
    tids.sort_unstable();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12] // utime, stime: fields 14 and 15, counted from field 3
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(CpuTime {
        threads_ns,
        tids,
        process_ns: ticks * 1_000_000_000 / hz,
    })
}

/// CPU used between two readings of the same process, ns: from the threads'
/// schedstat when every thread of the first reading is still alive (precise),
/// else from the process totals (clock-tick resolution).
pub fn cpu_between(t0: &CpuTime, t1: &CpuTime) -> u64 {
    let alive: HashSet<u32> = t1.tids.iter().copied().collect();
    if t0.tids.iter().all(|t| alive.contains(t)) && t1.tids.len() == t0.tids.len() {
        t1.threads_ns.saturating_sub(t0.threads_ns)
    } else {
        t1.process_ns.saturating_sub(t0.process_ns)
    }
}

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `VmRSS`), KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Where `pid`'s threads wait in the kernel (`/proc/PID/task/TID/wchan`),
/// as `comm: function` for each distinct pair with its count, leaving out
/// threads idle in a futex or epoll wait, e.g. `lightswitch: wait_for_partner x1`.
pub fn waiting_in(pid: u32) -> String {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return String::new();
    };
    for task in tasks.flatten() {
        let read = |f: &str| fs::read_to_string(task.path().join(f)).unwrap_or_default();
        let wchan = read("wchan");
        let idle = ["", "0", "futex_do_wait", "do_epoll_wait"].contains(&wchan.as_str());
        if !idle {
            *seen
                .entry(format!("{}: {wchan}", read("comm").trim()))
                .or_default() += 1;
        }
    }
    seen.iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reset the peak RSS of `pid` (its `VmHWM`) to its current RSS, so that
/// the next `VmHWM` read is the peak since now: writing `5` to
/// `/proc/PID/clear_refs` (Linux 4.0 and later; `Documentation/filesystems/proc.rst`).
pub fn reset_peak_rss(pid: u32) -> Result<()> {
    fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of {pid} (/proc/{pid}/clear_refs)"))
}

/// Run-time totals of a process's BPF programs of type `perf_event`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfRunStats {
    /// Time spent in the programs, ns (tail-called programs count in the caller's).
    pub run_time_ns: u64,
    /// Times the programs ran: one per sample for the entry program.
    pub run_cnt: u64,
}

/// `BPF_PROG_TYPE_PERF_EVENT` in `include/uapi/linux/bpf.h`.
const BPF_PROG_TYPE_PERF_EVENT: u64 = 7;

/// Sum the run-time statistics of the `perf_event` BPF programs `pid` holds
/// open (each program once), from `/proc/PID/fdinfo`. Zero unless
/// `kernel.bpf_stats_enabled` is 1.
pub fn bpf_run_stats(pid: u32) -> Result<BpfRunStats> {
    let mut seen = HashSet::new();
    let mut total = BpfRunStats::default();
    let dir = format!("/proc/{pid}/fd");
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let entry = entry?;
        let Ok(target) = fs::read_link(entry.path()) else {
            continue;
        };
        if target.as_os_str() != "anon_inode:bpf-prog" {
            continue;
        }
        let fd = entry.file_name();
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy()))
        else {
            continue;
        };
        let field = |name: &str| -> Option<u64> {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse().ok())
        };
        if field("prog_type") != Some(BPF_PROG_TYPE_PERF_EVENT) {
            continue;
        }
        if !seen.insert(field("prog_id")) {
            continue;
        }
        total.run_time_ns += field("run_time_ns").unwrap_or(0);
        total.run_cnt += field("run_cnt").unwrap_or(0);
    }
    Ok(total)
}

/// Processes and threads created since boot (`processes` in `/proc/stat`;
/// unlike pids, it does not wrap).
pub fn forks() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    stat.lines()
        .find_map(|l| l.strip_prefix("processes ")?.trim().parse().ok())
        .context("no `processes` line in /proc/stat")
}

/// Path of a sysctl under `/proc/sys` (`kernel.bpf_stats_enabled`).
fn sysctl_path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

/// Read a sysctl as a trimmed string.
pub fn read_sysctl(name: &str) -> Result<String> {
    let path = sysctl_path(name);
    Ok(fs::read_to_string(&path)
        .with_context(|| format!("reading {path}"))?
        .trim()
        .to_string())
}

/// Read a numeric sysctl.
pub fn read_sysctl_u64(name: &str) -> Result<u64> {
    let value = read_sysctl(name)?;
    value
        .parse()
        .with_context(|| format!("{name} is not a number: {value}"))
}

/// Set a sysctl.
pub fn write_sysctl(name: &str, value: &str) -> Result<()> {
    let path = sysctl_path(name);
    fs::write(&path, value).with_context(|| format!("writing {value} to {path}"))
}

/// Sysctls the harness changed, with their original values: restored by
/// [`restore_sysctls`] at exit, including on Ctrl-C.
static CHANGED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Set a sysctl for the rest of the harness run, remembering the original
/// value (the first time) for [`restore_sysctls`].
pub fn set_sysctl_for_run(name: &str, value: &str) -> Result<()> {
    let original = read_sysctl(name)?;
    {
        let mut changed = CHANGED.lock().unwrap_or_else(|e| e.into_inner());
        if !changed.iter().any(|(n, _)| n == name) {
            changed.push((name.to_string(), original));
        }
    }
    write_sysctl(name, value)
}

/// Put back every sysctl [`set_sysctl_for_run`] changed.
pub fn restore_sysctls() {
    let changed = CHANGED.lock().unwrap_or_else(|e| e.into_inner());
    for (name, value) in changed.iter() {
        if let Err(err) = write_sysctl(name, value) {
            eprintln!("overhead: cannot restore {name}={value}: {err:#}");
        }
    }
}

/// The kernel's message when perf sampling interrupts take too long (it then
/// lowers `kernel.perf_event_max_sample_rate`).
const THROTTLE_MESSAGE: &str = "perf: interrupt took too long";

/// Number of throttling messages in the kernel log (`/dev/kmsg`, which
/// returns one record per read, from the oldest still buffered).
pub fn throttle_messages() -> Result<usize> {
    let mut kmsg = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .context("opening /dev/kmsg")?;
    let mut count = 0;
    let mut record = vec![0u8; 8192];
    loop {
        match kmsg.read(&mut record) {
            Ok(0) => break,
            Ok(n) => {
                if String::from_utf8_lossy(&record[..n]).contains(THROTTLE_MESSAGE) {
                    count += 1;
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            // A record overwritten while reading: continue with the next one.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(e).context("reading /dev/kmsg"),
        }
    }
    Ok(count)
}

/// Whether the kernel throttled sampling during one run.
#[derive(Debug, Clone, Copy)]
pub struct Throttling {
    /// New `perf: interrupt took too long` messages.
    pub messages: usize,
    /// `kernel.perf_event_max_sample_rate` before the run.
    pub rate_before: u64,
    /// The same after the run (lower when the kernel throttled).
    pub rate_after: u64,
}

impl Throttling {
    /// Whether either sign of throttling appeared.
    pub fn throttled(&self) -> bool {
        self.messages > 0 || self.rate_after < self.rate_before
    }
}

/// Watches one run for throttling; [`ThrottleWatch::finish`] reports it.
/// The maximum sample rate is restored then and when the watch is dropped
/// (also after a failed run), so the next run starts from the same one.
pub struct ThrottleWatch {
    messages: usize,
    rate: u64,
}

/// The sysctl the kernel lowers when it throttles.
const MAX_SAMPLE_RATE: &str = "kernel.perf_event_max_sample_rate";

impl ThrottleWatch {
    /// Take the "before" readings.
    pub fn start() -> Result<Self> {
        Ok(ThrottleWatch {
            messages: throttle_messages()?,
            rate: read_sysctl_u64(MAX_SAMPLE_RATE)?,
        })
    }

    /// Take the "after" readings and restore the maximum sample rate.
    pub fn finish(&self) -> Result<Throttling> {
        let result = Throttling {
            messages: throttle_messages()?.saturating_sub(self.messages),
            rate_before: self.rate,
            rate_after: read_sysctl_u64(MAX_SAMPLE_RATE)?,
        };
        self.restore()?;
        Ok(result)
    }

    fn restore(&self) -> Result<()> {
        if read_sysctl_u64(MAX_SAMPLE_RATE)? != self.rate {
            write_sysctl(MAX_SAMPLE_RATE, &self.rate.to_string())?;
        }
        Ok(())
    }
}

impl Drop for ThrottleWatch {
    fn drop(&mut self) {
        if let Err(err) = self.restore() {
            eprintln!("overhead: {err:#}");
        }
    }
}
