//! The endpoints of the agent's HTTP API:
//!
//! - `GET /debug/pprof/profile?seconds=N&pids=1,2&format=pprof|flame-graph|folded&sample_freq=HZ`:
//!   a CPU profile of the next N seconds (default 30), gzip'd pprof unless
//!   `format` says otherwise (any name or alias in [`crate::profile::format`], e.g.
//!   `flamegraph`, `svg`).
//! - `GET /debug/pprof/heap?format=pprof|flame-graph` (or an alias: `flame`,
//!   `flamegraph`, `svg`): the profiler's own
//!   heap profile (jemalloc, [`crate::agent::heap`]).
//! - `GET /debug/pprof/heap/settings`, `POST /debug/pprof/heap/settings?enabled=true|false`:
//!   read or switch heap sampling; the answer is `{"enabled":BOOL}`.
//! - `GET /` (and `/assets/…`, `/licenses`): the web view ([`crate::agent::page`]),
//!   over `/v1/recordings`, `/v1/timeline`, `/v1/profiles/merged` and
//!   `/v1/profiles/diff` ([`super::recordings`]).
//! - `GET /metrics`: Prometheus text format ([`super::metrics`]).
//! - `GET /healthz`: `ok`.
//!
//! With a token, every endpoint but `/healthz` needs `Authorization: Bearer
//! TOKEN` (401 with `WWW-Authenticate: Bearer` otherwise). Bad query values
//! get 400 with the reason, unknown paths 404, profile requests beyond the
//! limit 429, a frequency other than the one sampling runs at 409.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use axum::extract::{FromRef, RawQuery, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::metrics::{resident_memory_bytes, Metrics};
use super::ondemand::{Answer, ProfileRequest};
use super::recordings::{self, Recordings};
use super::request::{query_pairs, value, Requests, PROFILE_PARAMETERS};
use super::ServerConfig;
use crate::agent::heap::{self, HeapFormat};
use crate::agent::http::{blocking, text};
use crate::agent::page::assets::check_request;
use crate::agent::page::merged;
use crate::profile::format::ProfileFormat;
use crate::util::timefmt;

/// What every handler shares: the token, the on-demand requester and the
/// web view's recordings (handlers take the last two as their own state,
/// through [`FromRef`]).
#[derive(Clone)]
pub struct AppState {
    token: Option<Arc<str>>,
    requests: Requests,
    recordings: Arc<Recordings>,
}

impl AppState {
    /// The state of a server configured by `config`, requiring `token`
    /// (already checked: [`crate::agent::http::server_token`]), handing profile
    /// requests to `requests` and exporting `metrics`.
    pub fn new(
        config: &ServerConfig,
        token: Option<Arc<str>>,
        requests: Sender<ProfileRequest>,
        metrics: Arc<Metrics>,
    ) -> Self {
        AppState {
            token,
            requests: Requests::new(config, requests, metrics),
            recordings: Arc::default(),
        }
    }
}

impl FromRef<AppState> for Requests {
    fn from_ref(state: &AppState) -> Self {
        state.requests.clone()
    }
}

impl FromRef<AppState> for Arc<Recordings> {
    fn from_ref(state: &AppState) -> Self {
        state.recordings.clone()
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
        .merge(crate::agent::page::assets::routes())
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

async fn profile(State(requests): State<Requests>, RawQuery(query): RawQuery) -> Response {
    let arrived_mono_ns = timefmt::monotonic_ns();
    let query = match requests.parse_profile_query(query.as_deref(), PROFILE_PARAMETERS) {
        Ok(q) => q,
        Err(message) => {
            requests.metrics.profile_request("bad_request");
            return text(StatusCode::BAD_REQUEST, message);
        }
    };
    let format = query.format;
    match requests.run(query, Some(format), arrived_mono_ns).await {
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

async fn metrics(State(requests): State<Requests>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        requests
            .metrics
            .render(resident_memory_bytes(), crate::agent::heap::stats()),
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
        .and_then(|pairs| merged::format(value(&pairs, "format")))
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
