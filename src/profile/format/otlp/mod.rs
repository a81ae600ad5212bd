//! OpenTelemetry profiles (OTLP, `opentelemetry.proto.profiles.v1development`,
//! proto v1.10.0/v1.11.0 wire): a binary protobuf `ExportProfilesServiceRequest`,
//! the body an OTLP/HTTP receiver takes at `/v1development/profiles`, built
//! with the types prost generates from `proto/otlp/`.
//!
//! Shape of what is written:
//! - one `ResourceProfiles` (resource attribute `host.name`:
//!   [`Profile::host`]), one `ScopeProfiles` (scope `lightswitch` and its
//!   version), one `Profile` for the run or window;
//! - the `Profile`'s `time_unix_nano` and `duration_nano` are the window's
//!   ([`Profile::start_unix_ns`], [`Profile::duration_ns`]), widened to hold
//!   the few samples taken just before its start or counted in it late, so
//!   that every timestamp lies in `[time, time + duration)`;
//! - `sample_type` samples/count, `period_type` cpu/nanoseconds, `period`
//!   1e9 / sampling frequency;
//! - one `Sample` per (stack, attribute set). With a timeline
//!   ([`Profile::timeline`]) each carries `timestamps_unix_nano`, the time of
//!   every sample it stands for, in time order, and no `values` (the spec's
//!   "timestamps only" shape: each timestamp counts 1); without one (a
//!   profile read back or merged) each carries `values` = `[count]` and no
//!   timestamps. Timestamps are the window's start on the wall clock plus
//!   each sample's BPF timestamp's offset from the window's start
//!   (CLOCK_MONOTONIC differences), as in the Firefox format;
//! - sample attributes by the semantic conventions: `process.pid`,
//!   `thread.id` (integers), `thread.name`, `process.executable.name` (the
//!   process's `comm`, the executable's base name as the kernel keeps it,
//!   at most 15 bytes), and `container.id` for a process that ran in a
//!   container ([`Profile::containers`]);
//! - one `Mapping` per profile mapping, with its file name (the kernel is
//!   `[kernel.kallsyms]`) and its GNU build ID as the attribute
//!   `process.executable.build_id.gnu` (hex); one `Location` per profile
//!   frame, inlined functions as extra `Line`s, innermost first, with the
//!   attribute `profile.frame.type` `kernel` or `native`; a stack whose walk
//!   stopped early ends in a location without mapping or address named
//!   `[unwind: ...]`, as in the other formats;
//! - with off-CPU waits recorded (`--off-cpu`, [`Profile::off_cpu`]), a
//!   second `Profile` in the same scope with `sample_type`
//!   off_cpu/nanoseconds: one `Sample` per (stack, attribute set) that
//!   waited, with each wait's length in `values` and its start in the
//!   parallel `timestamps_unix_nano` (with a timeline, [`Profile::waits`]),
//!   else its total off-CPU ns as the one value;
//! - index 0 of every dictionary table is its zero element, and nothing
//!   else is stored twice.

mod dictionary;
pub mod read;

use std::collections::HashMap;
use std::io::Write;

use anyhow::{bail, Context, Result};
use flate2::write::GzEncoder;
use prost::Message;

use super::{Compression, FormatSpec};
use crate::profile::{FrameKind, Profile};
use dictionary::{index, Dictionary, Value};
use proto::collector::ExportProfilesServiceRequest;
use proto::common::{any_value, AnyValue, InstrumentationScope, KeyValue};
use proto::profiles::{self as otlp, ResourceProfiles, ScopeProfiles};

#[allow(missing_docs, clippy::all)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/otlp.rs"));
}

