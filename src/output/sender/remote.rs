//! The remote sender: POSTs each window's profile, gzip'd pprof, to an HTTP
//! endpoint (`lightswitch collector`, or anything that takes pprof).
//!
//! Request: `POST <url>`, body = gzip'd pprof, with
//! `Content-Type: application/vnd.google.protobuf`, `Content-Encoding: gzip`,
//! [`HOST_HEADER`] (the machine's host name), [`WINDOW_START_HEADER`] and
//! [`WINDOW_END_HEADER`] (the window, ns since the Unix epoch),
//! [`SAMPLES_HEADER`], and `Authorization: Bearer TOKEN` when a token is
//! configured (`--token` or `LIGHTSWITCH_TOKEN`). Credentials in the URL
//! (`http://user:pass@host/...`) are sent as basic auth instead.
//! Any 2xx answer is success. Delivery (queueing, retries, counters) is
//! [`super::queue`]'s; [`HttpTransport`] is also what the Pyroscope sender posts with.

use std::io::Read;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use reqwest::blocking::{Client, Response};
use reqwest::StatusCode;
use url::Url;

use super::network::{Headers, NetworkSender, Request};
use super::queue::{Attempt, Backoff, Delivery, Item, Transport};
use super::spool::SpoolSettings;
use crate::profile::format::pprof;
use crate::profile::format::{Compression, ProfileFormat};
use crate::profile::Profile;
use crate::util::wire::{HOST_HEADER, SAMPLES_HEADER, WINDOW_END_HEADER, WINDOW_START_HEADER};

/// Default endpoint of the remote sender: a local `lightswitch collector`.
pub const DEFAULT_URL: &str = "http://127.0.0.1:4567/v1/profiles";

/// How to reach a server: URL, credentials, limits.
#[derive(Clone)]
pub struct HttpConfig {
    /// Where to POST (credentials removed).
    pub url: Url,
    /// `user:password` from the URL, sent as basic auth.
    pub basic: Option<(String, Option<String>)>,
    /// Bearer token.
    pub token: Option<String>,
    /// Timeout of one request.
    pub timeout: Duration,
    /// Queue budget, bytes.
    pub queue_bytes: usize,
    /// Retry policy.
    pub backoff: Backoff,
    /// Where undelivered profiles are kept across restarts (`--spool-dir`).
    pub spool: Option<SpoolSettings>,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print credentials.
        f.debug_struct("HttpConfig")
            .field("url", &self.url.as_str())
            .field("basic", &self.basic.as_ref().map(|_| "<set>"))
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("timeout", &self.timeout)
            .field("queue_bytes", &self.queue_bytes)
            .finish()
    }
}

/// A network sender's settings as the user gave them (`--token`,
/// `--send-timeout`, `--send-queue-bytes`), before validation.
#[derive(Clone, Default)]
pub struct HttpSettings {
    /// Bearer token, if any (`--token` / `LIGHTSWITCH_TOKEN`).
    pub token: Option<String>,
    /// Timeout of one request, seconds.
    pub send_timeout_s: f64,
    /// Queue budget, bytes.
    pub send_queue_bytes: usize,
    /// `--spool-dir`, `--spool-max-bytes`, `--spool-max-age` (the host is
    /// filled in by [`HttpConfig::new`]).
    pub spool: Option<SpoolSettings>,
}

impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("HttpSettings")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("send_timeout_s", &self.send_timeout_s)
            .field("send_queue_bytes", &self.send_queue_bytes)
            .field("spool", &self.spool)
            .finish()
    }
}

impl HttpConfig {
    /// Parse `url` (http or https) and validate `settings`. Errors name the
    /// flag at fault.
    pub fn new(url: &str, settings: &HttpSettings) -> Result<Self> {
        let mut url =
            Url::parse(url).with_context(|| format!("--server-url {url:?} is not a URL"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            anyhow::bail!("--server-url must be an http:// or https:// URL with a host");
        }
        let basic = (!url.username().is_empty()).then(|| {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            (decode(url.username()), url.password().map(decode))
        });
        // Neither setter fails on an http(s) URL with a host.
        let _ = url.set_username("");
        let _ = url.set_password(None);
        crate::sampling::preflight::count("--send-queue-bytes", settings.send_queue_bytes as u64)?;
        if settings
            .token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            anyhow::bail!(
                "--token / LIGHTSWITCH_TOKEN is set but empty: give a token, or unset it \
                 to send without one"
            );
        }
        Ok(HttpConfig {
            url,
            basic,
            token: settings.token.clone(),
            timeout: crate::sampling::preflight::seconds(
                "--send-timeout",
                settings.send_timeout_s,
            )?,
            queue_bytes: settings.send_queue_bytes,
            backoff: Backoff::default(),
            spool: settings.spool.clone().map(|s| SpoolSettings {
                host: super::hostname(),
                ..s
            }),
        })
    }
}

impl HttpConfig {
    /// Start a delivery thread sending through `transport`, with this
    /// config's queue budget, per-request timeout, backoff and spool.
    /// Errors: the spool cannot be opened or the thread cannot be started.
    pub fn deliver_through<T: Transport>(&self, transport: T) -> Result<Delivery> {
        Delivery::start(
            transport,
            self.queue_bytes,
            self.timeout,
            self.backoff,
            self.spool.clone(),
        )
        .context("starting the sender thread")
    }
}

/// POSTs items to one URL with a blocking HTTP client (rustls for https).
pub struct HttpTransport {
    client: Client,
    config: HttpConfig,
    fixed_headers: Vec<(String, String)>,
}

