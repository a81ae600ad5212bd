//! pprof protobuf encoding (`proto/profile.proto`, generated with prost).
//!
//! Shape of what is written: sample types `samples/count` and
//! `cpu/nanoseconds` (count × period); period type `cpu/nanoseconds` with
//! period = 1e9 / sampling frequency; one Mapping per profile mapping
//! (object and load range; the kernel is `[kernel.kallsyms]`), the first
//! the one pprof readers present as the profiled program: the executable
//! `record`'s command or the `--pids` started in, the kernel for the whole
//! machine (see `first_mapping`); one Location
//! per distinct frame (mapping, address), with inlined functions as several
//! lines, innermost first; Functions deduplicated by (name, system name,
//! file); labels `pid`, `tid` (numeric), `comm` and `thread_name` on every
//! sample. Stacks whose walk stopped early end in a location named after the
//! unwind result, as in the other formats. What the profile shows and where
//! it was taken are comments (`go tool pprof -comments`): `subject: pid 42
//! (nginx)` and `host: web-1`, read back by `report` and `diff`.

use std::collections::HashMap;
use std::io::Write;

use anyhow::{Context, Result};
use flate2::write::GzEncoder;
use prost::Message;

use crate::profile::{FrameKind, Profile};

/// Types generated from `proto/profile.proto` (package `perftools.profiles`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

/// Prefix of the comment that holds [`Profile::subject`].
pub const SUBJECT_COMMENT: &str = "subject: ";
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
    encode: |profile, compression, out| Ok(out.write_all(&encode(profile, compression)?)?),
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

/// Build the pprof message for `profile`.
pub fn to_proto(profile: &Profile) -> proto::Profile {
    let mut strings = Strings::new();
    let period = profile.period_ns() as i64;
    let value_type = |strings: &mut Strings, t: &str, u: &str| proto::ValueType {
        r#type: strings.get(t),
        unit: strings.get(u),
    };
    let sample_type = vec![
        value_type(&mut strings, "samples", "count"),
        value_type(&mut strings, "cpu", "nanoseconds"),
    ];
    let period_type = Some(value_type(&mut strings, "cpu", "nanoseconds"));
    let mapping = mappings(profile, &mut strings);
    let (location, function) = locations(profile, &mut strings);
    let sample = samples(profile, period, &mut strings);
    let default_sample_type = strings.get("cpu");
    let comment = [
        (SUBJECT_COMMENT, &profile.subject),
        (HOST_COMMENT, &profile.host),
    ]
    .into_iter()
    .filter_map(|(prefix, value)| Some(strings.get(&format!("{prefix}{}", value.as_deref()?))))
    .collect();
    proto::Profile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: profile.start_unix_ns as i64,
        duration_nanos: profile.duration_ns as i64,
        period_type,
        period,
        comment,
        default_sample_type,
    }
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
/// lines, innermost first as in the profile), and the functions they name,
/// each (name, system name, file) once.
fn locations(
    profile: &Profile,
    strings: &mut Strings,
) -> (Vec<proto::Location>, Vec<proto::Function>) {
    let mut functions: Vec<proto::Function> = Vec::new();
    let mut function_ids: HashMap<(i64, i64, i64), u64> = HashMap::new();
    let locations = profile
        .frames
        .iter()
        .enumerate()
        .map(|(i, frame)| {
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
            proto::Location {
                id: i as u64 + 1,
                mapping_id: frame.mapping.map_or(0, |m| m as u64 + 1),
                address: if frame.kind == FrameKind::UnwindMarker {
                    0
                } else {
                    frame.address
                },
                line,
                is_folded: false,
            }
        })
        .collect();
    (locations, functions)
}

/// One pprof sample per profile sample: its location ids, `[count, count *
/// period_ns]`, and the pid, tid, comm and thread_name labels.
fn samples(profile: &Profile, period: i64, strings: &mut Strings) -> Vec<proto::Sample> {
    let (pid, tid, comm, thread_name) = (
        strings.get("pid"),
        strings.get("tid"),
        strings.get("comm"),
        strings.get("thread_name"),
    );
    profile
        .samples
        .iter()
        .map(|s| proto::Sample {
            location_id: s.frames.iter().map(|&f| f as u64 + 1).collect(),
            value: vec![s.count as i64, s.count as i64 * period],
            label: vec![
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
            ],
        })
        .collect()
}

