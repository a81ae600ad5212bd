//! The answer of `GET /v1/profiles/merged` that both servers give: the
//! collector from its sample store ([`crate::collector::queries`]), the
//! agent from its recordings ([`crate::agent::api::recordings`]). Each finds
//! the range's [`Profile`] its own way; the `format=` parameter, the
//! encoding and the headers the web view reads are the same.

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;

use crate::agent::http::text;
use crate::profile::format::{self, Compression, ProfileFormat};
use crate::profile::Profile;
use crate::util::wire::{MERGED_PROFILES_HEADER, OFF_CPU_WAITS_HEADER, SAMPLES_HEADER};

/// `format=` of a merged profile (`value`, absent: pprof): any name or
/// alias in the format registry, off-CPU views included
/// (`folded-off-cpu`, `flame-graph-off-cpu`); errors are the 400 message.
pub fn format(value: Option<&str>) -> Result<ProfileFormat, String> {
    value.map_or(Ok(ProfileFormat::Pprof), |name| {
        ProfileFormat::from_name(name).map_err(|e| format!("format={name:?}: {e}"))
    })
}

/// What a merged answer counts, for its headers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Stored windows (collector) or recordings (agent) merged
    /// (`X-Lightswitch-Merged-Profiles`).
    pub inputs: u64,
    /// On-CPU samples in the range (`X-Lightswitch-Samples`).
    pub samples: u64,
    /// Off-CPU waits (`--off-cpu`) that began in the range
    /// (`X-Lightswitch-Off-Cpu-Waits`): the web view links the range's
    /// off-CPU flame graph when there are any.
    pub waits: u64,
}

/// `profile` encoded as `format` (pprof and OTLP gzip'd, as the agent's
/// on-demand answers; the other formats have one encoding), with the
/// headers of `counts`; 422 when the format cannot show it (e.g. a
/// timeline format of a merge of several inputs).
pub fn answer(profile: &Profile, format: ProfileFormat, counts: Counts) -> Response {
    match format::encode(profile, format, Compression::Gzip) {
        Ok(bytes) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, format.mime_type())
            .header(MERGED_PROFILES_HEADER, counts.inputs.to_string())
            .header(SAMPLES_HEADER, counts.samples.to_string())
            .header(OFF_CPU_WAITS_HEADER, counts.waits.to_string())
            .body(Body::from(bytes))
            .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}")),
    }
}
