//! Reading a saved profile for `diff` and `report`: pprof (raw or gzip'd,
//! decoded and checked by the collector's decoder,
//! [`crate::collector::merge::decode_body`], and converted back into a
//! [`Profile`]), folded stacks (`comm;root;...;leaf COUNT` lines, as
//! lightswitch, inferno and Brendan Gregg's scripts write them), or a
//! timeline (Firefox Profiler JSON, raw or gzip'd: [`super::timeline`]).

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

/// Decode `bytes`: folded stacks when they are text whose every line ends
/// in a count, a timeline when they are (or decompress to) JSON, else pprof
/// (raw or gzip'd).
pub fn parse_profile(bytes: &[u8]) -> Result<Profile> {
    parse_input(bytes).map(|(profile, _)| profile)
}

/// [`parse_profile`], also saying which format `bytes` are in.
pub fn parse_input(bytes: &[u8]) -> Result<(Profile, InputFormat)> {
    if bytes.is_empty() {
        bail!("the file is empty");
    }
    let raw = if merge::is_gzip(bytes) {
        gunzip(bytes)?
    } else {
        if let Ok(text) = std::str::from_utf8(bytes) {
            if let Ok(profile) = parse_folded(text) {
                return Ok((profile, InputFormat::Folded));
            }
        }
        bytes.to_vec()
    };
    if timeline::looks_like_json(&raw) {
        return Ok((timeline::parse_timeline(&raw)?, InputFormat::Timeline));
    }
    match merge::decode_body(&raw, MAX_DECODED_BYTES) {
        Ok((proto, _)) => Ok((merge::profile_from_pprof(&proto), InputFormat::Pprof)),
        Err(BodyError::Malformed(why) | BodyError::TooLarge(why)) => {
            bail!("not folded stacks or a timeline, and as pprof: {why}")
        }
    }
}

/// Decompress gzip'd `bytes`, refusing more than [`MAX_DECODED_BYTES`].
fn gunzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut raw = Vec::new();
    GzDecoder::new(bytes)
        .take(MAX_DECODED_BYTES as u64 + 1)
        .read_to_end(&mut raw)
        .context("not valid gzip")?;
    if raw.len() > MAX_DECODED_BYTES {
        bail!("decompresses to more than {MAX_DECODED_BYTES} bytes");
    }
    Ok(raw)
}

/// Parse folded stacks into a profile: the first frame of a line is the
/// process name, `_[k]`-suffixed frames are kernel frames, `[unwind: ...]`
/// frames are unwind markers, everything else is a user frame. Errors on a
/// line without a count, or when there is no line at all.
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
                    }],
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
    fn garbage_and_empty_input_are_errors() {
        assert!(parse_profile(b"").is_err());
        let err = parse_profile(b"main;foo notanumber\n").unwrap_err();
        assert!(format!("{err:#}").contains("not folded stacks"), "{err:#}");
        assert!(parse_profile(&[0x1f, 0x8b, 0, 1, 2]).is_err());
        assert!(parse_profile(&[0xff, 0xfe, 0x00]).is_err());
    }
}
