//! The endpoints of the agent's HTTP API:
//!
//! - `GET /debug/pprof/profile?seconds=N&pids=1,2&format=pprof|flame-graph|folded&sample_freq=HZ`:
//!   a CPU profile of the next N seconds (default 30), gzip'd pprof unless
//!   `format` says otherwise (any name or alias in [`crate::format`], e.g.
//!   `flamegraph`, `svg`).
//! - `GET /debug/pprof/heap?format=pprof|flame-graph` (or an alias: `flame`,
//!   `flamegraph`, `svg`): the profiler's own
//!   heap profile (jemalloc, [`crate::heap`]).
//! - `GET /debug/pprof/heap/settings`, `POST /debug/pprof/heap/settings?enabled=true|false`:
//!   read or switch heap sampling; the answer is `{"enabled":BOOL}`.
//! - `GET /` (and `/assets/…`, `/licenses`): the web view ([`crate::web`]),
//!   over `/v1/recordings`, `/v1/timeline`, `/v1/profiles/merged` and
//!   `/v1/profiles/diff` ([`super::recordings`]).
//! - `GET /metrics`: Prometheus text format ([`super::metrics`]).
//! - `GET /healthz`: `ok`.
//!
//! With a token, every endpoint but `/healthz` needs `Authorization: Bearer
//! TOKEN` (401 with `WWW-Authenticate: Bearer` otherwise). Bad query values
//! get 400 with the reason, unknown paths 404, profile requests beyond the
//! limit 429, a frequency other than the one sampling runs at 409.

use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use axum::extract::{RawQuery, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use super::metrics::{resident_memory_bytes, Metrics};
use super::ondemand::{Answer, ProfileRequest, RequestError};
use super::recordings::{self, Recordings};
use super::{ServerConfig, DEFAULT_SECONDS};
use crate::format::ProfileFormat;
use crate::heap::{self, HeapFormat};
use crate::httpd::{blocking, check_request, text};
use crate::timefmt;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    token: Option<Arc<str>>,
    // A Mutex so the state is Sync whatever the channel's own guarantees.
    requests: Arc<Mutex<Sender<ProfileRequest>>>,
    metrics: Arc<Metrics>,
    max_seconds: u64,
    max_requests: usize,
    pids: Arc<[u32]>,
    max_sample_freq_hz: u64,
    off_cpu: bool,
    recordings: Arc<Recordings>,
}

impl AppState {
    /// The state of a server configured by `config`, requiring `token`
    /// (already checked: [`crate::httpd::server_token`]), handing profile
    /// requests to `requests` and exporting `metrics`.
    pub fn new(
        config: &ServerConfig,
        token: Option<Arc<str>>,
        requests: Sender<ProfileRequest>,
        metrics: Arc<Metrics>,
    ) -> Self {
        AppState {
            token,
            requests: Arc::new(Mutex::new(requests)),
            metrics,
            max_seconds: config.max_seconds,
            max_requests: config.max_requests,
            pids: config.pids.clone().into(),
            max_sample_freq_hz: config.max_sample_freq_hz,
            off_cpu: config.off_cpu,
            recordings: Arc::default(),
        }
    }

    /// The recordings the web view made.
    pub(super) fn recordings(&self) -> &Recordings {
        &self.recordings
    }
}

/// The routes with authentication; unknown paths get 404.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/debug/pprof/profile", get(profile))
        .route("/debug/pprof/heap", get(heap_profile))
        .route(
            "/debug/pprof/heap/settings",
            get(heap_settings).post(heap_settings),
        )
        .route(
            "/v1/recordings",
            get(recordings::list).post(recordings::record),
        )
        .route("/v1/timeline", get(recordings::timeline))
        .route("/v1/profiles/merged", get(recordings::merged))
        .route("/v1/profiles/diff", get(recordings::diff))
        .merge(crate::web::assets::routes())
        .fallback(|request: Request| async move {
            text(
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint: {} (see /, /debug/pprof/profile, /debug/pprof/heap, \
                     /debug/pprof/heap/settings, /v1/recordings, /v1/timeline, \
                     /v1/profiles/merged, /v1/profiles/diff, /metrics, /healthz)",
                    request.uri().path()
                ),
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        if request.uri().path() != "/healthz" {
            if let Some(denied) = check_request(&request, token) {
                return denied;
            }
        }
    }
    next.run(request).await
}

