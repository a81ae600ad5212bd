//! What a run reports when it ends: [`RunSummary`] and the lines it prints,
//! and the [`Totals`] a continuous run counts for it.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::output::sender::worker::WorkerReport;
use crate::profile::window::ClosedWindow;
use crate::sampling::records::UnwindStatus;
use crate::sampling::sampler::off_cpu::OffCpuCounts;
use crate::symbolize::debuginfod::DebuginfodStats;
use crate::unwind::deferred::DeferredStats;
use crate::util::text::plural;

/// Counts over all windows of a continuous run (each window's aggregator
/// leaves the loop with it).
#[derive(Debug, Default)]
pub struct Totals {
    /// Windows closed.
    pub windows: u64,
    /// Distinct processes with on-CPU samples (not those that only waited).
    pub pids: HashSet<u32>,
    /// Samples per unwind result.
    pub status: HashMap<UnwindStatus, u64>,
}

impl Totals {
    /// Count `closed` in.
    pub fn account(&mut self, closed: &ClosedWindow) {
        self.windows += 1;
        let sampled = closed.aggregator.stacks().filter(|(_, count)| *count > 0);
        self.pids.extend(sampled.map(|(key, _)| key.pid));
        for (status, n) in closed.aggregator.status_counts() {
            *self.status.entry(*status).or_default() += n;
        }
    }
}

/// What a run produced, for the summary line.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Where the profile was written (one file per format).
    pub outputs: Vec<std::path::PathBuf>,
    /// Samples in the profile.
    pub samples: u64,
    /// Distinct processes with on-CPU samples.
    pub processes: usize,
    /// Samples lost (a ring buffer full, or records that did not parse).
    pub lost: u64,
    /// Samples per unwind result (`complete`, `truncated`, ...).
    pub unwind: BTreeMap<String, u64>,
    /// Walks stopped by an unsupported CFI rule, per rule kind.
    pub unsupported: BTreeMap<String, u64>,
    /// Walks the BPF program could not finish, finished (or not) in user
    /// space from their stack copies.
    pub deferred: DeferredStats,
    /// Continuous mode only: windows and delivery.
    pub continuous: Option<ContinuousSummary>,
    /// Listen-only mode (`--listen` alone): on-demand profiles served.
    pub served: Option<u64>,
    /// With `--off-cpu`: the waits recorded and those left out.
    pub off_cpu: Option<OffCpuCounts>,
    /// What the run's debuginfod client did; `None` without servers.
    pub debuginfod: Option<DebuginfodStats>,
}

/// What a continuous run emitted.
#[derive(Debug, Clone)]
pub struct ContinuousSummary {
    /// Windows closed over the run.
    pub windows: u64,
    /// Samples that arrived after their window had closed (counted in the next).
    pub late_samples: u64,
    /// What the window worker and the sender did.
    pub report: WorkerReport,
}

impl RunSummary {
    /// `N samples, P processes, L samples lost`, each noun in its number
    /// (`1 sample, 1 process, 0 samples lost`).
    fn counts(&self) -> String {
        format!(
            "{}, {}, {} lost",
            plural(self.samples, "sample", "samples"),
            plural(self.processes as u64, "process", "processes"),
            plural(self.lost, "sample", "samples")
        )
    }
}

