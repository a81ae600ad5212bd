//! The collector's HTTP API (axum on a small tokio runtime).
//!
//! - `POST /v1/profiles`: body = raw or gzip'd pprof. The host comes from the
//!   `X-Lightswitch-Host` header (else `?host=`, else `unknown`); the window
//!   from `X-Lightswitch-Window-Start`/`-End` (ns since the Unix epoch or
//!   RFC 3339), else from the profile's `time_nanos`/`duration_nanos`, else
//!   the time of receipt. 200 with a JSON description of what was stored;
//!   400 with a message if the body is not a valid pprof profile; 413 if it
//!   is over `--max-body-bytes` or decompresses to more than
//!   `--max-decoded-bytes` (decompression is streamed and stops there). At
//!   most `--max-concurrent-ingests` bodies are read and decoded at once;
//!   others wait, and a request not done within [`INGEST_TIMEOUT`] gets 408.
//!   Its samples also go into the sample store ([`super::store`]), each
//!   at the window's start (pprof has no per-sample time). A storage
//!   failure that may pass (a full disk) is answered 503 with
//!   `Retry-After`, other storage failures 500, and nothing of the request
//!   is kept; a window stored before (the same host, window and content) is
//!   answered 200 and not stored twice.
//! - `POST /v1development/profiles`: OTLP/HTTP ([`super::ingest::otlp`]).
//! - `GET /v1/profiles?host=&from=&to=`: JSON list of stored pprof files whose
//!   window overlaps `[from, to)`, oldest first.
//! - `GET /v1/profiles/merged`, `GET /v1/timeline`, `GET /v1/hosts`: the
//!   sample store's answers ([`super::queries`]); `GET /metrics` its
//!   counters ([`super::metrics`]). All are described in docs/collector.md.
//!
//! - `GET /v1/profiles/diff?from=&to=&base_from=&base_to=`: the
//!   differential flame graph of two ranges ([`super::diff`]).
//! - `GET /`, `/assets/…`, `/licenses`: the web view ([`crate::web`]); with
//!   a token, a browser is asked for it as a Basic password.
//!
//! Times (headers and `from`/`to`) outside what u64 nanoseconds hold
//! (after 2554-07-21) are refused with 400 naming the value.
//!
//! With a token configured, every request needs `Authorization: Bearer
//! TOKEN` (401 otherwise, checked before the body is read).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::handler::Handler;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tower_http::timeout::TimeoutLayer;
use tracing::{info, warn};

use super::archive::{Filter, Storage, StoredProfile};
use super::ingest::{refusal, storing_failed};
use super::queries;
use super::sample_store::identity::content_hash;
use super::state::{json, query_pairs, query_value, time_param, AppState, TIME_FORMS};
use crate::agent::http::{blocking, text};
use crate::agent::page::assets::check_request;
use crate::profile::merge::{self, BodyError};
use crate::util::timefmt;
use crate::util::wire::{HOST_HEADER, WINDOW_END_HEADER, WINDOW_START_HEADER};

/// Longest a `POST /v1/profiles` may take, waiting for its turn and
/// reading its body included (a slow client is answered 408 and dropped).
pub const INGEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The collector's routes with body limits, the ingest limit and timeout,
/// and authentication.
pub fn router(state: AppState) -> Router {
    let ingest_limits = (
        TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, INGEST_TIMEOUT),
        middleware::from_fn_with_state(state.clone(), one_of_few_ingests),
    );
    Router::new()
        .route(
            "/v1/profiles",
            get(list).post(ingest.layer(ingest_limits.clone())),
        )
        .route(
            "/v1development/profiles",
            post(super::ingest::otlp.layer(ingest_limits)),
        )
        .route("/v1/profiles/merged", get(queries::merged))
        .route("/v1/timeline", get(queries::timeline))
        .route("/v1/hosts", get(queries::hosts))
        .route("/v1/profiles/diff", get(super::diff::diff))
        .route("/metrics", get(super::metrics::render))
        .merge(crate::agent::page::assets::routes())
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// Let a body be read and decoded only while fewer than
/// `--max-concurrent-ingests` others are (the rest wait their turn).
async fn one_of_few_ingests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = state.ingests.acquire().await else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "the collector is stopping");
    };
    next.run(request).await
}

async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        if let Some(denied) = check_request(&request, token) {
            return denied;
        }
    }
    next.run(request).await
}

/// The listing filter of a query; errors are the 400 message.
fn filter_from(pairs: &[(String, String)]) -> Result<Filter, String> {
    Ok(Filter {
        host: query_value(pairs, "host").map(str::to_string),
        from: time_param(pairs, "from")?,
        to: time_param(pairs, "to")?,
    })
}

