//! The JIT perf map of a process (`/tmp/perf-PID.map`, written by runtimes
//! that generate code: node `--perf-basic-prof`, CPython `-X perf`, JVM
//! agents), opened while the process lives so that its frames can be named
//! after it exited, and after its mount namespace (a container's private
//! `/tmp`) is gone: the open file keeps it readable.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::maps::MapsEntry;

/// An open perf map and a path that reads it from the profiler
/// (`/proc/self/fd/N`, valid while this value lives).
#[derive(Debug)]
pub struct PerfMapFile {
    /// Where the process sees its map, as opened
    /// (`/proc/PID/root/tmp/perf-NSPID.map`).
    pub path: PathBuf,
    /// `/proc/self/fd/N` of [`Self::file`].
    pub open_path: PathBuf,
    /// The open map.
    pub file: File,
}

impl PerfMapFile {
    /// Opens process `pid`'s perf map; `None` when it has none (or is gone).
    pub fn open(pid: u32) -> Option<PerfMapFile> {
        let path = perf_map_path(pid)?;
        let file = File::open(&path).ok()?;
        let open_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Some(PerfMapFile {
            path,
            open_path,
            file,
        })
    }
}

/// Whether a process with these maps may have a perf map: it has
/// executable memory no file backs (JIT code), other than the kernel's
/// `[vdso]`/`[vsyscall]`.
pub fn may_have_perf_map(entries: &[MapsEntry]) -> bool {
    entries
        .iter()
        .any(|e| e.executable && !e.is_file_backed() && !e.path.starts_with("[v"))
}

/// The path of process `pid`'s perf map as it sees it:
/// `/proc/PID/root/tmp/perf-NSPID.map`, NSPID its pid in its own PID
/// namespace. `None` when the process is gone.
pub fn perf_map_path(pid: u32) -> Option<PathBuf> {
    let ns_pid = namespace_pid(pid)?;
    let path = format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map");
    Some(Path::new(&path).to_path_buf())
}

/// Process `pid`'s id in its own (innermost) PID namespace: the last field
/// of `NSpid` in `/proc/PID/status` (`pid` itself on kernels before 4.1,
/// which have no `NSpid`). `None` when the process is gone.
pub fn namespace_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse_ns_pid(&status).unwrap_or(pid))
}

fn parse_ns_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_pid_is_the_innermost_nspid() {
        let status = "Name:\tnode\nTgid:\t27137\nNSpid:\t27137\t1\nPPid:\t1\n";
        assert_eq!(parse_ns_pid(status), Some(1));
        assert_eq!(parse_ns_pid("Name:\tx\n"), None);
        let me = std::process::id();
        assert_eq!(namespace_pid(me), Some(me));
        assert_eq!(
            perf_map_path(me),
            Some(PathBuf::from(format!("/proc/{me}/root/tmp/perf-{me}.map")))
        );
    }
}
