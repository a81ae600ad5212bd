//! SVG flame graph, drawn by inferno from the folded stacks
//! ([`super::folded`]). The title names what was profiled
//! ([`Profile::subject`]) and the subtitle the host, start, duration,
//! frequency and sample count. Boxes are coloured by what kind of frame they
//! are ([`FrameClass`]), not by inferno's palettes that guess a language
//! from a name's punctuation: every name gets its colour from a
//! [`PaletteMap`] filled before drawing.

use std::collections::HashMap;

use anyhow::{Context, Result};
use inferno::flamegraph::color::{Color, PaletteMap};
use inferno::flamegraph::{self, Options};

use super::{folded, FormatSpec};
use crate::profile::{FrameKind, Profile, Weight};

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
    off_cpu: false,
    encode: |profile, _, out| Ok(out.write_all(&encode(profile, &title(profile))?)?),
};

/// The kind of a flame graph box, which decides its colour family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameClass {
    /// The bottom row: a process name. Blue-grey.
    Process,
    /// Kernel code. Orange: red 230-255, green 100-150, blue 0-40.
    Kernel,
    /// User code of an object file (executables, shared libraries, the
    /// vDSO). Yellow: red 230-255, green 180-230, blue 40-90.
    UserNative,
    /// User code in no file: JIT-compiled code named by a perf map or
    /// jitdump, or anonymous memory. Green: red 60-120, green 170-220,
    /// blue 60-120.
    Jit,
    /// A Python function (a frame in the `[python]` mapping,
    /// [`crate::unwind::interp`]). Aqua: red 40-90, green 170-220, blue 200-240.
    Python,
    /// An `[unwind: ...]` marker: the user walk stopped early. Grey: red =
    /// green = blue, 150-190.
    UnwindResult,
}

impl FrameClass {
    /// This class's colour for `name`: a shade of the class's colour
    /// family chosen by a hash of the name (the same name is always the
    /// same shade, neighbours usually differ).
    pub fn color(self, name: &str) -> Color {
        let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        // Three independent values in 0..=1.
        let v = |shift: u32| ((hash >> shift) & 0xff) as f64 / 255.0;
        let span = |low: u8, high: u8, t: f64| low + (f64::from(high - low) * t).round() as u8;
        let (r, g, b) = match self {
            FrameClass::Process => (span(130, 160, v(0)), span(160, 190, v(0)), 230),
            FrameClass::Kernel => (
                span(230, 255, v(0)),
                span(100, 150, v(8)),
                span(0, 40, v(16)),
            ),
            FrameClass::UserNative => (
                span(230, 255, v(0)),
                span(180, 230, v(8)),
                span(40, 90, v(16)),
            ),
            FrameClass::Jit => (
                span(60, 120, v(0)),
                span(170, 220, v(8)),
                span(60, 120, v(16)),
            ),
            FrameClass::Python => (
                span(40, 90, v(0)),
                span(170, 220, v(8)),
                span(200, 240, v(16)),
            ),
            FrameClass::UnwindResult => {
                let grey = span(150, 190, v(0));
                (grey, grey, grey)
            }
        };
        Color { r, g, b }
    }
}

/// The class of every name the folded stacks of `profile` have (process
/// names, then frames as [`folded::write`] names them). A name of
/// two classes (rare: a process named like a function) keeps the first.
pub fn frame_classes(profile: &Profile) -> HashMap<String, FrameClass> {
    let mut classes = HashMap::new();
    for sample in &profile.samples {
        classes
            .entry(folded::clean(&sample.process_comm))
            .or_insert(FrameClass::Process);
    }
    for frame in &profile.frames {
        let class = match frame.kind {
            FrameKind::Kernel => FrameClass::Kernel,
            FrameKind::UnwindMarker => FrameClass::UnwindResult,
            FrameKind::User => {
                let filename = frame.mapping.map(|m| profile.mappings[m].filename.as_str());
                if filename == Some(crate::unwind::interp::python::MAPPING_NAME) {
                    FrameClass::Python
                } else if filename.is_none_or(is_anonymous) {
                    FrameClass::Jit
                } else {
                    FrameClass::UserNative
                }
            }
        };
        for line in frame.lines.iter() {
            let mut name = folded::clean(&line.function);
            if frame.kind == FrameKind::Kernel {
                name.push_str(folded::KERNEL_SUFFIX);
            }
            classes.entry(name).or_insert(class);
        }
    }
    classes
}