/// One stored profile as the listing describes it: host, window (ns and
/// RFC 3339), gzip'd size in bytes, path relative to the storage root
/// (fields in this order).
#[derive(serde::Serialize)]
struct Described {
    host: String,
    start_unix_ns: u64,
    end_unix_ns: u64,
    start: String,
    end: String,
    size: u64,
    path: String,
}

/// The answer of a listing.
#[derive(serde::Serialize)]
struct Listing {
    profiles: Vec<Described>,
}

fn describe(storage: &Storage, p: &StoredProfile) -> Described {
    let relative = p.path.strip_prefix(storage.root()).unwrap_or(&p.path);
    Described {
        host: p.host.clone(),
        start_unix_ns: p.start_unix_ns,
        end_unix_ns: p.end_unix_ns,
        start: timefmt::rfc3339(p.start_unix_ns),
        end: timefmt::rfc3339(p.end_unix_ns),
        size: p.size,
        path: relative.to_string_lossy().into_owned(),
    }
}

/// A time header; errors are the 400 message.
fn header_time(headers: &HeaderMap, name: &str) -> Result<Option<u64>, String> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(timefmt::parse)
        .map(Some)
        .ok_or_else(|| {
            format!(
                "header {name}: {:?} is not a time ({TIME_FORMS})",
                String::from_utf8_lossy(value.as_bytes())
            )
        })
}

fn ingest_blocking(
    state: &AppState,
    query: Option<String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let (profile, raw) = match merge::decode_body(body, state.max_decoded_bytes) {
        Ok(decoded) => decoded,
        Err(BodyError::Malformed(message)) => return text(StatusCode::BAD_REQUEST, message),
        Err(BodyError::TooLarge(message)) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("{message} (--max-decoded-bytes)"),
            )
        }
    };
    let pairs = query_pairs(query.as_deref());
    let host = headers
        .get(HOST_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| query_value(&pairs, "host"))
        .unwrap_or("unknown")
        .to_string();
    let (start, end) = match (
        header_time(headers, WINDOW_START_HEADER),
        header_time(headers, WINDOW_END_HEADER),
    ) {
        (Err(message), _) | (_, Err(message)) => return text(StatusCode::BAD_REQUEST, message),
        (Ok(Some(s)), Ok(Some(e))) => (s, e),
        (Ok(s), Ok(e)) => {
            let start = s.unwrap_or_else(|| match profile.time_nanos {
                t if t > 0 => t as u64,
                _ => timefmt::now_unix_ns(),
            });
            (
                start,
                e.unwrap_or(start.saturating_add(profile.duration_nanos.max(0) as u64)),
            )
        }
    };
    if end < start {
        return text(StatusCode::BAD_REQUEST, "the window ends before it starts");
    }
    let model = merge::profile_from_pprof(&profile);
    drop(profile);
    let content = content_hash(&raw);
    let gzipped = if merge::is_gzip(body) {
        body.to_vec()
    } else {
        match gzip(&raw) {
            Ok(g) => g,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
        }
    };
    // The archive first: its file is named by content, so storing it again
    // is harmless, and it is removed if the samples cannot be stored.
    let stored = match state.storage.store(&host, start, end, &gzipped) {
        Ok(stored) => stored,
        Err(e) => {
            state.store.health.failed(&e);
            return refusal(storing_failed(e));
        }
    };
    match super::ingest::store_pprof(&state.store, &host, (start, end), &model, content) {
        Ok(done) if done.duplicate => {
            info!(
                "{} came again: answered, not stored twice",
                stored.path.display()
            );
        }
        Ok(_) => info!("stored {} ({} bytes)", stored.path.display(), stored.size),
        Err(refused) => {
            if let Err(e) = std::fs::remove_file(&stored.path) {
                warn!(
                    "cannot remove {} of a failed request: {e}",
                    stored.path.display()
                );
            }
            return refusal(refused);
        }
    }
    json(StatusCode::OK, &describe(&state.storage, &stored))
}

fn gzip(raw: &[u8]) -> anyhow::Result<Vec<u8>> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(raw)?;
    Ok(gz.finish()?)
}

async fn ingest(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    blocking(move || ingest_blocking(&state, query, &headers, &body)).await
}

async fn list(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    blocking(move || {
        let filter = match filter_from(&query_pairs(query.as_deref())) {
            Ok(f) => f,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        match state.storage.list(&filter) {
            Ok(profiles) => {
                let items: Vec<_> = profiles
                    .iter()
                    .map(|p| describe(&state.storage, p))
                    .collect();
                json(StatusCode::OK, &Listing { profiles: items })
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
        }
    })
    .await
}
