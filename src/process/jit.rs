//! The files in which runtimes that generate code name it, opened while the
//! process lives so that its frames can be named after it exited, and after
//! its mount namespace (a container's private `/tmp`) is gone: the open
//! file keeps it readable.
//! - The perf map, `/tmp/perf-PID.map` (node `--perf-basic-prof`, CPython
//!   `-X perf`, JVM agents), found by name.
//! - The jitdump file, `jit-PID.dump` (node `--perf-prof`, JVM and LLVM
//!   agents), found through the process's executable mapping of it (the
//!   marker perf's jitdump convention has writers leave), in any directory.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::maps::MapsEntry;

/// An open JIT symbol file (perf map or jitdump) and a path that reads it
/// from the profiler (`/proc/self/fd/N`, valid while this value lives).
#[derive(Debug)]
pub struct JitFile {
    /// The file as opened (`/proc/PID/root/tmp/perf-NSPID.map`,
    /// `/proc/PID/root/DIR/jit-NSPID.dump`).
    pub path: PathBuf,
    /// `/proc/self/fd/N` of [`Self::file`].
    pub open_path: PathBuf,
    /// The open map.
    pub file: File,
}

impl JitFile {
    /// Opens process `pid`'s perf map; `None` when it has none (or is gone).
    pub fn perf_map(pid: u32) -> Option<JitFile> {
        Self::open(perf_map_path(pid)?)
    }

    /// Opens the jitdump file process `pid` (with maps `entries`) mapped;
    /// `None` when it mapped none.
    pub fn jitdump(pid: u32, entries: &[MapsEntry]) -> Option<JitFile> {
        let entry = entries
            .iter()
            .find(|e| e.executable && e.is_file_backed() && is_jitdump_name(&e.path))?;
        Self::open(PathBuf::from(format!("/proc/{pid}/root{}", entry.path)))
    }

    fn open(path: PathBuf) -> Option<JitFile> {
        let file = File::open(&path).ok()?;
        let open_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Some(JitFile {
            path,
            open_path,
            file,
        })
    }
}

/// Whether `path` names a jitdump file: `jit-N.dump`.
fn is_jitdump_name(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("jit-")?.strip_suffix(".dump"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a process with these maps may have a JIT symbol file: it has
/// executable memory no file backs (JIT code), other than the kernel's
/// `[vdso]`/`[vsyscall]`.
pub fn has_anonymous_code(entries: &[MapsEntry]) -> bool {
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
        assert!(is_jitdump_name("/home/u/jit-1234.dump"));
        assert!(!is_jitdump_name("/home/u/jit-.dump"));
        assert!(!is_jitdump_name("/home/u/jit-12a.dump"));
        assert_eq!(
            perf_map_path(me),
            Some(PathBuf::from(format!("/proc/{me}/root/tmp/perf-{me}.map")))
        );
    }
}
