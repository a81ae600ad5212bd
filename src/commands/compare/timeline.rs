//! Reading a timeline back for `diff` and `report`: the Firefox Profiler's
//! processed profile JSON (gzip'd, as `--profile-format firefox` writes
//! `profile.json.gz`, or plain), decoded with serde into a [`Profile`]
//! whose [`Profile::timeline`] keeps every sample's time, and cut to a
//! span of time ([`slice`], `report --from/--to`).
//!
//! What is read, per thread: `samples` (`stack`, `time` or `timeDeltas`,
//! `weight` when present), `stackTable` (`prefix`, `frame`), `frameTable`
//! (`address`, `category`, `func`), `funcTable` (`name`, `resource`),
//! `resourceTable` (`lib`), the thread's `stringArray` (or the profile's
//! `shared.stringArray` in newer versions of the format), `markers`; and
//! the profile's `meta` (`startTime`, `interval`, `categories`) and `libs`.
//! Frames in the category `Kernel` are kernel frames, those in `Unwind`
//! unwind markers, the others user frames; a frame whose function has a
//! resource is in that resource's library (one [`ProfileMapping`] per
//! library, from address 0, so that addresses are the frames' offsets in
//! it). lightswitch's `exec`/`exit` and lost-samples markers come back as
//! [`Profile::markers`] and [`Profile::lost`]; other markers are ignored.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rustc_hash::FxHashMap;
use serde::Deserialize;
use serde_json::Value;

use crate::profile::format::firefox::{LOST_MARKER_TYPE, PROCESS_MARKER_TYPE};
use crate::profile::{
    stack_unwind_status, Frame, FrameKind, Line, LostSamples, ProcessMarker, ProcessMarkerKind,
    Profile, ProfileMapping, Sample, TimedSample,
};

/// Most samples (sum of weights) a timeline may hold: 12 bytes each in
/// memory, so 50 M is 600 MB, 40 times a 60 s whole-machine run at 10 kHz.
const MAX_SAMPLES: u64 = 50_000_000;

