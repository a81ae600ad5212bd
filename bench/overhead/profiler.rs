//! The profilers under test: `lightswitch` and `perf record` (frame-pointer
//! and DWARF call graphs), started on the whole machine, stopped with
//! SIGINT like a user would, and their own reports parsed.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};

use anyhow::{bail, Context, Result};

/// Which profiler, and how it records stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// lightswitch (BPF sampling, DWARF unwinding in BPF).
    Lightswitch,
    /// `perf record -a -g`: frame-pointer call graphs.
    PerfFp,
    /// `perf record -a --call-graph dwarf`: copies 8 KiB of user stack per
    /// sample, unwound when the file is read.
    PerfDwarf,
}

impl Kind {
    /// Name in the report tables.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Lightswitch => "lightswitch",
            Kind::PerfFp => "perf -g",
            Kind::PerfDwarf => "perf dwarf",
        }
    }
}

/// Paths and settings shared by every run.
pub struct Tools {
    /// The lightswitch binary.
    pub lightswitch: PathBuf,
    /// The perf binary, when installed.
    pub perf: Option<PathBuf>,
    /// Scratch directory for profiles and perf.data files.
    pub scratch: PathBuf,
    /// Unwind-table cache shared by the lightswitch runs of one harness run.
    pub unwind_cache: PathBuf,
}

/// A profiler that is running.
pub struct Running {
    kind: Kind,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    perf_data: Option<PathBuf>,
    reaped: bool,
}

/// What a profiler reported after it stopped.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// Samples in its output.
    pub samples: u64,
    /// Samples lost: lightswitch's count; perf's `LOST_SAMPLES` of its event
    /// (samples the kernel could not write to perf's buffers).
    pub lost: u64,
    /// perf only: samples per second over the recording (samples / time from
    /// the first to the last sample).
    pub sample_rate: Option<f64>,
    /// lightswitch only: user-stack results (`complete`, `no_table`, ...).
    pub unwind: BTreeMap<String, u64>,
    /// Peak resident set size over the whole process lifetime, KiB (`wait4` ru_maxrss).
    pub max_rss_kib: u64,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// Everything it wrote to stdout (lightswitch: its summary).
    pub stdout: String,
}

