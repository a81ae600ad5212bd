//! The agent's recordings: what its web view shows. The agent has no store
//! (a collector does); its page records on demand instead. A recording is
//! an on-demand profile ([`super::ondemand`]) kept symbolized with every
//! sample's time, so the page's timeline and flame graphs can cut any
//! range of it at sample resolution, as the collector's do. The latest
//! recordings are held in memory, oldest dropped first once they hold more
//! than [`MAX_SAMPLES`] samples and off-CPU waits together (about 12 bytes
//! a sample and 24 a wait, plus the distinct stacks). On an agent started
//! with `--off-cpu`, recordings keep every off-CPU wait with its start and
//! ns (unless asked `offcpu=false`), so a range's profile has the waits
//! that began in it, as the collector's merged profiles have.
//!
//! - `POST /v1/recordings?seconds=N[&pids=1,2][&sample_freq=HZ][&offcpu=false]`:
//!   record the next N seconds (as `/debug/pprof/profile`, same limits), keep it,
//!   and answer its span, samples and waits as JSON once it is done:
//!   `{"from":"NS","to":"NS","host":"h","samples":n,"waits":n}`.
//!
//! - `GET /v1/recordings`: the recordings held, oldest first, each as
//!   above: `{"recordings":[...]}`.
//! - `GET /v1/timeline?from=&to=&step=[&host=&pid=&tid=&comm=]`: sample
//!   density of the recordings ([`crate::agent::page::timeline`]).
//! - `GET /v1/profiles/merged?from=&to=&format=[&host=&pid=&tid=&comm=]`:
//!   exactly the recorded samples and waits in `[from, to)` (defaults: all
//!   time, as on the collector), in any format
//!   of [`crate::profile::format`] (pprof gzip'd; `folded-off-cpu` and
//!   `flame-graph-off-cpu` for the waits), with the collector's headers
//!   `X-Lightswitch-Samples` (on-CPU samples) and
//!   `X-Lightswitch-Off-Cpu-Waits`; 404 when there are none. A range
//!   over one recording keeps every sample's time (a Firefox Profiler
//!   timeline); one over several is merged, and then only the aggregated
//!   formats can show it.
//! - `GET /v1/profiles/diff?...`: the differential flame graph of two
//!   ranges ([`crate::agent::page::diff`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::ondemand::Answer;
use super::request::Requests;
use crate::agent::http::{blocking, text};
use crate::agent::page::diff::{answer as diff_answer, DiffQuery};
use crate::agent::page::merged;
use crate::agent::page::timeline::{self, value, QueryError, SampleFilter, TimelineQuery};
use crate::profile::merge;
use crate::profile::slice::slice;
use crate::profile::{Profile, TimedSample, TimedWait};
use crate::util::timefmt;

/// Most samples and off-CPU waits the recordings hold together (about 24
/// MB of timeline when all are samples); the oldest recordings go first
/// beyond it (the newest is always kept).
pub const MAX_SAMPLES: u64 = 2_000_000;

/// The recordings held, oldest first.
#[derive(Debug, Default)]
pub struct Recordings {
    held: Mutex<VecDeque<Arc<Profile>>>,
}

impl Recordings {
    /// Keep `profile`, dropping the oldest recordings while all of them
    /// together hold more than [`MAX_SAMPLES`] samples and waits.
    pub fn add(&self, profile: Profile) {
        let size = |p: &Profile| p.total_samples() + p.waits.len() as u64;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.push_back(Arc::new(profile));
        let mut total: u64 = held.iter().map(|p| size(p)).sum();
        while total > MAX_SAMPLES && held.len() > 1 {
            if let Some(dropped) = held.pop_front() {
                total -= size(&dropped);
            }
        }
    }

    /// The recordings held now, oldest first.
    pub fn snapshot(&self) -> Vec<Arc<Profile>> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().cloned().collect()
    }
}

/// A recording as the API describes it.
#[derive(Serialize)]
struct Described {
    from: String,
    to: String,
    host: String,
    samples: u64,
    waits: u64,
}

fn describe(p: &Profile) -> Described {
    Described {
        from: p.start_unix_ns.to_string(),
        to: (p.start_unix_ns + p.duration_ns).to_string(),
        host: p.host.as_deref().unwrap_or("unknown").to_string(),
        samples: p.total_samples(),
        waits: p.waits.len() as u64,
    }
}