/// Types generated from `proto/otlp/` by prost, one module per package.
pub mod proto {
    /// `opentelemetry.proto.collector.profiles.v1development`: the export
    /// request and response.
    pub use super::generated::opentelemetry::proto::collector::profiles::v1development as collector;
    /// `opentelemetry.proto.common.v1`: values, key-values, scopes.
    pub use super::generated::opentelemetry::proto::common::v1 as common;
    /// `opentelemetry.proto.profiles.v1development`: profiles and their dictionary.
    pub use super::generated::opentelemetry::proto::profiles::v1development as profiles;
    /// `opentelemetry.proto.resource.v1`: the resource.
    pub use super::generated::opentelemetry::proto::resource::v1 as resource;
}

/// Semantic-convention attribute keys the encoder writes (and `read` reads).
pub mod keys {
    /// Resource: the host the samples were taken on (string).
    pub const HOST_NAME: &str = "host.name";
    /// Sample: the process id (integer).
    pub const PROCESS_PID: &str = "process.pid";
    /// Sample: the thread id (integer).
    pub const THREAD_ID: &str = "thread.id";
    /// Sample: the thread's name (string).
    pub const THREAD_NAME: &str = "thread.name";
    /// Sample: the process's executable name (its `comm`; string).
    pub const PROCESS_EXECUTABLE_NAME: &str = "process.executable.name";
    /// Sample: the container the process ran in (64 hex digits; string).
    pub const CONTAINER_ID: &str = "container.id";
    /// Mapping: the object's GNU build ID, hex (string).
    pub const BUILD_ID_GNU: &str = "process.executable.build_id.gnu";
    /// Location: `kernel` or `native` (string).
    pub const FRAME_TYPE: &str = "profile.frame.type";
}

/// Name of the instrumentation scope.
pub const SCOPE_NAME: &str = "lightswitch";

/// The registry entry: `otlp`, `profile.otlp.pb`, OTLP/HTTP's content type.
/// An empty profile is a valid request (a profile without samples).
pub const SPEC: FormatSpec = FormatSpec {
    name: "otlp",
    aliases: &["opentelemetry", "otel"],
    noun: "OTLP profile",
    help: "OpenTelemetry profiles (OTLP ExportProfilesServiceRequest protobuf), every sample's \
           time kept; gzip'd with --pprof-compression gzip; default file name profile.otlp.pb",
    default_file_name: "profile.otlp.pb",
    mime_type: "application/x-protobuf",
    encodes_empty: true,
    timeline: true,
    off_cpu: false,
    encode: write,
};

/// Encode `profile` as OTLP bytes, gzip'd or not. Errors as [`to_request`]'s.
pub fn encode(profile: &Profile, compression: Compression) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    write(profile, compression, &mut bytes)?;
    Ok(bytes)
}

/// Write `profile` to `out` as OTLP bytes, gzip'd or not. The request is
/// built whole in memory first (a protobuf message's length precedes it,
/// and the samples sit three messages deep). Errors as [`to_request`]'s,
/// and `out`'s write errors.
pub fn write(profile: &Profile, compression: Compression, out: &mut dyn Write) -> Result<()> {
    let bytes = to_request(profile)?.encode_to_vec();
    match compression {
        Compression::None => out.write_all(&bytes).context("writing the OTLP profile"),
        Compression::Gzip => {
            let mut gz = GzEncoder::new(out, flate2::Compression::default());
            gz.write_all(&bytes)
                .and_then(|()| gz.finish().map(drop))
                .context("writing the gzip'd OTLP profile")
        }
    }
}

