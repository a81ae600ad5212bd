//! Inputs shared by the benchmarks: addresses inside this very process's
//! mapped objects (so the profiler's process tracker and symbolizer read
//! real ELF files), and samples built from them.

use lightswitch::sampling::records::{RawSample, UnwindStatus};

/// The first executable mapping of this process whose path satisfies
/// `wanted`: (start, end) addresses.
pub fn executable_mapping(wanted: impl Fn(&str) -> bool) -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (range, perms, path) = (fields.first()?, fields.get(1)?, fields.get(5)?);
        if !perms.contains('x') || !wanted(path) {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        Some((
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        ))
    })
}

/// The mapping of this benchmark's own executable.
pub fn own_text() -> (u64, u64) {
    let exe = std::fs::read_link("/proc/self/exe").expect("/proc/self/exe");
    let exe = exe.to_string_lossy().into_owned();
    executable_mapping(|p| p == exe).expect("the executable's text mapping")
}

/// `n` distinct addresses spread evenly over `[start, end)`.
pub fn spread(n: usize, (start, end): (u64, u64)) -> Vec<u64> {
    let step = ((end - start) / n as u64).max(1);
    (0..n as u64).map(|i| start + i * step).collect()
}

/// A sample of this process with the given stacks (leaf first).
pub fn sample(kernel_stack: Vec<u64>, user_stack: Vec<u64>) -> RawSample {
    let pid = std::process::id();
    RawSample {
        timestamp_ns: 0,
        pid,
        tid: pid,
        cpu: 0,
        process_comm: "bench".into(),
        thread_comm: "bench".into(),
        kernel_thread: false,
        kernel_stack,
        user_stack,
        user_status: UnwindStatus::Complete,
        python: Vec::new(),
        python_walked: false,
        stack_copy: None,
        wait: None,
    }
}
