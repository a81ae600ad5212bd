//! The Pyroscope sender: pushes each window's profile to Grafana Pyroscope
//! through its push API, `push.v1.PusherService/Push`, with the Connect
//! protocol's unary binary encoding: `POST <base>/push.v1.PusherService/Push`,
//! `Content-Type: application/proto`, `Connect-Protocol-Version: 1`, body a
//! serialized [`proto::push::v1::PushRequest`] (schema: `proto/pyroscope/`,
//! as published by Pyroscope).
//!
//! Each request holds one series whose labels are `__name__=process_cpu`,
//! `service_name` (`--pyroscope-app-name`), `host` (this machine) and the
//! `--label KEY=VALUE` pairs, sorted by name, and one raw sample whose
//! `raw_profile` is the window's gzip'd pprof and whose `ID` is a random
//! UUID. `X-Scope-OrgID` carries `--pyroscope-tenant-id`; credentials in the
//! URL are sent as basic auth (Grafana Cloud's user id and API token), else
//! `--token` as a bearer token.

use anyhow::Result;
use prost::Message;

use super::network::{Headers, NetworkSender, Request};
use super::remote::{HttpConfig, HttpTransport};
use crate::profile::format::pprof;
use crate::profile::format::Compression;
use crate::profile::Profile;

/// Types generated from Pyroscope's push API definition (`proto/pyroscope/`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    /// Package `types.v1`.
    pub mod types {
        /// Version 1.
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
        }
    }
    /// Package `push.v1`.
    pub mod push {
        /// Version 1.
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
        }
    }
}

use proto::push::v1::{PushRequest, RawProfileSeries, RawSample};
use proto::types::v1::LabelPair;

/// Default base URL: a Pyroscope server on this machine (its default port).
pub const DEFAULT_URL: &str = "http://127.0.0.1:4040";
/// Path of the push method under the base URL.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// The profile type name Pyroscope files CPU profiles under.
pub const PROFILE_NAME: &str = "process_cpu";
/// Label carrying the host name.
pub const HOST_LABEL: &str = "host";

/// The push endpoint for a server's base URL (kept as is if it already
/// ends with [`PUSH_PATH`]).
pub fn push_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with(PUSH_PATH) {
        base.to_string()
    } else {
        format!("{base}{PUSH_PATH}")
    }
}

/// The labels of every pushed series, sorted by name.
pub fn series_labels(app_name: &str, host: &str, extra: &[(String, String)]) -> Vec<LabelPair> {
    let mut labels: Vec<LabelPair> = [
        ("__name__", PROFILE_NAME),
        ("service_name", app_name),
        (HOST_LABEL, host),
    ]
    .iter()
    .map(|(name, value)| LabelPair {
        name: name.to_string(),
        value: value.to_string(),
    })
    .chain(extra.iter().map(|(name, value)| LabelPair {
        name: name.clone(),
        value: value.clone(),
    }))
    .collect();
    labels.sort_by(|a, b| a.name.cmp(&b.name));
    // A later --label with the same name wins over an earlier one.
    labels.dedup_by(|later, earlier| {
        let same = later.name == earlier.name;
        if same {
            earlier.value = std::mem::take(&mut later.value);
        }
        same
    });
    labels
}

/// The push request for one gzip'd pprof profile.
pub fn push_request(labels: &[LabelPair], gzipped_pprof: Vec<u8>, id: String) -> PushRequest {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: labels.to_vec(),
            samples: vec![RawSample {
                raw_profile: gzipped_pprof,
                id,
            }],
        }],
    }
}

/// How the `--sender=pyroscope` sender makes a request of a window: a
/// push request with the series' labels and a new UUID.
pub struct PyroscopeRequest {
    labels: Vec<LabelPair>,
}

impl Request for PyroscopeRequest {
    fn request(&mut self, profile: &Profile) -> Result<(Vec<u8>, Headers)> {
        let raw = pprof::encode(profile, Compression::Gzip)?;
        let request = push_request(&self.labels, raw, uuid::Uuid::new_v4().to_string());
        Ok((request.encode_to_vec(), Vec::new()))
    }
}

/// The `--sender=pyroscope` sender.
pub type PyroscopeSender = NetworkSender<PyroscopeRequest>;

impl PyroscopeSender {
    /// Start the sender thread posting to `config.url` (the push endpoint)
    /// with `labels` on every series and `tenant` as `X-Scope-OrgID`.
    pub fn start(
        config: HttpConfig,
        labels: Vec<LabelPair>,
        tenant: Option<String>,
    ) -> Result<Self> {
        let mut headers = vec![
            ("Content-Type".to_string(), "application/proto".to_string()),
            ("Connect-Protocol-Version".to_string(), "1".to_string()),
        ];
        if let Some(tenant) = tenant.filter(|t| !t.is_empty()) {
            headers.push(("X-Scope-OrgID".to_string(), tenant));
        }
        let transport = HttpTransport::new(config.clone(), headers)?;
        Ok(NetworkSender::new(
            config.deliver_through(transport)?,
            PyroscopeRequest { labels },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_sorted_with_extras_and_the_url_gets_the_method() {
        let labels = series_labels(
            "app",
            "h1",
            &[("zone".into(), "a".into()), ("env".into(), "x".into())],
        );
        let pairs: Vec<(&str, &str)> = labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                ("__name__", "process_cpu"),
                ("env", "x"),
                ("host", "h1"),
                ("service_name", "app"),
                ("zone", "a")
            ]
        );
        assert_eq!(
            push_url("http://p:4040/"),
            "http://p:4040/push.v1.PusherService/Push"
        );
        assert_eq!(
            push_url("http://p:4040/push.v1.PusherService/Push"),
            "http://p:4040/push.v1.PusherService/Push"
        );
    }

    #[test]
    fn request_round_trips_and_ids_are_uuids() {
        let id = uuid::Uuid::new_v4().to_string();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        let labels = series_labels("app", "h", &[]);
        let bytes = push_request(&labels, vec![1, 2, 3], id.clone()).encode_to_vec();
        let back = PushRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.series[0].labels, labels);
        assert_eq!(back.series[0].samples[0].raw_profile, vec![1, 2, 3]);
        assert_eq!(back.series[0].samples[0].id, id);
    }
}
