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
//! - `GET /v1/profiles?host=&from=&to=`: JSON list of stored profiles whose
//!   window overlaps `[from, to)`, oldest first.
//! - `GET /v1/profiles/merged?from=&to=&host=&format=pprof|flame-graph|folded`:
//!   those profiles merged into one ([`super::merge`]); pprof is gzip'd.
//!   Stored profiles are read and merged one at a time, so memory holds
//!   the merged result and one input. 404 if no profile matches; 413 if
//!   more than `--max-merge-profiles` match (the message says how many).
//!   Headers `X-Lightswitch-Merged-Profiles` and
//!   `X-Lightswitch-Skipped-Profiles` (unreadable files) say what went in.
//!
//! - `GET /v1/profiles/diff?from=&to=&base_from=&base_to=&host=`: the
//!   differential flame graph of two ranges ([`crate::web::diff`]), each
//!   merged as above.
//! - `GET /`, `/assets/…`, `/licenses`: the web view ([`crate::web`]).
//!
//! Times (headers and `from`/`to`) outside what u64 nanoseconds hold
//! (after 2554-07-21) are refused with 400 naming the value.
//!
//! With a token configured, every request needs `Authorization: Bearer
//! TOKEN` (401 otherwise, checked before the body is read).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, RawQuery, Request, State};
use axum::handler::Handler;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::Semaphore;
use tower_http::timeout::TimeoutLayer;
use tracing::{info, warn};

use super::merge::{self, BodyError};
use super::storage::{Filter, Storage, StoredProfile};
use crate::format::{self, Compression, ProfileFormat};
use crate::httpd::{blocking, check_request, text};
use crate::timefmt;
use crate::wire::{
    HOST_HEADER, MERGED_PROFILES_HEADER, SKIPPED_PROFILES_HEADER, WINDOW_END_HEADER,
    WINDOW_START_HEADER,
};

/// Longest a `POST /v1/profiles` may take, waiting for its turn and
/// reading its body included (a slow client is answered 408 and dropped).
pub const INGEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Where profiles go.
    pub storage: Arc<Storage>,
    /// Required bearer token, if any (never empty: see
    /// [`crate::httpd::server_token`]).
    pub token: Option<Arc<str>>,
    /// Largest accepted body, bytes.
    pub max_body_bytes: usize,
    /// Largest size a body may decompress to, bytes (also the bound when
    /// stored profiles are read back for a merge).
    pub max_decoded_bytes: usize,
    /// Bodies read and decoded at once: one permit per ingest in progress.
    pub ingests: Arc<Semaphore>,
    /// Most stored profiles one merge request may cover.
    pub max_merge_profiles: usize,
}

/// The collector's routes with body limits, the ingest limit and timeout,
/// and authentication.
pub fn router(state: AppState) -> Router {
    let ingest_limits = (
        TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, INGEST_TIMEOUT),
        middleware::from_fn_with_state(state.clone(), one_of_few_ingests),
    );
    Router::new()
        .route("/v1/profiles", get(list).post(ingest.layer(ingest_limits)))
        .route("/v1/profiles/merged", get(merged))
        .route("/v1/profiles/diff", get(diff))
        .merge(crate::web::assets::routes())
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

/// A JSON answer (one line), fields in the order `body` declares them.
fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let body = match serde_json::to_string(body) {
        Ok(body) => format!("{body}\n"),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        if let Some(denied) = check_request(&request, token) {
            return denied;
        }
    }
    next.run(request).await
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn query_value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

/// The times a header or query parameter may give, for error messages.
const TIME_FORMS: &str = "expected ns since the Unix epoch or an RFC 3339 UTC time, \
     1970-01-01T00:00:00Z to 2554-07-21T23:34:33Z";

/// A time query parameter; errors are the 400 message.
fn time_param(pairs: &[(String, String)], key: &str) -> Result<Option<u64>, String> {
    match query_value(pairs, key) {
        None => Ok(None),
        Some(v) => timefmt::parse(v)
            .map(Some)
            .ok_or_else(|| format!("{key}={v:?} is not a time ({TIME_FORMS})")),
    }
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
    let gzipped = if merge::is_gzip(body) {
        body.to_vec()
    } else {
        match gzip(&raw) {
            Ok(g) => g,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
        }
    };
    match state.storage.store(&host, start, end, &gzipped) {
        Ok(stored) => {
            info!("stored {} ({} bytes)", stored.path.display(), stored.size);
            json(StatusCode::OK, &describe(&state.storage, &stored))
        }
        Err(e) => {
            warn!("storing a profile failed: {e:#}");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("storing the profile failed: {e:#}"),
            )
        }
    }
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

