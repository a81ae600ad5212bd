//! `GET /v1/profiles/diff?from=&to=&base_from=&base_to=[&format=svg][&host=&pid=&tid=&comm=]`:
//! the differential flame graph of the samples in `[from, to)` against
//! those in `[base_from, base_to)` (inferno, through
//! [`crate::profile::format::flamegraph::differential`]: the new range's
//! stacks, red where their share grew, blue where it shrank; the base is
//! scaled to the new range's total first). Both servers answer it: each
//! finds the two ranges' profiles its own way and hands them to [`answer`].
//!
//! `format` may only name the flame graph (`svg`, `flame-graph`, …); 400
//! otherwise, and for a missing or empty range. The headers
//! `X-Lightswitch-Samples` and `X-Lightswitch-Base-Samples` give the two
//! ranges' sample counts.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::timeline::{range, value, SampleFilter};
use crate::agent::http::text;
use crate::profile::format::flamegraph;
use crate::profile::format::ProfileFormat;
use crate::profile::Profile;
use crate::util::timefmt;
use crate::util::wire::{BASE_SAMPLES_HEADER, SAMPLES_HEADER};

/// A validated diff query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffQuery {
    /// The range shown, `[from, to)`, ns since the Unix epoch.
    pub new: (u64, u64),
    /// The range compared against, `[base_from, base_to)`.
    pub base: (u64, u64),
    /// Which samples count, in both ranges.
    pub filter: SampleFilter,
}

impl DiffQuery {
    /// The query's ranges and filters; errors are the 400 message.
    pub fn parse(pairs: &[(String, String)]) -> Result<Self, String> {
        if let Some(name) = value(pairs, "format") {
            match ProfileFormat::from_name(name) {
                Ok(ProfileFormat::FlameGraph) => {}
                _ => {
                    return Err(format!(
                        "format={name:?}: a diff is drawn only as a flame graph (svg)"
                    ))
                }
            }
        }
        Ok(DiffQuery {
            new: range(pairs, "from", "to")?,
            base: range(pairs, "base_from", "base_to")?,
            filter: SampleFilter::from_pairs(pairs)?,
        })
    }
}

fn describe((from, to): (u64, u64)) -> String {
    format!("{} + {} ns", timefmt::rfc3339(from), to - from)
}

/// The differential flame graph of `new` against `base` (the profiles of
/// `query`'s two ranges), or 404 when the new range has no sample, 500 when
/// inferno fails.
pub fn answer(query: &DiffQuery, base: &Profile, new: &Profile) -> Response {
    let (base_samples, new_samples) = (base.total_samples(), new.total_samples());
    if new_samples == 0 {
        return text(
            StatusCode::NOT_FOUND,
            format!("no samples in {}", describe(query.new)),
        );
    }
    match flamegraph::differential(base, new, &describe(query.base), &describe(query.new)) {
        Ok(svg) => (
            [
                (
                    header::CONTENT_TYPE.as_str(),
                    ProfileFormat::FlameGraph.mime_type().to_string(),
                ),
                (SAMPLES_HEADER, new_samples.to_string()),
                (BASE_SAMPLES_HEADER, base_samples.to_string()),
            ],
            svg,
        )
            .into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")),
    }
}
