//! `lightswitch diff` for CI systems: the comparison of [`super::diff`] as
//! a Markdown step summary ([`markdown`], GitHub-flavoured tables, for
//! `$GITHUB_STEP_SUMMARY` or a merge-request comment), as GitHub Actions
//! workflow commands ([`github_annotations`]: `::error`/`::warning` lines,
//! shown on the run and its checks), and as a JUnit XML report ([`junit`]:
//! one test case per gated function, read by GitLab, Jenkins and others).
//!
//! All three are pure functions of a [`Diff`] and a [`Gate`]; the gate is
//! the same one `--fail-above` applies to the exit status.

use std::path::Path;

use anyhow::{Context, Result};
use quick_xml::events::{BytesDecl, BytesText, Event};
use quick_xml::Writer;

use super::diff::{Diff, FunctionChange};

/// The thresholds a function's growth is held against, in percentage
/// points of its inclusive share (NEW's minus BASE's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gate {
    /// `--fail-above`: growth above it fails the diff (exit status 1), an
    /// `::error` annotation, a failed test case.
    pub fail_above: Option<f64>,
    /// `--warn-above`: growth above it (and not above `fail_above`) is a
    /// `::warning` annotation; it never changes the exit status.
    pub warn_above: Option<f64>,
}

/// What the gate says of one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Grew above `fail_above`.
    Failed,
    /// Grew above `warn_above`, not above `fail_above`.
    Warned,
    /// Neither.
    Passed,
}

impl Gate {
    /// The verdict on `change`.
    pub fn verdict(&self, change: &FunctionChange) -> Verdict {
        let above = |t: Option<f64>| t.is_some_and(|t| change.inclusive_change > t);
        if above(self.fail_above) {
            Verdict::Failed
        } else if above(self.warn_above) {
            Verdict::Warned
        } else {
            Verdict::Passed
        }
    }

    /// The functions of `diff` the gate fails, largest change first: the
    /// one rule behind `diff`'s exit status (1 when any) and every CI
    /// output's failures. Empty without `fail_above`.
    pub fn failed<'a>(&self, diff: &'a Diff) -> Vec<&'a FunctionChange> {
        diff.functions
            .iter()
            .filter(|c| self.verdict(c) == Verdict::Failed)
            .collect()
    }

    /// Whether any threshold is set.
    pub fn is_set(&self) -> bool {
        self.fail_above.is_some() || self.warn_above.is_some()
    }
}

/// The functions a CI report lists: the `top` largest changes (0: all),
/// then every function the gate failed or warned of that is not among them,
/// in the diff's order (largest change first).
pub fn listed<'a>(diff: &'a Diff, gate: &Gate, top: usize) -> Vec<&'a FunctionChange> {
    let top = if top == 0 { usize::MAX } else { top };
    diff.functions
        .iter()
        .enumerate()
        .filter(|(i, c)| *i < top || gate.verdict(c) != Verdict::Passed)
        .map(|(_, c)| c)
        .collect()
}

/// A cell of a GitHub-flavoured Markdown table holding `text` as code:
/// the pipe, which ends a cell even inside backticks, is escaped; a
/// backtick in the text gets a longer fence around it (CommonMark's code
/// spans); line breaks become spaces.
fn code_cell(text: &str) -> String {
    let text = text.replace(['\n', '\r'], " ").replace('|', "\\|");
    let longest_run = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run + 1);
    // A space on both sides when the text starts or ends with a backtick.
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// A percentage with two decimals (`12.50%`).
fn percent(value: f64) -> String {
    format!("{value:.2}%")
}

/// A change in percentage points with its sign (`+3.10 pp`, `-0.25 pp`).
fn points(value: f64) -> String {
    format!("{value:+.2} pp")
}