/// Whether a mapping named `filename` is memory no object file backs
/// (`[anon]`, `[anon:NAME]`, `[heap]`, `/memfd:...`, `//anon`): where JIT
/// compilers put their code. `[vdso]` is the kernel's object file.
fn is_anonymous(filename: &str) -> bool {
    (filename.starts_with('[') && filename != "[vdso]")
        || filename.starts_with("/memfd:")
        || filename.starts_with("//anon")
}

/// The title: `CPU profile of SUBJECT` ([`Profile::subject`]), or
/// `lightswitch CPU profile` when the profile does not say.
/// A subject longer than [`MAX_SUBJECT_CHARS`] is cut there, with `...`.
/// An off-CPU view ([`Weight::OffCpuNs`]) says `Off-CPU profile`.
pub fn title(profile: &Profile) -> String {
    let kind = match profile.weight {
        Weight::Samples => "CPU",
        Weight::OffCpuNs => "Off-CPU",
    };
    let Some(subject) = &profile.subject else {
        return format!("lightswitch {kind} profile");
    };
    if subject.chars().count() <= MAX_SUBJECT_CHARS {
        return format!("{kind} profile of {subject}");
    }
    let cut: String = subject.chars().take(MAX_SUBJECT_CHARS).collect();
    format!("{kind} profile of {cut}...")
}

/// Longest subject a title shows in full, characters (a long command line
/// would run off the image).
pub const MAX_SUBJECT_CHARS: usize = 100;

/// The subtitle: `host H, started 2024-05-01 12:00:00 UTC, 5.00 s at 99 Hz,
/// 9873 samples`; parts the profile does not know (host, start, frequency of
/// folded input) are left out.
pub fn subtitle(profile: &Profile) -> String {
    let mut parts = Vec::new();
    if let Some(host) = &profile.host {
        parts.push(format!("host {host}"));
    }
    if profile.start_unix_ns > 0 {
        let start = jiff::Timestamp::from_nanosecond(i128::from(profile.start_unix_ns))
            .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string());
        if let Ok(start) = start {
            parts.push(format!("started {start}"));
        }
    }
    let mut span = String::new();
    if profile.duration_ns > 0 {
        span = format!("{:.2} s", profile.duration_ns as f64 / 1e9);
    }
    if profile.sample_freq_hz > 0 {
        span = format!("{span} at {} Hz", profile.sample_freq_hz)
            .trim_start()
            .to_string();
    }
    if !span.is_empty() {
        parts.push(span);
    }
    parts.push(match profile.weight {
        Weight::Samples => crate::util::text::plural(profile.total_samples(), "sample", "samples"),
        Weight::OffCpuNs => format!("{:.3} s off-CPU", profile.total_samples() as f64 / 1e9),
    });
    parts.join(", ")
}

/// Render `profile` as an SVG flame graph. `title` is drawn at the top, the
/// [`subtitle`] under it; boxes are coloured by [`FrameClass`]. Boxes
/// narrower than inferno's `min_width` (0.01% of the total) are not drawn,
/// and the stacks under them are merged before inferno reads them
/// ([`folded::flame_graph_lines`]), so memory follows what is drawn.
/// Errors if inferno cannot render (e.g. the profile has no samples).
pub fn encode(profile: &Profile, title: &str) -> Result<Vec<u8>> {
    let lines = folded::flame_graph_lines(profile, Options::default().min_width);
    render(profile, title, &lines)
}

