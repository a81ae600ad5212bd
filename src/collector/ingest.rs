//! Received profiles -> the sample store ([`super::store`]): OTLP
//! requests (`POST /v1development/profiles`, every sample at its own
//! time) and pprof windows (`POST /v1/profiles`, no per-sample time: each
//! sample is placed at its window's start). Off-CPU waits (`--off-cpu`)
//! are stored as waits with their ns: from OTLP's off_cpu/nanoseconds
//! profile each wait at its own start, from pprof's `off_cpu/nanoseconds`
//! sample type each stack's total as one wait at the window's start.

use std::sync::Arc;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use prost::Message;
use tracing::{info, warn};

use super::sample_store::health;
use super::sample_store::identity::{content_hash, WindowId};
use super::sample_store::writer::{Batch, Ingested, Wait};
use super::sample_store::SampleStore;
use super::state::AppState;
use crate::agent::http::{blocking, text};
use crate::profile::format::otlp::proto::collector::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use crate::profile::format::otlp::proto::profiles as otlp;
use crate::profile::format::otlp::read::{self, Names};
use crate::profile::format::otlp::OFF_CPU_TYPE;
use crate::profile::merge::{self, BodyError};
use crate::profile::{Profile, Sample};
use crate::util::wire::HOST_HEADER;

/// Most samples one request may carry (each becomes a stored row; a
/// request over it is refused with 413, nothing stored): 8 Mi, seven
/// minutes of a 2-CPU machine at 10 kHz.
pub const MAX_INGEST_SAMPLES: u64 = 8 << 20;

/// A request refused: status and message.
pub type Refusal = (StatusCode, String);

fn refused(e: BodyError) -> Refusal {
    match e {
        BodyError::Malformed(m) => (StatusCode::BAD_REQUEST, m),
        BodyError::TooLarge(m) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{m} (--max-decoded-bytes)"),
        ),
    }
}

fn too_many(n: u64) -> Refusal {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request holds {n} samples, more than the {MAX_INGEST_SAMPLES} one request may carry"),
    )
}

/// Store a pprof window of `host`, `[start, end)`: each of its samples at
/// `start` (pprof has no per-sample time), and each stack's off-CPU ns
/// ([`Sample::off_cpu_ns`]) as one wait at `start`; `content` is the
/// [`content_hash`] of the inflated pprof, for the window's identity (a
/// window stored before is not stored again). Errors: more than
/// [`MAX_INGEST_SAMPLES`] (413), the store's ([`storing_failed`]: 503 or 500).
pub fn store_pprof(
    store: &SampleStore,
    host: &str,
    window: (u64, u64),
    profile: &Profile,
    content: u128,
) -> Result<Ingested, Refusal> {
    let total = profile.total_samples();
    if total > MAX_INGEST_SAMPLES {
        return Err(too_many(total));
    }
    let times = profile
        .samples
        .iter()
        .enumerate()
        .flat_map(|(i, s)| std::iter::repeat_n((window.0, i as u32), s.count as usize))
        .collect();
    let waits = (profile.samples.iter().enumerate())
        .filter(|(_, s)| s.off_cpu_ns > 0)
        .map(|(i, s)| Wait {
            time: window.0,
            sample: i as u32,
            ns: s.off_cpu_ns,
        })
        .collect();
    let batch = Batch {
        host,
        window,
        profile,
        times,
        waits,
    };
    let id = WindowId::of(&[(host, window.0, window.1)], content);
    store
        .ingest_request(vec![batch], Some(id))
        .map_err(storing_failed)
}

/// How long a sender is asked to wait (`Retry-After`, seconds) when the
/// storage failed in a way that may pass (a full disk): long enough for
/// retention or an operator to make room, short enough that a window
/// waits in the agent's queue for little longer than the disk is full.
pub const RETRY_AFTER_SECS: u64 = 2;

/// The answer to a failed store (already counted and logged once per
/// episode by [`SampleStore::health`]): `503 Service Unavailable` (with
/// `Retry-After`, see [`refusal`]) when the failure may pass
/// ([`health::is_transient`]: a full disk, a quota, an I/O error), else
/// `500` (and a log line each time).
pub fn storing_failed(e: anyhow::Error) -> Refusal {
    if health::is_transient(&e) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("storing the samples failed, try again later: {e:#}"),
        )
    } else {
        warn!("storing samples failed: {e:#}");
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("storing the samples failed: {e:#}"),
        )
    }
}

