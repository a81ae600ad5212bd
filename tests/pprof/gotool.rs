//! Reading what `go tool pprof` prints: `-top` rows, `-traces`, `-tags`.

use super::*;

/// A pprof value as printed: a count (`481`) or a duration (`1.47s`,
/// `953.91ms`), durations in nanoseconds.
pub(crate) fn parse_value(text: &str) -> Option<f64> {
    let at = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(at);
    let scale = match unit {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "mins" => 60e9,
        "hrs" => 3600e9,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// One row of `go tool pprof -top`.
#[derive(Debug, Clone)]
pub(crate) struct TopRow {
    pub(crate) flat: f64,
    pub(crate) cum: f64,
    /// The node: a function, or with `-lines` `function file:line`.
    pub(crate) name: String,
}

/// Split off the first whitespace-separated token of `text`.
pub(crate) fn token(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    (&text[..end], text[end..].trim_start())
}

/// The rows of `go tool pprof -top` output (after the `flat flat% sum%
/// cum cum%` header).
pub(crate) fn parse_top(text: &str) -> Vec<TopRow> {
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|l| {
            l.split_whitespace().collect::<Vec<_>>() == ["flat", "flat%", "sum%", "cum", "cum%"]
        })
        .unwrap_or_else(|| panic!("no table header in `go tool pprof -top` output:\n{text}"));
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (flat, rest) = token(line);
            let (_, rest) = token(rest);
            let (_, rest) = token(rest);
            let (cum, rest) = token(rest);
            let (_, name) = token(rest);
            let value = |v: &str| {
                parse_value(v).unwrap_or_else(|| panic!("bad value {v:?} in row {line:?}:\n{text}"))
            };
            TopRow {
                flat: value(flat),
                cum: value(cum),
                name: name.to_string(),
            }
        })
        .collect()
}

/// The row of node `name` (panics with the table if missing).
pub(crate) fn row<'a>(rows: &'a [TopRow], name: &str, text: &str) -> &'a TopRow {
    rows.iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no row {name:?} in `go tool pprof -top` output:\n{text}"))
}

/// The number after `Total samples = ` in a pprof header.
pub(crate) fn header_total(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.split_once("Total samples = ").map(|(_, t)| t.trim()))
        .and_then(|t| parse_value(token(t).0))
        .unwrap_or_else(|| panic!("no `Total samples = ` in pprof output:\n{text}"))
}

/// One trace of `go tool pprof -traces`.
#[derive(Debug)]
pub(crate) struct Trace {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
    /// Leaf first.
    pub(crate) frames: Vec<String>,
}

pub(crate) fn parse_traces(text: &str) -> Vec<Trace> {
    let separator = |l: &str| l.starts_with("-----------+");
    let mut traces = Vec::new();
    let mut blocks = text.split('\n').skip_while(|l| !separator(l)).peekable();
    while blocks.next().is_some() {
        let mut trace = Trace {
            labels: BTreeMap::new(),
            value: -1.0,
            frames: Vec::new(),
        };
        while let Some(line) = blocks.next_if(|l| !separator(l)) {
            if line.trim().is_empty() {
                continue;
            }
            let (first, rest) = token(line);
            if trace.value < 0.0 {
                if let Some(key) = first.strip_suffix(':') {
                    trace
                        .labels
                        .insert(key.to_string(), rest.trim().to_string());
                } else {
                    trace.value = parse_value(first)
                        .unwrap_or_else(|| panic!("bad trace line {line:?}:\n{text}"));
                    trace.frames.push(rest.trim().to_string());
                }
            } else {
                trace.frames.push(line.trim().to_string());
            }
        }
        if trace.value >= 0.0 {
            traces.push(trace);
        }
    }
    assert!(
        !traces.is_empty(),
        "no traces in `go tool pprof -traces` output:\n{text}"
    );
    traces
}

/// `go tool pprof -tags`: tag -> the values listed for it.
pub(crate) fn parse_tags(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut tags: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some((key, _)) = line.trim().split_once(": Total ") {
            current = Some(key.to_string());
            tags.entry(key.to_string()).or_default();
        } else if let (Some(key), Some((_, value))) = (&current, line.split_once("): ")) {
            tags.get_mut(key).unwrap().insert(value.trim().to_string());
        }
    }
    tags
}
