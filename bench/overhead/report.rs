//! Markdown output: each mode (re)writes its own block of
//! `docs/performance.md` between `<!-- overhead:MODE:begin -->` and
//! `<!-- overhead:MODE:end -->`, so hand-written text around the blocks, and
//! the blocks of modes not run this time, survive.

use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        s / 3600,
        s / 60 % 60
    )
}

/// Kernel release, CPU count and model, and the load average: the line
/// every block starts with.
pub fn machine_line(cpus: usize, conditions: &str) -> String {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let model = fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let load = fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string();
    format!(
        "_Measured {} on kernel {}, {cpus} CPUs ({model}), load average {load} at the start; {conditions}._",
        utc_now(),
        kernel.trim()
    )
}

/// A markdown table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        " --- |".repeat(header.len())
    );
    for row in rows {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

/// Replace the block of `mode` in the markdown file `doc` with `body`
/// (appending a new section if the file or the markers do not exist yet).
pub fn write_block(doc: &Path, mode: &str, body: &str) -> Result<()> {
    let begin = format!("<!-- overhead:{mode}:begin -->");
    let end = format!("<!-- overhead:{mode}:end -->");
    let text = fs::read_to_string(doc).unwrap_or_default();
    let block = format!("{begin}\n{}\n{end}", body.trim_end());
    let new = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => format!("{}{block}{}", &text[..b], &text[e + end.len()..]),
        _ => format!("{}\n## {mode}\n\n{block}\n", text.trim_end()),
    };
    fs::write(doc, new).with_context(|| format!("writing {}", doc.display()))
}

/// `x` with `digits` decimals, or `—` when unknown.
pub fn num(x: Option<f64>, digits: usize) -> String {
    x.filter(|v| v.is_finite())
        .map_or_else(|| "—".to_string(), |v| format!("{v:.digits$}"))
}

/// The median of `values` (the mean of the middle two for an even count); `None` if empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn blocks_are_replaced_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let doc = dir.path().join("p.md");
        fs::write(
            &doc,
            "intro\n<!-- overhead:soak:begin -->\nold\n<!-- overhead:soak:end -->\noutro\n",
        )
        .unwrap();
        write_block(&doc, "soak", "new").unwrap();
        write_block(&doc, "churn", "c").unwrap();
        let text = fs::read_to_string(&doc).unwrap();
        assert!(text.starts_with(
            "intro\n<!-- overhead:soak:begin -->\nnew\n<!-- overhead:soak:end -->\noutro"
        ));
        assert!(text.contains("## churn\n\n<!-- overhead:churn:begin -->\nc\n"));
    }
}
