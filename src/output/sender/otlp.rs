//! The OTLP sender (`--sender otlp`): POSTs each window as an OTLP/HTTP
//! profiles export request to `URL/v1development/profiles`, as an
//! OpenTelemetry Collector (feature gate `service.profilesSupport`), Grafana
//! Pyroscope, Parca or `lightswitch collector` receive it.
//!
//! Request: the window's `ExportProfilesServiceRequest` from
//! [`crate::profile::format::otlp`] (every sample's time in `timestamps_unix_nano`),
//! gzip'd, with `Content-Type: application/x-protobuf` and
//! `Content-Encoding: gzip`, the headers of [`OtlpSettings::headers`] and,
//! with `--token`, `Authorization: Bearer TOKEN`.
//!
//! Answers, as the OTLP/HTTP specification asks of exporters:
//! - 2xx: delivered. A body that is an `ExportProfilesServiceResponse` whose
//!   `partial_success` names rejected profiles or an error message is
//!   logged and counted as partial ([`Attempt::Partial`]).
//! - 429, 502, 503, 504, and no answer at all: retried with the queue's
//!   backoff, or after `Retry-After` when the answer gives one and it is
//!   longer.
//! - Anything else: rejected, not retried; the message is the body's
//!   `google.rpc.Status` message when it decodes as one.
//!
//! Where it sends ([`endpoint`]) and the extra headers ([`headers`]) follow
//! the OpenTelemetry SDKs' environment variables.

use anyhow::{bail, Context, Result};
use prost::Message;
use reqwest::StatusCode;

use super::network::{Headers, NetworkSender, Request};
use super::queue::{Attempt, Item, Transport};
use super::remote::{failed, HttpConfig, HttpTransport};
use crate::profile::format::otlp::{self, proto::collector::ExportProfilesServiceResponse};
use crate::profile::format::Compression;
use crate::profile::Profile;

/// The path an OTLP/HTTP receiver takes profiles at, appended to the base URL.
pub const PROFILES_PATH: &str = "v1development/profiles";

/// The OTLP/HTTP default base URL (port 4318), used when neither
/// `--server-url` nor an `OTEL_EXPORTER_OTLP_*ENDPOINT` variable gives one.
pub const DEFAULT_BASE_URL: &str = "http://localhost:4318";

/// The `Content-Type` of an OTLP/HTTP binary protobuf body.
pub const CONTENT_TYPE: &str = "application/x-protobuf";

/// What the OTLP sender was given: the base URL (`--server-url`), the
/// extra headers (`--otlp-header`, in order) and the environment.
#[derive(Debug, Clone, Default)]
pub struct OtlpSettings {
    /// `--server-url`: the receiver's base URL; [`PROFILES_PATH`] is appended.
    pub base_url: Option<String>,
    /// `--otlp-header KEY=VALUE`, as given.
    pub headers: Vec<(String, String)>,
}

