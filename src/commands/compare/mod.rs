//! Reading saved profiles back and looking at them: `lightswitch report`
//! ([`report`]: top functions, re-encoding) and `lightswitch diff`
//! ([`diff`]: what changed between two profiles). Both count per function
//! ([`function_table`]) on the format-neutral [`Profile`] that
//! [`input::read_profile`] decodes from pprof, folded stacks or a timeline
//! ([`timeline`]: Firefox Profiler JSON).

pub mod ci;
pub mod command;
pub mod diff;
pub mod input;
pub mod report;
pub mod timeline;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use anyhow::{Context, Result};

use crate::profile::format::folded;
use crate::profile::{FrameKind, Profile};

/// A function as profiles are compared: its name, and the file name (no
/// directory) of the object it is in, when the profile knows it and
/// objects are wanted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey {
    /// Demangled function name (or `object+0xOFFSET`, `[unwind: ...]`).
    pub name: Arc<str>,
    /// Object file name, e.g. `libc.so.6`, `[kernel.kallsyms]`.
    pub object: Option<Arc<str>>,
}

impl std::fmt::Display for FunctionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.object {
            Some(object) => write!(f, "{} ({object})", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// Samples of one function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Samples with the function anywhere on the stack (once per sample,
    /// however deep it recurses): "cum" in pprof.
    pub inclusive: u64,
    /// Samples with the function at the leaf (innermost inlined function
    /// of the innermost frame): "flat" in pprof.
    pub self_samples: u64,
}

/// Per-function sample counts of one profile.
#[derive(Debug, Clone, Default)]
pub struct FunctionTable {
    /// All samples of the profile (the denominator of every share).
    pub total: u64,
    /// Counts per function.
    pub functions: HashMap<FunctionKey, Counts>,
}

impl FunctionTable {
    /// `count` as a percentage of [`FunctionTable::total`] (0 for an empty profile).
    pub fn share(&self, count: u64) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            100.0 * count as f64 / self.total as f64
        }
    }
}

/// Whether any frame of `profile` knows its object (pprof has mappings;
/// folded stacks do not).
pub fn has_objects(profile: &Profile) -> bool {
    profile.frames.iter().any(|f| f.mapping.is_some())
}

/// The names ([`folded::clean`]ed) of the functions `profile` has at
/// least once in a frame without an object: an address in no mapping, or
/// a function a format writes without its object (a Firefox timeline
/// writes inlined functions as labels). A comparison cannot tell such a
/// function apart by object, so it keys it by name alone on both sides
/// ([`comparable_table`]).
pub fn unplaced_names(profile: &Profile) -> HashSet<Arc<str>> {
    profile
        .frames
        .iter()
        .filter(|f| f.kind != FrameKind::UnwindMarker && f.mapping.is_none())
        .flat_map(|f| f.lines.iter())
        .map(|line| Arc::from(folded::clean(&line.function)))
        .collect()
}

/// Count every function of `profile`: each line of each frame (inlined
/// functions included) is a function; process names are not. With
/// `with_objects`, functions of the same name in different objects are
/// kept apart. Errors when a count adds up past `u64::MAX` (the total
/// first: the readers of [`input`] refuse such a profile already).
pub fn function_table(profile: &Profile, with_objects: bool) -> Result<FunctionTable> {
    let all_placed = HashSet::new();
    count_functions(profile, with_objects.then_some(&all_placed), false)
}

/// [`function_table`] as `diff` compares: every name as folded stacks
/// write it ([`folded::clean`]: `;` as `:`), whatever format the profile
/// was read from, so the same samples count the same in any two formats;
/// with `objects`, functions are told apart by object too, but for the
/// names in it (the [`unplaced_names`] of both profiles), which are keyed
/// by name alone.
pub fn comparable_table(
    profile: &Profile,
    objects: Option<&HashSet<Arc<str>>>,
) -> Result<FunctionTable> {
    count_functions(profile, objects, true)
}

