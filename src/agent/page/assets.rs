//! The web view's files, built into the binary from `web/` (the page,
//! `app.js`, `app.css`) and `web/vendor/` (uPlot from the npm registry,
//! minified as published, with its licence; `web/vendor.sh` copies them
//! from `web/node_modules` after `npm ci`). Served by [`routes`]:
//!
//! - `GET /`: the page.
//! - `GET /assets/NAME`: a script, style sheet or licence, with its MIME
//!   type; 404 for any other name.
//! - `GET /licenses`: the licences of the bundled libraries, as text.
//!
//! These paths are what [`is_page`] matches: a server asks a browser for
//! its token with a `Basic` challenge there (see
//! [`crate::agent::http::check_token`]).

use axum::extract::{Path, Request};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::agent::http::{check_token, text, Challenge};

/// One file of the page: its name under `/assets/`, MIME type and bytes.
struct Asset {
    name: &'static str,
    mime: &'static str,
    bytes: &'static [u8],
}

const INDEX: &[u8] = include_bytes!("../../../web/index.html");

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        mime: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/app.js"),
    },
    Asset {
        name: "app.css",
        mime: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../web/app.css"),
    },
    Asset {
        name: "uPlot.iife.min.js",
        mime: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/vendor/uPlot.iife.min.js"),
    },
    Asset {
        name: "uPlot.min.css",
        mime: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../web/vendor/uPlot.min.css"),
    },
    Asset {
        name: "uPlot.LICENSE",
        mime: "text/plain; charset=utf-8",
        bytes: include_bytes!("../../../web/vendor/uPlot.LICENSE"),
    },
];

/// The bundled libraries: name, version, where from, licence file.
const LIBRARIES: &[(&str, &str, &str, &str)] = &[(
    "uPlot",
    "1.6.32",
    "npm package uplot (https://github.com/leeoniya/uPlot)",
    "uPlot.LICENSE",
)];

/// Whether `path` is one of the page's own (`/`, `/assets/…`, `/licenses`).
pub fn is_page(path: &str) -> bool {
    path == "/" || path == "/licenses" || path.starts_with("/assets/")
}

/// [`check_token`] with the challenge a path calls for: `Basic` for the
/// web view's pages ([`is_page`], so that a browser asks its user for the
/// token), `Bearer` for the API. `None` when `request` carries `token`,
/// else the 401 to send.
pub fn check_request(request: &Request, token: &str) -> Option<Response> {
    let challenge = if is_page(request.uri().path()) {
        Challenge::Basic
    } else {
        Challenge::Bearer
    };
    check_token(request, token, challenge)
}

/// The page's routes, to merge into a server's router (before its
/// authentication layer, which then covers them).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/assets/{name}", get(asset))
        .route("/licenses", get(licenses))
}

fn file(mime: &'static str, bytes: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, mime),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        bytes,
    )
        .into_response()
}

async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => file(a.mime, a.bytes),
        None => text(StatusCode::NOT_FOUND, format!("no such asset: {name}")),
    }
}

/// The licences page: each library, its origin, and its licence text.
fn licenses_text() -> String {
    let mut out = String::from(
        "The lightswitch web view bundles these JavaScript libraries, served from the \
         binary (nothing is fetched from a network). Flame graphs are SVG drawn by \
         inferno (CDDL-1.0), whose embedded script gives click-to-zoom and search.\n",
    );
    for (name, version, origin, licence) in LIBRARIES {
        let text = ASSETS
            .iter()
            .find(|a| a.name == *licence)
            .map(|a| String::from_utf8_lossy(a.bytes))
            .unwrap_or_default();
        out.push_str(&format!(
            "\n== {name} {version}, from the {origin} ==\n\n{text}"
        ));
    }
    out
}

async fn licenses() -> Response {
    text(StatusCode::OK, licenses_text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_only_assets_that_exist() {
        let page = String::from_utf8_lossy(INDEX);
        for reference in page.split("assets/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(
                ASSETS.iter().any(|a| a.name == name),
                "{name} is not bundled"
            );
        }
        assert!(
            licenses_text().contains("Leon Sorokin"),
            "uPlot's licence is served"
        );
        assert!(is_page("/") && is_page("/assets/app.js") && !is_page("/v1/timeline"));
    }
}