impl std::fmt::Display for RunSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(served) = self.served {
            write!(
                f,
                "{} served: {} read, {} lost",
                plural(served, "on-demand profile", "on-demand profiles"),
                plural(self.samples, "sample", "samples"),
                plural(self.lost, "sample", "samples")
            )?;
        } else if let Some(c) = &self.continuous {
            // Network senders: what was delivered is on the `delivery:` line.
            let verb = if c.report.sender.delivery.is_some() {
                "queued for"
            } else {
                "written to"
            };
            let empty = c.report.sender.windows_empty;
            write!(
                f,
                "{} {verb} {}: {}",
                plural(
                    c.report.windows_sent.saturating_sub(empty),
                    "window",
                    "windows"
                ),
                c.report.sender.destination,
                self.counts()
            )?;
            if empty > 0 {
                write!(
                    f,
                    " ({} had no samples, nothing written)",
                    plural(empty, "more window", "more windows")
                )?;
            }
            write!(
                f,
                "\nwindows: closed={} handed_over={} merged={} dropped={} failed={} panicked={} \
                 late_samples={} samples_missing_mapping={}",
                c.windows,
                c.report.windows_sent,
                c.report.windows_merged,
                c.report.windows_dropped,
                c.report.windows_failed,
                c.report.windows_panicked,
                c.late_samples,
                c.report.samples_missing_mapping
            )?;
            if let Some(delivery) = &c.report.sender.delivery {
                write!(f, "\ndelivery: {delivery}")?;
                if let Some(spool) = &delivery.spool {
                    write!(f, "\nspool: {spool}")?;
                }
            }
        } else {
            write!(
                f,
                "profile written to {}: {}",
                self.outputs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.counts()
            )?;
        }
        let unwind: Vec<String> = self
            .unwind
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if unwind.is_empty() {
            write!(f, "\nuser stacks: none")?;
        } else {
            write!(f, "\nuser stacks: {}", unwind.join(" "))?;
        }
        if !self.unsupported.is_empty() {
            let kinds: Vec<String> = self
                .unsupported
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            write!(f, "\nunsupported CFI rules: {}", kinds.join(" "))?;
        }
        if let Some(off_cpu) = &self.off_cpu {
            write!(f, "\n{off_cpu}")?;
        }
        let d = &self.deferred;
        if d.held + d.no_room + d.not_sent > 0 {
            // Already counted under `user stacks:` by how they ended.
            write!(
                f,
                "\nstack copies: walked_on={} deeper_than_copy={} no_mapping={} no_rows_in_time={} not_held={} not_sent={}",
                d.finished, d.copy_ended, d.no_mapping, d.expired, d.no_room, d.not_sent
            )?;
        }
        // The run's one debuginfod client, when servers are set.
        if let Some(d) = &self.debuginfod {
            write!(
                f,
                "\ndebuginfod: fetched={} cached={} failed={} timed_out={} too_large={} skipped={} \
                 cancelled={}",
                d.fetched, d.cached, d.failed, d.timed_out, d.too_large, d.skipped, d.cancelled
            )?;
        }
        let o = crate::process::opener::counters();
        if o.timed_out + o.not_tried + o.too_large > 0 {
            write!(
                f,
                "\nobjects given up: timed_out={} not_tried={} too_large={} stuck_readers={}",
                o.timed_out, o.not_tried, o.too_large, o.stuck_now
            )?;
        }
        if o.copied > 0 {
            write!(
                f,
                "\nobjects copied from file systems that can hang: {}",
                o.copied
            )?;
        }
        let (unknown, unplaced) = crate::unwind::interp::frame_counters();
        if unknown + unplaced > 0 {
            write!(f, "\npython frames: unknown={unknown} unplaced={unplaced}")?;
        }
        let v = crate::unwind::interp::verdicts();
        if v != Default::default() {
            write!(
                f,
                "\npython processes: walked={} unsupported={} unreadable={}",
                v.walked, v.unsupported, v.unreadable
            )?;
            if !v.labels.is_empty() {
                write!(f, " ({})", v.labels.join(", "))?;
            }
        }
        let j = crate::process::untrusted::counters();
        if j != Default::default() {
            write!(
                f,
                "\njit files: refused={} reads_timed_out={} reads_refused={} names_cut={} \
                 entries_dropped={} records_skipped={} bytes_unread={}",
                j.files_refused,
                j.reads_timed_out,
                j.reads_refused,
                j.names_cut,
                j.entries_dropped,
                j.records_skipped,
                j.bytes_unread
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "summary_tests.rs"]
mod tests;