/// A refusal as an HTTP answer (plain text); a 503 says when to try again
/// ([`RETRY_AFTER_SECS`]).
pub fn refusal((status, message): Refusal) -> Response {
    let mut response = text(status, message);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from(RETRY_AFTER_SECS),
        );
    }
    response
}

/// One resource's samples, ready for the store.
struct ResourceBatch {
    host: Arc<str>,
    window: (u64, u64),
    profile: Profile,
    times: Vec<(u64, u32)>,
    waits: Vec<Wait>,
}

/// What an OTLP request gave: batches, and the samples and profiles refused.
#[derive(Default)]
struct Converted {
    batches: Vec<ResourceBatch>,
    rejected_samples: u64,
    rejected_profiles: i64,
    reason: Option<String>,
}

/// The times of OTLP sample `s` (count `count`) of a profile starting at
/// `start`: one per timestamp, each repeated by its value (in units of
/// `period`) when values and timestamps pair up; without timestamps,
/// `count` samples at `start`. Errors: values and timestamps do not pair
/// up, or more than [`MAX_INGEST_SAMPLES`].
fn sample_times(s: &otlp::Sample, count: u64, start: u64, period: i64) -> Result<Vec<u64>, String> {
    let ts = &s.timestamps_unix_nano;
    let too_many = || format!("a sample counts more than {MAX_INGEST_SAMPLES} samples");
    if ts.is_empty() {
        if count > MAX_INGEST_SAMPLES {
            return Err(too_many());
        }
        return Ok(vec![start; count as usize]);
    }
    if s.values.is_empty() {
        return Ok(ts.clone());
    }
    if s.values.len() != ts.len() || s.values.iter().any(|&v| v < 0) {
        return Err(NOT_PAIRED.into());
    }
    let each = |v: i64| (v / period.max(1)) as u64;
    if s.values.iter().map(|&v| each(v)).sum::<u64>() > MAX_INGEST_SAMPLES {
        return Err(too_many());
    }
    let mut out = Vec::with_capacity(ts.len());
    for (&t, &v) in ts.iter().zip(&s.values) {
        out.extend(std::iter::repeat_n(t, each(v) as usize));
    }
    Ok(out)
}

/// Why a sample whose values and timestamps do not pair up is refused.
const NOT_PAIRED: &str = "values and timestamps of a sample do not pair up";

/// The waits of OTLP sample `s` of an off-CPU profile (off_cpu/nanoseconds)
/// starting at `start`, as (start, ns): each value a wait at its timestamp;
/// without timestamps, one wait of the values' sum at `start`. Waits of 0
/// ns are left out. Errors: values and timestamps do not pair up, or a
/// value is negative.
fn wait_times(s: &otlp::Sample, start: u64) -> Result<Vec<(u64, u64)>, String> {
    let ts = &s.timestamps_unix_nano;
    if s.values.iter().any(|&v| v < 0) || (!ts.is_empty() && ts.len() != s.values.len()) {
        return Err(NOT_PAIRED.into());
    }
    let waits: Vec<(u64, u64)> = if ts.is_empty() {
        vec![(start, s.values.iter().map(|&v| v as u64).sum())]
    } else {
        ts.iter()
            .zip(&s.values)
            .map(|(&t, &v)| (t, v as u64))
            .collect()
    };
    Ok(waits.into_iter().filter(|w| w.1 > 0).collect())
}

/// Whether OTLP profile `p` is off-CPU time (sample type
/// off_cpu/nanoseconds, as the agent's `--off-cpu` sends it).
fn is_off_cpu(names: &Names<'_>, p: &otlp::Profile) -> bool {
    p.sample_type.as_ref().is_some_and(|t| {
        names.str(t.type_strindex).ok() == Some(OFF_CPU_TYPE)
            && names.str(t.unit_strindex).ok() == Some("nanoseconds")
    })
}