/// The query's `key=value` pairs; a key outside `allowed` or given twice is
/// an error (the 400 message).
fn query_pairs(query: Option<&str>, allowed: &[&str]) -> Result<Vec<(String, String)>, String> {
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

fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `format=` of a CPU profile: any name or alias in the format registry;
/// pprof when absent.
fn profile_format(value: Option<&str>) -> Result<ProfileFormat, String> {
    value.map_or(Ok(ProfileFormat::Pprof), |name| {
        ProfileFormat::from_name(name).map_err(|e| format!("format={name:?}: {e}"))
    })
}

/// A validated `/debug/pprof/profile` query.
#[derive(Debug, PartialEq)]
pub(super) struct ProfileQuery {
    duration_ns: u64,
    pids: Vec<u32>,
    format: ProfileFormat,
    sample_freq_hz: Option<u64>,
    off_cpu: bool,
}

/// Shortest on-demand profile, seconds: one sampling period at 100 Hz
/// (anything shorter holds no sample at the usual frequencies).
const MIN_SECONDS: f64 = 0.01;

/// The parameters of `/debug/pprof/profile`.
const PROFILE_PARAMETERS: &[&str] = &["seconds", "pids", "format", "sample_freq", "offcpu"];

/// A profile request's query, of which only the `allowed` parameters may
/// be given; errors are the 400 message.
pub(super) fn parse_profile_query(
    state: &AppState,
    query: Option<&str>,
    allowed: &[&str],
) -> Result<ProfileQuery, String> {
    let pairs = query_pairs(query, allowed)?;
    let seconds = match value(&pairs, "seconds") {
        None => DEFAULT_SECONDS.min(state.max_seconds as f64),
        Some(text) => match text.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= MIN_SECONDS && s <= state.max_seconds as f64 => s,
            _ => {
                return Err(format!(
                    "seconds={text:?} must be a number of seconds of at least {MIN_SECONDS} and at most {}",
                    state.max_seconds
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
            if !state.pids.is_empty() && !state.pids.contains(&pid) {
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
                .filter(|f| (1..=state.max_sample_freq_hz).contains(f))
                .ok_or_else(|| {
                    format!(
                        "sample_freq={text:?} must be a frequency in Hz from 1 to {} \
                         (kernel.perf_event_max_sample_rate)",
                        state.max_sample_freq_hz
                    )
                })?,
        ),
    };
    let off_cpu = match value(&pairs, "offcpu") {
        None | Some("false") => false,
        Some("true") if state.off_cpu => true,
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
        format: profile_format(value(&pairs, "format"))?,
        sample_freq_hz,
        off_cpu,
    })
}

/// Counts a profile request as in progress while it lives.
struct InProgress(Arc<Metrics>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0
            .profile_requests_active()
            .fetch_sub(1, Ordering::SeqCst);
    }
}

async fn profile(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let arrived_mono_ns = timefmt::monotonic_ns();
    let query = match parse_profile_query(&state, query.as_deref(), PROFILE_PARAMETERS) {
        Ok(q) => q,
        Err(message) => {
            state.metrics.profile_request("bad_request");
            return text(StatusCode::BAD_REQUEST, message);
        }
    };
    let format = query.format;
    match run_request(&state, query, Some(format), arrived_mono_ns).await {
        Ok(Answer::Encoded(body)) => (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, format.mime_type()),
                (header::CONTENT_DISPOSITION, "inline"),
            ],
            body,
        )
            .into_response(),
        Ok(Answer::Profile(_)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "a profile came back unencoded (a bug)",
        ),
        Err(response) => response,
    }
}

