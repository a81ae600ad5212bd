//! What the collector's handlers share: the state axum hands each of
//! them, and the helpers that read a query and write a JSON answer.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::archive::Storage;
use super::sample_store::SampleStore;
use crate::agent::http::text;
use crate::util::timefmt;

/// The last non-empty value of a key among a query's pairs.
pub(super) use crate::agent::page::timeline::value as query_value;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Where profiles go.
    pub storage: Arc<Storage>,
    /// Required bearer token, if any (never empty: see
    /// [`crate::agent::http::server_token`]).
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
    /// The sample store (every sample at its time).
    pub store: Arc<SampleStore>,
    /// Most samples a merge into a timeline format (firefox, otlp) may hold.
    pub max_timeline_samples: u64,
}

/// A JSON answer (one line), fields in the order `body` declares them.
pub(super) fn json(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let body = match serde_json::to_string(body) {
        Ok(body) => format!("{body}\n"),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The `key=value` pairs of a URL query, percent-decoded, in order.
pub(super) fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// The times a header or query parameter may give, for error messages.
pub(super) const TIME_FORMS: &str = "expected ns since the Unix epoch or an RFC 3339 UTC time, \
     1970-01-01T00:00:00Z to 2554-07-21T23:34:33Z";

/// A time query parameter; errors are the 400 message.
pub(super) fn time_param(pairs: &[(String, String)], key: &str) -> Result<Option<u64>, String> {
    match query_value(pairs, key) {
        None => Ok(None),
        Some(v) => timefmt::parse(v)
            .map(Some)
            .ok_or_else(|| format!("{key}={v:?} is not a time ({TIME_FORMS})")),
    }
}