/// OTLP sample `s` of profile `p` as a profile sample and its rows,
/// (time, off-CPU ns) with 0 ns for an on-CPU sample. `period`: ns per
/// value of an on-CPU profile in ns, else 1. Errors: the sample's, to
/// refuse it alone.
fn convert_sample(
    names: &Names<'_>,
    frames: &[crate::profile::Frame],
    s: &otlp::Sample,
    p: &otlp::Profile,
    period: i64,
    off_cpu: bool,
) -> Result<(Sample, Vec<(u64, u64)>), String> {
    let unit = if off_cpu { 1 } else { period };
    let sample = read::sample(names, frames, s, unit).map_err(|e| format!("{e:#}"))?;
    if off_cpu {
        let waits = wait_times(s, p.time_unix_nano)?;
        let sample = Sample {
            count: 0,
            off_cpu_ns: waits.iter().map(|w| w.1).sum(),
            ..sample
        };
        return Ok((sample, waits));
    }
    let times = sample_times(s, sample.count, p.time_unix_nano, period)?;
    let sample = Sample {
        count: times.len() as u64,
        ..sample
    };
    Ok((sample, times.into_iter().map(|t| (t, 0)).collect()))
}

/// The samples of `request`, one batch per resource (its `host.name`, else
/// `fallback_host`); the waits of its off_cpu/nanoseconds profiles as
/// waits. Errors (the whole request refused): a broken dictionary (400) or
/// too many samples and waits (413). Samples whose indices are out of range
/// or whose values and timestamps do not pair up are refused one by one
/// and counted.
fn convert(
    request: &ExportProfilesServiceRequest,
    fallback_host: &str,
) -> Result<Converted, Refusal> {
    let bad = |e: anyhow::Error| {
        (
            StatusCode::BAD_REQUEST,
            format!("not a valid OTLP profiles request: {e:#}"),
        )
    };
    let Some(dict) = request.dictionary.as_ref() else {
        let empty = request
            .resource_profiles
            .iter()
            .all(|r| r.scope_profiles.iter().all(|s| s.profiles.is_empty()));
        return if empty {
            Ok(Converted::default())
        } else {
            Err(bad(anyhow::anyhow!("it has no dictionary")))
        };
    };
    let names = Names::new(dict);
    let mappings = read::mappings(&names).map_err(bad)?;
    let frames = read::frames(&names, &mappings).map_err(bad)?;
    let mut out = Converted::default();
    let mut total = 0u64;
    for resource in &request.resource_profiles {
        let host = read::resource_host(resource).unwrap_or_else(|| Arc::from(fallback_host));
        let mut batch = ResourceBatch {
            host,
            window: (u64::MAX, 0),
            profile: Profile {
                mappings: mappings.clone(),
                frames: frames.clone(),
                ..Default::default()
            },
            times: Vec::new(),
            waits: Vec::new(),
        };
        for p in resource.scope_profiles.iter().flat_map(|s| &s.profiles) {
            let in_ns = p
                .sample_type
                .as_ref()
                .is_some_and(|t| names.str(t.unit_strindex).ok() == Some("nanoseconds"));
            let period = if in_ns { p.period.max(1) } else { 1 };
            let off_cpu = is_off_cpu(&names, p);
            batch.profile.off_cpu |= off_cpu;
            if batch.profile.sample_freq_hz == 0 && p.period > 0 && !off_cpu {
                batch.profile.sample_freq_hz = (1_000_000_000 / p.period as u64).max(1);
            }
            batch.window.0 = batch.window.0.min(p.time_unix_nano);
            batch.window.1 = batch
                .window
                .1
                .max(p.time_unix_nano.saturating_add(p.duration_nano));
            let mut rejected_here = 0;
            for s in &p.samples {
                let frames = &batch.profile.frames;
                match convert_sample(&names, frames, s, p, period, off_cpu) {
                    Ok((sample, rows)) => {
                        total += rows.len() as u64;
                        if total > MAX_INGEST_SAMPLES {
                            return Err(too_many(total));
                        }
                        batch.add(sample, rows);
                    }
                    Err(reason) => {
                        rejected_here += s.timestamps_unix_nano.len().max(1) as u64;
                        out.reason.get_or_insert(reason);
                    }
                }
            }
            if rejected_here > 0 {
                out.rejected_samples += rejected_here;
                out.rejected_profiles += 1;
            }
        }
        if !batch.times.is_empty() || !batch.waits.is_empty() {
            out.batches.push(batch);
        }
    }
    Ok(out)
}

