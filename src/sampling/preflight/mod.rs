//! Checks that the run can succeed, done before anything is loaded, so that
//! each problem gets its own clear error: a frequency out of range, a pid that
//! does not exist, an unwritable output path, a kernel without BTF, missing
//! privileges, a kernel too old for the BPF program (a missing helper, map or
//! program type, found by loading a probe program, not by version number).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::{MapType, ProgramType};

mod verifier_probe;
pub use verifier_probe::perf_event_allows_unpreallocated_hash;

/// Where the kernel exports its own BTF (needed for CO-RE relocations).
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";
/// The kernel's highest allowed perf sampling frequency, Hz.
pub const MAX_SAMPLE_RATE_SYSCTL: &str = "/proc/sys/kernel/perf_event_max_sample_rate";

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// `kernel.perf_event_max_sample_rate`, Hz.
pub fn max_sample_rate() -> Result<u64> {
    let text = fs::read_to_string(MAX_SAMPLE_RATE_SYSCTL)
        .with_context(|| format!("reading {MAX_SAMPLE_RATE_SYSCTL}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("parsing {MAX_SAMPLE_RATE_SYSCTL}: {text:?}"))
}

/// Error unless `freq_hz` is within 1 ..= `max_hz`.
pub fn check_frequency(freq_hz: u64, max_hz: u64) -> Result<()> {
    if freq_hz == 0 || freq_hz > max_hz {
        bail!(
            "sample frequency {freq_hz} Hz is out of range: it must be between 1 and {max_hz} Hz \
             (kernel.perf_event_max_sample_rate)"
        );
    }
    Ok(())
}

/// The processes (thread group ids) to sample for `--pids`: each pid as
/// given, or the process a thread id belongs to (`Tgid:` in
/// `/proc/PID/status`), without duplicates. Errors for the first pid with
/// no `/proc/PID` (no such process or thread).
pub fn resolve_pids(pids: &[u32]) -> Result<Vec<u32>> {
    let mut resolved: Vec<u32> = Vec::new();
    for &pid in pids {
        let status = (pid > 0)
            .then(|| fs::read_to_string(format!("/proc/{pid}/status")).ok())
            .flatten();
        let Some(status) = status else {
            bail!("process {pid} does not exist (no /proc/{pid})");
        };
        let tgid = status
            .lines()
            .find_map(|l| l.strip_prefix("Tgid:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(pid);
        if !resolved.contains(&tgid) {
            resolved.push(tgid);
        }
    }
    Ok(resolved)
}

/// Longest time any seconds option accepts (about 31.7 years): far beyond
/// any real run, and small enough for every clock computation.
pub const MAX_SECONDS: f64 = 1e9;

/// Shortest `--profile-interval`, seconds.
pub const MIN_PROFILE_INTERVAL_S: f64 = 0.1;

/// Seconds from the command line (`--duration`, `--profile-interval`,
/// timeouts) as a duration. Errors, naming `flag`, unless `value` is above 0
/// and at most [`MAX_SECONDS`].
pub fn seconds(flag: &str, value: f64) -> Result<Duration> {
    check_seconds(value).map_err(|err| anyhow::anyhow!("{flag} {err}"))?;
    Ok(Duration::from_secs_f64(value))
}

/// The range every seconds option shares: above 0, finite, at most
/// [`MAX_SECONDS`]. The error text ("must be ...") reads after the option's
/// name.
pub fn check_seconds(value: f64) -> std::result::Result<(), String> {
    if !value.is_finite() || value <= 0.0 || value > MAX_SECONDS {
        return Err(format!(
            "must be a number of seconds above 0 and at most {MAX_SECONDS}, got {value}"
        ));
    }
    Ok(())
}

/// A count or size limit from the command line (`--max-profiles`, the
/// servers' and the sender's limits): at least 1. Errors name `flag`, with
/// the words [`crate::commands::cli::values::parse_count`] gives clap.
pub fn count(flag: &str, value: u64) -> Result<()> {
    check_count(value).map_err(|err| anyhow::anyhow!("{flag} {err}"))
}

/// The range every count or size limit shares: at least 1. The error text
/// ("must be ...") reads after the option's name.
pub fn check_count(value: u64) -> std::result::Result<(), String> {
    if value == 0 {
        return Err("must be at least 1".to_string());
    }
    Ok(())
}

/// `--profile-interval`'s range: [`check_seconds`], and at least
/// [`MIN_PROFILE_INTERVAL_S`] (a window shorter than that costs more to
/// write than it holds). The error text reads after the option's name.
pub fn check_interval(value: f64) -> std::result::Result<(), String> {
    check_seconds(value)?;
    if value < MIN_PROFILE_INTERVAL_S {
        return Err(format!(
            "must be at least {MIN_PROFILE_INTERVAL_S} seconds, got {value}"
        ));
    }
    Ok(())
}

/// Make sure `file` can be written in its directory, creating that
/// directory for the check if needed. That directory is `dir`
/// (`--profile-path`), one below it (`--profile-name sub/x.svg`), or
/// elsewhere for an absolute name, which leaves `dir` alone. Nothing is
/// left behind: neither `file` if it did not exist before, nor the
/// directories made for the check (the profile's writer makes them again,
/// so that a run that writes nothing leaves no empty directory).
pub fn check_output(dir: &Path, file: &Path) -> Result<()> {
    let profile_path = dir;
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(dir);
    if dir.exists() && !dir.is_dir() {
        // Name the option that put a file where a directory must be.
        let culprit = if dir == profile_path {
            "--profile-path names a directory; --profile-name the file in it"
        } else {
            "--profile-name's directory part names it"
        };
        bail!(
            "output directory {} is not a directory ({culprit})",
            dir.display()
        );
    }
    if crate::util::files::is_stdout(file) {
        crate::util::files::check_stdout_open()?;
    }
    let made = MadeDirs::create(dir)?;
    let checked = check_output_in(dir, file);
    drop(made);
    checked
}

/// The directories [`MadeDirs::create`] made, removed again (if still
/// empty) on drop, deepest first.
struct MadeDirs(Vec<PathBuf>);

impl MadeDirs {
    /// Create `dir` and its missing parents, remembering which were made.
    fn create(dir: &Path) -> Result<Self> {
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .filter(|d| !d.as_os_str().is_empty())
            .take_while(|d| fs::symlink_metadata(d).is_err())
            .map(Path::to_path_buf)
            .collect();
        fs::create_dir_all(dir)
            .with_context(|| format!("cannot create output directory {}", dir.display()))?;
        Ok(MadeDirs(missing))
    }
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        for made in &self.0 {
            // Only an empty directory goes: one something else filled
            // meanwhile stays.
            let _ = fs::remove_dir(made);
        }
    }
}

/// [`check_output`] once `file`'s directory `dir` exists.
fn check_output_in(dir: &Path, file: &Path) -> Result<()> {
    if file.is_dir() {
        bail!("output path {} is a directory", file.display());
    }
    if crate::util::files::writes_through(file) {
        // A device, FIFO or symlink is written into at the end; opening a
        // FIFO now would hand its reader an end of file.
        return check_access(file);
    }
    let existed = file.exists();
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .with_context(|| format!("output file {} is not writable", file.display()))?;
    if !existed {
        let _ = fs::remove_file(file);
    }
    // The profile goes to a temporary file in `dir` renamed over `file`:
    // where files cannot be made (/proc, a read-only mount), say so now
    // rather than after the run.
    tempfile::Builder::new()
        .prefix(crate::util::files::TMP_PREFIX)
        .tempfile_in(dir)
        .with_context(|| {
            format!(
                "output file {}: cannot create files in {}",
                file.display(),
                dir.display()
            )
        })?;
    Ok(())
}

/// Error unless this process may write to what `file` leads to (access(2),
/// `W_OK`; a symlink to nothing yet is left to the write).
fn check_access(file: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    if fs::metadata(file).is_err() {
        return Ok(());
    }
    let c_path = std::ffi::CString::new(file.as_os_str().as_bytes())
        .with_context(|| format!("output path {} holds a NUL byte", file.display()))?;
    // SAFETY: a valid NUL-terminated path; access(2) only reads it.
    if unsafe { libc::access(c_path.as_ptr(), libc::W_OK) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("output file {} is not writable", file.display()));
    }
    Ok(())
}

/// Error if the kernel does not export BTF at [`KERNEL_BTF`].
pub fn check_btf() -> Result<()> {
    if !Path::new(KERNEL_BTF).exists() {
        bail!(
            "the kernel has no BTF ({KERNEL_BTF} is missing): lightswitch needs a kernel built with \
             CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    Ok(())
}

/// The effective capability set of this process (`CapEff` in `/proc/self/status`).
fn effective_capabilities() -> Result<u64> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .context("no CapEff line in /proc/self/status")?;
    u64::from_str_radix(hex.trim(), 16).context("parsing CapEff")
}

/// Names of the capabilities missing from `caps` for loading BPF programs
/// and opening system-wide perf events. CAP_SYS_ADMIN stands in for both.
pub fn missing_capabilities(caps: u64) -> Vec<&'static str> {
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_SYS_ADMIN) {
        return Vec::new();
    }
    let mut missing = Vec::new();
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    missing
}

/// Error naming each missing capability.
pub fn check_privileges() -> Result<()> {
    let missing = missing_capabilities(effective_capabilities()?);
    if !missing.is_empty() {
        let missing = missing.join(" and ");
        bail!("missing privileges: {missing} (run as root, or grant {missing}, or CAP_SYS_ADMIN)");
    }
    Ok(())
}

/// The oldest kernel the BPF program has been loaded and tested on
/// (docs/kernels.md).
pub const TESTED_MINIMUM_KERNEL: &str = "5.10";

/// How a kernel feature the BPF program needs is probed.
#[derive(Debug, Clone, Copy)]
pub enum Probe {
    /// A helper (`enum bpf_func_id` in the kernel's uapi `linux/bpf.h`)
    /// callable from a program of this type.
    Helper(ProgramType, libbpf_sys::bpf_func_id),
    /// A map type the kernel can create.
    Map(MapType),
    /// A small program the verifier must accept (`verifier_probe`).
    Verifier(fn() -> Result<bool>),
}

/// A kernel feature the BPF program uses: its name as a user would search
/// for it, the Linux release that added it, and how to probe for it.
#[derive(Debug, Clone, Copy)]
pub struct KernelFeature {
    /// E.g. "the bpf_loop BPF helper".
    pub name: &'static str,
    /// The mainline release that added it, e.g. "5.17".
    pub since: &'static str,
    /// How its presence is tested.
    pub probe: Probe,
}

/// What every variant of `src/sampling/bpf/profiler.bpf.c` needs beyond a kernel
/// with BTF, newest first (the first missing one names the minimum). Its
/// `tp_btf` programs (Linux 5.5) are older than all of these and are not
/// probed: libbpf's program-type probe cannot load a tracing program
/// without an attach target.
pub const KERNEL_FEATURES: &[KernelFeature] = &[
    KernelFeature {
        name: "tail calls from BPF programs with BPF-to-BPF calls",
        since: "5.10",
        probe: Probe::Verifier(verifier_probe::tail_calls_with_subprograms),
    },
    KernelFeature {
        name: "BPF ring buffers (BPF_MAP_TYPE_RINGBUF)",
        since: "5.8",
        probe: Probe::Map(MapType::RingBuf),
    },
];

/// What the `bpf_loop` variant of the programs needs beyond
/// [`KERNEL_FEATURES`]; a kernel without any of them gets the compat
/// variant ([`crate::sampling::sampler::variant`]).
pub const BPF_LOOP_VARIANT_FEATURES: &[KernelFeature] = &[
    KernelFeature {
        name: "the bpf_loop BPF helper",
        since: "5.17",
        probe: Probe::Helper(ProgramType::PerfEvent, libbpf_sys::BPF_FUNC_loop),
    },
    KernelFeature {
        name: "the bpf_find_vma BPF helper",
        since: "5.17",
        probe: Probe::Helper(ProgramType::PerfEvent, libbpf_sys::BPF_FUNC_find_vma),
    },
    KernelFeature {
        name: "the bpf_task_pt_regs BPF helper",
        since: "5.15",
        probe: Probe::Helper(ProgramType::PerfEvent, libbpf_sys::BPF_FUNC_task_pt_regs),
    },
    KernelFeature {
        name: "the bpf_get_current_task_btf BPF helper",
        since: "5.11",
        probe: Probe::Helper(
            ProgramType::PerfEvent,
            libbpf_sys::BPF_FUNC_get_current_task_btf,
        ),
    },
];

/// Whether this kernel has `feature`, by loading a minimal probe program or
/// creating a minimal map (libbpf's `libbpf_probe_bpf_helper` and
/// `libbpf_probe_bpf_map_type`, or `verifier_probe`'s programs; needs
/// CAP_BPF).
pub fn has_kernel_feature(feature: &KernelFeature) -> Result<bool> {
    let supported = match feature.probe {
        Probe::Helper(prog, helper) => prog
            .is_helper_supported(helper)
            .map_err(anyhow::Error::from),
        Probe::Map(map) => map.is_supported().map_err(anyhow::Error::from),
        Probe::Verifier(probe) => probe(),
    };
    supported.with_context(|| format!("probing the kernel for {}", feature.name))
}

/// This kernel's release (`/proc/sys/kernel/osrelease`, as `uname -r`).
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Error naming, in one line, the features of `features` this kernel lacks
/// and the release that added the newest of them. Run after
/// [`check_privileges`]: the probes load programs.
pub fn check_kernel_features(features: &[KernelFeature]) -> Result<()> {
    let mut missing = Vec::new();
    for feature in features {
        if !has_kernel_feature(feature)? {
            missing.push(feature);
        }
    }
    let Some(newest) = missing.first() else {
        return Ok(());
    };
    let names: Vec<String> = missing
        .iter()
        .map(|f| format!("{} (Linux {})", f.name, f.since))
        .collect();
    bail!(
        "kernel {} is too old: it lacks {}; lightswitch needs Linux {} or newer (tested on {} and newer)",
        kernel_release(),
        names.join(", "),
        newest.since,
        TESTED_MINIMUM_KERNEL
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequency_bounds() {
        assert!(check_frequency(1, 100).is_ok());
        assert!(check_frequency(100, 100).is_ok());
        let err = check_frequency(101, 100).unwrap_err().to_string();
        assert!(err.contains("between 1 and 100"), "{err}");
        assert!(check_frequency(0, 100).is_err());
    }

    #[test]
    fn pids_resolve_threads_to_their_process() {
        let me = std::process::id();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tid_tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().ok();
        });
        let tid = tid_rx.recv().unwrap();
        assert_ne!(tid as u32, me);
        assert_eq!(resolve_pids(&[me, tid as u32]).unwrap(), vec![me]);
        done_tx.send(()).unwrap();
        thread.join().unwrap();
        assert!(resolve_pids(&[0]).is_err());
        assert!(resolve_pids(&[i32::MAX as u32]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(
            seconds("--duration", 0.5).unwrap(),
            Duration::from_millis(500)
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e20] {
            assert!(seconds("--duration", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn capability_names() {
        assert_eq!(missing_capabilities(0), vec!["CAP_BPF", "CAP_PERFMON"]);
        assert_eq!(missing_capabilities(1 << CAP_BPF), vec!["CAP_PERFMON"]);
        assert!(missing_capabilities((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_empty());
        assert!(missing_capabilities(1 << CAP_SYS_ADMIN).is_empty());
    }

    #[test]
    fn output_check_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        let file = sub.join("out.svg");
        check_output(&sub, &file).unwrap();
        // The directories made for the check go again: a run that writes
        // nothing leaves no empty --profile-path behind.
        assert!(!dir.path().join("a").exists());
        assert!(!file.exists());
        // One that was there stays.
        fs::create_dir(dir.path().join("a")).unwrap();
        check_output(&sub, &file).unwrap();
        assert!(dir.path().join("a").is_dir() && !sub.exists());
        assert!(check_output(dir.path(), dir.path()).is_err());
        let not_dir = dir.path().join("plain");
        fs::write(&not_dir, b"").unwrap();
        let err = format!(
            "{:#}",
            check_output(&not_dir, &not_dir.join("x")).unwrap_err()
        );
        assert!(err.contains("is not a directory"), "{err}");
        assert!(err.contains("--profile-path names a directory"), "{err}");
        // A file where --profile-name's directory part should be is blamed
        // on --profile-name.
        let err = format!(
            "{:#}",
            check_output(dir.path(), &not_dir.join("x.svg")).unwrap_err()
        );
        assert!(err.contains("--profile-name's directory part"), "{err}");
        // A name with directories gets them; an absolute one leaves the
        // profile path alone.
        let unused = dir.path().join("unused");
        check_output(&unused, &dir.path().join("c/d/x.svg")).unwrap();
        assert!(!dir.path().join("c").exists() && !unused.exists());
        // A directory that cannot be made is named.
        let err = format!(
            "{:#}",
            check_output(&not_dir.join("sub"), &not_dir.join("sub/x")).unwrap_err()
        );
        assert!(err.contains("cannot create output directory"), "{err}");
        // Where no file can be made, the check says so before any sampling.
        let err = format!(
            "{:#}",
            check_output(Path::new("."), Path::new("/proc/version")).unwrap_err()
        );
        assert!(err.contains("cannot create files in /proc"), "{err}");
    }

    /// A FIFO is checked without being opened: opening it would block with
    /// no reader, and hand a waiting reader an end of file.
    #[test]
    fn output_check_does_not_open_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        check_output(dir.path(), &fifo).unwrap();
    }

    #[test]
    fn this_kernel_has_every_feature_the_program_needs() {
        check_kernel_features(KERNEL_FEATURES).unwrap();
        check_kernel_features(BPF_LOOP_VARIANT_FEATURES).unwrap();
    }

    /// The error path against the real kernel: a helper id past the end of
    /// `enum bpf_func_id` is one no kernel has.
    #[test]
    fn a_missing_feature_is_named_in_one_line() {
        let absent = KernelFeature {
            name: "the bpf_from_the_future BPF helper",
            since: "99.1",
            probe: Probe::Helper(ProgramType::PerfEvent, 100_000),
        };
        let features = [absent, KERNEL_FEATURES[0]];
        let err = check_kernel_features(&features).unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(
            err.contains("lacks the bpf_from_the_future BPF helper (Linux 99.1);"),
            "{err}"
        );
        assert!(err.contains("needs Linux 99.1 or newer"), "{err}");
        assert!(!err.contains("tail calls"), "{err}");
    }
}
