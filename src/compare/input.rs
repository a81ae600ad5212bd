//! Reading a saved profile for `diff` and `report`: pprof (raw or gzip'd,
//! decoded and checked by the collector's decoder,
//! [`crate::collector::merge::decode_body`], and converted back into a
//! [`Profile`]), folded stacks (`comm;root;...;leaf COUNT` lines, as
//! lightswitch, inferno and Brendan Gregg's scripts write them), a
//! timeline (Firefox Profiler JSON, raw or gzip'd: [`super::timeline`]), or
//! OpenTelemetry profiles (an OTLP export request, raw or gzip'd:
//! [`crate::format::otlp::read`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use flate2::read::GzDecoder;

use super::timeline;
use crate::collector::merge::{self, BodyError};
use crate::format::folded::KERNEL_SUFFIX;
use crate::profile::{unwind_marker_name, Frame, FrameKind, Line, Profile, Sample};
use crate::sample::UnwindStatus;

/// Largest size a gzip'd profile may decompress to, bytes (1 GiB).
const MAX_DECODED_BYTES: usize = 1 << 30;

/// The kind of file a profile was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// pprof protobuf, raw or gzip'd.
    Pprof,
    /// Folded stacks.
    Folded,
    /// Firefox Profiler JSON, raw or gzip'd: every sample has its time
    /// ([`Profile::timeline`] is filled).
    Timeline,
    /// An OTLP profiles export request, raw or gzip'd: [`Profile::timeline`]
    /// is filled when its samples have their timestamps.
    Otlp,
}

/// Read and decode the profile in `path`. Errors name the file and say why
/// it is not a pprof profile, folded stacks or a timeline.
pub fn read_profile(path: &Path) -> Result<Profile> {
    read_input(path).map(|(profile, _)| profile)
}

/// [`read_profile`], also saying which format the file is in.
pub fn read_input(path: &Path) -> Result<(Profile, InputFormat)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_input(&bytes)
        .with_context(|| format!("{} is not a profile lightswitch reads", path.display()))
}

/// Decode `bytes`: JSON (raw or gzip'd) is read as a timeline, other
/// text as folded stacks (its error names the first bad line), anything
/// else as pprof (raw or gzip'd), or when it is not pprof as OTLP (the two
/// cannot be mistaken for each other: field 1 of a pprof profile holds
/// varints where an OTLP request's holds a message, and the reverse).
pub fn parse_profile(bytes: &[u8]) -> Result<Profile> {
    parse_input(bytes).map(|(profile, _)| profile)
}

/// [`parse_profile`], also saying which format `bytes` are in.
pub fn parse_input(bytes: &[u8]) -> Result<(Profile, InputFormat)> {
    if bytes.is_empty() {
        bail!("the file is empty");
    }
    let raw = if merge::is_gzip(bytes) {
        Cow::Owned(gunzip(bytes)?)
    } else {
        Cow::Borrowed(bytes)
    };
    if timeline::looks_like_json(&raw) {
        let profile = timeline::parse_timeline(&raw)
            .context("it is JSON, but not a Firefox Profiler timeline")?;
        return Ok((profile, InputFormat::Timeline));
    }
    if let Some(text) = as_text(&raw) {
        let profile = parse_folded(text).context("it is text, but not folded stacks")?;
        return Ok((profile, InputFormat::Folded));
    }
    match merge::decode_body(&raw, MAX_DECODED_BYTES) {
        Ok((proto, _)) => Ok((merge::profile_from_pprof(&proto), InputFormat::Pprof)),
        Err(BodyError::Malformed(why)) => match crate::format::otlp::read::decode(&raw) {
            Ok(profile) => Ok((profile, InputFormat::Otlp)),
            Err(otlp) => bail!("it is binary, but not a pprof profile: {why} (nor OTLP: {otlp:#})"),
        },
        Err(BodyError::TooLarge(why)) => bail!("it is binary, but not a pprof profile: {why}"),
    }
}

/// Decompress gzip'd `bytes`, refusing more than [`MAX_DECODED_BYTES`].
fn gunzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut raw = Vec::new();
    GzDecoder::new(bytes)
        .take(MAX_DECODED_BYTES as u64 + 1)
        .read_to_end(&mut raw)
        .context("it is not valid gzip")?;
    if raw.len() > MAX_DECODED_BYTES {
        bail!("it decompresses to more than {MAX_DECODED_BYTES} bytes");
    }
    Ok(raw)
}

/// `bytes` as text: UTF-8 without control characters other than tab,
/// newline and carriage return. A pprof profile is never that: its first
/// byte is a field tag followed by binary lengths and varints, and gzip's
/// magic number is not UTF-8.
fn as_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.chars()
        .all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
        .then_some(text)
}