/// The URL profiles are POSTed to, in the SDKs' order of precedence:
/// `base_url` (`--server-url`) + `/v1development/profiles`; else
/// `OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT` as it is (a signal's own endpoint
/// is the full URL); else `OTEL_EXPORTER_OTLP_ENDPOINT` +
/// `/v1development/profiles`; else [`DEFAULT_BASE_URL`] + the path. `env`
/// reads a variable (unset and empty are the same).
pub fn endpoint(base_url: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> String {
    let join = |base: &str| format!("{}/{PROFILES_PATH}", base.trim_end_matches('/'));
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(base) = base_url {
        return join(base);
    }
    if let Some(url) = env("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT") {
        return url.trim().to_string();
    }
    match env("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Some(base) => join(base.trim()),
        None => join(DEFAULT_BASE_URL),
    }
}

/// The extra request headers: `OTEL_EXPORTER_OTLP_HEADERS`, then
/// `OTEL_EXPORTER_OTLP_PROFILES_HEADERS`, then `cli` (`--otlp-header`); a
/// later source replaces an earlier one's header of the same name (names
/// compared without case). The variables hold `key1=value1,key2=value2`
/// with percent-encoded values, as the OpenTelemetry SDKs read them.
/// Errors: an entry without `=` or with an empty name, naming where it came from.
pub fn headers(
    cli: &[(String, String)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut add = |name: String, value: String| {
        out.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
        out.push((name, value));
    };
    for variable in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
    ] {
        let Some(list) = env(variable) else { continue };
        for entry in list.split(',').filter(|e| !e.trim().is_empty()) {
            let Some((name, value)) = entry.split_once('=') else {
                bail!("{variable}: {entry:?} is not KEY=VALUE");
            };
            let name = name.trim();
            if name.is_empty() {
                bail!("{variable}: {entry:?} has no header name");
            }
            let value = percent_encoding::percent_decode_str(value.trim())
                .decode_utf8()
                .with_context(|| format!("{variable}: the value of {name} is not UTF-8"))?;
            add(name.to_string(), value.into_owned());
        }
    }
    for (name, value) in cli {
        add(name.clone(), value.clone());
    }
    for (name, value) in &out {
        reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .with_context(|| format!("OTLP header {name:?} is not a valid header name"))?;
        reqwest::header::HeaderValue::from_str(value).with_context(|| {
            format!("the value of OTLP header {name} is not a valid header value")
        })?;
    }
    Ok(out)
}

/// Whether an OTLP/HTTP answer's status is worth retrying: 429, 502, 503
/// and 504, the statuses the OTLP specification names as retryable.
pub fn is_retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error answer (fields 1
/// and 2 of `google/rpc/status.proto`; `details` is not read).
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// An error answer's body as text: the `google.rpc.Status` message when
/// the body decodes as one with a message, else the body as text.
fn explain(body: &[u8]) -> String {
    match RpcStatus::decode(body) {
        Ok(status) if !status.message.is_empty() => status.message,
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

/// What a 2xx answer's body says: `None` when it is empty or a response
/// without a partial success, else the description of what was dropped.
pub fn partial_success(body: &[u8]) -> Option<String> {
    let response = ExportProfilesServiceResponse::decode(body).ok()?;
    let partial = response.partial_success?;
    if partial.rejected_profiles == 0 && partial.error_message.is_empty() {
        return None;
    }
    Some(format!(
        "partial_success: {} profiles rejected{}{}",
        partial.rejected_profiles,
        if partial.error_message.is_empty() {
            ""
        } else {
            ": "
        },
        partial.error_message
    ))
}

/// Posts export requests; see the module's description of answers.
struct OtlpTransport {
    http: HttpTransport,
}

/// The most of a success answer's body that is read, bytes.
const MAX_RESPONSE_BYTES: u64 = 64 * 1024;

impl Transport for OtlpTransport {
    fn send(&mut self, item: &Item, timeout: std::time::Duration) -> Attempt {
        use std::io::Read;
        match self.http.post(item, timeout) {
            Ok(response) if response.status().is_success() => {
                let mut body = Vec::new();
                let _ = response.take(MAX_RESPONSE_BYTES).read_to_end(&mut body);
                match partial_success(&body) {
                    Some(message) => Attempt::Partial(message),
                    None => Attempt::Delivered,
                }
            }
            Ok(response) => failed(response, is_retryable, explain),
            Err(err) => Attempt::Retry(err),
        }
    }

    fn destination(&self) -> String {
        self.http.destination()
    }
}

/// How the `--sender=otlp` sender makes a request of a window: the gzip'd
/// export request of [`otlp::encode`].
pub struct OtlpRequest;

impl Request for OtlpRequest {
    fn request(&mut self, profile: &Profile) -> Result<(Vec<u8>, Headers)> {
        Ok((otlp::encode(profile, Compression::Gzip)?, Vec::new()))
    }
}

/// The `--sender=otlp` sender.
pub type OtlpSender = NetworkSender<OtlpRequest>;

impl OtlpSender {
    /// Start the sender thread posting to `config.url` (already the full
    /// endpoint, see [`endpoint`]) with the extra `headers`. Errors: the
    /// HTTP client or the thread could not be created.
    pub fn start(config: HttpConfig, headers: Vec<(String, String)>) -> Result<Self> {
        let mut fixed = vec![
            ("Content-Type".to_string(), CONTENT_TYPE.to_string()),
            ("Content-Encoding".to_string(), "gzip".to_string()),
        ];
        fixed.extend(headers);
        let http = HttpTransport::new(config.clone(), fixed)?;
        let delivery = config.deliver_through(OtlpTransport { http })?;
        Ok(NetworkSender::new(delivery, OtlpRequest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::format::otlp::proto::collector::ExportProfilesPartialSuccess;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn endpoint_follows_the_sdks_precedence() {
        let none = env_of(&[]);
        assert_eq!(
            endpoint(None, &none),
            "http://localhost:4318/v1development/profiles"
        );
        assert_eq!(
            endpoint(Some("http://c:4567/"), &none),
            "http://c:4567/v1development/profiles"
        );
        let base = env_of(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel:4318/otlp")]);
        assert_eq!(
            endpoint(None, &base),
            "https://otel:4318/otlp/v1development/profiles"
        );
        let both = env_of(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otel:4318"),
            ("OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT", "https://p:9/in"),
        ]);
        assert_eq!(endpoint(None, &both), "https://p:9/in");
        assert_eq!(
            endpoint(Some("http://x"), &both),
            "http://x/v1development/profiles"
        );
    }

    #[test]
    fn headers_come_from_both_variables_then_the_command_line() {
        let env = env_of(&[
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "Authorization=Basic%20YWJj, X-Scope-OrgID=a",
            ),
            ("OTEL_EXPORTER_OTLP_PROFILES_HEADERS", "x-scope-orgid=b"),
        ]);
        let cli = vec![("X-Extra".to_string(), "1".to_string())];
        assert_eq!(
            headers(&cli, &env).unwrap(),
            vec![
                ("Authorization".to_string(), "Basic YWJj".to_string()),
                ("x-scope-orgid".to_string(), "b".to_string()),
                ("X-Extra".to_string(), "1".to_string()),
            ]
        );
        let bad = env_of(&[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")]);
        let err = headers(&[], &bad).unwrap_err().to_string();
        assert!(err.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{err}");
        let cli = vec![("bad name".to_string(), "1".to_string())];
        assert!(headers(&cli, &env_of(&[])).is_err());
    }

    #[test]
    fn only_the_specs_statuses_are_retried() {
        for code in [429, 502, 503, 504] {
            assert!(is_retryable(StatusCode::from_u16(code).unwrap()));
        }
        for code in [400, 401, 404, 413, 500, 501] {
            assert!(!is_retryable(StatusCode::from_u16(code).unwrap()));
        }
    }

    #[test]
    fn partial_success_is_read_from_the_response() {
        assert_eq!(partial_success(&[]), None);
        let full = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess::default()),
        };
        assert_eq!(partial_success(&full.encode_to_vec()), None);
        let partial = ExportProfilesServiceResponse {
            partial_success: Some(ExportProfilesPartialSuccess {
                rejected_profiles: 2,
                error_message: "too old".into(),
            }),
        };
        assert_eq!(
            partial_success(&partial.encode_to_vec()).unwrap(),
            "partial_success: 2 profiles rejected: too old"
        );
        let status = RpcStatus {
            code: 3,
            message: "bad dictionary".into(),
        };
        assert_eq!(explain(&status.encode_to_vec()), "bad dictionary");
        assert_eq!(explain(b"plain text"), "plain text");
    }
}
