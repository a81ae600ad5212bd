//! pprof protobuf encoding (`proto/profile.proto`, generated with prost).
//!
//! Shape of what is written: sample types `samples/count` and
//! `cpu/nanoseconds` (count × period), and with off-CPU waits recorded
//! (`--off-cpu`, [`Profile::off_cpu`]) a third, `off_cpu/nanoseconds`: the
//! time threads spent off their CPU with each stack (`go tool pprof
//! -sample_index=off_cpu`); a stack only seen waiting has 0 samples and a
//! stack only seen running 0 off-CPU ns. Period type `cpu/nanoseconds` with
//! period = 1e9 / sampling frequency; one Mapping per profile mapping
//! (object and load range; the kernel is `[kernel.kallsyms]`), the first
//! the one pprof readers present as the profiled program: the executable
//! `record`'s command or the `--pids` started in, the kernel for the whole
//! machine (see `first_mapping`); one Location
//! per distinct frame (mapping, address), with inlined functions as several
//! lines, innermost first; Functions deduplicated by (name, system name,
//! file); labels `pid`, `tid` (numeric), `comm` and `thread_name` on every
//! sample, and `container.id` on those of a process that ran in a container. Stacks whose walk stopped early end in a location named after the
//! unwind result, as in the other formats. What the profile shows and where
//! it was taken are comments (`go tool pprof -comments`): `subject: pid 42
//! (nginx)` and `host: web-1`, read back by `report` and `diff`.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result};
use flate2::write::GzEncoder;

use crate::profile::{FrameKind, Profile};
use parts::{Parts, Stream};

mod parts;

/// Types generated from `proto/profile.proto` (package `perftools.profiles`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// Prefix of the comment that holds [`Profile::subject`].
pub const SUBJECT_COMMENT: &str = "subject: ";
/// The sample type of off-CPU time (unit nanoseconds).
pub const OFF_CPU_TYPE: &str = "off_cpu";

/// Prefix of the comment that holds [`Profile::host`].
pub const HOST_COMMENT: &str = "host: ";

/// The registry entry: `pprof`, `profile.pb`, the protobuf MIME type the
/// remote sender and the collector use. An empty profile is a valid pprof.
pub const SPEC: super::FormatSpec = super::FormatSpec {
    name: "pprof",
    aliases: &["pb", "protobuf"],
    noun: "pprof profile",
    help: "pprof protobuf (`go tool pprof`); default file name profile.pb",
    default_file_name: "profile.pb",
    mime_type: "application/vnd.google.protobuf",
    encodes_empty: true,
    timeline: false,
    off_cpu: false,
    encode: write,
};

/// Whether the written pprof is gzip-compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Raw protobuf bytes.
    #[default]
    None,
    /// gzip-compressed protobuf (what `go tool pprof` and HTTP receivers prefer).
    Gzip,
}

/// The string table under construction: index 0 is always "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, value: &str) -> i64 {
        if let Some(&i) = self.index.get(value) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(value.to_string());
        self.index.insert(value.to_string(), i);
        i
    }
}

/// Build the pprof message for `profile` in memory (the collector's merge
/// reads lightswitch's own profiles this way).
pub fn to_proto(profile: &Profile) -> proto::Profile {
    let mut message = proto::Profile::default();
    build(profile, &mut message).expect("collecting into memory cannot fail");
    message
}

/// Build the pprof message for `profile`, handing its parts to `parts` as
/// they are made: mappings, then one location at a time, the functions,
/// one sample at a time, and last the header fields with the string table
/// (each string's index is fixed when first used, so the table can only
/// come last; protobuf readers take fields in any order).
fn build(profile: &Profile, parts: &mut dyn Parts) -> Result<()> {
    let mut strings = Strings::new();
    let period = profile.period_ns() as i64;
    let value_type = |strings: &mut Strings, t: &str, u: &str| proto::ValueType {
        r#type: strings.get(t),
        unit: strings.get(u),
    };
    let mut sample_type = vec![
        value_type(&mut strings, "samples", "count"),
        value_type(&mut strings, "cpu", "nanoseconds"),
    ];
    if profile.off_cpu {
        sample_type.push(value_type(&mut strings, OFF_CPU_TYPE, "nanoseconds"));
    }
    let period_type = Some(value_type(&mut strings, "cpu", "nanoseconds"));
    for mapping in mappings(profile, &mut strings) {
        parts.mapping(mapping)?;
    }
    for function in locations(profile, &mut strings, parts)? {
        parts.function(function)?;
    }
    samples(profile, period, &mut strings, parts)?;
    let default_sample_type = strings.get("cpu");
    let comment = [
        (SUBJECT_COMMENT, &profile.subject),
        (HOST_COMMENT, &profile.host),
    ]
    .into_iter()
    .filter_map(|(prefix, value)| Some(strings.get(&format!("{prefix}{}", value.as_deref()?))))
    .collect();
    parts.rest(proto::Profile {
        sample_type,
        string_table: strings.table,
        time_nanos: profile.start_unix_ns as i64,
        duration_nanos: profile.duration_ns as i64,
        period_type,
        period,
        comment,
        default_sample_type,
        ..Default::default()
    })
}

