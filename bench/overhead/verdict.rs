//! The verdict of a hostile-neighbour soak (`churn --hostile N`, issue
//! 40), per agent: windows keep flowing (every window handed over, none
//! dropped, failed or panicked, and never long without a new one), VmRSS
//! stays under [`RSS_LIMIT_MIB`], the bystander keeps [`BYSTANDER_SHARE`]
//! of its samples, the agent exits 0 within its deadline, and no frame is
//! named from the root-only file a perf-map symlink points to.

use crate::hostile::Tally;

/// Highest VmRSS reading an agent may have, MiB.
pub const RSS_LIMIT_MIB: f64 = 128.0;
/// Share of its expected samples the bystander must keep.
pub const BYSTANDER_SHARE: f64 = 0.9;

/// What the verdict needs of one agent at the end of a hostile soak.
pub struct AgentOutcome<'a> {
    /// `10 s` (its window length).
    pub label: String,
    /// Window length, s.
    pub window_s: f64,
    /// `exit 0`, or how it ended.
    pub exit: &'a str,
    /// Its `windows: closed=...` summary line, if it exited 0.
    pub summary: Option<&'a str>,
    /// (reading time s, windows written so far) of every reading.
    pub written: Vec<(f64, Option<f64>)>,
    /// Time between two readings, s.
    pub every_s: f64,
    /// Highest VmRSS reading, KiB.
    pub max_vm_rss_kib: u64,
    /// Its folded files' tally.
    pub tally: &'a Tally,
    /// Samples the bystander should have: its CPU time x the frequency.
    pub expected: f64,
}

/// `closed`, `handed_over`, `merged`, `dropped`, `failed` and `panicked`
/// of a `windows:` summary line (`merged` is 0 when the line has none).
fn window_counts(line: &str) -> Option<[u64; 6]> {
    let field = |name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
            .parse()
            .ok()
    };
    Some([
        field("closed")?,
        field("handed_over")?,
        field("merged").unwrap_or(0),
        field("dropped")?,
        field("failed")?,
        field("panicked")?,
    ])
}

/// The longest time without a new window written, s: between the start
/// (0), each reading at which the count grew, and the last reading.
fn longest_gap(written: &[(f64, Option<f64>)]) -> f64 {
    let (mut last_t, mut last_n, mut gap) = (0.0, 0.0, 0.0f64);
    for &(t, n) in written {
        if let Some(n) = n.filter(|&n| n > last_n) {
            gap = gap.max(t - last_t);
            (last_t, last_n) = (t, n);
        }
    }
    let end = written.last().map_or(0.0, |r| r.0);
    gap.max(end - last_t)
}

/// One agent's checks: (passed, text) each.
fn agent_checks(a: &AgentOutcome) -> Vec<(bool, String)> {
    let gap = longest_gap(&a.written);
    let gap_limit = 3.0 * a.window_s.max(a.every_s);
    let windows = match a.summary.and_then(window_counts) {
        Some([closed, handed, merged, dropped, failed, panicked]) => (
            closed == handed + merged && dropped + failed + panicked == 0,
            format!("closed={closed} handed_over={handed} merged={merged} dropped={dropped} failed={failed} panicked={panicked}"),
        ),
        None => (false, "no final summary (the agent did not exit 0)".to_string()),
    };
    let flowing = windows.0 && gap <= gap_limit;
    let rss = a.max_vm_rss_kib as f64 / 1024.0;
    let got = a.tally.bystander as f64;
    let share = got / a.expected.max(1.0);
    let mut checks = vec![
        (
            flowing,
            format!(
                "windows flowing: {}; longest time without a new window {gap:.0} s (limit {gap_limit:.0} s)",
                windows.1
            ),
        ),
        (
            rss < RSS_LIMIT_MIB,
            format!("RSS: max VmRSS {rss:.1} MiB (limit {RSS_LIMIT_MIB:.0} MiB)"),
        ),
        (
            share >= BYSTANDER_SHARE,
            format!(
                "bystander: {got:.0} samples of {:.0} expected (its CPU time x frequency), {:.1}% (limit {:.0}%; {} folded files read)",
                a.expected,
                share * 100.0,
                BYSTANDER_SHARE * 100.0,
                a.tally.files
            ),
        ),
        (a.exit == "exit 0", format!("exit: {}", a.exit)),
    ];
    if a.tally.secret > 0 {
        checks.push((
            false,
            format!(
                "symlink followed: {} samples named from the root-only file a perf map links to",
                a.tally.secret
            ),
        ));
    }
    checks
}

/// The verdict of a hostile soak, as report lines, and whether every
/// check of every agent passed.
pub fn verdict(agents: &[AgentOutcome]) -> (String, bool) {
    let mut all_ok = true;
    let mut lines = Vec::new();
    for a in agents {
        for (ok, text) in agent_checks(a) {
            all_ok &= ok;
            let mark = if ok { "ok" } else { "**FAIL**" };
            lines.push(format!("- {} windows: {mark} {text}", a.label));
        }
    }
    let head = if all_ok { "PASS" } else { "**FAIL**" };
    (
        format!(
            "Hostile-neighbour verdict: {head}\n\n{}\n",
            lines.join("\n")
        ),
        all_ok,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_stop_flowing_when_a_gap_is_too_long_or_a_window_is_not_handed_over() {
        let mut tally = Tally::default();
        tally.bystander = 950;
        let mut outcome = AgentOutcome {
            label: "1 s".into(),
            window_s: 1.0,
            exit: "exit 0",
            summary: Some(
                "windows: closed=60 handed_over=60 dropped=0 failed=0 panicked=0 late_samples=0",
            ),
            written: (1..=6)
                .map(|i| (i as f64 * 10.0, Some(i as f64 * 10.0)))
                .collect(),
            every_s: 10.0,
            max_vm_rss_kib: 50 << 10,
            tally: &tally,
            expected: 1000.0,
        };
        assert!(verdict(std::slice::from_ref(&outcome)).1);
        outcome = AgentOutcome {
            written: vec![
                (10.0, Some(9.0)),
                (20.0, None),
                (30.0, None),
                (40.0, None),
                (50.0, Some(9.0)),
            ],
            summary: None,
            exit: "no exit within 60 s of SIGINT: killed",
            ..outcome
        };
        assert_eq!(longest_gap(&outcome.written), 40.0);
        let (text, ok) = verdict(&[outcome]);
        assert!(!ok);
        assert!(
            text.contains("**FAIL** windows flowing: no final summary"),
            "{text}"
        );
        assert!(text.contains("ok RSS: max VmRSS 50.0 MiB"), "{text}");
        assert!(
            text.contains("ok bystander: 950 samples of 1000 expected"),
            "{text}"
        );
        assert_eq!(
            window_counts("windows: closed=5 handed_over=4 dropped=1 failed=0 panicked=0"),
            Some([5, 4, 0, 1, 0, 0])
        );
        assert_eq!(
            window_counts("windows: closed=9 handed_over=6 merged=3 dropped=0 failed=0 panicked=0"),
            Some([9, 6, 3, 0, 0, 0])
        );
    }
}
