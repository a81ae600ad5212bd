//! One on-demand profile request of the agent's HTTP API, from its query
//! to its answer: what `/debug/pprof/profile` ([`super::routes`]) and the
//! web view's recordings ([`super::recordings`]) share.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use axum::response::Response;
use tokio::sync::oneshot;

use super::metrics::Metrics;
use super::ondemand::{Answer, ProfileRequest, RequestError};
use super::{ServerConfig, DEFAULT_SECONDS};
use crate::agent::http::text;
use crate::agent::page::merged;
use crate::profile::format::ProfileFormat;

/// Hands profile requests to the sampling loop, within the server's
/// limits (`--listen-max-seconds`, `--listen-max-requests`, `--pids`, the
/// sampling frequency, `--off-cpu`), and counts them in the metrics.
#[derive(Clone)]
pub struct Requests {
    // A Mutex so the state is Sync whatever the channel's own guarantees.
    requests: Arc<Mutex<Sender<ProfileRequest>>>,
    /// The agent's counters (`GET /metrics`).
    pub(super) metrics: Arc<Metrics>,
    max_seconds: u64,
    max_requests: usize,
    pids: Arc<[u32]>,
    max_sample_freq_hz: u64,
    off_cpu: bool,
}

impl Requests {
    /// The requester of a server configured by `config`, handing requests
    /// to `requests` and counting them in `metrics`.
    pub fn new(
        config: &ServerConfig,
        requests: Sender<ProfileRequest>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Requests {
            requests: Arc::new(Mutex::new(requests)),
            metrics,
            max_seconds: config.max_seconds,
            max_requests: config.max_requests,
            pids: config.pids.clone().into(),
            max_sample_freq_hz: config.max_sample_freq_hz,
            off_cpu: config.off_cpu,
        }
    }