/// The SVG of folded `lines` (`stack count`) of `profile`, as [`encode`]
/// draws it.
fn render(profile: &Profile, title: &str, lines: &[String]) -> Result<Vec<u8>> {
    let mut palette = PaletteMap::default();
    for (name, class) in frame_classes(profile) {
        palette.insert(&name, class.color(&name));
    }
    let mut options = Options::default();
    options.title = title.to_string();
    options.subtitle = Some(subtitle(profile));
    options.count_name = match profile.weight {
        Weight::Samples => "samples",
        Weight::OffCpuNs => "ns off-CPU",
    }
    .to_string();
    options.palette_map = Some(&mut palette);
    // Names the palette lacks (the root, `all`) take a colour from their
    // hash, not at random: the same profile gives the same bytes.
    options.deterministic = true;
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .context("rendering the flame graph")?;
    Ok(singular_counts(svg))
}

/// inferno writes every box's count with the plural `count_name`, "1
/// samples": say "1 sample" in the titles (tooltips) of boxes of one
/// sample. `svg` is inferno's output; boxes of more samples, and counts
/// such as "11 samples", are left as they are.
pub fn singular_counts(svg: Vec<u8>) -> Vec<u8> {
    const PLURAL: &str = "(1 samples,";
    match String::from_utf8(svg) {
        Ok(text) if text.contains(PLURAL) => text.replace(PLURAL, "(1 sample,").into_bytes(),
        Ok(text) => text.into_bytes(),
        Err(err) => err.into_bytes(),
    }
}

