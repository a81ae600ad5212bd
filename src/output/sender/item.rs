//! What a network sender delivers: one profile's request, as the queue
//! ([`super::queue`]) holds it in memory and the spool ([`super::spool`])
//! keeps it on disk until the server acknowledges it.

/// One profile waiting to be sent.
#[derive(Debug, Clone)]
pub struct Item {
    /// The request body.
    pub body: Vec<u8>,
    /// Extra request headers (name, value) for this profile.
    pub headers: Vec<(String, String)>,
    /// What the profile is, for log lines (e.g. its window).
    pub description: String,
}
