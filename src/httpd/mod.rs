//! Pieces shared by lightswitch's two HTTP servers (axum): the on-demand
//! endpoints of `--listen` (`src/server/`) and the collector
//! (`src/collector/`): the accept loop with its limits ([`serve`]),
//! bearer tokens, and plain-text and blocking responses.

pub mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// A `text/plain` response: `message` and a newline.
pub fn text(status: StatusCode, message: impl Into<String>) -> Response {
    let mut message = message.into();
    message.push('\n');
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

/// Run `f` (blocking work: symbolizing, merging, jemalloc calls) on tokio's
/// blocking pool; a panic in it becomes a 500.
pub async fn blocking(f: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal error: {e}"),
        )
    })
}

/// The bearer token a server listening on `address` requires, from the
/// flag or environment variable that `names` names (for messages, e.g.
/// `--listen-token / LIGHTSWITCH_LISTEN_TOKEN`). A token that is set but
/// empty (or only white space: a secret that failed to render) is an
/// error, never "no authentication"; no token on an address other than
/// loopback is allowed with a warning.
pub fn server_token(
    token: Option<&str>,
    names: &str,
    address: SocketAddr,
) -> anyhow::Result<Option<Arc<str>>> {
    match token {
        Some(t) if t.trim().is_empty() => anyhow::bail!(
            "{names} is set but empty: give a token, or unset it to serve without authentication"
        ),
        Some(t) => Ok(Some(Arc::from(t))),
        None => {
            if !address.ip().is_loopback() {
                tracing::warn!(
                    "listening on {address} without a token ({names}): anyone who can reach \
                     this address can use the API"
                );
            }
            Ok(None)
        }
    }
}

/// Compare without an early exit, so timing does not reveal the token.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `None` if `request` carries `Authorization: Bearer TOKEN` with `token`
/// (compared in constant time); otherwise the 401 response to send, with
/// `WWW-Authenticate: Bearer` (RFC 6750).
pub fn check_bearer(request: &Request, token: &str) -> Option<Response> {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            // The scheme is case-insensitive (RFC 9110, 11.1).
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim);
    if given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
        return None;
    }
    let mut response = text(
        StatusCode::UNAUTHORIZED,
        "missing or wrong bearer token (Authorization: Bearer TOKEN)",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_must_match_exactly() {
        let with = |value: &str| {
            Request::builder()
                .header(header::AUTHORIZATION, value)
                .body(axum::body::Body::empty())
                .expect("request")
        };
        assert!(check_bearer(&with("Bearer s3cret"), "s3cret").is_none());
        let denied = check_bearer(&with("Bearer s3cre"), "s3cret").expect("401");
        assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(denied.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert!(check_bearer(&with("Basic s3cret"), "s3cret").is_some());
        assert!(check_bearer(&with("bearer s3cret"), "s3cret").is_none());
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"ab"));
    }

    #[test]
    fn an_empty_token_is_an_error_not_no_authentication() {
        let any: SocketAddr = "0.0.0.0:80".parse().unwrap();
        for empty in ["", " ", "\n"] {
            let err = server_token(Some(empty), "--token / TOKEN_VAR", any).unwrap_err();
            assert!(err.to_string().contains("TOKEN_VAR"), "{err}");
        }
        let token = server_token(Some("s3cret"), "--token", any).unwrap();
        assert_eq!(token.as_deref(), Some("s3cret"));
        assert!(server_token(None, "--token", any).unwrap().is_none());
    }
}