impl ResourceBatch {
    /// Add `sample` and its rows (time, off-CPU ns; 0: an on-CPU sample).
    fn add(&mut self, sample: Sample, rows: Vec<(u64, u64)>) {
        let index = self.profile.samples.len() as u32;
        for (time, ns) in rows {
            if ns == 0 {
                self.times.push((time, index));
            } else {
                self.waits.push(Wait {
                    time,
                    sample: index,
                    ns,
                });
            }
        }
        self.profile.samples.push(sample);
    }
}

/// Store the OTLP export request `body` (raw or gzip'd protobuf, at most
/// `max_decoded_bytes` once inflated): one batch per resource, host from
/// its `host.name`, else `fallback_host`. Returns the OTLP response (its
/// `partial_success` set when samples were refused) and what was stored.
/// Errors: the status and message to answer with (400 not a request, 413
/// too large, 503 or 500 the store failed: [`storing_failed`]).
pub fn store_otlp(
    store: &SampleStore,
    body: &[u8],
    max_decoded_bytes: usize,
    fallback_host: &str,
) -> Result<(ExportProfilesServiceResponse, Ingested), Refusal> {
    let raw = merge::inflate(body, max_decoded_bytes).map_err(refused)?;
    let content = content_hash(&raw);
    let request = ExportProfilesServiceRequest::decode(raw.as_slice()).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            format!("the body does not decode as an OTLP ExportProfilesServiceRequest: {e}"),
        )
    })?;
    drop(raw);
    let converted = convert(&request, fallback_host)?;
    drop(request);
    let mut resources = converted.batches;
    let windows: Vec<(&str, u64, u64)> = (resources.iter())
        .map(|b| (&*b.host, b.window.0, b.window.1))
        .collect();
    let id = WindowId::of(&windows, content);
    drop(windows);
    let batches = (resources.iter_mut())
        .map(|b| Batch {
            host: &b.host,
            window: b.window,
            profile: &b.profile,
            times: std::mem::take(&mut b.times),
            waits: std::mem::take(&mut b.waits),
        })
        .collect();
    let stored = store
        .ingest_request(batches, Some(id))
        .map_err(storing_failed)?;
    let partial_success = (converted.rejected_samples > 0).then(|| {
        let reason = converted.reason.as_deref().unwrap_or("");
        warn!(
            "refused {} OTLP samples: {reason}",
            converted.rejected_samples
        );
        ExportProfilesPartialSuccess {
            rejected_profiles: converted.rejected_profiles,
            error_message: format!("{} samples refused: {reason}", converted.rejected_samples),
        }
    });
    Ok((ExportProfilesServiceResponse { partial_success }, stored))
}