fn json(body: &impl Serialize) -> Response {
    match serde_json::to_string(body) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{body}\n"),
        )
            .into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// `POST /v1/recordings`.
pub(super) async fn record(
    State(requests): State<Requests>,
    State(recordings): State<Arc<Recordings>>,
    RawQuery(query): RawQuery,
) -> Response {
    let arrived_mono_ns = timefmt::monotonic_ns();
    let query = match requests.parse_recording_query(query.as_deref()) {
        Ok(q) => q,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    match requests.run(query, None, arrived_mono_ns).await {
        Ok(Answer::Profile(profile)) => {
            let described = describe(&profile);
            recordings.add(*profile);
            json(&described)
        }
        Ok(Answer::Encoded(_)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "a recording came back encoded (a bug)",
        ),
        Err(response) => response,
    }
}

/// `GET /v1/recordings`.
pub(super) async fn list(State(recordings): State<Arc<Recordings>>) -> Response {
    #[derive(Serialize)]
    struct Listing {
        recordings: Vec<Described>,
    }
    let recordings = recordings.snapshot();
    json(&Listing {
        recordings: recordings.iter().map(|p| describe(p)).collect(),
    })
}

/// `GET /v1/timeline`.
pub(super) async fn timeline(
    State(recordings): State<Arc<Recordings>>,
    RawQuery(query): RawQuery,
) -> Response {
    blocking(move || {
        let query = match TimelineQuery::parse(&pairs(query.as_deref())) {
            Ok(q) => q,
            Err(QueryError::Bad(m)) => return text(StatusCode::BAD_REQUEST, m),
            Err(QueryError::TooLarge(m)) => return text(StatusCode::PAYLOAD_TOO_LARGE, m),
        };
        let recordings = recordings.snapshot();
        json(&timeline::build(recordings.iter().map(|p| &**p), &query))
    })
    .await
}

/// `profile` with only the samples `filter` passes (host: the profile's),
/// its timeline and waits kept for them.
fn filtered(mut profile: Profile, filter: &SampleFilter) -> Profile {
    let host = profile.host.as_deref().unwrap_or("unknown").to_string();
    let mut index = vec![None; profile.samples.len()];
    let mut kept = Vec::new();
    for (i, sample) in std::mem::take(&mut profile.samples).into_iter().enumerate() {
        if filter.matches(&host, &sample) {
            index[i] = Some(kept.len() as u32);
            kept.push(sample);
        }
    }
    profile.samples = kept;
    profile.timeline = profile
        .timeline
        .iter()
        .filter_map(|t| {
            let sample = index.get(t.sample as usize).copied().flatten()?;
            Some(TimedSample {
                offset_ns: t.offset_ns,
                sample,
            })
        })
        .collect();
    profile.waits = profile
        .waits
        .iter()
        .filter_map(|w| {
            let sample = index.get(w.sample as usize).copied().flatten()?;
            Some(TimedWait { sample, ..*w })
        })
        .collect();
    profile
}

/// The recorded samples and off-CPU waits (by their start) in `[from, to)`
/// that `filter` passes, as [`Range`]: one recording's cut with its
/// timeline and waits, several merged (timeline and waits dropped, each
/// stack's off-CPU ns kept). The range is first narrowed to the span of
/// the recordings it meets (from the start of the earliest wait they
/// hold, which may have begun before its recording did), so that an open
/// range (all time) spans them, not 1970 to 2554.
fn range_profile(
    recordings: &[Arc<Profile>],
    (from, to): (u64, u64),
    filter: &SampleFilter,
) -> Range {
    let end_of = |p: &Profile| p.start_unix_ns.saturating_add(p.duration_ns.max(1));
    let met: Vec<&Arc<Profile>> = recordings
        .iter()
        .filter(|p| p.start_unix_ns < to && from < end_of(p))
        .collect();
    // A wait that began before its recording did (offset < 0) is in it.
    let first = |p: &Profile| {
        let earliest = p.waits.iter().map(|w| w.start_offset_ns).min().unwrap_or(0);
        p.start_unix_ns.saturating_add_signed(earliest.min(0))
    };
    let from = met
        .iter()
        .map(|p| first(p))
        .min()
        .map_or(from, |s| s.max(from));
    let to = met
        .iter()
        .map(|p| end_of(p))
        .max()
        .map_or(to, |e| e.min(to));
    let mut cuts: Vec<Profile> = met
        .into_iter()
        .map(|p| {
            let offset = |t: u64| (i128::from(t) - i128::from(p.start_unix_ns)) as i64;
            filtered(slice(p, offset(from), offset(to)), filter)
        })
        .filter(|p| p.total_samples() > 0 || !p.waits.is_empty())
        .collect();
    let inputs = cuts.len();
    let waits = cuts.iter().map(|p| p.waits.len() as u64).sum();
    let profile = if inputs == 1 {
        cuts.pop().unwrap_or_default()
    } else {
        merge::merge(cuts).profile
    };
    Range {
        profile,
        inputs,
        waits,
    }
}

/// What [`range_profile`] found.
struct Range {
    /// The samples and waits of the range.
    profile: Profile,
    /// How many recordings went in.
    inputs: usize,
    /// Off-CPU waits that began in the range (`X-Lightswitch-Off-Cpu-Waits`).
    waits: u64,
}

/// `GET /v1/profiles/merged`.
pub(super) async fn merged(
    State(recordings): State<Arc<Recordings>>,
    RawQuery(query): RawQuery,
) -> Response {
    blocking(move || {
        let pairs = pairs(query.as_deref());
        let parsed = timeline::range_or_all(&pairs, "from", "to").and_then(|range| {
            let format = merged::format(value(&pairs, "format"))?;
            Ok((range, format, SampleFilter::from_pairs(&pairs)?))
        });
        let (range, format, filter) = match parsed {
            Ok(p) => p,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let Range {
            profile,
            inputs,
            waits,
        } = range_profile(&recordings.snapshot(), range, &filter);
        if inputs == 0 {
            return text(
                StatusCode::NOT_FOUND,
                "no recorded sample or off-CPU wait in from/to",
            );
        }
        let counts = merged::Counts {
            inputs: inputs as u64,
            samples: profile.total_samples(),
            waits,
        };
        merged::answer(&profile, format, counts)
    })
    .await
}

/// `GET /v1/profiles/diff`.
pub(super) async fn diff(
    State(recordings): State<Arc<Recordings>>,
    RawQuery(query): RawQuery,
) -> Response {
    blocking(move || {
        let query = match DiffQuery::parse(&pairs(query.as_deref())) {
            Ok(q) => q,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let recordings = recordings.snapshot();
        let base = range_profile(&recordings, query.base, &query.filter).profile;
        let new = range_profile(&recordings, query.new, &query.filter).profile;
        diff_answer(&query, &base, &new)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Sample;
    use crate::sampling::records::UnwindStatus;

    fn recording(start: u64, pid_offsets: &[(u32, i64)]) -> Profile {
        let mut p = Profile {
            start_unix_ns: start,
            duration_ns: 1_000,
            host: Some(Arc::from("h")),
            ..Default::default()
        };
        for &(pid, offset_ns) in pid_offsets {
            p.samples.push(Sample {
                pid,
                tid: pid,
                process_comm: Arc::from("app"),
                thread_comm: Arc::from("app"),
                frames: vec![],
                unwind_status: UnwindStatus::Complete,
                count: 1,
                off_cpu_ns: 0,
            });
            let sample = p.samples.len() as u32 - 1;
            p.timeline.push(TimedSample { offset_ns, sample });
        }
        p
    }

    #[test]
    fn a_range_is_cut_at_sample_times_and_filtered() {
        let a = Arc::new(recording(1_000, &[(1, 0), (2, 10), (1, 500)]));
        let b = Arc::new(recording(5_000, &[(1, 0)]));
        let all = SampleFilter::default();
        let r = range_profile(&[a.clone(), b.clone()], (1_000, 1_500), &all);
        assert_eq!((r.profile.total_samples(), r.inputs), (2, 1));
        assert_eq!(r.profile.timeline.len(), 2);
        let only_1 = SampleFilter {
            pid: Some(1),
            ..Default::default()
        };
        let r = range_profile(&[a.clone(), b.clone()], (1_000, 6_000), &only_1);
        assert_eq!((r.profile.total_samples(), r.inputs), (3, 2));
        let r = range_profile(&[a, b], (3_000, 4_000), &all);
        assert_eq!(r.inputs, 0);
    }

    /// `recording`, with off-CPU waits (sample, start offset, ns).
    fn waited(start: u64, pids: &[(u32, i64)], waits: &[(u32, i64, u64)]) -> Profile {
        let mut p = recording(start, pids);
        p.off_cpu = true;
        for &(sample, start_offset_ns, duration_ns) in waits {
            p.samples[sample as usize].off_cpu_ns += duration_ns;
            p.waits.push(TimedWait {
                start_offset_ns,
                duration_ns,
                sample,
            });
        }
        p
    }

    #[test]
    fn a_range_keeps_the_waits_that_began_in_it() {
        // Pid 2 only waited in the range: its stack is kept with 0 samples.
        let a = Arc::new(waited(
            1_000,
            &[(1, 0), (2, 600)],
            &[(0, 100, 7), (1, 200, 5), (0, 700, 11)],
        ));
        let b = Arc::new(waited(5_000, &[(1, 0)], &[(0, 10, 3)]));
        let all = SampleFilter::default();
        let r = range_profile(&[a.clone(), b.clone()], (1_050, 1_500), &all);
        assert!(r.profile.off_cpu);
        assert_eq!((r.profile.total_samples(), r.inputs, r.waits), (0, 1, 2));
        assert_eq!(r.profile.total_off_cpu_ns(), 12);
        let starts: Vec<i64> = r.profile.waits.iter().map(|w| w.start_offset_ns).collect();
        assert_eq!(starts, [50, 150]);
        let only_2 = SampleFilter {
            pid: Some(2),
            ..Default::default()
        };
        let r = range_profile(&[a.clone(), b.clone()], (1_000, 2_000), &only_2);
        assert_eq!((r.profile.total_samples(), r.waits), (1, 1));
        assert_eq!(r.profile.total_off_cpu_ns(), 5);
        // Two recordings merge: waits dropped, each stack's ns added up.
        let r = range_profile(&[a, b], (0, 10_000), &all);
        assert_eq!((r.inputs, r.waits, r.profile.waits.len()), (2, 4, 0));
        assert!(r.profile.off_cpu);
        assert_eq!(r.profile.total_off_cpu_ns(), 26);
    }

    /// An open range (no from or to: 0 to `u64::MAX`) spans the
    /// recordings it meets, not 1970 to 2554, and keeps every sample at
    /// its time.
    #[test]
    fn an_open_range_spans_the_recordings() {
        let a = Arc::new(recording(1_000, &[(1, 0), (2, 10)]));
        let b = Arc::new(recording(5_000, &[(1, 999)]));
        let all = SampleFilter::default();
        let r = range_profile(std::slice::from_ref(&a), (0, u64::MAX), &all);
        let span = (r.profile.start_unix_ns, r.profile.duration_ns);
        assert_eq!(span, (1_000, 1_000));
        let offsets: Vec<i64> = r.profile.timeline.iter().map(|t| t.offset_ns).collect();
        assert_eq!(offsets, [0, 10]);
        let r = range_profile(&[a, b], (0, u64::MAX), &all);
        assert_eq!((r.inputs, r.profile.total_samples()), (2, 3));
        assert_eq!(r.profile.start_unix_ns, 1_000);
        // A wait that began 300 ns before its recording is in all time.
        let c = Arc::new(waited(1_000, &[(1, 0)], &[(0, -300, 50)]));
        let r = range_profile(&[c], (0, u64::MAX), &all);
        assert_eq!((r.waits, r.profile.start_unix_ns), (1, 700));
    }

    #[test]
    fn the_oldest_recordings_go_first() {
        let held = Recordings::default();
        held.add(recording(1, &[(1, 0)]));
        assert_eq!(held.snapshot().len(), 1);
        let big = Profile {
            samples: vec![Sample {
                count: MAX_SAMPLES,
                ..recording(2, &[(1, 0)]).samples[0].clone()
            }],
            ..Default::default()
        };
        held.add(big);
        assert_eq!(held.snapshot().len(), 1, "the first recording was dropped");
        assert_eq!(held.snapshot()[0].total_samples(), MAX_SAMPLES);
    }
}
