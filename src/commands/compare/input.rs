//! Reading a saved profile for `diff` and `report`: pprof (raw or gzip'd,
//! decoded and checked by the collector's decoder,
//! [`crate::profile::merge::decode_body`], and converted back into a
//! [`Profile`]), folded stacks (`comm;root;...;leaf COUNT` lines, as
//! lightswitch, inferno and Brendan Gregg's scripts write them), a
//! timeline (Firefox Profiler JSON, raw or gzip'd: [`super::timeline`]), or
//! OpenTelemetry profiles (an OTLP export request, raw or gzip'd:
//! [`crate::profile::format::otlp::read`]), or a Perfetto trace (raw or
//! gzip'd: [`crate::profile::format::perfetto::read`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use flate2::read::GzDecoder;
use prost::Message;

use super::timeline;
use crate::profile::format::folded::KERNEL_SUFFIX;
use crate::profile::format::pprof::proto;
use crate::profile::merge;
use crate::profile::{marked_status, Frame, FrameKind, Line, Profile, Sample};
use crate::sampling::records::UnwindStatus;

/// Default of `report`'s and `diff`'s `--max-input-mb`: the largest size
/// an input may have once decoded (decompressed, when gzip'd), MiB.
pub const DEFAULT_MAX_INPUT_MB: u32 = 512;

/// An input larger than `--max-input-mb` once decoded. Reading stops at
/// the limit, so a larger file (or a gzip bomb) costs at most that much
/// memory.
#[derive(Debug, thiserror::Error)]
#[error(
    "it {} more than {limit_mib} MiB, the limit of --max-input-mb",
    if *.gzip { "decompresses to" } else { "is" }
)]
pub struct InputTooLarge {
    /// The limit, MiB.
    pub limit_mib: u64,
    /// Whether the input was gzip'd.
    pub gzip: bool,
}

/// Folded stacks whose counts add up to more samples than a `u64` holds:
/// every total and share derived from them would be wrong.
#[derive(Debug, thiserror::Error)]
#[error(
    "line {line}: its count {count} brings the total past {} samples",
    u64::MAX
)]
pub struct CountOverflow {
    /// The line (from 1) whose count overflowed the total.
    pub line: usize,
    /// That line's count.
    pub count: u64,
}

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
    /// A Perfetto trace, raw or gzip'd: every sample has its time
    /// ([`Profile::timeline`] is filled).
    Perfetto,
}

/// Read and decode the profile in `path`, refusing one larger than
/// `max_bytes` once decoded ([`InputTooLarge`]). Errors name the file and
/// say why it could not be read, why it is not a pprof profile, folded
/// stacks or a timeline, or on which line its counts overflow
/// ([`CountOverflow`]). The profile's total of samples fits in a `u64`.
pub fn read_profile(path: &Path, max_bytes: u64) -> Result<Profile> {
    read_input(path, max_bytes).map(|(profile, _)| profile)
}

/// [`read_profile`], also saying which format the file is in.
pub fn read_input(path: &Path, max_bytes: u64) -> Result<(Profile, InputFormat)> {
    let raw = File::open(path)
        .and_then(|file| {
            let size = file.metadata()?.len();
            Ok((file, size))
        })
        .map_err(anyhow::Error::from)
        .and_then(|(file, size)| decode(BufReader::new(file), size, max_bytes))
        .with_context(|| format!("reading {}", path.display()))?;
    parse_decoded(&raw).map_err(|err| {
        let what = if err.is::<CountOverflow>() {
            format!("adding up the counts of {}", path.display())
        } else {
            format!("{} is not a profile lightswitch reads", path.display())
        };
        err.context(what)
    })
}

/// Decode `bytes`: JSON (raw or gzip'd) is read as a timeline, other
/// text as folded stacks (its error names the first bad line), anything
/// else as pprof (raw or gzip'd), or when it is not pprof as OTLP (the two
/// cannot be mistaken for each other: field 1 of a pprof profile holds
/// varints where an OTLP request's holds a message, and the reverse), or
/// when neither as a Perfetto trace (whose packets hold none of the fields
/// a pprof profile or an OTLP request needs). At most
/// [`DEFAULT_MAX_INPUT_MB`] of decoded bytes.
pub fn parse_profile(bytes: &[u8]) -> Result<Profile> {
    parse_input(bytes).map(|(profile, _)| profile)
}

/// [`parse_profile`], also saying which format `bytes` are in.
pub fn parse_input(bytes: &[u8]) -> Result<(Profile, InputFormat)> {
    let max_bytes = u64::from(DEFAULT_MAX_INPUT_MB) << 20;
    let raw = decode(bytes, bytes.len() as u64, max_bytes)?;
    parse_decoded(&raw)
}

