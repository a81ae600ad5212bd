//! `GET /v1/profiles/diff` on the collector: the two ranges' samples read
//! from the sample store as `GET /v1/profiles/merged` reads them (exactly
//! the samples in each range, with the same filters and the same
//! `--max-merge-profiles` bound), drawn by [`crate::agent::page::diff`].

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::sample_store::assemble::Assembler;
use super::sample_store::query::Selection;
use super::state::{query_pairs, AppState};
use crate::agent::http::{blocking, text};
use crate::agent::page::diff::{answer, DiffQuery};
use crate::profile::Profile;

/// The aggregated profile of `[from, to)` under `query`'s filters (empty
/// when no sample matches); the error is the 413 message when too many
/// windows match.
fn range_profile(
    state: &AppState,
    query: &DiffQuery,
    (from, to): (u64, u64),
) -> Result<Profile, String> {
    let filter = &query.filter;
    let selection = Selection {
        from,
        to,
        host: filter.host.clone(),
        pid: filter.pid,
        tid: filter.tid,
        comm: filter.comm.clone(),
    };
    let blocks = state.store.blocks_for(&selection);
    if blocks.len() > state.max_merge_profiles {
        return Err(format!(
            "{} stored windows match [{from}, {to}), more than the {} one merge may cover \
             (--max-merge-profiles): narrow the ranges or filter",
            blocks.len(),
            state.max_merge_profiles
        ));
    }
    let mut assembler = Assembler::new(false);
    let scanned = state.store.scan(&selection, &blocks, &mut assembler);
    Ok(assembler.finish(from, to - from, &scanned))
}

/// `GET /v1/profiles/diff`: see [`crate::agent::page::diff`].
pub async fn diff(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    blocking(move || {
        let query = match DiffQuery::parse(&query_pairs(query.as_deref())) {
            Ok(q) => q,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let profiles = range_profile(&state, &query, query.base)
            .and_then(|base| Ok((base, range_profile(&state, &query, query.new)?)));
        match profiles {
            Ok((base, new)) => answer(&query, &base, &new),
            Err(message) => text(StatusCode::PAYLOAD_TOO_LARGE, message),
        }
    })
    .await
}