/// The comparison as Markdown: a heading, one line with both inputs and
/// their samples and the gate's outcome, then a table of the listed
/// functions ([`listed`]): verdict, function, object, inclusive share in
/// BASE and NEW and its change, self share in BASE and NEW and its change.
/// Fit for `$GITHUB_STEP_SUMMARY`.
pub fn markdown(diff: &Diff, base: &Path, new: &Path, gate: &Gate, top: usize) -> String {
    let mut out = String::from("## lightswitch diff\n\n");
    out.push_str(&format!(
        "Base {} ({} samples), new {} ({} samples).",
        code_cell(&base.display().to_string()),
        diff.base_samples,
        code_cell(&new.display().to_string()),
        diff.new_samples
    ));
    let failed = gate.failed(diff).len();
    if let Some(limit) = gate.fail_above {
        if failed == 0 {
            out.push_str(&format!(
                " No function grew by more than {limit} points: passed.\n\n"
            ));
        } else {
            out.push_str(&format!(
                " **{failed} {} grew by more than {limit} points: failed.**\n\n",
                if failed == 1 { "function" } else { "functions" }
            ));
        }
    } else {
        out.push_str("\n\n");
    }
    let rows = listed(diff, gate, top);
    if rows.is_empty() {
        out.push_str("No function's share changed.\n");
        return out;
    }
    out.push_str(
        "| | function | object | inclusive base | inclusive new | inclusive change \
         | self base | self new | self change |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in &rows {
        let mark = match gate.verdict(c) {
            Verdict::Failed => "❌",
            Verdict::Warned => "⚠️",
            Verdict::Passed if c.inclusive_change > 0.0 => "▲",
            Verdict::Passed => "▼",
        };
        out.push_str(&format!(
            "| {mark} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            code_cell(&c.function),
            c.object.as_deref().map(code_cell).unwrap_or_default(),
            percent(c.base.inclusive),
            percent(c.new.inclusive),
            points(c.inclusive_change),
            percent(c.base.self_share),
            percent(c.new.self_share),
            points(c.self_change),
        ));
    }
    let more = diff.functions.len() - rows.len();
    if more > 0 {
        out.push_str(&format!(
            "\n{more} more {} changed less (`--top 0` lists all).\n",
            if more == 1 { "function" } else { "functions" }
        ));
    }
    out
}

/// Escape the message of a GitHub Actions workflow command: `%`, CR and LF
/// (GitHub's toolkit, `escapeData`).
fn escape_data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escape a property value of a workflow command (`title=`): as
/// [`escape_data`], and `:` and `,`, which end a property
/// (GitHub's toolkit, `escapeProperty`).
fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

/// One GitHub Actions workflow command per function the gate failed
/// (`::error`) or warned of (`::warning`), largest change first: its
/// title names the function, its message the change and the threshold.
/// Empty when nothing is over a threshold.
pub fn github_annotations(diff: &Diff, gate: &Gate) -> String {
    let mut out = String::new();
    for c in &diff.functions {
        let (command, limit) = match gate.verdict(c) {
            Verdict::Failed => ("error", gate.fail_above),
            Verdict::Warned => ("warning", gate.warn_above),
            Verdict::Passed => continue,
        };
        let limit = limit.unwrap_or_default();
        let title = format!("{} grew by {:+.2} points", c.label(), c.inclusive_change);
        let message = format!(
            "{}: inclusive share {} -> {} ({}), self {} -> {}; the limit is {limit} points",
            c.label(),
            percent(c.base.inclusive),
            percent(c.new.inclusive),
            points(c.inclusive_change),
            percent(c.base.self_share),
            percent(c.new.self_share),
        );
        out.push_str(&format!(
            "::{command} title={}::{}\n",
            escape_property(&title),
            escape_data(&message)
        ));
    }
    out
}

/// A JUnit XML report (the de facto schema GitLab, Jenkins and the JUnit
/// ant task read): one `<testsuite name="lightswitch diff">` with one
/// `<testcase>` per listed function ([`listed`]; `classname` its object,
/// `name` the function), holding a `<failure>` when the gate failed it.
/// Warnings are not failures: they go in the case's `<system-out>`.
pub fn junit(diff: &Diff, gate: &Gate, top: usize) -> Result<Vec<u8>> {
    let rows = listed(diff, gate, top);
    let failures = rows
        .iter()
        .filter(|c| gate.verdict(c) == Verdict::Failed)
        .count();
    let mut writer = Writer::new_with_indent(Vec::new(), b' ', 2);
    writer
        .write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))
        .context("writing the JUnit report")?;
    let tests = rows.len().to_string();
    let failures = failures.to_string();
    writer
        .create_element("testsuites")
        .write_inner_content(|w| {
            w.create_element("testsuite")
                .with_attributes([
                    ("name", "lightswitch diff"),
                    ("tests", tests.as_str()),
                    ("failures", failures.as_str()),
                    ("errors", "0"),
                ])
                .write_inner_content(|w| {
                    for c in &rows {
                        write_case(w, c, gate)?;
                    }
                    Ok(())
                })?;
            Ok(())
        })
        .context("writing the JUnit report")?;
    let mut bytes = writer.into_inner();
    bytes.push(b'\n');
    Ok(bytes)
}