    /// A profile request's query, of which only the `allowed` parameters may
    /// be given; errors are the 400 message.
    pub(super) fn parse_profile_query(
        &self,
        query: Option<&str>,
        allowed: &[&str],
    ) -> Result<ProfileQuery, String> {
        let pairs = query_pairs(query, allowed)?;
        let seconds = match value(&pairs, "seconds") {
            None => DEFAULT_SECONDS.min(self.max_seconds as f64),
            Some(text) => match text.parse::<f64>() {
                Ok(s) if s.is_finite() && s >= MIN_SECONDS && s <= self.max_seconds as f64 => s,
                _ => {
                    return Err(format!(
                        "seconds={text:?} must be a number of seconds of at least {MIN_SECONDS} and at most {}",
                        self.max_seconds
                    ))
                }
            },
        };
        let mut pids = Vec::new();
        if let Some(text) = value(&pairs, "pids") {
            for part in text.split(',') {
                let pid = part
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| format!("pids={text:?}: {part:?} is not a process id"))?;
                if !self.pids.is_empty() && !self.pids.contains(&pid) {
                    return Err(format!(
                        "pid {pid} is not among the processes this agent samples (--pids)"
                    ));
                }
                pids.push(pid);
            }
        }
        let sample_freq_hz = match value(&pairs, "sample_freq") {
            None => None,
            Some(text) => Some(
                text.parse::<u64>()
                    .ok()
                    .filter(|f| (1..=self.max_sample_freq_hz).contains(f))
                    .ok_or_else(|| {
                        format!(
                            "sample_freq={text:?} must be a frequency in Hz from 1 to {} \
                             (kernel.perf_event_max_sample_rate)",
                            self.max_sample_freq_hz
                        )
                    })?,
            ),
        };
        let off_cpu = match value(&pairs, "offcpu") {
            None | Some("false") => false,
            Some("true") if self.off_cpu => true,
            Some("true") => {
                return Err("offcpu=true: this agent does not record off-CPU waits \
                            (start it with --off-cpu)"
                    .into())
            }
            Some(other) => return Err(format!("offcpu={other:?} must be true or false")),
        };
        Ok(ProfileQuery {
            duration_ns: (seconds * 1e9) as u64,
            pids,
            format: merged::format(value(&pairs, "format"))?,
            sample_freq_hz,
            off_cpu,
        })
    }

    /// A `POST /v1/recordings` query (`seconds`, `pids`, `sample_freq`,
    /// `offcpu`): as a profile query, but a recording has the off-CPU
    /// waits whenever the agent records them (`--off-cpu`) unless it says
    /// `offcpu=false`, so the web view's ranges show where threads waited.
    /// Errors are the 400 message.
    pub(super) fn parse_recording_query(
        &self,
        query: Option<&str>,
    ) -> Result<ProfileQuery, String> {
        let mut parsed = self.parse_profile_query(query, RECORDING_PARAMETERS)?;
        if value(&query_pairs(query, RECORDING_PARAMETERS)?, "offcpu").is_none() {
            parsed.off_cpu = self.off_cpu;
        }
        Ok(parsed)
    }

    /// Hand `query` to the sampling loop (as `format`; `None`: the profile
    /// itself, for the web view's recordings) and wait for its answer,
    /// counting it in the metrics. Errors are the response to send: 404 for a
    /// process that does not exist or no samples, 429 beyond
    /// `--listen-max-requests`, 409 for another frequency, 500/503 for
    /// failures.
    pub(super) async fn run(
        &self,
        query: ProfileQuery,
        format: Option<ProfileFormat>,
        arrived_mono_ns: u64,
    ) -> Result<Answer, Response> {
        let metrics = self.metrics.clone();
        // Like `--pids` on the command line: a process that does not exist
        // would only ever give an empty profile.
        if let Some(pid) = query
            .pids
            .iter()
            .find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        {
            metrics.profile_request("not_found");
            return Err(text(
                StatusCode::NOT_FOUND,
                format!("process {pid} does not exist (no /proc/{pid})"),
            ));
        }
        let active = metrics.profile_requests_active();
        if active.fetch_add(1, Ordering::SeqCst) >= self.max_requests as u64 {
            active.fetch_sub(1, Ordering::SeqCst);
            metrics.profile_request("too_many");
            return Err(text(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{} profile requests are in progress already (--listen-max-requests)",
                    self.max_requests
                ),
            ));
        }
        let _in_progress = InProgress(metrics.clone());
        let (reply, answer) = oneshot::channel();
        let request = ProfileRequest {
            duration_ns: query.duration_ns,
            pids: query.pids,
            sample_freq_hz: query.sample_freq_hz,
            format,
            off_cpu: query.off_cpu,
            arrived_mono_ns,
            reply,
        };
        let sent = self
            .requests
            .lock()
            .map_err(|_| ())
            .and_then(|tx| tx.send(request).map_err(|_| ()));
        if sent.is_err() {
            metrics.profile_request("failed");
            return Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the profiler is shutting down",
            ));
        }
        let (status, result) = match answer.await {
            Ok(Ok(answer)) => ("served", Ok(answer)),
            Ok(Err(RequestError::Conflict(message))) => {
                ("conflict", Err(text(StatusCode::CONFLICT, message)))
            }
            Ok(Err(RequestError::NoSamples(message))) => {
                ("no_samples", Err(text(StatusCode::NOT_FOUND, message)))
            }
            Ok(Err(RequestError::Failed(message))) => (
                "failed",
                Err(text(StatusCode::INTERNAL_SERVER_ERROR, message)),
            ),
            Err(_) => (
                "failed",
                Err(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the profiler stopped before the profile was complete",
                )),
            ),
        };
        metrics.profile_request(status);
        result
    }
}

/// The query's `key=value` pairs; a key outside `allowed` or given twice is
/// an error (the 400 message).
pub(super) fn query_pairs(
    query: Option<&str>,
    allowed: &[&str],
) -> Result<Vec<(String, String)>, String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if !allowed.contains(&k.as_ref()) {
            return Err(format!(
                "unknown query parameter {k:?} (expected {})",
                allowed.join(", ")
            ));
        }
        if pairs.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("query parameter {k:?} is given twice"));
        }
        pairs.push((k.into_owned(), v.into_owned()));
    }
    Ok(pairs)
}

