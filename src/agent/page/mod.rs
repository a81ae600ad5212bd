//! The web view (`GET /` on the collector and on the agent's `--listen`):
//! static assets built into the binary ([`assets`]: the page, its script
//! and style, and the vendored JavaScript libraries from `web/vendor/` with
//! their licences at `/licenses`), the answer of `GET /v1/profiles/merged`
//! both servers give ([`merged`]: format, encoding, count headers), and
//! the endpoints both servers answer for it: the differential flame graph of
//! two time ranges ([`diff`]) and the time-density JSON of `GET
//! /v1/timeline` built from profiles held in memory ([`timeline`], the
//! agent's recordings). The page reads everything through the same JSON
//! and profile endpoints scripts use; nothing is fetched from a network.

pub mod assets;
pub mod diff;
pub mod merged;
pub mod timeline;
