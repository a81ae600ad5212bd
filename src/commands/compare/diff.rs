//! `lightswitch diff BASE NEW`: which functions' shares of the samples
//! changed between two profiles, for people (a table), machines (JSON) and
//! eyes (inferno's differential flame graph), and a CI gate
//! (`--fail-above PCT`).
//!
//! Counts are normalized to shares of each profile's total, so profiles of
//! different lengths or frequencies compare. A function is its name, and
//! its object's file name when both profiles know objects (pprof does,
//! folded stacks do not), so two builds of one program in different
//! directories compare.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::{comparable_table, has_objects, unplaced_names, FunctionKey, FunctionTable};
#[cfg(test)]
use crate::profile::format::flamegraph;
use crate::profile::Profile;
use crate::util::text::plural;

/// lightswitch's exit status when an input cannot be read or decoded.
pub const BAD_INPUT_EXIT_STATUS: i32 = 2;

/// A function's share of one profile's samples, percent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Shares {
    /// Share of samples with the function on the stack.
    pub inclusive: f64,
    /// Share of samples with the function at the leaf.
    #[serde(rename = "self")]
    pub self_share: f64,
}

/// One function in both profiles.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionChange {
    /// Function name.
    pub function: String,
    /// Object file name, when both profiles know objects.
    pub object: Option<String>,
    /// Shares in BASE (0 when absent).
    pub base: Shares,
    /// Shares in NEW (0 when absent).
    pub new: Shares,
    /// NEW's inclusive share minus BASE's, percentage points.
    pub inclusive_change: f64,
    /// NEW's self share minus BASE's, percentage points.
    pub self_change: f64,
}

impl FunctionChange {
    /// The larger of the two changes, in absolute value: the sort key.
    fn magnitude(&self) -> f64 {
        self.inclusive_change.abs().max(self.self_change.abs())
    }

    /// The function's name, with its object in parentheses when known.
    pub fn label(&self) -> String {
        match &self.object {
            Some(object) => format!("{} ({object})", self.function),
            None => self.function.clone(),
        }
    }
}

/// The comparison of two profiles.
#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    /// Samples in BASE.
    pub base_samples: u64,
    /// Samples in NEW.
    pub new_samples: u64,
    /// Every function of either profile whose shares changed, largest
    /// change first.
    pub functions: Vec<FunctionChange>,
    /// Functions in both profiles only in objects of different names (the
    /// binaries were likely renamed): how many, and the first one as
    /// (function, BASE's object, NEW's object).
    #[serde(skip)]
    pub renamed: Option<(usize, [String; 3])>,
}

/// Compare `base` and `new` function by function: by name as folded
/// stacks write it, and by object when both profiles know objects (but
/// for functions either one has without an object), so the same samples
/// diff to nothing whatever their two formats. Errors when either
/// profile's counts add up past `u64::MAX` ([`comparable_table`]); shares
/// and their changes are `f64`s, which do not overflow.
pub fn diff(base: &Profile, new: &Profile) -> Result<Diff> {
    let unplaced = (has_objects(base) && has_objects(new)).then(|| {
        let mut names = unplaced_names(base);
        names.extend(unplaced_names(new));
        names
    });
    let before = comparable_table(base, unplaced.as_ref()).context("counting BASE's samples")?;
    let after = comparable_table(new, unplaced.as_ref()).context("counting NEW's samples")?;
    let keys: BTreeSet<&FunctionKey> = before
        .functions
        .keys()
        .chain(after.functions.keys())
        .collect();
    let shares = |table: &FunctionTable, key: &FunctionKey| {
        let counts = table.functions.get(key).copied().unwrap_or_default();
        Shares {
            inclusive: table.share(counts.inclusive),
            self_share: table.share(counts.self_samples),
        }
    };
    let mut functions: Vec<FunctionChange> = keys
        .into_iter()
        .map(|key| {
            let (b, n) = (shares(&before, key), shares(&after, key));
            FunctionChange {
                function: key.name.to_string(),
                object: key.object.as_ref().map(|o| o.to_string()),
                base: b,
                new: n,
                inclusive_change: n.inclusive - b.inclusive,
                self_change: n.self_share - b.self_share,
            }
        })
        .filter(|c| c.magnitude() > 0.0)
        .collect();
    // Largest change first; ties by name, so the order is stable.
    functions.sort_by(|a, b| {
        b.magnitude()
            .total_cmp(&a.magnitude())
            .then_with(|| a.function.cmp(&b.function))
    });
    Ok(Diff {
        base_samples: before.total,
        new_samples: after.total,
        functions,
        renamed: renamed(&before, &after),
    })
}