/// The OTLP export request for `profile` (see the module docs). Errors
/// when the profile has a timeline that does not hold each of its samples
/// once (a bug of the caller).
pub fn to_request(profile: &Profile) -> Result<ExportProfilesServiceRequest> {
    let timeline_len = profile.timeline.len() as u64;
    if timeline_len != 0 && timeline_len != profile.total_samples() {
        bail!(
            "the profile's timeline holds {timeline_len} samples, its stacks {}",
            profile.total_samples()
        );
    }
    let mut dict = Dictionary::new();
    add_mappings(profile, &mut dict);
    add_locations(profile, &mut dict);
    let (time_unix_nano, duration_nano) = time_range(profile);
    let mut profiles = vec![otlp::Profile {
        sample_type: Some(value_type(&mut dict, "samples", "count")),
        samples: samples(profile, &mut dict)?,
        time_unix_nano,
        duration_nano,
        period_type: Some(value_type(&mut dict, "cpu", "nanoseconds")),
        period: profile.period_ns() as i64,
        ..Default::default()
    }];
    if profile.off_cpu {
        profiles.push(otlp::Profile {
            sample_type: Some(value_type(&mut dict, OFF_CPU_TYPE, "nanoseconds")),
            samples: off_cpu_samples(profile, &mut dict)?,
            time_unix_nano,
            duration_nano,
            ..Default::default()
        });
    }
    let host = profile.host.as_deref().map(|host| KeyValue {
        key: keys::HOST_NAME.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(host.to_string())),
        }),
        ..Default::default()
    });
    Ok(ExportProfilesServiceRequest {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(proto::resource::Resource {
                attributes: host.into_iter().collect(),
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: SCOPE_NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dict.finish()),
    })
}

/// The `sample_type` of the off-CPU profile (unit nanoseconds).
pub const OFF_CPU_TYPE: &str = "off_cpu";

fn value_type(dict: &mut Dictionary, kind: &str, unit: &str) -> otlp::ValueType {
    otlp::ValueType {
        type_strindex: dict.string(kind),
        unit_strindex: dict.string(unit),
    }
}

/// `(time_unix_nano, duration_nano)`: the window, widened to hold every
/// sample of the timeline (offsets before 0 or at or past its end).
fn time_range(profile: &Profile) -> (u64, u64) {
    let offsets = profile.timeline.iter().map(|t| t.offset_ns);
    let first = offsets.clone().min().unwrap_or(0).min(0);
    let window_end = i64::try_from(profile.duration_ns).unwrap_or(i64::MAX);
    let end = offsets
        .max()
        .map_or(window_end, |last| window_end.max(last + 1));
    let start = profile.start_unix_ns.saturating_add_signed(first);
    (start, end.abs_diff(first))
}

/// One mapping per profile mapping, at index `m + 1`.
fn add_mappings(profile: &Profile, dict: &mut Dictionary) {
    for m in &profile.mappings {
        let filename_strindex = dict.string(&m.filename);
        let attribute_indices = m
            .build_id
            .as_deref()
            .map(|id| dict.attribute(keys::BUILD_ID_GNU, Value::Str(id)))
            .into_iter()
            .collect();
        dict.tables().mapping_table.push(otlp::Mapping {
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.file_offset,
            filename_strindex,
            attribute_indices,
        });
    }
}

/// One location per profile frame, at index `i + 1`: its mapping, address
/// (0 for an unwind marker), lines innermost first and frame type.
fn add_locations(profile: &Profile, dict: &mut Dictionary) {
    for frame in &profile.frames {
        let lines = frame
            .lines
            .iter()
            .map(|l| otlp::Line {
                function_index: dict.function(
                    &l.function,
                    &l.system_name,
                    l.file.as_deref().unwrap_or(""),
                ),
                line: l.line.map_or(0, i64::from),
                column: 0,
            })
            .collect();
        let frame_type = match frame.kind {
            FrameKind::Kernel => Some("kernel"),
            FrameKind::User => Some("native"),
            FrameKind::UnwindMarker => None,
        };
        let attribute_indices = frame_type
            .map(|t| dict.attribute(keys::FRAME_TYPE, Value::Str(t)))
            .into_iter()
            .collect();
        dict.tables().location_table.push(otlp::Location {
            mapping_index: frame.mapping.map_or(0, |m| index(m + 1)),
            address: if frame.kind == FrameKind::UnwindMarker {
                0
            } else {
                frame.address
            },
            lines,
            attribute_indices,
        });
    }
}