fn otlp_blocking(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<ExportProfilesServiceResponse, Refusal> {
    let fallback = headers
        .get(HOST_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let (response, stored) = store_otlp(&state.store, body, state.max_decoded_bytes, fallback)?;
    if stored.duplicate {
        info!("an OTLP request stored before came again: answered, not stored twice");
    } else {
        info!(
            "stored {} OTLP samples and {} off-CPU waits in {} blocks",
            stored.samples, stored.waits, stored.blocks
        );
    }
    Ok(response)
}

/// `POST /v1development/profiles`: an OTLP/HTTP export (binary protobuf,
/// gzip'd or not). 200 with an `ExportProfilesServiceResponse` (its
/// `partial_success` says how many samples were refused and why); 400 with
/// a message if the body is not a request; 413 over the size limits; 503
/// with `Retry-After` if storing failed in a way that may pass (a full
/// disk), else 500. A request stored before (the same window sent again)
/// is answered 200 and not stored twice.
pub async fn otlp(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    blocking(move || match otlp_blocking(&state, &headers, &body) {
        Ok(response) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            response.encode_to_vec(),
        )
            .into_response(),
        Err(refused) => refusal(refused),
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collector::sample_store::assemble::Assembler;
    use crate::collector::sample_store::query::Selection;
    use crate::collector::sample_store::timeline::Density;
    use crate::profile::format::off_cpu::tests::waited_profile;
    use crate::profile::format::{encode, Compression, ProfileFormat};
    use crate::util::files::PROFILE_MODE;

    /// Everything stored, as `merged` assembles it (with a timeline), and
    /// the timeline's total (counted row by row, then from the blocks'
    /// headers: the same).
    fn everything(store: &SampleStore) -> (Profile, u64) {
        let all = Selection {
            from: 0,
            to: u64::MAX,
            ..Default::default()
        };
        let blocks = store.blocks_for(&all);
        let mut assembler = Assembler::new(true);
        let scanned = store.scan(&all, &blocks, &mut assembler);
        let (start, end) = scanned.span.unwrap();
        let mut density = Density::new(start, end - start, 1);
        store.scan(&all, &blocks, &mut density);
        // The threads are known now: the blocks are counted from their headers.
        store.scan(&all, &blocks, &mut density);
        let twice: u64 = density.finish(end).hosts.iter().map(|h| h.total).sum();
        let counted = scanned.samples;
        assert_eq!(twice, 2 * counted);
        (assembler.finish(start, end - start, &scanned), counted)
    }

    /// The sum of the counts of folded `text`.
    fn folded_total(text: &[u8]) -> u64 {
        let text = String::from_utf8_lossy(text);
        let counts = text.lines().map(|l| l.rsplit_once(' ').unwrap().1);
        counts.map(|n| n.parse::<u64>().unwrap()).sum()
    }

    #[test]
    fn otlp_waits_are_stored_with_their_ns_and_start_and_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
        let sent = waited_profile();
        let body = crate::profile::format::otlp::to_request(&sent)
            .unwrap()
            .encode_to_vec();
        let (response, stored) = store_otlp(&store, &body, 1 << 20, "h").unwrap();
        assert_eq!(response.partial_success, None);
        assert_eq!((stored.samples, stored.waits), (sent.total_samples(), 3));
        let (back, counted) = everything(&store);
        assert!(back.off_cpu);
        assert_eq!(back.total_samples(), sent.total_samples());
        assert_eq!(
            counted,
            sent.total_samples(),
            "waits are not timeline samples"
        );
        assert_eq!(back.total_off_cpu_ns(), 9_000_000);
        let waits = |p: &Profile| -> Vec<(u64, u64)> {
            let at = |w: &crate::profile::TimedWait| {
                p.start_unix_ns.wrapping_add_signed(w.start_offset_ns)
            };
            p.waits.iter().map(|w| (at(w), w.duration_ns)).collect()
        };
        assert_eq!(waits(&back), waits(&sent));
        // The agent's formats: pprof's third sample type, the folded twin.
        let pprof = crate::profile::format::pprof::to_proto(&back);
        let off_cpu: i64 = pprof.sample.iter().map(|s| s.value[2]).sum();
        let names: Vec<&str> = (pprof.sample_type.iter())
            .map(|t| pprof.string_table[t.r#type as usize].as_str())
            .collect();
        assert_eq!(
            (names, off_cpu),
            (vec!["samples", "cpu", "off_cpu"], 9_000_000)
        );
        let folded = encode(&back, ProfileFormat::FoldedOffCpu, Compression::None).unwrap();
        assert_eq!(folded_total(&folded), 9_000_000);
        let on = encode(&back, ProfileFormat::Folded, Compression::None).unwrap();
        assert_eq!(folded_total(&on), sent.total_samples());
    }

    #[test]
    fn pprof_off_cpu_time_is_stored_as_one_wait_per_stack_at_the_window_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = SampleStore::open(dir.path(), PROFILE_MODE).unwrap();
        let sent = waited_profile();
        let model = merge::profile_from_pprof(&crate::profile::format::pprof::to_proto(&sent));
        let window = (sent.start_unix_ns, sent.start_unix_ns + sent.duration_ns);
        let stored = store_pprof(&store, "h", window, &model, 1).unwrap();
        assert_eq!((stored.samples, stored.waits), (sent.total_samples(), 2));
        let (back, _) = everything(&store);
        assert!(back.off_cpu);
        assert_eq!(back.total_off_cpu_ns(), 9_000_000);
        assert!(back.waits.iter().all(|w| w.start_offset_ns == 0));
    }
}