/// The error and its causes, `a: b: c` (reqwest's Display shows only the first).
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl HttpTransport {
    /// A transport posting to `config.url` with `fixed_headers` on every request.
    pub fn new(config: HttpConfig, fixed_headers: Vec<(String, String)>) -> Result<Self> {
        let client = Client::builder()
            .user_agent(concat!("lightswitch/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(config.timeout.min(Duration::from_secs(5)))
            .build()
            .context("creating the HTTP client")?;
        Ok(HttpTransport {
            client,
            config,
            fixed_headers,
        })
    }
}

/// Whether an HTTP status is worth retrying: 5xx, 408 Request Timeout, 429 Too Many Requests.
pub fn is_retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

impl HttpTransport {
    /// POST `item` once within `timeout`: the server's answer, whatever its
    /// status, or the error of a request that got none (to retry).
    pub fn post(&mut self, item: &Item, timeout: Duration) -> Result<Response, String> {
        let mut request = self
            .client
            .post(self.config.url.clone())
            .timeout(timeout)
            .body(item.body.clone());
        for (name, value) in self.fixed_headers.iter().chain(&item.headers) {
            request = request.header(name.as_str(), value.as_str());
        }
        if let Some((user, password)) = &self.config.basic {
            request = request.basic_auth(user, password.as_ref());
        } else if let Some(token) = &self.config.token {
            request = request.bearer_auth(token);
        }
        request.send().map_err(|err| error_chain(&err))
    }
}

/// What an answer that is not a success means: retry (after the
/// `Retry-After` it gives, if any) when `retryable` says so, else rejected.
/// The message is the status and at most 1 KiB of the body, made readable
/// by `explain` (e.g. a decoded `google.rpc.Status`).
pub fn failed(
    response: Response,
    retryable: fn(StatusCode) -> bool,
    explain: fn(&[u8]) -> String,
) -> Attempt {
    let status = response.status();
    let after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, SystemTime::now()));
    let mut body = Vec::new();
    let _ = response.take(1024).read_to_end(&mut body);
    let message = explain(&body);
    let message = message.trim();
    let text = if message.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {message}")
    };
    match (retryable(status), after) {
        (true, Some(after)) => Attempt::RetryAfter(text, after),
        (true, None) => Attempt::Retry(text),
        (false, _) => Attempt::Rejected(text),
    }
}

/// A `Retry-After` value (RFC 9110 §10.2.3): whole seconds, or an HTTP
/// date, as the wait from `now` (zero for a date in the past). `None` when
/// it is neither.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The body of an answer as text (lossy UTF-8).
pub fn body_text(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

impl Transport for HttpTransport {
    fn send(&mut self, item: &Item, timeout: Duration) -> Attempt {
        match self.post(item, timeout) {
            Ok(response) if response.status().is_success() => Attempt::Delivered,
            Ok(response) => failed(response, is_retryable, body_text),
            Err(err) => Attempt::Retry(err),
        }
    }

    fn destination(&self) -> String {
        self.config.url.to_string()
    }
}

/// How the `--sender=remote` sender makes a request of a window: gzip'd
/// pprof with the host, window and sample count headers.
pub struct RemoteRequest {
    host: String,
}

impl Request for RemoteRequest {
    fn request(&mut self, profile: &Profile) -> Result<(Vec<u8>, Headers)> {
        let body = pprof::encode(profile, Compression::Gzip)?;
        let end = profile.start_unix_ns + profile.duration_ns;
        let headers = vec![
            (HOST_HEADER.into(), self.host.clone()),
            (
                WINDOW_START_HEADER.into(),
                profile.start_unix_ns.to_string(),
            ),
            (WINDOW_END_HEADER.into(), end.to_string()),
            (SAMPLES_HEADER.into(), profile.total_samples().to_string()),
        ];
        Ok((body, headers))
    }
}

/// The `--sender=remote` sender.
pub type RemoteSender = NetworkSender<RemoteRequest>;

impl RemoteSender {
    /// Start the sender thread for `config`; `host` names this machine in
    /// the [`HOST_HEADER`] header.
    pub fn start(config: HttpConfig, host: String) -> Result<Self> {
        let transport = HttpTransport::new(
            config.clone(),
            vec![
                (
                    "Content-Type".into(),
                    ProfileFormat::Pprof.mime_type().into(),
                ),
                ("Content-Encoding".into(), "gzip".into()),
            ],
        )?;
        Ok(NetworkSender::new(
            config.deliver_through(transport)?,
            RemoteRequest { host },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_credentials_become_basic_auth_and_leave_the_url() {
        let cli = HttpSettings {
            send_timeout_s: 10.0,
            send_queue_bytes: 1 << 20,
            ..HttpSettings::default()
        };
        let c = HttpConfig::new("https://me:p%40ss@example.invalid:8443/x", &cli).unwrap();
        assert_eq!(c.url.as_str(), "https://example.invalid:8443/x");
        assert_eq!(c.basic, Some(("me".into(), Some("p@ss".into()))));
        assert!(!format!("{c:?}").contains("p@ss"));
        assert!(HttpConfig::new("ftp://x/", &cli).is_err());
        assert!(HttpConfig::new("not a url", &cli).is_err());
    }

    #[test]
    fn retryable_statuses() {
        assert!(is_retryable(StatusCode::INTERNAL_SERVER_ERROR));
        assert!(is_retryable(StatusCode::SERVICE_UNAVAILABLE));
        assert!(is_retryable(StatusCode::TOO_MANY_REQUESTS));
        assert!(!is_retryable(StatusCode::UNAUTHORIZED));
        assert!(!is_retryable(StatusCode::BAD_REQUEST));
        assert!(!is_retryable(StatusCode::PAYLOAD_TOO_LARGE));
    }

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after(" 7 ", now), Some(Duration::from_secs(7)));
        // 1445412480 is Wed, 21 Oct 2015 07:28:00 GMT.
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-3", now), None);
    }
}