/// One pprof mapping per profile mapping (ids from 1). Their has_* flags
/// say what symbolization found for them: set when any of the mapping's
/// frames got functions, file names, line numbers (pprof's reading: these
/// kinds of information are present, do not re-symbolize for them). A
/// binary with DWARF still has frames without (crt1's `_start`); that does
/// not make its DWARF absent.
fn mappings(profile: &Profile, strings: &mut Strings) -> Vec<proto::Mapping> {
    let mut mappings: Vec<proto::Mapping> = profile
        .mappings
        .iter()
        .enumerate()
        .map(|(i, m)| proto::Mapping {
            id: i as u64 + 1,
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.file_offset,
            filename: strings.get(&m.filename),
            build_id: strings.get(m.build_id.as_deref().unwrap_or("")),
            ..Default::default()
        })
        .collect();
    for frame in profile.frames.iter().filter(|f| f.symbolized) {
        let Some(m) = frame.mapping else { continue };
        let mapping = &mut mappings[m];
        let files = frame.lines.iter().any(|l| l.file.is_some());
        mapping.has_functions = true;
        mapping.has_filenames |= files;
        mapping.has_line_numbers |= frame.lines.iter().any(|l| l.line.is_some());
        // Inlined frames are expanded from DWARF, which is also where file
        // names come from: with them, inlining was resolved.
        mapping.has_inline_frames |= files;
    }
    // pprof takes the first mapping for the main binary ("File:" in its
    // reports); ids stay as they are, so the locations' references hold.
    if let Some(main) = first_mapping(profile) {
        mappings[..=main].rotate_right(1);
    }
    mappings
}

/// The index of the mapping pprof readers should present as the profiled
/// program, by [`Profile::targets`]: for chosen processes (`record`'s
/// command, `--pids`) the mapping most of their samples started in, that
/// of each sample's outermost user frame (`_start`, `main`: the program's
/// executable), weighted by count (all samples' when theirs have no user
/// frame); for the whole machine the kernel's, as no one program is its
/// binary (`None` without kernel frames: the order stays). `None` as well
/// when the targets are unknown (a profile read back or merged keeps its
/// order).
fn first_mapping(profile: &Profile) -> Option<usize> {
    let targets = profile.targets.as_deref()?;
    if targets.is_empty() {
        return profile
            .frames
            .iter()
            .find(|f| f.kind == FrameKind::Kernel)
            .and_then(|f| f.mapping);
    }
    let target = |pid: u32| targets.contains(&pid);
    started_in(profile, target, true)
        .or_else(|| started_in(profile, target, false))
        .or_else(|| started_in(profile, |_| true, false))
}

/// The mapping most of the samples of the processes `chosen` picks started
/// in (their outermost user frame's), weighted by count; with `whole_only`,
/// only samples whose walk reached the outermost frame (no unwind marker:
/// a shell's stacks cut short in `__libc_vfork` start in libc, not in the
/// shell). `None` when none of them has a user frame.
fn started_in(profile: &Profile, chosen: impl Fn(u32) -> bool, whole_only: bool) -> Option<usize> {
    let mut weight: HashMap<usize, u64> = HashMap::new();
    let whole = |frames: &[usize]| {
        frames.iter().all(|&f| {
            profile
                .frames
                .get(f)
                .is_none_or(|frame| frame.kind != FrameKind::UnwindMarker)
        })
    };
    let counted = profile
        .samples
        .iter()
        .filter(|s| chosen(s.pid) && (!whole_only || whole(&s.frames)));
    for sample in counted {
        let outermost = sample.frames.iter().rev().find_map(|&f| {
            let frame = profile.frames.get(f)?;
            (frame.kind == FrameKind::User).then_some(frame.mapping)?
        });
        if let Some(m) = outermost {
            *weight.entry(m).or_default() += sample.count;
        }
    }
    weight
        .into_iter()
        .max_by_key(|&(m, count)| (count, std::cmp::Reverse(m)))
        .map(|(m, _)| m)
}

