//! Pieces shared by lightswitch's two HTTP servers (axum): the on-demand
//! endpoints of `--listen` (`src/agent/api/`) and the collector
//! (`src/collector/`): the accept loop with its limits ([`serve`]),
//! tokens (a Bearer header, or a browser's Basic password), and plain-text
//! and blocking responses.

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

/// How a 401 asks for the token: `Bearer` (scripts and API clients, RFC
/// 6750), or `Basic` with a realm, which makes a browser ask its user and
/// send the token as the password of every later request (the web view's
/// pages: [`crate::agent::page::assets::check_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    /// `WWW-Authenticate: Bearer`.
    Bearer,
    /// `WWW-Authenticate: Basic realm="lightswitch"`.
    Basic,
}

/// The token a request carries: `Authorization: Bearer TOKEN`, or `Basic`
/// credentials whose password is the token (any user name).
fn given_token(request: &Request) -> Option<Vec<u8>> {
    use base64::Engine;
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    // The scheme is case-insensitive (RFC 9110, 11.1).
    let (scheme, credentials) = value.split_once(' ')?;
    let credentials = credentials.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(credentials.as_bytes().to_vec());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credentials)
            .ok()?;
        let colon = decoded.iter().position(|&b| b == b':')?;
        return Some(decoded[colon + 1..].to_vec());
    }
    None
}

/// `None` if `request` carries `token` ([`given_token`], compared in
/// constant time); otherwise the 401 response to send, with the
/// `WWW-Authenticate` header of `challenge`.
pub fn check_token(request: &Request, token: &str, challenge: Challenge) -> Option<Response> {
    if given_token(request).is_some_and(|g| same(&g, token.as_bytes())) {
        return None;
    }
    let mut response = text(
        StatusCode::UNAUTHORIZED,
        "missing or wrong token (Authorization: Bearer TOKEN, or the token as a Basic password)",
    );
    let value = match challenge {
        Challenge::Bearer => "Bearer",
        Challenge::Basic => "Basic realm=\"lightswitch\", charset=\"UTF-8\"",
    };
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(value));
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
        let check = |value: &str| check_token(&with(value), "s3cret", Challenge::Bearer);
        assert!(check("Bearer s3cret").is_none());
        let denied = check("Bearer s3cre").expect("401");
        assert_eq!(denied.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(denied.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert!(check("Basic s3cret").is_some());
        assert!(check("bearer s3cret").is_none());
        // A browser's Basic credentials: any user, the token as password.
        assert!(check("Basic dXNlcjpzM2NyZXQ=").is_none()); // user:s3cret
        assert!(check("Basic OnMzY3JldA==").is_none()); // :s3cret
        assert!(check("Basic dXNlcjpzM2NyZQ==").is_some()); // user:s3cre
        let page = check_token(&with("Bearer x"), "s3cret", Challenge::Basic).expect("401");
        assert!(page.headers()[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Basic realm="));
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
