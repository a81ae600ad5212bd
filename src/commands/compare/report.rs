//! `lightswitch report FILE`: the top functions of a saved profile, flat
//! and cumulative like `go tool pprof -top`, or the profile re-encoded into
//! another output format (e.g. pprof to flame graph); for a timeline, of
//! the span `--from`/`--to` only.

use anyhow::{bail, Result};

use super::FunctionTable;
use crate::profile::{Profile, Weight};
use crate::util::text::plural;

/// The top-functions table of `table` (from `profile`): the `top` functions
/// with the most self samples (0: all), with `flat flat% sum% cum cum%`
/// columns as `go tool pprof -top` prints them (counts in samples).
pub fn render_top(profile: &Profile, table: &FunctionTable, top: usize) -> String {
    let mut rows: Vec<_> = table.functions.iter().collect();
    rows.sort_by(|(ka, a), (kb, b)| {
        b.self_samples
            .cmp(&a.self_samples)
            .then(b.inclusive.cmp(&a.inclusive))
            .then_with(|| ka.cmp(kb))
    });
    let shown = if top == 0 {
        rows.len()
    } else {
        top.min(rows.len())
    };
    // Folded stacks do not say how often they were sampled.
    let rate = match profile.sample_freq_hz {
        _ if profile.weight == Weight::OffCpuNs => String::new(),
        0 => String::new(),
        hz => {
            let cpu_s = table.total as f64 * profile.period_ns() as f64 / 1e9;
            if cpu_s < 1.0 {
                format!(" at {hz} Hz ({:.1} ms of CPU)", cpu_s * 1e3)
            } else {
                format!(" at {hz} Hz ({cpu_s:.2} s of CPU)")
            }
        }
    };
    // Off-CPU views count ns: shown as ms.
    let off_cpu = profile.weight == Weight::OffCpuNs;
    let amount = |n: u64| {
        if off_cpu {
            format!("{:.3}ms", n as f64 / 1e6)
        } else {
            n.to_string()
        }
    };
    let what = if off_cpu {
        format!("{} off-CPU", amount(table.total))
    } else {
        plural(table.total, "sample", "samples")
    };
    let mut out = format!(
        "{what}{rate}; showing {shown} of {}\n",
        plural(rows.len() as u64, "function", "functions")
    );
    out.push_str(&format!(
        "{:>10} {:>7} {:>7} {:>10} {:>7}  function\n",
        "flat", "flat%", "sum%", "cum", "cum%"
    ));
    let mut sum = 0;
    for (key, counts) in rows.into_iter().take(shown) {
        sum += counts.self_samples;
        out.push_str(&format!(
            "{:>10} {:>6.2}% {:>6.2}% {:>10} {:>6.2}%  {key}\n",
            amount(counts.self_samples),
            table.share(counts.self_samples),
            table.share(sum),
            amount(counts.inclusive),
            table.share(counts.inclusive),
        ));
    }
    out
}

/// The off-CPU view of `profile` read from `file`
/// ([`Profile::off_cpu_view`]). Errors when the profile has no off-CPU
/// time recorded (not made with `--off-cpu`, or a format without it).
pub fn off_cpu_of(profile: Profile, file: &std::path::Path) -> Result<Profile> {
    if !profile.off_cpu {
        bail!(
            "{} has no off-CPU time: record with --off-cpu and write pprof, OTLP or firefox",
            file.display()
        );
    }
    Ok(profile.off_cpu_view())
}

/// Per thread (pid, tid, name), on-CPU ms (samples times the period),
/// off-CPU ms and their sum, most total first.
pub fn render_threads(profile: &Profile) -> String {
    let mut threads: std::collections::BTreeMap<(u32, u32), (&str, u64, u64)> = Default::default();
    for s in &profile.samples {
        let entry = threads
            .entry((s.pid, s.tid))
            .or_insert((&s.thread_comm, 0, 0));
        entry.1 += s.count;
        entry.2 += s.off_cpu_ns;
    }
    let period = profile.period_ns() as f64;
    let mut rows: Vec<_> = threads
        .into_iter()
        .map(|((pid, tid), (name, samples, off))| {
            let on_ms = samples as f64 * period / 1e6;
            let off_ms = off as f64 / 1e6;
            (pid, tid, name, on_ms, off_ms)
        })
        .collect();
    rows.sort_by(|a, b| (b.3 + b.4).total_cmp(&(a.3 + a.4)));
    let mut out = format!(
        "{} at {} Hz; on-CPU = samples x {:.3} ms{}\n",
        plural(rows.len() as u64, "thread", "threads"),
        profile.sample_freq_hz,
        period / 1e6,
        if profile.off_cpu {
            ""
        } else {
            " (no off-CPU time recorded: --off-cpu)"
        }
    );
    out.push_str(&format!(
        "{:>8} {:>8} {:>12} {:>12} {:>12}  thread\n",
        "pid", "tid", "on-CPU ms", "off-CPU ms", "total ms"
    ));
    for (pid, tid, name, on_ms, off_ms) in rows {
        out.push_str(&format!(
            "{pid:>8} {tid:>8} {on_ms:>12.1} {off_ms:>12.1} {:>12.1}  {name}\n",
            on_ms + off_ms
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::compare::function_table;
    use crate::commands::compare::input::parse_folded;

    #[test]
    fn top_table_sorts_by_flat_and_sums() {
        let profile = parse_folded("app;main;a 30\napp;main;b 60\napp;main 10\n").unwrap();
        let table = function_table(&profile, false).unwrap();
        let text = render_top(&profile, &table, 2);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("100 samples"), "{text}");
        assert!(lines[0].contains("showing 2 of 3 functions"), "{text}");
        let cols = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            cols(lines[2]),
            ["60", "60.00%", "60.00%", "60", "60.00%", "b"]
        );
        assert_eq!(
            cols(lines[3]),
            ["30", "30.00%", "90.00%", "30", "30.00%", "a"]
        );
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn threads_show_on_and_off_cpu_side_by_side() {
        let mut profile = parse_folded("app;main;a 30\napp;main;b 10\n").unwrap();
        profile.sample_freq_hz = 100;
        profile.off_cpu = true;
        profile.samples[1].off_cpu_ns = 250_000_000;
        let text = render_threads(&profile);
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(row[2..5], ["400.0", "250.0", "650.0"], "{text}");
        let view = profile.off_cpu_view();
        let table = function_table(&view, false).unwrap();
        let top = render_top(&view, &table, 0);
        assert!(top.starts_with("250.000ms off-CPU; showing"), "{top}");
    }

    #[test]
    fn one_sample_is_singular() {
        let mut profile = parse_folded("app;main 1\n").unwrap();
        let table = function_table(&profile, false).unwrap();
        let text = render_top(&profile, &table, 0);
        assert!(
            text.starts_with("1 sample; showing 1 of 1 function\n"),
            "{text}"
        );
        // Under a second of CPU is said in ms, not as 0.00 s.
        profile.sample_freq_hz = 999;
        let text = render_top(&profile, &table, 0);
        assert!(
            text.starts_with("1 sample at 999 Hz (1.0 ms of CPU); showing"),
            "{text}"
        );
    }
}