/// The value of `key` among `pairs` (checked pairs: each key once).
pub(super) fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A validated `/debug/pprof/profile` query.
#[derive(Debug, PartialEq)]
pub(super) struct ProfileQuery {
    duration_ns: u64,
    pids: Vec<u32>,
    /// The answer's format (`format=`).
    pub(super) format: ProfileFormat,
    sample_freq_hz: Option<u64>,
    off_cpu: bool,
}

/// Shortest on-demand profile, seconds: one sampling period at 100 Hz
/// (anything shorter holds no sample at the usual frequencies).
const MIN_SECONDS: f64 = 0.01;

/// The parameters of `/debug/pprof/profile`.
pub(super) const PROFILE_PARAMETERS: &[&str] =
    &["seconds", "pids", "format", "sample_freq", "offcpu"];

/// The parameters of `POST /v1/recordings`.
const RECORDING_PARAMETERS: &[&str] = &["seconds", "pids", "sample_freq", "offcpu"];

/// Counts a profile request as in progress while it lives.
struct InProgress(Arc<Metrics>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0
            .profile_requests_active()
            .fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pids: Vec<u32>) -> Requests {
        state_with(pids, false)
    }

    fn state_with(pids: Vec<u32>, off_cpu: bool) -> Requests {
        let (tx, _rx) = std::sync::mpsc::channel();
        Requests::new(
            &ServerConfig {
                listen: "0".into(),
                token: None,
                max_seconds: 60,
                max_requests: 2,
                max_connections: 8,
                pids,
                max_sample_freq_hz: 1000,
                off_cpu,
            },
            tx,
            Arc::new(Metrics::default()),
        )
    }

    #[test]
    fn profile_queries_are_validated() {
        let s = state(vec![]);
        let q = s.parse_profile_query(None, PROFILE_PARAMETERS).unwrap();
        assert_eq!(q.duration_ns, 30_000_000_000);
        assert_eq!(q.format, ProfileFormat::Pprof);
        let q = s
            .parse_profile_query(
                Some("seconds=1.5&pids=7,8&format=flame-graph&sample_freq=49"),
                PROFILE_PARAMETERS,
            )
            .unwrap();
        assert_eq!(
            q,
            ProfileQuery {
                duration_ns: 1_500_000_000,
                pids: vec![7, 8],
                format: ProfileFormat::FlameGraph,
                sample_freq_hz: Some(49),
                off_cpu: false,
            }
        );
        for bad in [
            "seconds=0",
            "seconds=1e-9",
            "seconds=61",
            "seconds=abc",
            "seconds=NaN",
            "pids=1,x",
            "pids=0",
            "format=png",
            "sample_freq=0",
            "sample_freq=1001",
            "secs=1",
            "seconds=1&seconds=2",
        ] {
            assert!(
                s.parse_profile_query(Some(bad), PROFILE_PARAMETERS)
                    .is_err(),
                "{bad} passed"
            );
        }
        let narrowed = state(vec![5, 6]);
        assert!(narrowed
            .parse_profile_query(Some("pids=6"), PROFILE_PARAMETERS)
            .is_ok());
        let err = narrowed
            .parse_profile_query(Some("pids=7"), PROFILE_PARAMETERS)
            .unwrap_err();
        assert!(err.contains("pid 7"), "{err}");
    }

    #[test]
    fn recordings_have_waits_when_the_agent_records_them() {
        let off_cpu = |s: &Requests, q| s.parse_recording_query(q).map(|q| q.off_cpu);
        let plain = state(vec![]);
        assert_eq!(off_cpu(&plain, None), Ok(false));
        assert!(off_cpu(&plain, Some("offcpu=true")).is_err());
        let waits = state_with(vec![], true);
        assert_eq!(off_cpu(&waits, Some("seconds=2")), Ok(true));
        assert_eq!(off_cpu(&waits, Some("offcpu=false")), Ok(false));
        assert!(off_cpu(&waits, Some("format=svg")).is_err());
    }
}