/// One `<testcase>` of [`junit`].
fn write_case(w: &mut Writer<Vec<u8>>, c: &FunctionChange, gate: &Gate) -> std::io::Result<()> {
    let classname = c.object.as_deref().unwrap_or("lightswitch");
    let summary = format!(
        "inclusive share {} -> {} ({}), self {} -> {}",
        percent(c.base.inclusive),
        percent(c.new.inclusive),
        points(c.inclusive_change),
        percent(c.base.self_share),
        percent(c.new.self_share),
    );
    w.create_element("testcase")
        .with_attributes([
            ("classname", classname),
            ("name", c.function.as_str()),
            ("time", "0"),
        ])
        .write_inner_content(|w| {
            match gate.verdict(c) {
                Verdict::Failed => {
                    let message = format!(
                        "grew by {:+.2} points, above {}",
                        c.inclusive_change,
                        gate.fail_above.unwrap_or_default()
                    );
                    w.create_element("failure")
                        .with_attributes([("message", message.as_str()), ("type", "regression")])
                        .write_text_content(BytesText::new(&summary))?;
                }
                Verdict::Warned | Verdict::Passed => {
                    w.create_element("system-out")
                        .write_text_content(BytesText::new(&summary))?;
                }
            }
            Ok(())
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::compare::diff::diff;
    use crate::commands::compare::input::parse_folded;

    /// BASE and NEW where `grows` goes 10% -> 40% (+30 points), `warm`
    /// 10% -> 18% (+8), `a|b` (a pipe in its name) 0% -> 2%, and `shrinks`
    /// 80% -> 40% (-40).
    fn changed() -> Diff {
        let base =
            parse_folded("app;main;grows 10\napp;main;warm 10\napp;main;shrinks 80\n").unwrap();
        let new = parse_folded(
            "app;main;grows 40\napp;main;warm 18\napp;main;shrinks 40\napp;main;a|b 2\n",
        )
        .unwrap();
        diff(&base, &new).unwrap()
    }

    const GATE: Gate = Gate {
        fail_above: Some(20.0),
        warn_above: Some(5.0),
    };

    /// The cells of every table row of `markdown`, as a GFM parser reads them.
    fn table_rows(markdown: &str) -> Vec<Vec<String>> {
        use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
        let mut rows = Vec::new();
        let mut row: Vec<String> = Vec::new();
        let mut cell: Option<String> = None;
        for event in Parser::new_ext(markdown, Options::ENABLE_TABLES) {
            match event {
                Event::Start(Tag::TableCell) => cell = Some(String::new()),
                Event::End(TagEnd::TableCell) => row.push(cell.take().unwrap()),
                Event::End(TagEnd::TableRow | TagEnd::TableHead) => {
                    rows.push(std::mem::take(&mut row))
                }
                Event::Text(t) | Event::Code(t) => {
                    if let Some(c) = cell.as_mut() {
                        c.push_str(&t)
                    }
                }
                _ => {}
            }
        }
        rows
    }

    #[test]
    fn markdown_is_a_table_a_gfm_parser_reads_back() {
        let d = changed();
        let text = markdown(&d, Path::new("base.pb"), Path::new("new.pb"), &GATE, 0);
        assert!(
            text.contains("1 function grew by more than 20 points: failed"),
            "{text}"
        );
        let rows = table_rows(&text);
        assert_eq!(rows[0][1], "function");
        assert!(rows.iter().all(|r| r.len() == 9), "{rows:?}");
        let row = |name: &str| rows.iter().find(|r| r[1] == name).unwrap().clone();
        let grows = row("grows");
        assert_eq!(grows[0], "❌");
        assert_eq!(&grows[3..6], ["10.00%", "40.00%", "+30.00 pp"]);
        assert_eq!(row("warm")[0], "⚠️");
        assert_eq!(&row("warm")[3..6], ["10.00%", "18.00%", "+8.00 pp"]);
        assert_eq!(row("a|b")[0], "▲", "the pipe stays in the name's cell");
        assert_eq!(&row("shrinks")[3..6], ["80.00%", "40.00%", "-40.00 pp"]);
        assert_eq!(rows.len(), 1 + d.functions.len());
    }

    #[test]
    fn markdown_lists_the_top_and_every_gated_function() {
        let d = changed();
        // The largest change is `shrinks` (-40); `grows` (+30) and `warm`
        // (+8) are listed for the gate although past --top 1.
        let rows = table_rows(&markdown(&d, Path::new("b"), Path::new("n"), &GATE, 1));
        let names: Vec<&str> = rows[1..].iter().map(|r| r[1].as_str()).collect();
        assert_eq!(names, ["shrinks", "grows", "warm"]);
        let text = markdown(&d, Path::new("b"), Path::new("n"), &Gate::default(), 1);
        assert!(text.contains("3 more functions changed less"), "{text}");
        assert!(
            !text.contains("failed") && !text.contains("passed"),
            "{text}"
        );
    }

    #[test]
    fn code_cells_fence_backticks_and_escape_pipes() {
        assert_eq!(code_cell("a`b"), "``a`b``");
        assert_eq!(code_cell("`x"), "`` `x ``");
        assert_eq!(code_cell("a|b"), "`a\\|b`");
    }

    #[test]
    fn annotations_are_one_workflow_command_per_gated_function() {
        let text = github_annotations(&changed(), &GATE);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            "::error title=grows grew by +30.00 points::grows: inclusive share 10.00%25 -> \
             40.00%25 (+30.00 pp), self 10.00%25 -> 40.00%25; the limit is 20 points"
        );
        assert!(
            lines[1].starts_with("::warning title=warm grew by +8.00 points::"),
            "{}",
            lines[1]
        );
        assert!(github_annotations(&changed(), &Gate::default()).is_empty());
    }

    #[test]
    fn workflow_command_values_are_escaped() {
        assert_eq!(escape_data("50% a\nb"), "50%25 a%0Ab");
        assert_eq!(escape_property("f(a, b): x"), "f(a%2C b)%3A x");
    }

    #[test]
    fn junit_has_one_case_per_listed_function_and_fails_the_gated_ones() {
        let d = changed();
        let xml = String::from_utf8(junit(&d, &GATE, 1).unwrap()).unwrap();
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let suite = doc
            .descendants()
            .find(|n| n.has_tag_name("testsuite"))
            .unwrap();
        assert_eq!(suite.attribute("tests"), Some("3"));
        assert_eq!(suite.attribute("failures"), Some("1"));
        let cases: Vec<_> = suite
            .children()
            .filter(|n| n.has_tag_name("testcase"))
            .collect();
        let names: Vec<&str> = cases.iter().filter_map(|c| c.attribute("name")).collect();
        assert_eq!(names, ["shrinks", "grows", "warm"]);
        let failed: Vec<&str> = cases
            .iter()
            .filter(|c| c.children().any(|n| n.has_tag_name("failure")))
            .filter_map(|c| c.attribute("name"))
            .collect();
        assert_eq!(failed, ["grows"]);
        let failure = cases[1]
            .children()
            .find(|n| n.has_tag_name("failure"))
            .unwrap();
        assert_eq!(
            failure.attribute("message"),
            Some("grew by +30.00 points, above 20")
        );
    }

    #[test]
    fn junit_escapes_names() {
        let base = parse_folded("app;main;a 1\n").unwrap();
        let new = parse_folded("app;main;a 1\napp;main;operator<<&\"x\" 1\n").unwrap();
        let xml = junit(&diff(&base, &new).unwrap(), &Gate::default(), 0).unwrap();
        let xml = String::from_utf8(xml).unwrap();
        let doc = roxmltree::Document::parse(&xml).unwrap();
        assert!(doc
            .descendants()
            .any(|n| n.attribute("name") == Some("operator<<&\"x\"")));
    }
}
