//! The identity of a received window, by which a window sent twice (a
//! sender that retried after a lost answer, an agent that re-sent its spool
//! after a restart) is stored once.
//!
//! The collector computes it from what it receives, so no sender has to be
//! trusted to name it: the host, the window's start and end (ns since the
//! Unix epoch) of each batch the request holds, and a hash of the request's
//! content once inflated (the pprof profile or the OTLP export request).
//! The agent re-sends a window byte for byte (from its queue, or from its
//! spool after a restart), so the same window always gets the same
//! identity. It is written into the names of the request's blocks
//! ([`super::block_name`]), so the set of identities seen is as durable as
//! the blocks, rebuilt from a directory listing at start-up, and shrinks
//! with retention.

use std::fmt;
use std::str::FromStr;

use xxhash_rust::xxh3::Xxh3;

/// A window's identity: 128 bits of xxh3 over the host, start, end of each
/// of the request's windows and its inflated content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowId(pub u128);

impl WindowId {
    /// The identity of a request holding `windows` (host as sent, start,
    /// end; ns since the Unix epoch) whose inflated body has the
    /// [`content_hash`] `content`.
    pub fn of(windows: &[(&str, u64, u64)], content: u128) -> Self {
        let mut hasher = Xxh3::new();
        for (host, start, end) in windows {
            hasher.update(&(host.len() as u64).to_le_bytes());
            hasher.update(host.as_bytes());
            hasher.update(&start.to_le_bytes());
            hasher.update(&end.to_le_bytes());
        }
        hasher.update(&content.to_le_bytes());
        WindowId(hasher.digest128())
    }
}

/// The hash of a request's inflated body that its [`WindowId`] takes.
pub fn content_hash(body: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(body)
}

impl fmt::Display for WindowId {
    /// 32 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl FromStr for WindowId {
    type Err = std::num::ParseIntError;

    /// 32 hex digits (as [`WindowId`]'s `Display` writes them).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 {
            // Let the parser name the error for a wrong length too.
            return u128::from_str_radix("-", 16).map(WindowId);
        }
        u128::from_str_radix(s, 16).map(WindowId)
    }
}

/// Which request a block belongs to, and its place among its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartOf {
    /// The request's identity.
    pub id: WindowId,
    /// This block's number, from 0.
    pub part: u32,
    /// How many blocks the request stored.
    pub parts: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_window_gets_the_same_identity_and_any_change_another() {
        let (p, q) = (content_hash(b"profile"), content_hash(b"profilf"));
        let a = WindowId::of(&[("web-1", 10, 20)], p);
        assert_eq!(a, WindowId::of(&[("web-1", 10, 20)], p));
        for other in [
            WindowId::of(&[("web-2", 10, 20)], p),
            WindowId::of(&[("web-1", 11, 20)], p),
            WindowId::of(&[("web-1", 10, 21)], p),
            WindowId::of(&[("web-1", 10, 20)], q),
            WindowId::of(&[("web-1", 10, 20), ("web-1", 10, 20)], p),
        ] {
            assert_ne!(a, other);
        }
        assert_eq!(a.to_string().parse::<WindowId>().unwrap(), a);
        assert!("abc".parse::<WindowId>().is_err());
        assert!("g".repeat(32).parse::<WindowId>().is_err());
    }
}
