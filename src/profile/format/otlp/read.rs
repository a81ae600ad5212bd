//! Reading an OTLP profiles request back into a [`Profile`] (for `report`
//! and `diff`): the inverse of the encoder, and lenient enough for other
//! producers' requests.
//!
//! Every profile of every resource and scope is read into one [`Profile`]
//! spanning them all. A sample's count is the number of its timestamps
//! when it has no values, else the sum of its values (divided by the
//! period when the sample type is in nanoseconds). When every sample has
//! one timestamp per counted sample, the profile keeps them as its
//! [`Profile::timeline`]. Kernel frames are locations whose
//! `profile.frame.type` is `kernel` or whose mapping is `[kernel.kallsyms]`;
//! unwind markers are locations without mapping or address whose only
//! line is named `[unwind: ...]`; processes and threads come from the
//! samples' `process.pid`, `thread.id`, `process.executable.name` and
//! `thread.name` attributes, each process's container from `container.id`
//! ([`Profile::containers`]), the host from the resource's `host.name`.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use prost::Message;

use super::keys;
use super::proto::collector::ExportProfilesServiceRequest;
use super::proto::common::{any_value, AnyValue};
use super::proto::profiles::{self as otlp, ProfilesDictionary};
use crate::profile::KERNEL_MAPPING_NAME;
use crate::profile::{
    stack_unwind_status, Frame, FrameKind, Line, Profile, ProfileMapping, Sample, TimedSample,
    TimedWait,
};

/// Decode `bytes` (raw protobuf) as an OTLP export request holding at
/// least one profile. Errors when they do not decode, hold no profile, or
/// an index points outside its table.
pub fn decode(bytes: &[u8]) -> Result<Profile> {
    let request = ExportProfilesServiceRequest::decode(bytes).context("it does not decode")?;
    profile_from_request(&request)
}

/// The profiles of `request` as one [`Profile`] (see the module docs).
/// Errors when it has no dictionary or no profile, or an index points
/// outside its table.
pub fn profile_from_request(request: &ExportProfilesServiceRequest) -> Result<Profile> {
    let dict = request
        .dictionary
        .as_ref()
        .context("it has no dictionary")?;
    let profiles: Vec<&otlp::Profile> = request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .flat_map(|s| &s.profiles)
        .collect();
    if profiles.is_empty() {
        bail!("it holds no profile");
    }
    let names = Names { dict };
    let start = profiles.iter().map(|p| p.time_unix_nano).min().unwrap_or(0);
    let end = profiles
        .iter()
        .map(|p| p.time_unix_nano.saturating_add(p.duration_nano))
        .max()
        .unwrap_or(start);
    let period_ns = profiles[0].period.max(0) as u64;
    let mut profile = Profile {
        start_unix_ns: start,
        duration_ns: end - start,
        sample_freq_hz: (1_000_000_000 + period_ns / 2)
            .checked_div(period_ns)
            .unwrap_or(1)
            .max(1),
        host: host(request),
        ..Default::default()
    };
    profile.mappings = mappings(&names)?;
    profile.frames = frames(&names, &profile.mappings)?;
    let mut timed = true;
    for p in profiles {
        let in_ns = p
            .sample_type
            .as_ref()
            .is_some_and(|t| names.str(t.unit_strindex).ok() == Some("nanoseconds"));
        let off_cpu = in_ns
            && p.sample_type
                .as_ref()
                .is_some_and(|t| names.str(t.type_strindex).ok() == Some(super::OFF_CPU_TYPE));
        if off_cpu {
            read_off_cpu(&names, &mut profile, p, start)?;
            continue;
        }
        let period = if in_ns { p.period.max(1) } else { 1 };
        for s in &p.samples {
            let sample = sample(&names, &profile.frames, s, period)?;
            if let Some(id) = names.string_attribute(&s.attribute_indices, keys::CONTAINER_ID)? {
                profile.containers.insert(sample.pid, Arc::from(id));
            }
            let unit = s.values.iter().all(|&v| v == 1);
            timed &= unit && s.timestamps_unix_nano.len() as u64 == sample.count;
            let index = profile.samples.len() as u32;
            profile
                .timeline
                .extend(s.timestamps_unix_nano.iter().map(|&t| TimedSample {
                    offset_ns: t.wrapping_sub(start) as i64,
                    sample: index,
                }));
            profile.samples.push(sample);
        }
    }
    if timed {
        profile.timeline.sort_unstable_by_key(|t| t.offset_ns);
    } else {
        profile.timeline = Vec::new();
    }
    Ok(profile)
}