/// Count the functions of `profile`, names cleaned when `clean_names`,
/// keyed by object (when `objects`) except for the names in `objects`.
fn count_functions(
    profile: &Profile,
    objects: Option<&HashSet<Arc<str>>>,
    clean_names: bool,
) -> Result<FunctionTable> {
    let object_names: Vec<Arc<str>> = profile
        .mappings
        .iter()
        .map(|m| Arc::from(m.filename.rsplit('/').next().unwrap_or(&m.filename)))
        .collect();
    // Cleaned once per frame, not per sample.
    let names: Vec<Vec<Arc<str>>> = profile
        .frames
        .iter()
        .map(|frame| {
            frame
                .lines
                .iter()
                .map(
                    |line| match clean_names.then(|| folded::clean(&line.function)) {
                        Some(clean) if *clean != *line.function => Arc::from(clean),
                        _ => line.function.clone(),
                    },
                )
                .collect()
        })
        .collect();
    let key_of = |frame_index: usize, line: usize| {
        let name = &names[frame_index][line];
        let object = match objects {
            Some(unplaced) if !unplaced.contains(name) => profile.frames[frame_index]
                .mapping
                .and_then(|m| object_names.get(m).cloned()),
            _ => None,
        };
        FunctionKey {
            name: name.clone(),
            object,
        }
    };
    let mut table = FunctionTable::default();
    let mut seen = HashSet::new();
    // A stack only seen off its CPU (count 0) names no function here.
    let counted = profile
        .samples
        .iter()
        .enumerate()
        .filter(|(_, s)| s.count > 0);
    for (number, sample) in counted {
        table.total = add(table.total, sample.count, || {
            format!("the counts of samples 0 to {number}")
        })?;
        if let Some(&leaf) = sample.frames.first() {
            let key = key_of(leaf, 0);
            let counts = table.functions.entry(key).or_default();
            counts.self_samples = add(counts.self_samples, sample.count, || {
                format!("the self counts of {}", key_of(leaf, 0))
            })?;
        }
        seen.clear();
        for &frame in &sample.frames {
            for line in 0..profile.frames[frame].lines.len() {
                let key = key_of(frame, line);
                if seen.insert(key.clone()) {
                    let counts = table.functions.entry(key.clone()).or_default();
                    counts.inclusive = add(counts.inclusive, sample.count, || {
                        format!("the inclusive counts of {key}")
                    })?;
                }
            }
        }
    }
    Ok(table)
}

/// `sum + count`, or an error saying that `what` (a closure, called on
/// error only) adds up past `u64::MAX`.
fn add(sum: u64, count: u64, what: impl FnOnce() -> String) -> Result<u64> {
    sum.checked_add(count)
        .with_context(|| format!("{} add up past {} samples", what(), u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::format::folded::tests::sample_profile;

    fn named(name: &str) -> FunctionKey {
        FunctionKey {
            name: Arc::from(name),
            object: None,
        }
    }

    #[test]
    fn inclusive_and_self_counts() {
        // Stacks (leaf first): vfs_read, do_syscall_64, [inner_inlined, c], main: 7
        // and [inner_inlined, c], [unwind: truncated]: 1.
        let table = function_table(&sample_profile(), true).unwrap();
        assert_eq!(table.total, 8);
        let counts = |n| table.functions[&named(n)];
        assert_eq!(counts("vfs_read").self_samples, 7);
        assert_eq!(counts("vfs_read").inclusive, 7);
        assert_eq!(counts("inner_inlined").self_samples, 1);
        assert_eq!(counts("inner_inlined").inclusive, 8);
        assert_eq!(counts("c").inclusive, 8);
        assert_eq!(counts("c").self_samples, 0);
        assert_eq!(counts("main").inclusive, 7);
        assert_eq!(counts("[unwind: truncated]").inclusive, 1);
        assert!((table.share(4) - 50.0).abs() < 1e-9);
    }

    #[test]
    fn recursion_counts_once_per_sample() {
        let mut profile = sample_profile();
        // main -> main -> c: main still counts once per sample.
        profile.samples[0].frames = vec![2, 3, 3];
        let table = function_table(&profile, false).unwrap();
        assert_eq!(table.functions[&named("main")].inclusive, 7);
    }

    #[test]
    fn counts_past_u64_are_an_error_not_a_wrong_total() {
        let mut profile = sample_profile();
        for sample in &mut profile.samples {
            sample.count = u64::MAX;
        }
        let err = function_table(&profile, false).unwrap_err();
        assert!(
            format!("{err:#}").contains("the counts of samples 0 to 1 add up past"),
            "{err:#}"
        );
        // One saturated sample is fine: its function has 100%.
        profile.samples.truncate(1);
        let table = function_table(&profile, false).unwrap();
        assert_eq!(table.total, u64::MAX);
        assert_eq!(
            table.share(table.functions[&named("main")].inclusive),
            100.0
        );
    }
}