/// All of `input` (`size` bytes, 0 when unknown), decompressed when
/// gzip'd: at most `max_bytes` of it, else [`InputTooLarge`]. The buffer
/// is allocated once, of the input's size or (gzip'd, or of unknown size)
/// of `max_bytes`: pages are only resident once written, so memory is
/// what was read, and reading stops at the limit whatever the input
/// claims.
fn decode<R: BufRead>(mut input: R, size: u64, max_bytes: u64) -> Result<Vec<u8>> {
    let gzip = merge::is_gzip(input.fill_buf()?);
    let capacity = if gzip || size == 0 {
        max_bytes
    } else {
        size.min(max_bytes)
    };
    let mut raw = Vec::with_capacity(usize::try_from(capacity)?);
    let mut beyond = [0u8; 1];
    let more = if gzip {
        let mut decoder = GzDecoder::new(input);
        (&mut decoder)
            .take(max_bytes)
            .read_to_end(&mut raw)
            .and_then(|_| decoder.read(&mut beyond))
            .context("it is not valid gzip")?
    } else {
        (&mut input).take(max_bytes).read_to_end(&mut raw)?;
        input.read(&mut beyond)?
    };
    if more > 0 {
        return Err(InputTooLarge {
            limit_mib: max_bytes >> 20,
            gzip,
        }
        .into());
    }
    Ok(raw)
}

/// Characters of an input line an error quotes at most.
const QUOTE_CHARS: usize = 80;

/// `line` quoted for an error: its first [`QUOTE_CHARS`] characters, and
/// `…` when there are more.
fn quote(line: &str) -> String {
    match line.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("{:?}…", &line[..cut]),
        None => format!("{line:?}"),
    }
}