/// Functions of `before` and `after` whose name both have, but never in
/// an object of the same name: how many, and the first by name with its
/// object in each.
fn renamed(before: &FunctionTable, after: &FunctionTable) -> Option<(usize, [String; 3])> {
    fn objects(table: &FunctionTable) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut by_name: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for key in table.functions.keys() {
            if let Some(object) = &key.object {
                by_name.entry(&key.name).or_default().insert(object);
            }
        }
        by_name
    }
    let (base, new) = (objects(before), objects(after));
    let mut found = base.iter().filter_map(|(name, b)| {
        let n = new.get(name)?;
        b.is_disjoint(n).then(|| {
            let first = |set: &BTreeSet<&str>| set.first().copied().unwrap_or_default().to_string();
            [name.to_string(), first(b), first(n)]
        })
    });
    let first = found.next()?;
    Some((1 + found.count(), first))
}

impl Diff {
    /// One line for people when functions match only by name, in objects
    /// named differently ([`Diff::renamed`]); `None` otherwise.
    pub fn renamed_hint(&self) -> Option<String> {
        let (count, [function, base, new]) = self.renamed.as_ref()?;
        Some(format!(
            "hint: {} of BASE {} in NEW only under another object name \
             ({function}: {base} in BASE, {new} in NEW) and {} counted apart: \
             are the binaries named differently?",
            plural(*count as u64, "function", "functions"),
            if *count == 1 { "is" } else { "are" },
            if *count == 1 { "is" } else { "are" },
        ))
    }

