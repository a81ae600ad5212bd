//! What every network sender shares: a window's profile is encoded into a
//! request ([`Request`], the sender's own part), queued for delivery
//! ([`super::queue::Delivery`]: bounded by bytes, retried, spooled with
//! `--spool-dir`), and at the end flushed and reported. [`super::remote`],
//! [`super::pyroscope`] and [`super::otlp`] are each a [`NetworkSender`]
//! with their own [`Request`] and transport.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;

use super::item::Item;
use super::queue::{Delivery, Queue};
use super::{Sender, SenderReport};
use crate::profile::Profile;

/// Request headers, (name, value).
pub type Headers = Vec<(String, String)>;

/// How a network sender turns one window's profile into a request.
pub trait Request: Send {
    /// The request body and this profile's own headers (name, value), on
    /// top of the transport's fixed ones. Errors: the profile could not be
    /// encoded (that window only).
    fn request(&mut self, profile: &Profile) -> Result<(Vec<u8>, Headers)>;
}

/// A network sender: encodes each window with its [`Request`] and hands
/// the bytes to a delivery thread, so [`Sender::send`] never waits on the
/// network.
pub struct NetworkSender<R: Request> {
    delivery: Delivery,
    request: R,
}

impl<R: Request> NetworkSender<R> {
    /// A sender making requests with `request` and handing them to
    /// `delivery` (started by [`super::remote::HttpConfig::deliver_through`]).
    pub fn new(delivery: Delivery, request: R) -> Self {
        NetworkSender { delivery, request }
    }
}

/// A log-friendly description of a profile's window.
pub fn describe_window(profile: &Profile) -> String {
    format!(
        "window {} +{:.3}s ({} samples)",
        crate::util::timefmt::rfc3339(profile.start_unix_ns),
        profile.duration_ns as f64 / 1e9,
        profile.total_samples()
    )
}

impl<R: Request> Sender for NetworkSender<R> {
    fn send(&mut self, profile: &Profile) -> Result<()> {
        let (body, headers) = self.request.request(profile)?;
        self.delivery.queue().push(Item {
            body,
            headers,
            description: describe_window(profile),
        });
        Ok(())
    }

    fn finish(self: Box<Self>, deadline: Instant) -> SenderReport {
        self.delivery.finish_report(deadline)
    }

    fn delivery_queue(&self) -> Option<Arc<Queue>> {
        Some(self.delivery.shared_queue())
    }
}