/// Parse decoded (decompressed) `raw` bytes: JSON as a timeline, other
/// text as folded stacks, anything else as pprof. A [`CountOverflow`] is
/// returned as it is, other errors say which format was tried.
fn parse_decoded(raw: &[u8]) -> Result<(Profile, InputFormat)> {
    if raw.is_empty() {
        bail!("the file is empty");
    }
    if timeline::looks_like_json(raw) {
        let profile = timeline::parse_timeline(raw)
            .context("it is JSON, but not a Firefox Profiler timeline")?;
        return Ok((profile, InputFormat::Timeline));
    }
    if let Some(text) = as_text(raw) {
        let head = text.trim_start();
        if head.starts_with("<?xml") || head.starts_with("<svg") {
            bail!(
                "it is an SVG flame graph, which cannot be read back: \
                 give the folded, pprof or Firefox output of the same run"
            );
        }
        let profile = parse_folded(text).map_err(|err| {
            if err.is::<CountOverflow>() {
                err
            } else {
                err.context("it is text, but not folded stacks")
            }
        })?;
        return Ok((profile, InputFormat::Folded));
    }
    // Decoded in place (the collector's decode_body would copy `raw`),
    // then checked as the collector checks a body; else OTLP.
    let pprof = proto::Profile::decode(raw)
        .map_err(|err| format!("it does not decode as one ({err})"))
        .and_then(|proto| merge::validate(&proto).map(|()| proto));
    match pprof {
        Ok(proto) => Ok((merge::profile_from_pprof(&proto), InputFormat::Pprof)),
        Err(why) => match crate::profile::format::otlp::read::decode(raw) {
            Ok(profile) => Ok((profile, InputFormat::Otlp)),
            Err(otlp) => match crate::profile::format::perfetto::read::decode(raw) {
                Ok(profile) => Ok((profile, InputFormat::Perfetto)),
                Err(perfetto) => bail!(
                    "it is binary, but not a pprof profile: {why} (nor OTLP: {otlp:#}; nor a \
                     Perfetto trace: {perfetto:#})"
                ),
            },
        },
    }
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
/// of the same name. Errors on a line without a count, when there is no
/// line at all, or ([`CountOverflow`]) when the counts add up to more
/// than a `u64` holds: the profile's total fits, and so does every sum of
/// some of its samples.
pub fn parse_folded(text: &str) -> Result<Profile> {
    let mut profile = Profile::default();
    let mut total: u64 = 0;
    let mut frames: HashMap<(FrameKind, &str), usize> = HashMap::new();
    // Lines of the same stack are one sample; names are shared.
    let mut samples: HashMap<&str, usize> = HashMap::new();
    let mut comms: HashMap<&str, Arc<str>> = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        let Some((stack, count)) = line.rsplit_once(' ') else {
            bail!("line {} has no count: {}", number + 1, quote(line));
        };
        let Ok(count) = count.parse::<u64>() else {
            bail!(
                "line {} does not end in a count: {}",
                number + 1,
                quote(line)
            );
        };
        total = total.checked_add(count).ok_or(CountOverflow {
            line: number + 1,
            count,
        })?;
        if let Some(&index) = samples.get(stack) {
            // At most the total, which fits.
            profile.samples[index].count += count;
            continue;
        }
        let mut names = stack.split(';');
        let comm = names.next().unwrap_or_default();
        let comm = comms.entry(comm).or_insert_with(|| Arc::from(comm)).clone();
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
            off_cpu_ns: 0,
        };
        for name in names {
            let (kind, name) = if let Some(kernel) = name.strip_suffix(KERNEL_SUFFIX) {
                (FrameKind::Kernel, kernel)
            } else if name.starts_with("[unwind: ") {
                if let Some(status) = marked_status(name) {
                    sample.unwind_status = status;
                }
                (FrameKind::UnwindMarker, name)
            } else {
                (FrameKind::User, name)
            };
            let index = *frames.entry((kind, name)).or_insert_with(|| {
                let name: Arc<str> = Arc::from(name);
                profile.frames.push(Frame {
                    kind,
                    address: 0,
                    mapping: None,
                    lines: vec![Line {
                        function: name.clone(),
                        system_name: name,
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
        samples.insert(stack, profile.samples.len());
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
    use crate::profile::format::folded;
    use crate::profile::format::folded::tests::sample_profile;

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
        use crate::profile::format::pprof::{encode, Compression};
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
        let table = crate::commands::compare::function_table(&profile, false).unwrap();
        let main = &table.functions[&crate::commands::compare::FunctionKey {
            name: Arc::from("main"),
            object: None,
        }];
        assert_eq!((main.self_samples, main.inclusive), (5, 8));
    }

    #[test]
    fn lines_of_one_stack_are_one_sample() {
        let profile = parse_folded("app;main;a 1\napp;main 4\napp;main;a 2\n").unwrap();
        assert_eq!(profile.samples.len(), 2);
        assert_eq!(profile.samples[0].count, 3);
        assert_eq!(profile.total_samples(), 7);
        assert!(Arc::ptr_eq(
            &profile.samples[0].process_comm,
            &profile.samples[1].process_comm
        ));
    }

    #[test]
    fn saturated_counts_are_an_error_naming_the_line() {
        let max = u64::MAX;
        // One saturated line is a valid profile.
        let one = parse_folded(&format!("app;main;a {max}\n")).unwrap();
        assert_eq!(one.total_samples(), max);
        let text = format!("app;main;a {max}\n\napp;main;b {max}\n");
        let err = parse_profile(text.as_bytes()).unwrap_err();
        let overflow = err
            .downcast_ref::<CountOverflow>()
            .expect("a CountOverflow");
        assert_eq!((overflow.line, overflow.count), (3, max));
        assert_eq!(
            err.to_string(),
            format!("line 3: its count {max} brings the total past {max} samples")
        );
    }

    #[test]
    fn decoding_stops_at_the_limit() {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let mib = 1 << 20;
        let zeros = vec![0u8; 2 * mib];
        let mut gzip = GzEncoder::new(Vec::new(), Compression::fast());
        gzip.write_all(&zeros).unwrap();
        let gzip = gzip.finish().unwrap();
        let err = decode(gzip.as_slice(), gzip.len() as u64, mib as u64).unwrap_err();
        let too_large = err.downcast_ref::<InputTooLarge>().expect("InputTooLarge");
        assert!(too_large.gzip);
        assert_eq!(
            err.to_string(),
            "it decompresses to more than 1 MiB, the limit of --max-input-mb"
        );
        // Exactly the limit is read; one byte more is refused.
        let raw = &zeros[..mib];
        assert_eq!(decode(raw, 0, mib as u64).unwrap().len(), mib);
        let err = decode(&zeros[..mib + 1], 0, mib as u64).unwrap_err();
        assert_eq!(
            err.to_string(),
            "it is more than 1 MiB, the limit of --max-input-mb"
        );
        assert_eq!(decode(gzip.as_slice(), 0, 2 * mib as u64).unwrap(), zeros);
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
        // A long line is quoted in part.
        let long = format!("main;{} x\n", "f".repeat(5000));
        let message = format!("{:#}", parse_profile(long.as_bytes()).unwrap_err());
        assert!(message.contains("does not end in a count"), "{message}");
        assert!(message.len() < 300 && message.contains('…'), "{message}");
        // An SVG flame graph is named as one, without quoting it.
        let svg = format!(
            "<?xml version=\"1.0\" standalone=\"no\"?><svg {}>\n",
            "a ".repeat(500)
        );
        let message = format!("{:#}", parse_profile(svg.as_bytes()).unwrap_err());
        assert!(message.contains("SVG flame graph"), "{message}");
        assert!(message.len() < 300, "{message}");
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