/// Render a differential flame graph of `new` against `base` (inferno:
/// NEW's stacks, coloured red where they grew and blue where they shrank;
/// BASE's counts scaled to NEW's total first). The subtitle names the two
/// inputs, `base_name` → `new_name`.
pub fn differential(
    base: &Profile,
    new: &Profile,
    base_name: &str,
    new_name: &str,
) -> Result<Vec<u8>> {
    let before = folded::encode(base);
    let after = folded::encode(new);
    let mut lines = Vec::new();
    let options = inferno::differential::Options {
        normalize: true,
        ..Default::default()
    };
    inferno::differential::from_readers(options, before.as_bytes(), after.as_bytes(), &mut lines)
        .context("pairing the two profiles' stacks")?;
    let lines = String::from_utf8(lines).context("inferno's differential output")?;
    let mut options = inferno::flamegraph::Options::default();
    options.title = "lightswitch differential flame graph (red: grew, blue: shrank)".into();
    options.subtitle = Some(format!("{base_name} → {new_name}"));
    options.count_name = "samples".into();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.lines(), &mut svg)
        .context("rendering the differential flame graph")?;
    Ok(singular_counts(svg))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::format::folded::tests::sample_profile;
    use crate::profile::Frame;

    /// A profile of 300 wide stacks and 20 000 narrow ones (1-3 samples
    /// each, 0.01% being about 300), over names that sort oddly as text
    /// (`work b` and `work.cold` sort between `work` and `work;...`), some
    /// ending where others go on.
    fn many_narrow_stacks() -> Profile {
        let names = [
            "work",
            "work b",
            "work.cold",
            "parse",
            "lex",
            "emit",
            "alloc",
            "hash",
        ];
        let mut frames: Vec<Frame> = Vec::new();
        let mut frame_of = HashMap::new();
        let mut frame = |name: String| -> usize {
            *frame_of.entry(name.clone()).or_insert_with(|| {
                let address = 0x1000 + frames.len() as u64;
                frames.push(folded::tests::frame(FrameKind::User, address, &[&name]));
                frames.len() - 1
            })
        };
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        let mut samples = Vec::new();
        for i in 0..20_300u64 {
            let mut stack = vec![frame("main".to_string())];
            for _ in 0..1 + next(7) {
                stack.push(frame(names[next(names.len() as u64) as usize].to_string()));
            }
            if next(2) == 0 {
                stack.push(frame(format!("leaf{}", next(5_000))));
            }
            stack.reverse();
            let template = &sample_profile().samples[0];
            samples.push(crate::profile::Sample {
                frames: stack,
                count: if i < 300 {
                    2_000 + next(20_000)
                } else {
                    1 + next(3)
                },
                ..template.clone()
            });
        }
        Profile {
            frames,
            samples,
            ..sample_profile()
        }
    }

    /// Merging the stacks under boxes too narrow to draw changes nothing
    /// drawn: the SVG is the one from every stack's line, byte for byte,
    /// and inferno reads half the lines or fewer.
    #[test]
    fn narrow_boxes_merge_before_inferno_and_the_svg_stays_the_same() {
        let profile = many_narrow_stacks();
        let every: Vec<String> = folded::folded_stacks(&profile)
            .iter()
            .map(|(stack, count)| format!("{stack} {count}"))
            .collect();
        let merged = folded::flame_graph_lines(&profile, Options::default().min_width);
        assert!(
            merged.len() * 2 <= every.len(),
            "{} lines of {}",
            merged.len(),
            every.len()
        );
        assert!(merged.iter().any(|l| l.contains(folded::NARROW_FRAMES)));
        let want = render(&profile, "t", &every).unwrap();
        let got = encode(&profile, "t").unwrap();
        assert!(
            want == got,
            "the SVGs differ:\n{}\n---\n{}",
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&got)
        );
    }

    #[test]
    fn svg_contains_frames_and_total() {
        let svg = String::from_utf8(encode(&sample_profile(), "test").unwrap()).unwrap();
        assert!(svg.starts_with("<?xml"));
        assert!(svg.contains("inner_inlined"));
        assert!(svg.contains("vfs_read"));
        assert!(svg.contains("8 samples"), "total count in the root frame");
    }

    #[test]
    fn a_box_of_one_sample_says_sample() {
        let mut profile = sample_profile();
        // One stack of one sample, beside the others.
        profile.samples.truncate(1);
        profile.samples[0].count = 1;
        let svg = String::from_utf8(encode(&profile, "test").unwrap()).unwrap();
        assert!(svg.contains("(1 sample, 100%)"), "{svg}");
        assert!(!svg.contains("1 samples"), "{svg}");
        let many = String::from_utf8(encode(&sample_profile(), "test").unwrap()).unwrap();
        assert!(many.contains("(8 samples, 100%)"), "{many}");
    }

    #[test]
    fn classes_and_their_colours() {
        let classes = frame_classes(&sample_profile());
        assert_eq!(classes["vfs_read_[k]"], FrameClass::Kernel);
        assert_eq!(classes["[unwind: truncated]"], FrameClass::UnwindResult);
        for (name, class) in &classes {
            let c = class.color(name);
            let fits = match class {
                FrameClass::Process => c.b == 230,
                FrameClass::Kernel => c.r >= 230 && (100..=150).contains(&c.g) && c.b <= 40,
                FrameClass::UserNative => c.r >= 230 && (180..=230).contains(&c.g),
                FrameClass::Jit => c.g >= 170 && c.r <= 120,
                FrameClass::Python => c.b >= 200 && c.r <= 90,
                FrameClass::UnwindResult => c.r == c.g && c.g == c.b,
            };
            assert!(fits, "{name}: {class:?} {c:?}");
        }
        assert!(is_anonymous("[anon]") && is_anonymous("/memfd:jit (deleted)"));
        assert!(!is_anonymous("[vdso]") && !is_anonymous("/usr/lib/libc.so.6"));
    }

    #[test]
    fn title_and_subtitle_say_what_and_when() {
        let mut profile = sample_profile();
        assert_eq!(title(&profile), "lightswitch CPU profile");
        profile.subject = Some("./bench -n 3".into());
        profile.host = Some("web-1".into());
        profile.start_unix_ns = 1_714_564_800_000_000_000;
        profile.duration_ns = 5_000_000_000;
        assert_eq!(title(&profile), "CPU profile of ./bench -n 3");
        profile.subject = Some("x".repeat(150).into());
        assert_eq!(
            title(&profile),
            format!("CPU profile of {}...", "x".repeat(100))
        );
        assert_eq!(
            subtitle(&profile),
            "host web-1, started 2024-05-01 12:00:00 UTC, 5.00 s at 100 Hz, 8 samples"
        );
    }
}