/// Hand `query` to the sampling loop (as `format`; `None`: the profile
/// itself, for the web view's recordings) and wait for its answer,
/// counting it in the metrics. Errors are the response to send: 404 for a
/// process that does not exist or no samples, 429 beyond
/// `--listen-max-requests`, 409 for another frequency, 500/503 for
/// failures.
pub(super) async fn run_request(
    state: &AppState,
    query: ProfileQuery,
    format: Option<ProfileFormat>,
    arrived_mono_ns: u64,
) -> Result<Answer, Response> {
    let metrics = state.metrics.clone();
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
    if active.fetch_add(1, Ordering::SeqCst) >= state.max_requests as u64 {
        active.fetch_sub(1, Ordering::SeqCst);
        metrics.profile_request("too_many");
        return Err(text(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{} profile requests are in progress already (--listen-max-requests)",
                state.max_requests
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
    let sent = state
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

async fn metrics(State(state): State<AppState>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state
            .metrics
            .render(resident_memory_bytes(), crate::heap::stats()),
    )
        .into_response()
}

/// The answer of `/debug/pprof/heap/settings`, fields in this order.
#[derive(serde::Serialize)]
struct HeapSettings {
    /// Whether heap sampling is on.
    enabled: bool,
    /// Whether the binary was built with jemalloc's profiling.
    available: bool,
}

async fn heap_profile(RawQuery(query): RawQuery) -> Response {
    let format = match query_pairs(query.as_deref(), &["format"])
        .and_then(|pairs| profile_format(value(&pairs, "format")))
        .and_then(|format| match format {
            ProfileFormat::Pprof => Ok((HeapFormat::Pprof, format)),
            ProfileFormat::FlameGraph => Ok((HeapFormat::FlameGraph, format)),
            other => Err(format!(
                "format={:?}: heap profiles come as pprof or flame-graph",
                other.name()
            )),
        }) {
        Ok(f) => f,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    blocking(move || match heap::dump(format.0) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, format.1.mime_type())],
            body,
        )
            .into_response(),
        Err(err) if !heap::available() => text(StatusCode::CONFLICT, format!("{err:#}")),
        // jemalloc_pprof's flame graph of an empty profile.
        Err(err) if format!("{err:#}").contains("No stack counts found") => text(
            StatusCode::NOT_FOUND,
            "no allocation has been sampled yet: nothing to draw (switch sampling on and wait)",
        ),
        Err(err) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{err:#}")),
    })
    .await
}

async fn heap_settings(method: Method, RawQuery(query): RawQuery) -> Response {
    let post = method == Method::POST;
    let enabled = match query_pairs(query.as_deref(), &["enabled"]).and_then(|pairs| {
        match value(&pairs, "enabled") {
            None if post => Err("POST needs enabled=true or enabled=false".to_string()),
            None => Ok(None),
            Some(_) if !post => Err("GET only reads the setting: POST changes it".to_string()),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(format!("enabled={other:?} is neither true nor false")),
        }
    }) {
        Ok(e) => e,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    blocking(move || {
        if let Some(enabled) = enabled {
            if let Err(err) = heap::set_active(enabled) {
                let status = if heap::available() {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::CONFLICT
                };
                return text(status, format!("{err:#}"));
            }
        }
        let active = heap::available() && heap::is_active().unwrap_or(false);
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            format!(
                "{}\n",
                serde_json::to_string(&HeapSettings {
                    enabled: active,
                    available: heap::available(),
                })
                .unwrap_or_default()
            ),
        )
            .into_response()
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pids: Vec<u32>) -> AppState {
        let (tx, _rx) = std::sync::mpsc::channel();
        AppState::new(
            &ServerConfig {
                listen: "0".into(),
                token: None,
                max_seconds: 60,
                max_requests: 2,
                max_connections: 8,
                pids,
                max_sample_freq_hz: 1000,
                off_cpu: false,
            },
            None,
            tx,
            Arc::new(Metrics::default()),
        )
    }

    #[test]
    fn profile_queries_are_validated() {
        let s = state(vec![]);
        let q = parse_profile_query(&s, None, PROFILE_PARAMETERS).unwrap();
        assert_eq!(q.duration_ns, 30_000_000_000);
        assert_eq!(q.format, ProfileFormat::Pprof);
        let q = parse_profile_query(
            &s,
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
                parse_profile_query(&s, Some(bad), PROFILE_PARAMETERS).is_err(),
                "{bad} passed"
            );
        }
        let narrowed = state(vec![5, 6]);
        assert!(parse_profile_query(&narrowed, Some("pids=6"), PROFILE_PARAMETERS).is_ok());
        let err = parse_profile_query(&narrowed, Some("pids=7"), PROFILE_PARAMETERS).unwrap_err();
        assert!(err.contains("pid 7"), "{err}");
    }
}