fn merged_blocking(state: &AppState, query: Option<String>) -> Response {
    let pairs = query_pairs(query.as_deref());
    let filter = match filter_from(&pairs) {
        Ok(f) => f,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let format = match query_value(&pairs, "format").map_or(Ok(ProfileFormat::Pprof), |name| {
        ProfileFormat::from_name(name).map_err(|e| format!("format={name:?}: {e}"))
    }) {
        Ok(format) => format,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let stored = match state.storage.list(&filter) {
        Ok(s) => s,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    };
    if stored.is_empty() {
        return text(
            StatusCode::NOT_FOUND,
            "no stored profile matches host/from/to",
        );
    }
    if stored.len() > state.max_merge_profiles {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} stored profiles match, more than the {} one merge may cover \
                 (--max-merge-profiles): narrow from/to or host",
                stored.len(),
                state.max_merge_profiles
            ),
        );
    }
    let (merged, skipped) = merge_stored(state, &stored);
    encode_merged(&merged, format, skipped)
}

/// Merge `stored` reading one file at a time: memory holds the merged
/// result and one input, however many inputs there are. Returns the merge
/// and the number of files skipped because they could not be read or
/// decoded (logged).
fn merge_stored(state: &AppState, stored: &[StoredProfile]) -> (merge::Merged, usize) {
    let mut skipped = 0;
    let inputs = stored.iter().filter_map(|p| {
        let decoded = state
            .storage
            .read(p)
            .map_err(|e| format!("{e:#}"))
            .and_then(|bytes| {
                merge::decode_body(&bytes, state.max_decoded_bytes).map_err(|e| format!("{e:?}"))
            });
        match decoded {
            Ok((proto, _)) => Some(merge::profile_from_pprof(&proto)),
            Err(e) => {
                warn!("skipping {}: {e}", p.path.display());
                skipped += 1;
                None
            }
        }
    });
    let merged = merge::merge(inputs);
    if merged.mixed_frequencies {
        warn!("merged profiles with different sampling frequencies; cpu time uses the first's");
    }
    (merged, skipped)
}

/// The answer to a merge: `merged` encoded as `format`.
fn encode_merged(merged: &merge::Merged, format: ProfileFormat, skipped: usize) -> Response {
    // pprof answers are gzip'd (what `go tool pprof` fetches); the other
    // formats have one encoding.
    let encoded = format::encode(&merged.profile, format, Compression::Gzip);
    match encoded {
        Ok(bytes) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, format.mime_type())
            .header(MERGED_PROFILES_HEADER, merged.inputs.to_string())
            .header(SKIPPED_PROFILES_HEADER, skipped.to_string())
            .body(Body::from(bytes))
            .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")),
    }
}

async fn merged(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    blocking(move || merged_blocking(&state, query)).await
}

/// The merged profile of `[from, to)` on `host` (if given), or the error
/// response ([`merged_blocking`]'s).
fn range_profile(
    state: &AppState,
    host: Option<&str>,
    (from, to): (u64, u64),
) -> Result<crate::profile::Profile, Response> {
    let filter = Filter {
        host: host.map(str::to_string),
        from: Some(from),
        to: Some(to),
    };
    let stored = state
        .storage
        .list(&filter)
        .map_err(|e| text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    if stored.len() > state.max_merge_profiles {
        return Err(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} stored profiles match, more than --max-merge-profiles ({})",
                stored.len(),
                state.max_merge_profiles
            ),
        ));
    }
    Ok(merge_stored(state, &stored).0.profile)
}

async fn diff(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    blocking(move || {
        let pairs = query_pairs(query.as_deref());
        let query = match crate::web::diff::DiffQuery::parse(&pairs) {
            Ok(q) => q,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let host = query.filter.host.as_deref();
        let profiles = range_profile(&state, host, query.base)
            .and_then(|base| Ok((base, range_profile(&state, host, query.new)?)));
        match profiles {
            Ok((base, new)) => crate::web::diff::answer(&query, &base, &new),
            Err(response) => response,
        }
    })
    .await
}
