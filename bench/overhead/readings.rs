//! One churn agent's readings, and what they say about memory: the
//! start-up peak against the steady span's level and peaks, the spread of
//! RssAnon, and its drift (the targets in docs/performance.md).

use std::collections::HashMap;

use crate::report;

/// One reading of one agent.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// Seconds since the agents started.
    pub t_s: f64,
    /// Peak VmRSS since the previous reading (since the start for the
    /// first): `VmHWM`, reset after each reading
    /// ([`crate::measure::reset_peak_rss`]), KiB. A window's close is over in well
    /// under a second, so readings alone (every `every_s`) rarely see its
    /// transient; this does, at every close.
    pub peak_kib: u64,
    /// `VmRSS` at the reading (`/proc/PID/status`), KiB.
    pub vm_rss_kib: u64,
    /// `RssAnon` at the reading (the heap and other private pages), KiB.
    pub rss_anon_kib: u64,
    /// CPU used since the previous reading, % of one CPU.
    pub cpu_pct: Option<f64>,
    /// The agent's `/metrics`, by series (`name{labels}`).
    pub metrics: HashMap<String, f64>,
}

impl Reading {
    /// One series of [`Self::metrics`].
    pub fn metric(&self, series: &str) -> Option<f64> {
        self.metrics.get(series).copied()
    }
}

/// What one agent's readings say about memory: start-up peak (the highest
/// peak VmRSS of the readings up to the first one after a minute), steady
/// VmRSS (median from minute 5, or from a fifth of the run in shorter
/// runs), the peaks of that span between readings (median and highest: the
/// windows' closes), the spread of RssAnon over it, and its drift
/// ([`drift_range`]).
pub fn memory_summary(readings: &[Reading], seconds: f64) -> String {
    let steady_from = if seconds >= 600.0 {
        300.0
    } else {
        seconds / 5.0
    };
    let start_up = readings
        .iter()
        .position(|r| r.t_s >= 60.0)
        .map_or(readings.len(), |i| i + 1);
    let peak = readings[..start_up]
        .iter()
        .map(|r| r.peak_kib)
        .max()
        .unwrap_or(0);
    let steady: Vec<&Reading> = readings.iter().filter(|r| r.t_s >= steady_from).collect();
    if steady.is_empty() {
        return format!(
            "start-up peak {:.1} MiB; not yet at the steady span (from {steady_from:.0} s)",
            mib(peak)
        );
    }
    let median_of = |f: &dyn Fn(&Reading) -> u64| {
        report::median(steady.iter().map(|r| f(r) as f64).collect()).unwrap_or(0.0)
    };
    let rss = median_of(&|r| r.vm_rss_kib);
    let anon = median_of(&|r| r.rss_anon_kib);
    let (lo, hi) = steady.iter().fold((u64::MAX, 0), |(lo, hi), r| {
        (lo.min(r.rss_anon_kib), hi.max(r.rss_anon_kib))
    });
    let first = steady[0].rss_anon_kib.max(1) as f64;
    let last = steady[steady.len() - 1].rss_anon_kib as f64;
    let pct = |kib: f64| (kib / anon.max(1.0) - 1.0) * 100.0;
    let drift = match drift_range(&steady) {
        Some((lo, hi)) => format!(
            "; its {DRIFT_SPAN_S:.0} s medians {:.1}-{:.1} MiB ({:+.0}%/{:+.0}%)",
            lo / 1024.0,
            hi / 1024.0,
            pct(lo),
            pct(hi)
        ),
        None => String::new(),
    };
    let steady_peak = median_of(&|r| r.peak_kib);
    let highest_peak = steady.iter().map(|r| r.peak_kib).max().unwrap_or(0);
    format!(
        "start-up peak (first minute) {:.1} MiB ({:.2}x steady VmRSS, {:.2}x the steady peaks' median); \
         from {steady_from:.0} s: peak VmRSS between readings median {:.1} MiB, highest {:.1} MiB; VmRSS median {:.1} MiB, RssAnon median {:.1} MiB, range {:.1}-{:.1} MiB ({:+.0}%/{:+.0}% of the median){drift}, \
         end/start of span {:.3}",
        mib(peak),
        peak as f64 / rss.max(1.0),
        peak as f64 / steady_peak.max(1.0),
        steady_peak / 1024.0,
        mib(highest_peak),
        rss / 1024.0,
        anon / 1024.0,
        mib(lo),
        mib(hi),
        pct(lo as f64),
        pct(hi as f64),
        last / first
    )
}