/// Whether `bytes` (decompressed) look like JSON: the first byte that is
/// not white space is `{`.
pub fn looks_like_json(bytes: &[u8]) -> bool {
    bytes
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{')
}

#[derive(Deserialize)]
struct FxProfile {
    meta: Meta,
    #[serde(default)]
    libs: Vec<Lib>,
    threads: Vec<Thread>,
    #[serde(default)]
    shared: Option<Shared>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    start_time: f64,
    interval: f64,
    #[serde(default)]
    product: String,
    #[serde(default)]
    categories: Vec<Category>,
}

#[derive(Deserialize)]
struct Category {
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Lib {
    path: String,
    #[serde(default)]
    code_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Shared {
    string_array: Vec<String>,
}

/// A pid or tid: the format has had both numbers and strings.
#[derive(Deserialize)]
#[serde(untagged)]
enum Id {
    Number(u64),
    Text(String),
}

impl Id {
    fn get(&self) -> u32 {
        match self {
            Id::Number(n) => u32::try_from(*n).unwrap_or(0),
            Id::Text(t) => t.parse().unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Thread {
    #[serde(default)]
    name: String,
    #[serde(default)]
    process_name: Option<String>,
    pid: Id,
    tid: Id,
    samples: Samples,
    stack_table: StackTable,
    frame_table: FrameTable,
    func_table: FuncTable,
    #[serde(default)]
    resource_table: ResourceTable,
    #[serde(default)]
    string_array: Option<Vec<String>>,
    #[serde(default)]
    markers: Markers,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Samples {
    stack: Vec<Option<usize>>,
    #[serde(default)]
    time: Option<Vec<f64>>,
    #[serde(default)]
    time_deltas: Option<Vec<f64>>,
    #[serde(default)]
    weight: Option<Vec<f64>>,
}

#[derive(Deserialize)]
struct StackTable {
    prefix: Vec<Option<usize>>,
    frame: Vec<usize>,
}

#[derive(Deserialize)]
struct FrameTable {
    #[serde(default)]
    address: Vec<Option<i64>>,
    category: Vec<Option<usize>>,
    func: Vec<usize>,
}

#[derive(Deserialize)]
struct FuncTable {
    name: Vec<usize>,
    resource: Vec<Option<i64>>,
}

#[derive(Deserialize, Default)]
struct ResourceTable {
    lib: Vec<Option<usize>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Markers {
    name: Vec<usize>,
    start_time: Vec<Option<f64>>,
    end_time: Vec<Option<f64>>,
    data: Vec<Value>,
}

/// `table[index]`, or an error naming the table.
fn at<T: Copy>(table: &[T], index: usize, what: &str) -> Result<T> {
    table.get(index).copied().with_context(|| {
        format!(
            "{what} index {index} is out of range (length {})",
            table.len()
        )
    })
}

/// ms (the format's unit) to ns.
fn ns(ms: f64) -> i64 {
    (ms * 1e6).round() as i64
}

/// Decode a Firefox processed profile (JSON, already decompressed). Errors
/// say which table or index is wrong.
pub fn parse_timeline(json: &[u8]) -> Result<Profile> {
    let fx: FxProfile = serde_json::from_slice(json)
        .context("not a Firefox Profiler processed profile (JSON with meta and threads)")?;
    let interval = fx.meta.interval;
    let mut profile = Profile {
        start_unix_ns: (fx.meta.start_time * 1e6).round().max(0.0) as u64,
        sample_freq_hz: if interval > 0.0 {
            (1000.0 / interval).round() as u64
        } else {
            0
        },
        subject: fx
            .meta
            .product
            .strip_prefix(crate::profile::format::firefox::PRODUCT_SUBJECT_PREFIX)
            .map(Arc::from),
        ..Default::default()
    };
    let kinds: Vec<FrameKind> = fx
        .meta
        .categories
        .iter()
        .map(|c| match c.name.as_str() {
            "Kernel" => FrameKind::Kernel,
            "Unwind" => FrameKind::UnwindMarker,
            _ => FrameKind::User,
        })
        .collect();
    for lib in &fx.libs {
        profile.mappings.push(ProfileMapping {
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
            filename: lib.path.clone(),
            build_id: lib.code_id.clone(),
        });
    }
    let shared = fx.shared.as_ref().map(|s| s.string_array.as_slice());
    let mut reader = Reader {
        profile: &mut profile,
        kinds: &kinds,
        frames: FxHashMap::default(),
        total: 0,
    };
    for (number, thread) in fx.threads.iter().enumerate() {
        reader
            .thread(thread, shared)
            .with_context(|| format!("thread {number} ({:?})", thread.name))?;
    }
    profile.timeline.sort_unstable();
    profile.markers.sort_by_key(|m| m.offset_ns);
    profile.lost.sort_by_key(|l| l.start_offset_ns);
    let last = profile.timeline.last().map_or(0, |t| t.offset_ns);
    profile.duration_ns = last.max(0) as u64 + profile.period_ns();
    Ok(profile)
}

/// State of the conversion: the profile being filled, and its frames by
/// what they are, shared across threads.
struct Reader<'a> {
    profile: &'a mut Profile,
    kinds: &'a [FrameKind],
    frames: FxHashMap<(FrameKind, Arc<str>, Option<usize>, u64), usize>,
    total: u64,
}

impl Reader<'_> {
    /// Add one thread's samples (one profile sample per distinct stack,
    /// one timed sample per unit of weight) and its markers.
    fn thread(&mut self, thread: &Thread, shared: Option<&[String]>) -> Result<()> {
        let strings = thread
            .string_array
            .as_deref()
            .or(shared)
            .context("no string table (stringArray)")?;
        let pid = thread.pid.get();
        let tid = thread.tid.get();
        let process_comm: Arc<str> = Arc::from(
            thread
                .process_name
                .as_deref()
                .unwrap_or(thread.name.as_str()),
        );
        let thread_comm: Arc<str> = Arc::from(thread.name.as_str());
        let samples = &thread.samples;
        let times = sample_times(samples)?;
        let mut sample_of_stack: HashMap<Option<usize>, u32> = HashMap::new();
        for (i, (&stack, &time)) in samples.stack.iter().zip(&times).enumerate() {
            let weight = match &samples.weight {
                Some(w) => at(w, i, "samples.weight")?,
                None => 1.0,
            };
            if !(weight >= 0.0 && weight.fract() == 0.0) {
                bail!("sample {i} has weight {weight}, not a count of samples");
            }
            let weight = weight as u64;
            self.total = self.total.saturating_add(weight);
            if self.total > MAX_SAMPLES {
                bail!("more than {MAX_SAMPLES} samples");
            }
            if weight == 0 {
                continue;
            }
            let index = match sample_of_stack.get(&stack) {
                Some(&index) => index,
                None => {
                    let frames = self.stack(thread, strings, stack)?;
                    let unwind_status = stack_unwind_status(&frames, &self.profile.frames);
                    self.profile.samples.push(Sample {
                        pid,
                        tid,
                        process_comm: process_comm.clone(),
                        thread_comm: thread_comm.clone(),
                        frames,
                        unwind_status,
                        count: 0,
                        off_cpu_ns: 0,
                    });
                    let index = (self.profile.samples.len() - 1) as u32;
                    sample_of_stack.insert(stack, index);
                    index
                }
            };
            self.profile.samples[index as usize].count += weight;
            let timed = TimedSample {
                offset_ns: ns(time),
                sample: index,
            };
            self.profile
                .timeline
                .extend(std::iter::repeat_n(timed, weight as usize));
        }
        self.markers(thread, strings, pid)
    }

    /// The profile frames of Firefox stack `stack`, leaf first.
    fn stack(
        &mut self,
        thread: &Thread,
        strings: &[String],
        stack: Option<usize>,
    ) -> Result<Vec<usize>> {
        let table = &thread.stack_table;
        let mut frames = Vec::new();
        let mut next = stack;
        while let Some(s) = next {
            let fx_frame = at(&table.frame, s, "stackTable.frame")?;
            frames.push(self.frame(thread, strings, fx_frame)?);
            next = at(&table.prefix, s, "stackTable.prefix")?;
            // Prefixes come before their stacks: this also ends any cycle.
            if next.is_some_and(|p| p >= s) {
                bail!("stack {s} has prefix {next:?}, not an earlier stack");
            }
        }
        Ok(frames)
    }

    /// The profile frame of Firefox frame `index` (made on first use).
    fn frame(&mut self, thread: &Thread, strings: &[String], index: usize) -> Result<usize> {
        let table = &thread.frame_table;
        let func = at(&table.func, index, "frameTable.func")?;
        let name = at(&thread.func_table.name, func, "funcTable.name")?;
        let name: Arc<str> = Arc::from(
            strings
                .get(name)
                .with_context(|| format!("string index {name} is out of range"))?
                .as_str(),
        );
        let category = at(&table.category, index, "frameTable.category")?;
        let kind = category
            .and_then(|c| self.kinds.get(c).copied())
            .unwrap_or(FrameKind::User);
        let resource = at(&thread.func_table.resource, func, "funcTable.resource")?;
        let mapping = match resource.and_then(|r| usize::try_from(r).ok()) {
            Some(r) => at(&thread.resource_table.lib, r, "resourceTable.lib")?,
            None => None,
        };
        if let Some(lib) = mapping.filter(|&l| l >= self.profile.mappings.len()) {
            bail!("library index {lib} is out of range");
        }
        let address = table
            .address
            .get(index)
            .copied()
            .flatten()
            .and_then(|a| u64::try_from(a).ok());
        let mapping = mapping.filter(|_| address.is_some());
        let address = address.filter(|_| mapping.is_some()).unwrap_or(0);
        let key = (kind, name, mapping, address);
        if let Some(&frame) = self.frames.get(&key) {
            return Ok(frame);
        }
        self.profile.frames.push(Frame {
            kind,
            address,
            mapping,
            lines: vec![Line {
                function: key.1.clone(),
                system_name: key.1.clone(),
                file: None,
                line: None,
            }]
            .into(),
            symbolized: kind != FrameKind::UnwindMarker,
        });
        let frame = self.profile.frames.len() - 1;
        self.frames.insert(key, frame);
        Ok(frame)
    }

    /// lightswitch's markers of the thread: execs, exits, lost samples.
    fn markers(&mut self, thread: &Thread, strings: &[String], pid: u32) -> Result<()> {
        let markers = &thread.markers;
        for (i, data) in markers.data.iter().enumerate() {
            let start = at(&markers.start_time, i, "markers.startTime")?.unwrap_or(0.0);
            match data["type"].as_str() {
                Some(PROCESS_MARKER_TYPE) => {
                    let name = at(&markers.name, i, "markers.name")?;
                    let kind = match strings.get(name).map(String::as_str) {
                        Some("exec") => ProcessMarkerKind::Exec,
                        Some("exit") => ProcessMarkerKind::Exit,
                        _ => continue,
                    };
                    let pid = data["pid"].as_f64().map_or(pid, |p| p as u32);
                    self.profile.markers.push(ProcessMarker {
                        offset_ns: ns(start),
                        pid,
                        kind,
                    });
                }
                Some(LOST_MARKER_TYPE) => {
                    let end = at(&markers.end_time, i, "markers.endTime")?.unwrap_or(start);
                    self.profile.lost.push(LostSamples {
                        start_offset_ns: ns(start),
                        end_offset_ns: ns(end),
                        samples: data["samples"].as_f64().unwrap_or(0.0).max(0.0) as u64,
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Each sample's time, ms after the profile's start: the `time` column, or
/// the running sum of `timeDeltas`.
fn sample_times(samples: &Samples) -> Result<Vec<f64>> {
    let times = match (&samples.time, &samples.time_deltas) {
        (Some(time), _) => time.clone(),
        (None, Some(deltas)) => deltas
            .iter()
            .scan(0.0, |t, d| {
                *t += d;
                Some(*t)
            })
            .collect(),
        (None, None) => bail!("samples have neither time nor timeDeltas"),
    };
    if times.len() != samples.stack.len() {
        bail!(
            "{} sample times for {} samples",
            times.len(),
            samples.stack.len()
        );
    }
    Ok(times)
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