fn capture(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = r.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Start `kind` sampling every CPU at `freq` Hz; `extra` are more
/// lightswitch arguments (ignored for perf). Output goes under `tools.scratch/name`.
pub fn start(
    tools: &Tools,
    kind: Kind,
    freq: u64,
    name: &str,
    extra: &[String],
) -> Result<Running> {
    let out = tools.scratch.join(name);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let freq = freq.to_string();
    let (mut command, perf_data) = match kind {
        Kind::Lightswitch => {
            let mut c = Command::new(&tools.lightswitch);
            c.args(["--sample-freq", &freq, "--profile-path"])
                .arg(&out)
                .arg("--unwind-cache-dir")
                .arg(&tools.unwind_cache)
                .args(extra);
            (c, None)
        }
        Kind::PerfFp | Kind::PerfDwarf => {
            let perf = tools
                .perf
                .as_ref()
                .context("perf is not installed (bash scripts/setup.sh installs linux-perf)")?;
            let data = out.join("perf.data");
            let mut c = Command::new(perf);
            c.args(["record", "-a", "-F", &freq, "-o"]).arg(&data);
            match kind {
                Kind::PerfFp => c.arg("-g"),
                _ => c.args(["--call-graph", "dwarf"]),
            };
            (c, Some(data))
        }
    };
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", kind.label()))?;
    let stdout = child.stdout.take().map(capture);
    let stderr = child.stderr.take().map(capture);
    Ok(Running {
        kind,
        child,
        stdout,
        stderr,
        perf_data,
        reaped: false,
    })
}

impl Running {
    /// Process id of the profiler.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (a profiler that failed to start exits early).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            self.reaped = true;
            let err = self.stderr.take().map(|h| h.join().unwrap_or_default());
            bail!(
                "{} exited early ({status}): {}",
                self.kind.label(),
                err.unwrap_or_default().trim()
            );
        }
        Ok(())
    }

    /// Stop it with SIGINT, wait for it to write its output, and read its report.
    pub fn stop(self, perf: Option<&Path>) -> Result<Finished> {
        self.interrupt();
        self.wait(perf)
    }

    /// Send it SIGINT (a user's Ctrl-C: it stops and writes its output).
    pub fn interrupt(&self) {
        // SAFETY: kill has no memory-safety preconditions; the child is not
        // reaped yet, so the pid is still its own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
    }

    /// Whether it has not exited yet (it is left to [`Self::wait`] to reap).
    pub fn alive(&self) -> bool {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer; WNOWAIT leaves the child
        // unreaped, so wait4 below still gets its status and usage.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                self.child.id(),
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is set by waitid (0 while the child runs).
        r == 0 && unsafe { info.si_pid() } == 0
    }

    /// Wait for it to exit (after [`Self::interrupt`]) and read its report.
    pub fn wait(mut self, perf: Option<&Path>) -> Result<Finished> {
        let pid = self.child.id() as i32;
        // SAFETY: wait4 has no memory-safety preconditions; `usage` and
        // `status` are valid out-pointers. The child is not reaped yet.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let mut status = 0;
        if unsafe { libc::wait4(pid, &mut status, 0, &mut usage) } != pid {
            bail!(
                "waiting for {}: {}",
                self.kind.label(),
                std::io::Error::last_os_error()
            );
        }
        self.reaped = true;
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let exited_ok = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        // perf record exits with SIGINT's status after a clean stop.
        let perf_ok = self.kind != Kind::Lightswitch
            && libc::WIFEXITED(status)
            && matches!(libc::WEXITSTATUS(status), 0 | 130)
            || libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT;
        if !exited_ok && !perf_ok {
            bail!(
                "{} failed (wait status {status:#x}): {}",
                self.kind.label(),
                stderr.trim()
            );
        }
        let mut finished = match &self.perf_data {
            None => parse_lightswitch(&stdout)
                .with_context(|| format!("no summary in lightswitch's output: {stdout}{stderr}"))?,
            Some(data) => perf_stats(perf.context("perf is not installed")?, data)?,
        };
        finished.max_rss_kib = usage.ru_maxrss.max(0) as u64;
        finished.stderr = stderr;
        finished.stdout = stdout;
        if let Some(data) = &self.perf_data {
            // perf.data files of DWARF runs are large; only the counts are kept.
            let _ = std::fs::remove_file(data);
        }
        Ok(finished)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The first `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.is_file())
}

/// Parse lightswitch's summary: `... N samples, P processes, L samples lost`
/// (singular nouns for 1: `1 sample, 1 process, 1 sample lost`)
/// (single profile or continuous mode) and `user stacks: complete=... no_table=...`.
pub fn parse_lightswitch(stdout: &str) -> Option<Finished> {
    let counts = stdout
        .lines()
        .find(|l| l.ends_with(" samples lost") || l.ends_with(" sample lost"))?
        .rsplit_once(": ")?
        .1;
    let numbers: Vec<u64> = counts
        .split(", ")
        .filter_map(|part| part.split_once(' ')?.0.parse().ok())
        .collect();
    let [samples, _processes, lost] = numbers[..] else {
        return None;
    };
    let unwind = stdout
        .lines()
        .find_map(|l| l.strip_prefix("user stacks:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Finished {
        samples,
        lost,
        unwind,
        ..Default::default()
    })
}

/// The first count of `what` (`SAMPLE events:`) in `perf report --stats` output.
fn stat_count(text: &str, what: &str) -> u64 {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(what))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Samples lost, from the per-event section of `perf report --stats` (after
/// `cpu-clock... stats:`), where `LOST_SAMPLES events:` sums the lost counts of
/// the records; the `Aggregated stats:` section above counts records instead.
fn lost_samples(stats: &str) -> u64 {
    let section = stats
        .lines()
        .position(|l| l.trim_end().ends_with(" stats:") && !l.trim().starts_with("Aggregated"))
        .map(|i| stats.lines().skip(i + 1).collect::<Vec<_>>().join("\n"));
    section.map_or(0, |s| stat_count(&s, "LOST_SAMPLES events:"))
}

/// Samples, lost samples and the sample rate of a perf.data file, from
/// `perf report --stats` (counts only, no unwinding) and the header's
/// first/last sample times.
fn perf_stats(perf: &Path, data: &Path) -> Result<Finished> {
    let run = |args: &[&str]| -> Result<String> {
        let out = Command::new(perf)
            .args(args)
            .arg("-i")
            .arg(data)
            .output()
            .with_context(|| format!("running perf {}", args.join(" ")))?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    let stats = run(&["report", "--stats"])?;
    let header = run(&["report", "--header-only"])?;
    let time = |what: &str| -> Option<f64> {
        header
            .lines()
            .find_map(|l| l.strip_prefix(what))
            .and_then(|v| v.trim().trim_start_matches(':').trim().parse().ok())
    };
    let samples = stat_count(&stats, "SAMPLE events:");
    let span = time("# time of last sample")
        .zip(time("# time of first sample"))
        .map(|(l, f)| l - f);
    Ok(Finished {
        samples,
        lost: lost_samples(&stats),
        sample_rate: span.filter(|s| *s > 0.0).map(|s| samples as f64 / s),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lightswitch_summary_parses() {
        let out = "profile written to ./f.svg: 9873 samples, 41 processes, 3 samples lost\n\
                   user stacks: complete=9650 no_table=61\n";
        let f = parse_lightswitch(out).unwrap();
        assert_eq!((f.samples, f.lost), (9873, 3));
        assert_eq!(f.unwind["complete"], 9650);
        let cont = "2 windows written to /tmp/x: 10 samples, 1 process, 0 samples lost\n";
        assert_eq!(parse_lightswitch(cont).unwrap().samples, 10);
        let one = "1 window written to /tmp/x: 1 sample, 1 process, 1 sample lost\n";
        let f = parse_lightswitch(one).unwrap();
        assert_eq!((f.samples, f.lost), (1, 1));
    }

    #[test]
    fn perf_lost_samples_come_from_the_event_section() {
        let stats = "Aggregated stats:\n            LOST events:        207  ( 0.4%)\n\
                     \x20         SAMPLE events:      51301  (92.0%)\n\
                     \x20   LOST_SAMPLES events:          2  ( 0.0%)\n\
                     cpu-clock:pppH stats:\n          SAMPLE events:      51301\n\
                     \x20   LOST_SAMPLES events:       8623\n";
        assert_eq!(stat_count(stats, "SAMPLE events:"), 51301);
        assert_eq!(lost_samples(stats), 8623);
        assert_eq!(lost_samples("Aggregated stats:\n  SAMPLE events: 5\n"), 0);
    }
}