/// Length of the spans whose RssAnon medians show drift, s.
const DRIFT_SPAN_S: f64 = 300.0;

/// The lowest and highest median RssAnon (KiB) of consecutive
/// [`DRIFT_SPAN_S`] spans of `steady` (readings in time order), counted
/// from its first reading, of at least 3 readings each; `None` with fewer
/// than two such spans. Each reading falls anywhere in its agent's window,
/// and a 10 s window's stacks, exited processes' mappings and close move
/// RssAnon by about a fifth within it: a span's median stands for the
/// level, the raw range for the saw-tooth around it.
fn drift_range(steady: &[&Reading]) -> Option<(f64, f64)> {
    let start = steady.first()?.t_s;
    let mut spans: Vec<Vec<f64>> = Vec::new();
    for r in steady {
        let span = ((r.t_s - start) / DRIFT_SPAN_S) as usize;
        if spans.len() <= span {
            spans.resize(span + 1, Vec::new());
        }
        spans[span].push(r.rss_anon_kib as f64);
    }
    let medians: Vec<f64> = spans
        .into_iter()
        .filter(|s| s.len() >= 3)
        .filter_map(report::median)
        .collect();
    if medians.len() < 2 {
        return None;
    }
    let lo = medians.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = medians.iter().copied().fold(0.0, f64::max);
    Some((lo, hi))
}

/// KiB to MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(t_s: f64, rss_anon_mib: u64) -> Reading {
        Reading {
            t_s,
            rss_anon_kib: rss_anon_mib * 1024,
            ..Reading::default()
        }
    }

    #[test]
    fn start_up_peak_is_set_against_steady_vmrss_and_the_steady_peaks() {
        // 20 minutes, a reading every 20 s: VmRSS 30 MiB between closes,
        // each interval's peak 45 MiB (a close's transient), 60 MiB in the
        // first minute.
        let readings: Vec<Reading> = (1..=60)
            .map(|i| Reading {
                t_s: i as f64 * 20.0,
                peak_kib: if i <= 3 { 60 } else { 45 } * 1024,
                vm_rss_kib: 30 * 1024,
                ..reading(i as f64 * 20.0, 20)
            })
            .collect();
        let summary = memory_summary(&readings, 1200.0);
        assert!(
            summary.starts_with(
                "start-up peak (first minute) 60.0 MiB (2.00x steady VmRSS, 1.33x the steady peaks' median); \
                 from 300 s: peak VmRSS between readings median 45.0 MiB, highest 45.0 MiB; VmRSS median 30.0 MiB"
            ),
            "{summary}"
        );
    }

    #[test]
    fn drift_is_the_range_of_span_medians_not_of_readings() {
        // A saw-tooth of 20-30 MiB whose level rises by 2 MiB in the third span.
        let readings: Vec<Reading> = (0..45)
            .map(|i| {
                let level = if i >= 30 { 22 } else { 20 };
                reading(i as f64 * 20.0, level + [0, 5, 10][i % 3])
            })
            .collect();
        let steady: Vec<&Reading> = readings.iter().collect();
        let (lo, hi) = drift_range(&steady).expect("three spans");
        assert_eq!((lo / 1024.0, hi / 1024.0), (25.0, 27.0));
        // One span is not a drift.
        assert_eq!(drift_range(&steady[..10]), None);
    }
}