/// Add the off-CPU profile `p` (sample type off_cpu/nanoseconds) to
/// `profile`: each sample's values are its waits (ns), its timestamps
/// (when there is one per value) their starts.
fn read_off_cpu(
    names: &Names<'_>,
    profile: &mut Profile,
    p: &otlp::Profile,
    start: u64,
) -> Result<()> {
    profile.off_cpu = true;
    for s in &p.samples {
        let mut sample = sample(names, &profile.frames, s, 1)?;
        sample.off_cpu_ns = sample.count;
        sample.count = 0;
        let index = profile.samples.len() as u32;
        if s.timestamps_unix_nano.len() == s.values.len() {
            profile.waits.extend(
                s.values
                    .iter()
                    .zip(&s.timestamps_unix_nano)
                    .map(|(&ns, &t)| TimedWait {
                        start_offset_ns: t.wrapping_sub(start) as i64,
                        duration_ns: ns.max(0) as u64,
                        sample: index,
                    }),
            );
        }
        profile.samples.push(sample);
    }
    profile.waits.sort_unstable_by_key(|w| w.start_offset_ns);
    Ok(())
}

/// The resource's `host.name`, when a resource has one.
fn host(request: &ExportProfilesServiceRequest) -> Option<Arc<str>> {
    request.resource_profiles.iter().find_map(resource_host)
}

/// `resource`'s `host.name` attribute, when it has one.
pub(crate) fn resource_host(resource: &otlp::ResourceProfiles) -> Option<Arc<str>> {
    resource
        .resource
        .iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == keys::HOST_NAME)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(Arc::from(s.as_str())),
            _ => None,
        })
}

/// The dictionary, with bounds-checked lookups.
pub(crate) struct Names<'d> {
    dict: &'d ProfilesDictionary,
}

impl<'d> Names<'d> {
    /// Lookups into `dict`.
    pub(crate) fn new(dict: &'d ProfilesDictionary) -> Self {
        Names { dict }
    }

    /// String `i`.
    pub(crate) fn str(&self, i: i32) -> Result<&'d str> {
        at(&self.dict.string_table, i, "string").map(String::as_str)
    }

    /// The value of the attribute among `indices` whose key is `key`.
    fn attribute(&self, indices: &[i32], key: &str) -> Result<Option<&'d AnyValue>> {
        for &i in indices {
            let kv = at(&self.dict.attribute_table, i, "attribute")?;
            if self.str(kv.key_strindex)? == key {
                return Ok(kv.value.as_ref());
            }
        }
        Ok(None)
    }

    /// The string value of the attribute `key` among `indices`.
    fn string_attribute(&self, indices: &[i32], key: &str) -> Result<Option<&'d str>> {
        Ok(
            match self.attribute(indices, key)?.and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => Some(s),
                Some(any_value::Value::StringValueStrindex(i)) => Some(self.str(*i)?),
                _ => None,
            },
        )
    }

    /// The integer value of the attribute `key` among `indices`.
    fn int_attribute(&self, indices: &[i32], key: &str) -> Result<Option<i64>> {
        Ok(
            match self.attribute(indices, key)?.and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::IntValue(n)) => Some(*n),
                _ => None,
            },
        )
    }
}

/// Element `i` of `table`, which must be in range.
fn at<'t, T>(table: &'t [T], i: i32, what: &str) -> Result<&'t T> {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .with_context(|| format!("{what} index {i} is outside its table of {}", table.len()))
}

/// The mapping table without its zero element: mapping index `m` is
/// profile mapping `m - 1`.
pub(crate) fn mappings(names: &Names<'_>) -> Result<Vec<ProfileMapping>> {
    let table = names.dict.mapping_table.iter().skip(1);
    table
        .map(|m| {
            let build_id = names.string_attribute(&m.attribute_indices, keys::BUILD_ID_GNU)?;
            Ok(ProfileMapping {
                start: m.memory_start,
                limit: m.memory_limit,
                file_offset: m.file_offset,
                filename: names.str(m.filename_strindex)?.to_string(),
                build_id: build_id.map(str::to_string),
            })
        })
        .collect()
}