/// Parse folded stacks into a profile: the first frame of a line is the
/// process name, `_[k]`-suffixed frames are kernel frames, `[unwind: ...]`
/// frames are unwind markers, everything else is a user frame. A line of
/// one frame (`main 5`, as other tools write) is that frame in a process
/// of the same name. Errors on a line without a count, or when there is no
/// line at all.
pub fn parse_folded(text: &str) -> Result<Profile> {
    let mut profile = Profile::default();
    let mut frames: HashMap<(FrameKind, &str), usize> = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        let Some((stack, count)) = line.rsplit_once(' ') else {
            bail!("line {} has no count: {line:?}", number + 1);
        };
        let Ok(count) = count.parse::<u64>() else {
            bail!("line {} does not end in a count: {line:?}", number + 1);
        };
        let mut names = stack.split(';');
        let comm: Arc<str> = Arc::from(names.next().unwrap_or_default());
        // One frame: it is the stack's function as well as its process.
        let names = names.chain((!stack.contains(';')).then_some(stack));
        let mut sample = Sample {
            pid: 0,
            tid: 0,
            process_comm: comm.clone(),
            thread_comm: comm,
            frames: Vec::new(),
            unwind_status: UnwindStatus::Complete,
            count,
        };
        for name in names {
            let (kind, name) = if let Some(kernel) = name.strip_suffix(KERNEL_SUFFIX) {
                (FrameKind::Kernel, kernel)
            } else if name.starts_with("[unwind: ") {
                if let Some(status) = merge::STATUSES
                    .iter()
                    .find(|s| unwind_marker_name(**s) == name)
                {
                    sample.unwind_status = *status;
                }
                (FrameKind::UnwindMarker, name)
            } else {
                (FrameKind::User, name)
            };
            let index = *frames.entry((kind, name)).or_insert_with(|| {
                profile.frames.push(Frame {
                    kind,
                    address: 0,
                    mapping: None,
                    lines: vec![Line {
                        function: Arc::from(name),
                        system_name: Arc::from(name),
                        file: None,
                        line: None,
                    }]
                    .into(),
                    symbolized: kind != FrameKind::UnwindMarker,
                });
                profile.frames.len() - 1
            });
            sample.frames.push(index);
        }
        // Folded lines go root to leaf; a sample's frames leaf first.
        sample.frames.reverse();
        profile.samples.push(sample);
    }
    if profile.samples.is_empty() {
        bail!("no folded stack lines");
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::folded;
    use crate::format::folded::tests::sample_profile;

    #[test]
    fn folded_round_trips_through_the_encoder() {
        let text = folded::encode(&sample_profile());
        let parsed = parse_profile(text.as_bytes()).unwrap();
        assert_eq!(folded::encode(&parsed), text);
        assert_eq!(parsed.total_samples(), 8);
        assert!(parsed
            .samples
            .iter()
            .any(|s| s.unwind_status == UnwindStatus::Truncated));
    }

    #[test]
    fn pprof_raw_and_gzip_decode_to_the_same_stacks() {
        use crate::format::pprof::{encode, Compression};
        let profile = sample_profile();
        // The fixture's kernel frames have no mapping and user-space
        // addresses, so pprof reads them back as user frames: compare names.
        let names = |p: &Profile| folded::encode(p).replace(KERNEL_SUFFIX, "");
        for compression in [Compression::None, Compression::Gzip] {
            let bytes = encode(&profile, compression).unwrap();
            let parsed = parse_profile(&bytes).unwrap();
            assert_eq!(names(&parsed), names(&profile), "{compression:?}");
            assert_eq!(parsed.sample_freq_hz, 100);
        }
    }

    #[test]
    fn a_line_of_one_frame_keeps_its_samples_as_that_function() {
        let profile = parse_folded("main 5\napp;main;work 3\n").unwrap();
        assert_eq!(profile.total_samples(), 8);
        let table = crate::compare::function_table(&profile, false);
        let main = &table.functions[&crate::compare::FunctionKey {
            name: Arc::from("main"),
            object: None,
        }];
        assert_eq!((main.self_samples, main.inclusive), (5, 8));
    }

    #[test]
    fn garbage_and_empty_input_are_errors() {
        assert!(parse_profile(b"").is_err());
        // Text is judged as folded stacks and the bad line is named.
        let err = parse_profile(b"main;foo 3\nmain;foo notanumber\n").unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("not folded stacks"), "{message}");
        assert!(
            message.contains("line 2 does not end in a count"),
            "{message}"
        );
        assert!(!message.contains("pprof"), "{message}");
        // Binary is judged as pprof.
        let err = parse_profile(&[0x0a, 0xff, 0x01]).unwrap_err();
        assert!(
            format!("{err:#}").contains("not a pprof profile"),
            "{err:#}"
        );
        assert!(parse_profile(&[0x1f, 0x8b, 0, 1, 2]).is_err());
        assert!(parse_profile(&[0xff, 0xfe, 0x00]).is_err());
    }
}
