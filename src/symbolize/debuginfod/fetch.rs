//! One debuginfod request, `GET URL/buildid/HEX/debuginfo`, into a file of
//! the cache: ended by a deadline (connect, headers and body together) and
//! by a size cap (the `Content-Length` a server announces, then the bytes
//! it actually sends). The body is written to a [`NamedTempFile`] in the
//! build ID's directory and renamed into place only once it is complete
//! and checked, so every error path (a timeout, a body over the cap, a
//! server that hangs up, a file that is not the wanted ELF) drops the
//! temporary file, which removes it.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use tempfile::NamedTempFile;

/// Prefix of the temporary files a fetch writes in `CACHE/HEX/` (the
/// `tempfile` crate's default); those left by a run that was killed are
/// removed at the next start ([`super::remove_stale_partials`]).
pub const PARTIAL_PREFIX: &str = ".tmp";

/// Why a fetch gave nothing.
#[derive(Debug)]
pub enum FetchError {
    /// The request's deadline passed (connecting, waiting for headers, or
    /// reading the body).
    TimedOut,
    /// The server announced, or sent, more bytes than the cap.
    TooLarge,
    /// The run is stopping ([`super::cancel`]): the request was cut, or
    /// never started.
    Cancelled,
    /// Anything else: refused connection, HTTP error status, I/O error in
    /// the cache, not an ELF file with the wanted build ID.
    Other(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::TimedOut => write!(f, "timed out"),
            FetchError::TooLarge => write!(f, "larger than DEBUGINFOD_MAXSIZE"),
            FetchError::Cancelled => write!(f, "cancelled: the run is stopping"),
            FetchError::Other(why) => write!(f, "{why}"),
        }
    }
}

/// Limits of one fetch.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The whole request (connect, headers, body) ends this long after it
    /// starts.
    pub timeout: Duration,
    /// Largest body accepted, bytes.
    pub max_bytes: u64,
}

/// `GET url` with `client` into `path` (whose directory is created), the
/// file kept only if `check` accepts the complete temporary file.
/// Errors: [`FetchError::TimedOut`] once `limits.timeout` has passed,
/// [`FetchError::TooLarge`] for a `Content-Length` over `limits.max_bytes`
/// (nothing is read then) or a body that grows past it; nothing is left
/// in `path`'s directory on any error.
pub fn fetch_to(
    client: &reqwest::blocking::Client,
    url: &str,
    path: &Path,
    limits: Limits,
    check: impl FnOnce(&Path) -> bool,
) -> Result<(), FetchError> {
    let deadline = Instant::now() + limits.timeout;
    // A request timeout (not the client's, which blocking reqwest applies
    // to each read alone) bounds connect, headers and body together.
    let mut response = client
        .get(url)
        .timeout(limits.timeout)
        .send()
        .map_err(|e| classify(&e, e.is_timeout(), deadline))?;
    if !response.status().is_success() {
        return Err(FetchError::Other(format!("HTTP {}", response.status())));
    }
    if response
        .content_length()
        .is_some_and(|n| n > limits.max_bytes)
    {
        return Err(FetchError::TooLarge);
    }
    let dir = path
        .parent()
        .ok_or_else(|| FetchError::Other("no cache directory".into()))?;
    let other = |e: std::io::Error| FetchError::Other(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(other)?;
    let mut file = tempfile::Builder::new()
        .prefix(PARTIAL_PREFIX)
        .tempfile_in(dir)
        .map_err(other)?;
    copy_body(&mut response, &mut file, limits.max_bytes, deadline)?;
    file.flush().map_err(other)?;
    if !check(file.path()) {
        return Err(FetchError::Other(
            "not an ELF file with that build ID".into(),
        ));
    }
    file.persist(path)
        .map_err(|e| FetchError::Other(e.to_string()))?;
    Ok(())
}

/// Copy `body` into `file` until its end, at most `max_bytes`, checking
/// `deadline` between reads (each read itself ends by the request's
/// timeout).
fn copy_body(
    body: &mut impl Read,
    file: &mut NamedTempFile,
    max_bytes: u64,
    deadline: Instant,
) -> Result<(), FetchError> {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        if Instant::now() >= deadline {
            return Err(FetchError::TimedOut);
        }
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let timeout = e.kind() == std::io::ErrorKind::TimedOut
                    || e.get_ref()
                        .and_then(|inner| inner.downcast_ref::<reqwest::Error>())
                        .is_some_and(reqwest::Error::is_timeout);
                return Err(classify(&e, timeout, deadline));
            }
        };
        total += n as u64;
        if total > max_bytes {
            return Err(FetchError::TooLarge);
        }
        file.write_all(&buf[..n])
            .map_err(|e| FetchError::Other(e.to_string()))?;
    }
}

/// An error `err` as a [`FetchError`]: a timeout if the library says so
/// (`timeout`) or the deadline has passed.
fn classify(err: &dyn std::fmt::Display, timeout: bool, deadline: Instant) -> FetchError {
    if timeout || Instant::now() >= deadline {
        FetchError::TimedOut
    } else {
        FetchError::Other(err.to_string())
    }
}