/// The location table without its zero element: location index `l` is
/// profile frame `l - 1`. A location without lines is named
/// `FILE+0xADDRESS` (`[unknown]+0xADDRESS` without a mapping).
pub(crate) fn frames(names: &Names<'_>, mappings: &[ProfileMapping]) -> Result<Vec<Frame>> {
    let mut frames = Vec::with_capacity(names.dict.location_table.len());
    for l in names.dict.location_table.iter().skip(1) {
        let mapping = match l.mapping_index {
            0 => None,
            m => Some(at(mappings, m - 1, "mapping").map(|_| (m - 1) as usize)?),
        };
        let mut lines = Vec::with_capacity(l.lines.len());
        for line in &l.lines {
            let f = at(&names.dict.function_table, line.function_index, "function")?;
            let file = names.str(f.filename_strindex)?;
            lines.push(Line {
                function: Arc::from(names.str(f.name_strindex)?),
                system_name: Arc::from(names.str(f.system_name_strindex)?),
                file: (!file.is_empty()).then(|| Arc::from(file)),
                line: u32::try_from(line.line).ok().filter(|&n| n > 0),
            });
        }
        let symbolized = !lines.is_empty();
        let frame_type = names.string_attribute(&l.attribute_indices, keys::FRAME_TYPE)?;
        let marker = mapping.is_none()
            && l.address == 0
            && lines.len() == 1
            && lines[0].function.starts_with("[unwind: ");
        let kind = if marker {
            FrameKind::UnwindMarker
        } else if frame_type == Some("kernel")
            || mapping.is_some_and(|m| mappings[m].filename == KERNEL_MAPPING_NAME)
        {
            FrameKind::Kernel
        } else {
            FrameKind::User
        };
        if lines.is_empty() {
            let file = mapping.map_or("[unknown]", |m| {
                let file = &mappings[m].filename;
                file.rsplit('/').next().unwrap_or(file)
            });
            let label: Arc<str> = Arc::from(format!("{file}+0x{:x}", l.address));
            lines.push(Line {
                function: label.clone(),
                system_name: label,
                file: None,
                line: None,
            });
        }
        frames.push(Frame {
            kind,
            address: l.address,
            mapping,
            lines: lines.into(),
            symbolized: symbolized && !marker,
        });
    }
    Ok(frames)
}

/// The profile sample of OTLP sample `s` (values in units of `period`).
pub(crate) fn sample(
    names: &Names<'_>,
    frames: &[Frame],
    s: &otlp::Sample,
    period: i64,
) -> Result<Sample> {
    let stack = at(&names.dict.stack_table, s.stack_index, "stack")?;
    let stack: Vec<usize> = stack
        .location_indices
        .iter()
        .map(|&l| at(frames, l - 1, "location").map(|_| (l - 1) as usize))
        .collect::<Result<_>>()?;
    let count = if s.values.is_empty() {
        s.timestamps_unix_nano.len() as u64
    } else {
        (s.values.iter().sum::<i64>() / period).max(0) as u64
    };
    let status = stack_unwind_status(&stack, frames);
    let attrs = &s.attribute_indices;
    let int = |key| {
        names
            .int_attribute(attrs, key)
            .map(|n| n.unwrap_or(0) as u32)
    };
    let comm: Arc<str> = Arc::from(
        names
            .string_attribute(attrs, keys::PROCESS_EXECUTABLE_NAME)?
            .unwrap_or("[unknown]"),
    );
    Ok(Sample {
        pid: int(keys::PROCESS_PID)?,
        tid: int(keys::THREAD_ID)?,
        thread_comm: match names.string_attribute(attrs, keys::THREAD_NAME)? {
            Some(name) => Arc::from(name),
            None => comm.clone(),
        },
        process_comm: comm,
        frames: stack,
        unwind_status: status,
        count,
        off_cpu_ns: 0,
    })
}