    /// The table for people: the `top` largest changes (0: all).
    pub fn render_text(&self, base: &Path, new: &Path, top: usize) -> String {
        let mut out = format!(
            "base: {} ({})\nnew:  {} ({})\n",
            base.display(),
            plural(self.base_samples, "sample", "samples"),
            new.display(),
            plural(self.new_samples, "sample", "samples")
        );
        if self.functions.is_empty() {
            out.push_str("no function's share changed\n");
            return out;
        }
        out.push_str(&format!(
            "{:>27}  {:>27}\n{:>8} {:>8} {:>9}  {:>8} {:>8} {:>9}  function\n",
            "inclusive", "self", "base", "new", "change", "base", "new", "change"
        ));
        let shown = if top == 0 { self.functions.len() } else { top };
        for c in self.functions.iter().take(shown) {
            out.push_str(&format!(
                "{:>7.2}% {:>7.2}% {:>+7.2}pp  {:>7.2}% {:>7.2}% {:>+7.2}pp  {}\n",
                c.base.inclusive,
                c.new.inclusive,
                c.inclusive_change,
                c.base.self_share,
                c.new.self_share,
                c.self_change,
                c.label()
            ));
        }
        if self.functions.len() > shown {
            let more = (self.functions.len() - shown) as u64;
            out.push_str(&format!(
                "({} more {} changed; --top 0 lists all)\n",
                more,
                if more == 1 { "function" } else { "functions" }
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::compare::ci::Gate;
    use crate::commands::compare::input::parse_folded;

    fn profile(text: &str) -> Profile {
        parse_folded(text).unwrap()
    }

    fn gate(fail_above: f64) -> Gate {
        Gate {
            fail_above: Some(fail_above),
            warn_above: None,
        }
    }

    #[test]
    fn a_profile_against_itself_changes_nothing() {
        let p = profile("app;main;a 30\napp;main;b 70\n");
        let d = diff(&p, &p).unwrap();
        assert!(d.functions.is_empty());
        assert!(gate(0.0).failed(&d).is_empty());
    }

    #[test]
    fn doubled_share_is_the_largest_change_and_fails_the_gate() {
        let base = profile("app;main;a 25\napp;main;b 75\n");
        // Twice the samples, and a's share doubles: 25% -> 50%.
        let new = profile("app;main;a 100\napp;main;b 100\n");
        let d = diff(&base, &new).unwrap();
        let first = &d.functions[0];
        assert_eq!(first.inclusive_change, 25.0);
        assert!(["a", "b"].contains(&first.function.as_str()));
        let a = d.functions.iter().find(|c| c.function == "a").unwrap();
        assert_eq!((a.base.inclusive, a.new.inclusive), (25.0, 50.0));
        assert_eq!((a.base.self_share, a.new.self_share), (25.0, 50.0));
        let grown: Vec<_> = gate(10.0)
            .failed(&d)
            .iter()
            .map(|c| c.function.clone())
            .collect();
        assert_eq!(grown, vec!["a".to_string()]);
        // main is on every stack in both: unchanged, not listed.
        assert!(d.functions.iter().all(|c| c.function != "main"));
    }

    #[test]
    fn functions_only_in_one_profile_count_from_zero() {
        let d = diff(&profile("app;main;old 10\n"), &profile("app;main;new 10\n")).unwrap();
        let new = d.functions.iter().find(|c| c.function == "new").unwrap();
        assert_eq!((new.base.inclusive, new.new.inclusive), (0.0, 100.0));
        let old = d.functions.iter().find(|c| c.function == "old").unwrap();
        assert_eq!(old.inclusive_change, -100.0);
    }

    #[test]
    fn differential_flame_graph_is_svg_with_both_functions() {
        let base = profile("app;main;a 25\napp;main;b 75\n");
        let new = profile("app;main;a 100\napp;main;b 100\n");
        let svg = String::from_utf8(flamegraph::differential(&base, &new, "a.pb", "b.pb").unwrap())
            .unwrap();
        assert!(
            svg.contains("a.pb → b.pb"),
            "the subtitle names both inputs"
        );
        let options = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(&svg, options).unwrap();
        let titles: Vec<&str> = doc
            .descendants()
            .filter(|n| n.has_tag_name("title"))
            .filter_map(|n| n.text())
            .collect();
        assert!(titles.iter().any(|t| t.starts_with("a (")), "{titles:?}");
        assert!(titles.iter().any(|t| t.starts_with("b (")), "{titles:?}");
    }
}

#[cfg(test)]
mod across_formats {
    use super::*;
    use crate::profile::format::folded::tests::sample_profile;
    use crate::profile::format::pprof::Compression;
    use crate::profile::format::ProfileFormat;
    use crate::profile::{FrameKind, ProfileMapping, TimedSample};

    /// The folded tests' profile with what separates the formats: user
    /// frames in an object (pprof and OTLP name it, folded stacks do not),
    /// kernel frames in the kernel's mapping, and a `;` in a name (folded
    /// stacks write it as `:`).
    fn tricky_profile() -> Profile {
        let mut p = sample_profile();
        p.mappings.push(ProfileMapping {
            start: 0x1000,
            limit: 0x3000,
            file_offset: 0,
            filename: "/opt/app/bin/app".into(),
            build_id: Some("0123abcd".into()),
        });
        for f in &mut p.frames {
            if f.kind == FrameKind::User {
                f.mapping = Some(0);
            }
        }
        let mut lines = p.frames[3].lines.to_vec();
        lines[0].function = "<[u8; 0] as Debug>::fmt".into();
        p.frames[3].lines = lines.into();
        // Every sample's time, for the formats that keep it.
        let mut offset_ns = 0;
        for (index, sample) in p.samples.iter().enumerate() {
            for _ in 0..sample.count {
                offset_ns += 1_000_000;
                p.timeline.push(TimedSample {
                    offset_ns,
                    sample: index as u32,
                });
            }
        }
        p
    }

    /// The same samples from a binary of another name: every user function
    /// changes (they are told apart by object), and the hint names one.
    #[test]
    fn renamed_binaries_get_a_hint() {
        let base = tricky_profile();
        assert_eq!(diff(&base, &base).unwrap().renamed_hint(), None);
        let mut new = tricky_profile();
        new.mappings[0].filename = "/opt/app/bin/app2".into();
        let d = diff(&base, &new).unwrap();
        assert!(d.functions.iter().any(|c| c.inclusive_change > 0.0));
        let hint = d.renamed_hint().expect("a hint");
        assert!(hint.contains(": app in BASE, app2 in NEW)"), "{hint}");
        assert!(hint.contains("named differently?"), "{hint}");
        assert!(!hint.contains('\n'), "{hint}");
    }

    /// The same samples written in any two formats diff to nothing.
    #[test]
    fn the_same_samples_in_any_two_formats_diff_to_nothing() {
        let profile = tricky_profile();
        let dir = tempfile::tempdir().unwrap();
        let formats = [
            ProfileFormat::Folded,
            ProfileFormat::Pprof,
            ProfileFormat::Firefox,
            ProfileFormat::Otlp,
            ProfileFormat::Perfetto,
        ];
        let read: Vec<(ProfileFormat, Profile)> = formats
            .iter()
            .map(|&format| {
                let bytes =
                    crate::profile::format::encode(&profile, format, Compression::Gzip).unwrap();
                let path = dir.path().join(format.spec().name);
                std::fs::write(&path, bytes).unwrap();
                let back = crate::commands::compare::input::read_profile(&path, 1 << 30).unwrap();
                (format, back)
            })
            .collect();
        for (a_format, a) in &read {
            for (b_format, b) in &read {
                let d = diff(a, b).unwrap();
                assert!(
                    d.functions.is_empty(),
                    "{} against {}: {:?}",
                    a_format.spec().name,
                    b_format.spec().name,
                    d.functions
                );
                assert_eq!(d.base_samples, d.new_samples);
            }
        }
    }
}
