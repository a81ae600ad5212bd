//! SVG flame graph, drawn by inferno from the folded stacks
//! ([`super::folded`]). Kernel frames carry the `_[k]` annotation and are
//! coloured by inferno's annotation-aware palette; the root frames are the
//! process names.

use anyhow::{Context, Result};
use inferno::flamegraph::{self, color::MultiPalette, Options, Palette};

use super::{folded, FormatSpec};
use crate::profile::Profile;

/// The registry entry: `flame-graph` (also `flamegraph`, `flame`, `svg`),
/// `flamegraph.svg`, `image/svg+xml`. An empty profile has nothing to draw.
pub const SPEC: FormatSpec = FormatSpec {
    name: "flame-graph",
    aliases: &["flamegraph", "flame", "svg"],
    noun: "flame graph",
    help: "SVG flame graph (inferno); default file name flamegraph.svg",
    default_file_name: "flamegraph.svg",
    mime_type: "image/svg+xml",
    encodes_empty: false,
    timeline: false,
    encode: |profile, _| encode(profile, TITLE),
};

/// The title drawn at the top of the profiler's CPU flame graphs.
const TITLE: &str = "lightswitch CPU profile";

/// Render `profile` as an SVG flame graph. `title` is drawn at the top.
/// Errors if inferno cannot render (e.g. the profile has no samples).
pub fn encode(profile: &Profile, title: &str) -> Result<Vec<u8>> {
    let stacks = folded::folded_stacks(profile);
    let lines: Vec<String> = stacks.iter().map(|(s, c)| format!("{s} {c}")).collect();
    let mut options = Options::default();
    options.title = title.to_string();
    options.count_name = "samples".to_string();
    options.colors = Palette::Multi(MultiPalette::Java);
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .context("rendering the flame graph")?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::folded::tests::sample_profile;

    #[test]
    fn svg_contains_frames_and_total() {
        let svg = String::from_utf8(encode(&sample_profile(), "test").unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("inner_inlined"));
        assert!(svg.contains("vfs_read"));
        assert!(svg.contains("8 samples"), "total count in the root frame");
    }
}