/// Encode `profile` as pprof bytes, gzip'd or not.
pub fn encode(profile: &Profile, compression: Compression) -> Result<Vec<u8>> {
    let bytes = to_proto(profile).encode_to_vec();
    match compression {
        Compression::None => Ok(bytes),
        Compression::Gzip => {
            let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&bytes)
                .context("gzip-compressing the pprof profile")?;
            gz.finish().context("gzip-compressing the pprof profile")
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::Arc;

    use super::*;
    use crate::format::folded::tests::sample_profile;
    use crate::profile::ProfileMapping;

    fn decode(bytes: &[u8]) -> proto::Profile {
        proto::Profile::decode(bytes).unwrap()
    }

    fn string(p: &proto::Profile, i: i64) -> &str {
        &p.string_table[i as usize]
    }

    #[test]
    fn header_fields_and_string_table() {
        let p = decode(&encode(&sample_profile(), Compression::None).unwrap());
        assert_eq!(p.string_table[0], "");
        let mut seen = std::collections::HashSet::new();
        assert!(
            p.string_table.iter().all(|s| seen.insert(s)),
            "strings are unique"
        );
        let types: Vec<(&str, &str)> = p
            .sample_type
            .iter()
            .map(|t| (string(&p, t.r#type), string(&p, t.unit)))
            .collect();
        assert_eq!(types, vec![("samples", "count"), ("cpu", "nanoseconds")]);
        let pt = p.period_type.as_ref().unwrap();
        assert_eq!(
            (string(&p, pt.r#type), string(&p, pt.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(p.period, 10_000_000, "1e9 / 100 Hz");
        assert_eq!(string(&p, p.default_sample_type), "cpu");
        assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.duration_nanos, 2_000_000_000);
        assert!(p.comment.is_empty(), "no subject, no host: no comment");
    }

    #[test]
    fn subject_and_host_are_comments_read_back() {
        let mut profile = sample_profile();
        profile.subject = Some("./bench 150 '150 ms'".into());
        profile.host = Some("web-1".into());
        let p = decode(&encode(&profile, Compression::None).unwrap());
        let comments: Vec<&str> = p.comment.iter().map(|&i| string(&p, i)).collect();
        assert_eq!(comments, ["subject: ./bench 150 '150 ms'", "host: web-1"]);
        let back = crate::collector::merge::profile_from_pprof(&p);
        assert_eq!(back.subject.as_deref(), Some("./bench 150 '150 ms'"));
        assert_eq!(back.host.as_deref(), Some("web-1"));
    }

    #[test]
    fn samples_values_labels_and_dedup() {
        let profile = sample_profile();
        let p = decode(&encode(&profile, Compression::None).unwrap());
        assert_eq!(p.sample.len(), 3);
        let total: i64 = p.sample.iter().map(|s| s.value[0]).sum();
        let cpu: i64 = p.sample.iter().map(|s| s.value[1]).sum();
        assert_eq!(total as u64, profile.total_samples());
        assert_eq!(cpu, total * 10_000_000);
        let s = &p.sample[0];
        assert_eq!(s.location_id, vec![1, 2, 3, 4]);
        let labels: Vec<(&str, String)> = s
            .label
            .iter()
            .map(|l| {
                let v = if l.str != 0 {
                    string(&p, l.str).to_string()
                } else {
                    l.num.to_string()
                };
                (string(&p, l.key), v)
            })
            .collect();
        assert_eq!(
            labels,
            vec![
                ("pid", "7".to_string()),
                ("tid", "7".to_string()),
                ("comm", "app".to_string()),
                ("thread_name", "worker;1".to_string())
            ]
        );
        // Five frames -> five locations; six distinct functions; the frame
        // with an inlined call has two lines, innermost first.
        assert_eq!(p.location.len(), 5);
        assert_eq!(p.function.len(), 6);
        let inl = &p.location[2];
        let names: Vec<&str> = inl
            .line
            .iter()
            .map(|l| string(&p, p.function[l.function_id as usize - 1].name))
            .collect();
        assert_eq!(names, vec!["inner_inlined", "c"]);
        // The truncated stack ends in the unwind marker.
        let last = *p.sample[2].location_id.last().unwrap();
        let marker = &p.location[last as usize - 1];
        assert_eq!(
            string(&p, p.function[marker.line[0].function_id as usize - 1].name),
            "[unwind: truncated]"
        );
    }

    #[test]
    fn mapping_flags_follow_symbolization() {
        let mut profile = sample_profile();
        profile.mappings = vec![
            ProfileMapping {
                start: 0x1000,
                limit: 0x3000,
                file_offset: 0,
                filename: "/bin/app".into(),
                build_id: Some("abcd".into()),
            },
            ProfileMapping {
                start: 0xffff_0000,
                limit: 0xffff_1000,
                file_offset: 0,
                filename: "[kernel.kallsyms]".into(),
                build_id: None,
            },
        ];
        profile.frames[0].mapping = Some(1);
        profile.frames[1].mapping = Some(1);
        profile.frames[2].mapping = Some(0);
        profile.frames[3].mapping = Some(0);
        profile.frames[3].symbolized = false;
        let p = decode(&encode(&profile, Compression::None).unwrap());
        let app = &p.mapping[0];
        assert_eq!(string(&p, app.filename), "/bin/app");
        assert_eq!(string(&p, app.build_id), "abcd");
        assert_eq!((app.memory_start, app.memory_limit), (0x1000, 0x3000));
        assert!(app.has_functions, "symbolized frames have functions");
        assert!(!app.has_filenames && !app.has_line_numbers && !app.has_inline_frames);
        // One frame with DWARF lines is enough to say the mapping has them.
        profile.frames[2].lines[0].file = Some("app.c".into());
        profile.frames[2].lines[0].line = Some(3);
        let p = decode(&encode(&profile, Compression::None).unwrap());
        let app = &p.mapping[0];
        assert!(app.has_filenames && app.has_line_numbers && app.has_inline_frames);
        let kernel = &p.mapping[1];
        assert!(kernel.has_functions);
        assert!(!kernel.has_filenames && !kernel.has_line_numbers);
        assert_eq!(p.location[2].mapping_id, 1);
        assert_eq!(p.location[0].mapping_id, 2);
    }

    #[test]
    fn the_first_mapping_is_the_profiled_program() {
        let mut profile = sample_profile();
        let mapping = |filename: &str, start| ProfileMapping {
            start,
            limit: start + 0x1000,
            file_offset: 0,
            filename: filename.into(),
            build_id: None,
        };
        profile.mappings = vec![
            mapping("[kernel.kallsyms]", 0xffff_0000),
            mapping("/lib/libc.so.6", 0x7000),
            mapping("/bin/app", 0x1000),
        ];
        profile.frames[0].mapping = Some(0);
        profile.frames[1].mapping = Some(0);
        profile.frames[2].mapping = Some(1);
        profile.frames[3].mapping = Some(2);
        // Another process, sampled most, whose stacks start in libc.
        let mut other = profile.samples[2].clone();
        (other.pid, other.count) = (9, 100);
        profile.samples.push(other);
        let first = |profile: &Profile| {
            let p = decode(&encode(profile, Compression::None).unwrap());
            p.mapping
                .iter()
                .map(|m| (m.id, string(&p, m.filename).to_string()))
                .collect::<Vec<_>>()
        };
        let owned = |names: &[(u64, &str)]| -> Vec<(u64, String)> {
            names.iter().map(|&(id, n)| (id, n.to_string())).collect()
        };
        // pid 7's 7 samples start in main (/bin/app); its truncated one's
        // outermost user frame is c (libc here), behind its unwind marker.
        profile.targets = Some(Arc::from([7]));
        let app_first = owned(&[
            (3, "/bin/app"),
            (1, "[kernel.kallsyms]"),
            (2, "/lib/libc.so.6"),
        ]);
        assert_eq!(first(&profile), app_first);
        // Most of its samples cut short in libc (a shell stopped in
        // `__libc_vfork`): its whole stacks still decide.
        let mut cut = profile.samples[2].clone();
        cut.count = 50;
        profile.samples.push(cut);
        assert_eq!(first(&profile), app_first);
        profile.samples.pop();
        // The whole machine: the kernel, not the process sampled most.
        profile.targets = Some(Arc::from([]));
        let kernel_first = owned(&[
            (1, "[kernel.kallsyms]"),
            (2, "/lib/libc.so.6"),
            (3, "/bin/app"),
        ]);
        assert_eq!(first(&profile), kernel_first);
        profile.mappings.swap(0, 2);
        profile.frames[0].mapping = Some(2);
        profile.frames[1].mapping = Some(2);
        profile.frames[3].mapping = Some(0);
        let p = decode(&encode(&profile, Compression::None).unwrap());
        assert_eq!(string(&p, p.mapping[0].filename), "[kernel.kallsyms]");
        assert_eq!(p.mapping[0].id, 3);
        // Unknown targets (read back, merged): the order stays.
        profile.targets = None;
        let kept = owned(&[
            (1, "/bin/app"),
            (2, "/lib/libc.so.6"),
            (3, "[kernel.kallsyms]"),
        ]);
        assert_eq!(first(&profile), kept);
        assert_eq!(p.location[3].mapping_id, 1);
    }

    #[test]
    fn gzip_round_trips() {
        let raw = encode(&sample_profile(), Compression::None).unwrap();
        let gz = encode(&sample_profile(), Compression::Gzip).unwrap();
        assert_eq!(&gz[..2], &[0x1f, 0x8b]);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, raw);
    }
}