/// One OTLP sample per (stack, attributes) of the profile's samples (those
/// counted at least once), with the timestamps of the timeline's samples,
/// or without a timeline their counts as values. Errors when the timeline
/// names a sample the profile does not have.
fn samples(profile: &Profile, dict: &mut Dictionary) -> Result<Vec<otlp::Sample>> {
    let mut out: Vec<otlp::Sample> = Vec::new();
    let mut by_identity = HashMap::new();
    let mut slot_of = Vec::with_capacity(profile.samples.len());
    for s in &profile.samples {
        if s.count == 0 {
            slot_of.push(None);
            continue;
        }
        let slot = slot_for(profile, s, dict, &mut by_identity, &mut out);
        slot_of.push(Some(slot));
        if profile.timeline.is_empty() {
            match out[slot].values.first_mut() {
                Some(total) => *total += s.count as i64,
                None => out[slot].values.push(s.count as i64),
            }
        }
    }
    for timed in &profile.timeline {
        let sample = timed.sample;
        let Some(&Some(slot)) = slot_of.get(sample as usize) else {
            bail!("the timeline names sample {sample}, which the profile does not count");
        };
        let time = profile.start_unix_ns.saturating_add_signed(timed.offset_ns);
        out[slot].timestamps_unix_nano.push(time);
    }
    Ok(out)
}

/// The index in `out` of the OTLP sample of `s`'s stack and attributes,
/// added if new; `container.id` is added from [`Profile::containers`] (it
/// is the pid's, so the identity holds it already).
fn slot_for(
    profile: &Profile,
    s: &crate::profile::Sample,
    dict: &mut Dictionary,
    by_identity: &mut HashMap<(i32, [i32; 4]), usize>,
    out: &mut Vec<otlp::Sample>,
) -> usize {
    let stack = dict.stack(s.frames.iter().map(|&f| index(f + 1)).collect());
    let attributes = [
        dict.attribute(keys::PROCESS_PID, Value::Int(s.pid.into())),
        dict.attribute(keys::THREAD_ID, Value::Int(s.tid.into())),
        dict.attribute(keys::THREAD_NAME, Value::Str(&s.thread_comm)),
        dict.attribute(keys::PROCESS_EXECUTABLE_NAME, Value::Str(&s.process_comm)),
    ];
    *by_identity.entry((stack, attributes)).or_insert_with(|| {
        let container = profile
            .containers
            .get(&s.pid)
            .map(|id| dict.attribute(keys::CONTAINER_ID, Value::Str(id)));
        out.push(otlp::Sample {
            stack_index: stack,
            attribute_indices: attributes.iter().copied().chain(container).collect(),
            ..Default::default()
        });
        out.len() - 1
    })
}

/// One OTLP sample per (stack, attributes) of the profile's samples that
/// waited: each wait of [`Profile::waits`] a value (ns) with its start as
/// timestamp, or without waits the stack's total off-CPU ns. Errors when a
/// wait names a sample that did not wait.
fn off_cpu_samples(profile: &Profile, dict: &mut Dictionary) -> Result<Vec<otlp::Sample>> {
    let mut out: Vec<otlp::Sample> = Vec::new();
    let mut by_identity = HashMap::new();
    let mut slot_of = Vec::with_capacity(profile.samples.len());
    for s in &profile.samples {
        if s.off_cpu_ns == 0 {
            slot_of.push(None);
            continue;
        }
        let slot = slot_for(profile, s, dict, &mut by_identity, &mut out);
        slot_of.push(Some(slot));
        if profile.waits.is_empty() {
            match out[slot].values.first_mut() {
                Some(total) => *total += s.off_cpu_ns as i64,
                None => out[slot].values.push(s.off_cpu_ns as i64),
            }
        }
    }
    for wait in &profile.waits {
        let sample = wait.sample;
        let Some(&Some(slot)) = slot_of.get(sample as usize) else {
            bail!("a wait names sample {sample}, which has no off-CPU time");
        };
        let time = profile
            .start_unix_ns
            .saturating_add_signed(wait.start_offset_ns);
        out[slot].values.push(wait.duration_ns as i64);
        out[slot].timestamps_unix_nano.push(time);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
