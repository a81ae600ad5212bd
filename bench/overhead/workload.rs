//! The CPU-bound workload (`workload.c`): one process per CPU, each counting
//! blocks of work done at a hot loop 30 frames deep. The harness reads the
//! counters (SIGUSR1 makes each process print its count) at the start and
//! the end of a measurement window.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Running copies of the workload.
pub struct Workloads {
    children: Vec<Child>,
    counts: Vec<Receiver<u64>>,
}

impl Workloads {
    /// Start `copies` processes of `binary`, running until stopped.
    pub fn start(binary: &Path, copies: usize) -> Result<Self> {
        let mut workloads = Workloads {
            children: Vec::new(),
            counts: Vec::new(),
        };
        for _ in 0..copies {
            let mut child = Command::new(binary)
                .stdout(Stdio::piped())
                .stdin(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            let stdout = child.stdout.take().context("workload stdout")?;
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(n) = line.trim().parse() {
                        if tx.send(n).is_err() {
                            break;
                        }
                    }
                }
            });
            workloads.children.push(child);
            workloads.counts.push(rx);
        }
        Ok(workloads)
    }

    /// Process ids of the copies.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// The blocks of work each copy has done so far, and when they were asked.
    pub fn counts(&mut self) -> Result<(Instant, Vec<u64>)> {
        // Drop counts a previous request left unread.
        for rx in &self.counts {
            while rx.try_recv().is_ok() {}
        }
        let asked = Instant::now();
        for child in &self.children {
            // SAFETY: kill has no memory-safety preconditions; the child is not reaped yet.
            if unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) } != 0 {
                bail!("workload {} is gone", child.id());
            }
        }
        let deadline = asked + Duration::from_secs(5);
        self.counts
            .iter()
            .map(|rx| {
                rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                    .context("a workload did not report its count within 5 s")
            })
            .collect::<Result<Vec<u64>>>()
            .map(|c| (asked, c))
    }
}

impl Drop for Workloads {
    fn drop(&mut self) {
        for child in &mut self.children {
            // SAFETY: as in `counts`.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
    }
}

/// Blocks of work per second over a window, summed over the copies.
pub fn throughput(start: &(Instant, Vec<u64>), end: &(Instant, Vec<u64>)) -> f64 {
    let blocks: u64 = start
        .1
        .iter()
        .zip(&end.1)
        .map(|(a, b)| b.saturating_sub(*a))
        .sum();
    blocks as f64 / end.0.duration_since(start.0).as_secs_f64().max(1e-9)
}
