//! The collector's read side over the sample store: merged profiles of any
//! time range at sample resolution, the time-density timeline, the hosts.
//! Routes are in [`super::server::router`]; the endpoints are described in
//! docs/collector.md.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::sample_store::assemble::Assembler;
use super::sample_store::query::Selection;
use super::sample_store::timeline::Density;
use super::state::{json, query_pairs, query_value, time_param, AppState};
use crate::agent::http::{blocking, text};
use crate::agent::page::merged;
use crate::agent::page::timeline::MAX_BUCKETS;
use crate::util::wire::{SAMPLES_HEADER, SKIPPED_PROFILES_HEADER};

/// A numeric query parameter; errors are the 400 message.
fn number<T: std::str::FromStr>(
    pairs: &[(String, String)],
    key: &str,
) -> Result<Option<T>, String> {
    query_value(pairs, key)
        .map(|v| {
            v.parse()
                .map_err(|_| format!("{key}={v:?} is not a number"))
        })
        .transpose()
}

/// The selection of a query: `from` (default 0), `to` (default the end of
/// u64 ns), `host`, `pid`, `tid`, `comm`; errors are the 400 message.
fn selection(pairs: &[(String, String)]) -> Result<Selection, String> {
    let from = time_param(pairs, "from")?.unwrap_or(0);
    let to = time_param(pairs, "to")?.unwrap_or(u64::MAX);
    if to <= from {
        return Err(format!("to ({to}) must be after from ({from})"));
    }
    Ok(Selection {
        from,
        to,
        host: query_value(pairs, "host").map(str::to_string),
        pid: number(pairs, "pid")?,
        tid: number(pairs, "tid")?,
        comm: query_value(pairs, "comm").map(str::to_string),
    })
}

fn merged_blocking(state: &AppState, query: Option<String>) -> Response {
    let pairs = query_pairs(query.as_deref());
    let selection = match selection(&pairs) {
        Ok(s) => s,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let format = match merged::format(query_value(&pairs, "format")) {
        Ok(format) => format,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let blocks = state.store.blocks_for(&selection);
    if blocks.len() > state.max_merge_profiles {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "{} stored windows match, more than the {} one merge may cover \
                 (--max-merge-profiles): narrow from/to or host",
                blocks.len(),
                state.max_merge_profiles
            ),
        );
    }
    let at_most: u64 = blocks.iter().map(|b| b.samples).sum();
    if format.is_timeline() && at_most > state.max_timeline_samples {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the windows of this range hold {at_most} samples, more than the {} a {} answer \
                 may keep one by one (--max-timeline-samples): narrow from/to, or ask for an \
                 aggregated format (pprof, folded, flame-graph)",
                state.max_timeline_samples,
                format.name()
            ),
        );
    }
    let mut assembler = Assembler::new(format.is_timeline());
    let scanned = state.store.scan(&selection, &blocks, &mut assembler);
    let Some((span_start, span_end)) = scanned.span else {
        return text(
            StatusCode::NOT_FOUND,
            "no stored sample or off-CPU wait matches from/to/host/pid/tid/comm",
        );
    };
    let start = span_start.max(selection.from);
    let end = span_end.min(selection.to).max(start);
    let profile = assembler.finish(start, end - start, &scanned);
    let counts = merged::Counts {
        inputs: scanned.windows as u64,
        samples: scanned.samples,
        waits: scanned.waits,
    };
    let mut response = merged::answer(&profile, format, counts);
    if response.status() == StatusCode::OK {
        if let Ok(v) = scanned.skipped.to_string().parse() {
            response.headers_mut().insert(SKIPPED_PROFILES_HEADER, v);
        }
    }
    response
}

/// `GET /v1/profiles/merged`: see docs/collector.md.
pub async fn merged(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    blocking(move || merged_blocking(&state, query)).await
}

fn timeline_blocking(state: &AppState, query: Option<String>) -> Response {
    let pairs = query_pairs(query.as_deref());
    let parsed = selection(&pairs).and_then(|s| {
        if query_value(&pairs, "from").is_none() || query_value(&pairs, "to").is_none() {
            return Err("from and to are required (ns since the Unix epoch)".to_string());
        }
        let step: u64 = number(&pairs, "step")?.ok_or("step is required (ns)")?;
        if step == 0 {
            return Err("step must be at least 1 ns".to_string());
        }
        Ok((s, step))
    });
    let (selection, step) = match parsed {
        Ok(p) => p,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let span = selection.to - selection.from;
    let buckets = span.div_ceil(step);
    if buckets > MAX_BUCKETS {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "[from, to) is {span} ns, {buckets} buckets of step {step} ns: at most \
                 {MAX_BUCKETS} buckets are counted, so the largest range for this step is {} ns \
                 (or use a step of at least {} ns)",
                step.saturating_mul(MAX_BUCKETS),
                span.div_ceil(MAX_BUCKETS)
            ),
        );
    }
    let blocks = state.store.blocks_for(&selection);
    let mut density = Density::new(selection.from, step, buckets);
    let scanned = state.store.scan(&selection, &blocks, &mut density);
    let mut response = json(StatusCode::OK, &density.finish(selection.to));
    if let Ok(v) = scanned.samples.to_string().parse() {
        response.headers_mut().insert(SAMPLES_HEADER, v);
    }
    response
}

/// `GET /v1/timeline`: see docs/collector.md.
pub async fn timeline(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    blocking(move || timeline_blocking(&state, query)).await
}

/// One host of `GET /v1/hosts`.
#[derive(serde::Serialize)]
struct Host {
    host: String,
    first: String,
    last: String,
    samples: u64,
}

/// `GET /v1/hosts`: `{"hosts":[{"host","first","last","samples"}]}`, first
/// and last sample time as decimal strings of ns since the Unix epoch.
pub async fn hosts(State(state): State<AppState>) -> Response {
    blocking(move || {
        let hosts: Vec<Host> = state
            .store
            .hosts()
            .into_iter()
            .map(|(host, first, last, samples)| Host {
                host,
                first: first.to_string(),
                last: last.to_string(),
                samples,
            })
            .collect();
        json(StatusCode::OK, &serde_json::json!({ "hosts": hosts }))
    })
    .await
}