/// One location per profile frame (ids from 1; inlined functions as extra
/// lines, innermost first as in the profile), handed to `parts` one at a
/// time; the functions they name, each (name, system name, file) once.
fn locations(
    profile: &Profile,
    strings: &mut Strings,
    parts: &mut dyn Parts,
) -> Result<Vec<proto::Function>> {
    let mut functions: Vec<proto::Function> = Vec::new();
    let mut function_ids: HashMap<(i64, i64, i64), u64> = HashMap::new();
    for (i, frame) in profile.frames.iter().enumerate() {
        let line = frame
            .lines
            .iter()
            .map(|l| {
                let key = (
                    strings.get(&l.function),
                    strings.get(&l.system_name),
                    strings.get(l.file.as_deref().unwrap_or("")),
                );
                let id = *function_ids.entry(key).or_insert_with(|| {
                    functions.push(proto::Function {
                        id: functions.len() as u64 + 1,
                        name: key.0,
                        system_name: key.1,
                        filename: key.2,
                        start_line: 0,
                    });
                    functions.len() as u64
                });
                proto::Line {
                    function_id: id,
                    line: l.line.map_or(0, i64::from),
                    column: 0,
                }
            })
            .collect();
        parts.location(proto::Location {
            id: i as u64 + 1,
            mapping_id: frame.mapping.map_or(0, |m| m as u64 + 1),
            address: if frame.kind == FrameKind::UnwindMarker {
                0
            } else {
                frame.address
            },
            line,
            is_folded: false,
        })?;
    }
    Ok(functions)
}

/// One pprof sample per profile sample, handed to `parts` one at a time:
/// its location ids, `[count, count * period_ns]` (then its off-CPU ns when
/// the profile has off-CPU time), and the pid, tid, comm and thread_name
/// labels (and container.id, when the process had one).
fn samples(
    profile: &Profile,
    period: i64,
    strings: &mut Strings,
    parts: &mut dyn Parts,
) -> Result<()> {
    let (pid, tid, comm, thread_name) = (
        strings.get("pid"),
        strings.get("tid"),
        strings.get("comm"),
        strings.get("thread_name"),
    );
    let container_key = (!profile.containers.is_empty()).then(|| strings.get("container.id"));
    for s in &profile.samples {
        let container = container_key.and_then(|key| {
            Some(proto::Label {
                key,
                str: strings.get(profile.containers.get(&s.pid)?),
                ..Default::default()
            })
        });
        parts.sample(proto::Sample {
            location_id: s.frames.iter().map(|&f| f as u64 + 1).collect(),
            value: if profile.off_cpu {
                vec![s.count as i64, s.count as i64 * period, s.off_cpu_ns as i64]
            } else {
                vec![s.count as i64, s.count as i64 * period]
            },
            label: [
                proto::Label {
                    key: pid,
                    num: s.pid.into(),
                    ..Default::default()
                },
                proto::Label {
                    key: tid,
                    num: s.tid.into(),
                    ..Default::default()
                },
                proto::Label {
                    key: comm,
                    str: strings.get(&s.process_comm),
                    ..Default::default()
                },
                proto::Label {
                    key: thread_name,
                    str: strings.get(&s.thread_comm),
                    ..Default::default()
                },
            ]
            .into_iter()
            .chain(container)
            .collect(),
        })?;
    }
    Ok(())
}

/// Encode `profile` as pprof bytes, gzip'd or not.
pub fn encode(profile: &Profile, compression: Compression) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    write(profile, compression, &mut bytes)?;
    Ok(bytes)
}

/// Write `profile` to `out` as pprof bytes, gzip'd or not, encoding each
/// location and sample as it is made: the `proto::Profile` is never whole
/// in memory (the bytes are, where `out` collects them: [`encode`], for
/// the remote senders). Issue 18: a 10 s window under process churn (11,000 samples,
/// 67,000 locations) built as one `proto::Profile` took 12 MiB more, plus
/// its 4 MiB encoding, on top of the profile itself, at every window close.
pub fn write(profile: &Profile, compression: Compression, out: &mut dyn Write) -> Result<()> {
    match compression {
        Compression::None => {
            let mut stream = Stream::new(out);
            build(profile, &mut stream)?;
            stream.flush()
        }
        Compression::Gzip => {
            let mut gz = GzEncoder::new(out, flate2::Compression::default());
            let mut stream = Stream::new(&mut gz);
            build(profile, &mut stream)?;
            stream.flush()?;
            gz.finish().context("gzip-compressing the pprof profile")?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
