//! Separate debug files fetched from debuginfod servers by build ID (the
//! debuginfod HTTP protocol: `GET URL/buildid/HEX/debuginfo`), for objects
//! whose debug information is nowhere on this machine.
//!
//! Servers come from `--debuginfod URL` or else from `DEBUGINFOD_URLS`
//! (space-separated, as elfutils' client reads it), tried in order. Fetched
//! files go to the cache elfutils' client uses, `CACHE/HEX/debuginfo`
//! (`--debuginfod-cache`, else `$DEBUGINFOD_CACHE_PATH`, else
//! `$XDG_CACHE_HOME/debuginfod_client`, else `~/.cache/debuginfod_client`),
//! so files gdb or perf fetched are used too, and each is fetched once. A
//! file is kept only if it is an ELF file with the wanted build ID, and is
//! written under a temporary name and renamed, so a reader never sees half
//! of one ([`fetch`]: the temporary file is removed on every error path;
//! those a killed run left behind are removed at the next start). A build
//! ID no server had is not asked for again for [`NEGATIVE_TTL`].
//!
//! Limits (a server is not trusted to be quick or honest):
//! - each request, connect, headers and body together, ends after
//!   `DEBUGINFOD_TIMEOUT` seconds ([`DEFAULT_TIMEOUT`] when unset), and
//!   connecting alone after [`CONNECT_TIMEOUT`];
//! - a debug file is at most `DEBUGINFOD_MAXSIZE` bytes
//!   ([`DEFAULT_MAX_SIZE`] when unset or 0), refused from its
//!   `Content-Length` before anything is read, and cut when the body grows
//!   past it;
//! - one window (one call of the symbolizer on a batch) spends at most
//!   [`Debuginfod::window_budget`] on debuginfod, all requests together:
//!   the caller passes its deadline to [`Debuginfod::debuginfo`], and
//!   build IDs it reaches after that are left for a later window.
//!
//! Fetching happens where windows are symbolized, on the symbolizing
//! thread, never on the sampling one. Each request runs on a thread of its
//! own that the symbolizing thread waits for; once the run is stopping
//! (SIGINT, SIGTERM: [`cancel`]), the wait ends within [`CANCEL_POLL`], the
//! request is counted as cancelled and left to end by its own deadline
//! (its partial file is removed then, or at the next start), and no new
//! request starts, so a stop is never delayed by a server.

mod fetch;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use object::Object;
use tracing::{debug, info, warn};

use super::kernel::hex;
use fetch::{FetchError, Limits};

/// Longest wait for a server to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest one request (connect, headers and body) may take, and the time
/// one window may spend on debuginfod, unless `DEBUGINFOD_TIMEOUT` (whole
/// seconds, above 0) says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest debug file fetched, bytes, unless `DEBUGINFOD_MAXSIZE` (bytes,
/// above 0) says otherwise: 256 MiB.
pub const DEFAULT_MAX_SIZE: u64 = 256 << 20;

/// How long a build ID no server had is not asked for again.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(600);

/// How often a wait for a request looks whether the run is stopping
/// ([`cancel`]).
pub const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Set while the run is stopping: requests in flight are given up and no
/// new one starts.
static CANCELLED: AtomicBool = AtomicBool::new(false);

/// The run is stopping (its first SIGINT, SIGTERM or SIGHUP): every request
/// in flight is given up within [`CANCEL_POLL`] and no new one starts,
/// until [`resume`]. Safe to call from a signal-handling thread.
pub fn cancel() {
    CANCELLED.store(true, Ordering::SeqCst);
}

/// Requests may start again (a new run in the same process).
pub fn resume() {
    CANCELLED.store(false, Ordering::SeqCst);
}

/// Whether [`cancel`] was called since the last [`resume`].
fn is_cancelled() -> bool {
    CANCELLED.load(Ordering::SeqCst)
}

/// Counts of what the debuginfod client did, since start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DebuginfodStats {
    /// Debug files fetched and cached.
    pub fetched: u64,
    /// Debug files found in the cache.
    pub cached: u64,
    /// Build IDs no server could serve (each counted once per attempt).
    pub failed: u64,
    /// Requests ended by their deadline (`DEBUGINFOD_TIMEOUT`, or what was
    /// left of the window's budget).
    pub timed_out: u64,
    /// Requests refused or cut for a body over `DEBUGINFOD_MAXSIZE`.
    pub too_large: u64,
    /// Build IDs not asked for because the window's debuginfod budget was
    /// spent (asked again in a later window).
    pub skipped: u64,
    /// Requests cut, or not started, because the run was stopping
    /// ([`cancel`]).
    pub cancelled: u64,
}

/// A debuginfod client: servers, cache directory, limits, negative cache,
/// counts.
pub struct Debuginfod {
    urls: Vec<String>,
    cache_dir: PathBuf,
    timeout: Duration,
    max_size: u64,
    client: OnceLock<Option<reqwest::blocking::Client>>,
    /// Build IDs (hex) that failed, with when.
    failures: Mutex<HashMap<String, Instant>>,
    fetched: AtomicU64,
    cached: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    too_large: AtomicU64,
    skipped: AtomicU64,
    cancelled: AtomicU64,
}

/// A positive whole number from the environment variable `name`.
fn positive_env(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
        .filter(|&t| t > 0)
}

impl Debuginfod {
    /// A client for `urls` (or `DEBUGINFOD_URLS` when empty) caching in
    /// `cache_dir` (or the default), with `DEBUGINFOD_TIMEOUT` and
    /// `DEBUGINFOD_MAXSIZE` from the environment; `None` when there is no
    /// server. Removes the partial files earlier runs left in the cache
    /// ([`remove_stale_partials`]).
    pub fn new(urls: &[String], cache_dir: Option<PathBuf>) -> Option<Debuginfod> {
        let from_env = std::env::var("DEBUGINFOD_URLS").unwrap_or_default();
        let urls: Vec<String> = if urls.is_empty() {
            from_env.split_whitespace().map(str::to_string).collect()
        } else {
            urls.to_vec()
        };
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let limits = Limits {
            timeout: positive_env("DEBUGINFOD_TIMEOUT")
                .map_or(DEFAULT_TIMEOUT, Duration::from_secs),
            max_bytes: positive_env("DEBUGINFOD_MAXSIZE").unwrap_or(DEFAULT_MAX_SIZE),
        };
        Some(Debuginfod::with_limits(
            urls,
            cache_dir.unwrap_or_else(default_cache_dir),
            limits,
        ))
    }

    /// A client for `urls` (at least one) caching in `cache_dir`, each
    /// request within `limits`; removes the cache's stale partial files.
    fn with_limits(urls: Vec<String>, cache_dir: PathBuf, limits: Limits) -> Debuginfod {
        info!(
            "debuginfod: servers {}, cache {}, timeout {:?}, max size {} bytes",
            urls.join(" "),
            cache_dir.display(),
            limits.timeout,
            limits.max_bytes
        );
        let removed = remove_stale_partials(&cache_dir, limits.timeout);
        if removed > 0 {
            info!("debuginfod: removed {removed} partial files earlier runs left in the cache");
        }
        Debuginfod {
            urls,
            cache_dir,
            timeout: limits.timeout,
            max_size: limits.max_bytes,
            client: OnceLock::new(),
            failures: Mutex::new(HashMap::new()),
            fetched: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            too_large: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        }
    }

    /// What this client did so far.
    pub fn stats(&self) -> DebuginfodStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DebuginfodStats {
            fetched: get(&self.fetched),
            cached: get(&self.cached),
            failed: get(&self.failed),
            timed_out: get(&self.timed_out),
            too_large: get(&self.too_large),
            skipped: get(&self.skipped),
            cancelled: get(&self.cancelled),
        }
    }

    /// The most time one window may spend on debuginfod, all requests
    /// together: the request timeout (`DEBUGINFOD_TIMEOUT`), so that a
    /// window, and the run's end, is delayed by at most that much whatever
    /// the servers do.
    pub fn window_budget(&self) -> Duration {
        self.timeout
    }

    /// The debug file of the object with GNU build ID `build_id`: from the
    /// cache, else fetched from the first server that has it, every request
    /// ending by `deadline` (the window's, from [`Self::window_budget`]) at
    /// the latest. `None` when no server has it, none answers in time, the
    /// file is over the size cap, it failed recently, `deadline` has
    /// passed (then it is asked again in a later window), or the run is
    /// stopping ([`cancel`]; counted in [`DebuginfodStats::cancelled`]).
    pub fn debuginfo(&self, build_id: &[u8], deadline: Instant) -> Option<PathBuf> {
        if build_id.is_empty() {
            return None;
        }
        let id = hex(build_id);
        let path = self.cache_dir.join(&id).join("debuginfo");
        if has_build_id(&path, build_id) {
            self.cached.fetch_add(1, Ordering::Relaxed);
            return Some(path);
        }
        // Not held during requests: another symbolizer (an on-demand
        // profile beside the window worker) never waits for this one's.
        if self
            .failures()
            .get(&id)
            .is_some_and(|t| t.elapsed() < NEGATIVE_TTL)
        {
            return None;
        }
        // A request that had less than half its own timeout (the window's
        // budget was mostly spent) may succeed in a later window: its
        // timeout is not a failure to remember. (The first request of a
        // window gets a little less than the whole timeout, the window's
        // deadline having started with the window: that one counts.)
        let mut cut_by_window = false;
        for url in &self.urls {
            if is_cancelled() {
                self.cancelled.fetch_add(1, Ordering::Relaxed);
                debug!("debuginfod: {id}: not asked, the run is stopping");
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                debug!("debuginfod: {id}: the window's budget is spent; left for a later window");
                return None;
            }
            let limits = Limits {
                timeout: left.min(self.timeout),
                max_bytes: self.max_size,
            };
            match self.fetch(url, &id, build_id, &path, limits) {
                Ok(()) => {
                    self.failures().remove(&id);
                    self.fetched.fetch_add(1, Ordering::Relaxed);
                    debug!("debuginfod: {id} from {url}");
                    return Some(path);
                }
                Err(err) => {
                    debug!("debuginfod: {id} from {url}: {err}");
                    match err {
                        FetchError::TimedOut => {
                            self.timed_out.fetch_add(1, Ordering::Relaxed);
                            cut_by_window |= limits.timeout < self.timeout / 2;
                        }
                        FetchError::TooLarge => {
                            self.too_large.fetch_add(1, Ordering::Relaxed);
                        }
                        FetchError::Cancelled => {
                            // Not a failure of the server's to remember.
                            self.cancelled.fetch_add(1, Ordering::Relaxed);
                            return None;
                        }
                        FetchError::Other(_) => {}
                    }
                }
            }
        }
        if cut_by_window {
            return None;
        }
        let first = self.failures().insert(id.clone(), Instant::now()).is_none();
        if first && self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
            warn!("debuginfod: no server had the debug file of build ID {id} (further misses are counted)");
        }
        None
    }

    /// The negative cache, locked (a poisoned lock still holds times).
    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn http(&self) -> Result<&reqwest::blocking::Client, FetchError> {
        self.client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .user_agent(concat!("lightswitch/", env!("CARGO_PKG_VERSION")))
                    .connect_timeout(CONNECT_TIMEOUT)
                    .build()
                    .map_err(|err| warn!("debuginfod: creating the HTTP client: {err}"))
                    .ok()
            })
            .as_ref()
            .ok_or_else(|| FetchError::Other("no HTTP client".into()))
    }

    /// `GET URL/buildid/ID/debuginfo` into `path` within `limits`, checked
    /// to be an ELF file with build ID `build_id`, on a thread of its own:
    /// [`FetchError::Cancelled`] as soon as the run is stopping ([`cancel`]),
    /// the request then left to end by its deadline.
    fn fetch(
        &self,
        url: &str,
        id: &str,
        build_id: &[u8],
        path: &Path,
        limits: Limits,
    ) -> Result<(), FetchError> {
        let client = self.http()?.clone();
        let url = format!("{url}/buildid/{id}/debuginfo");
        let (path, build_id) = (path.to_path_buf(), build_id.to_vec());
        let (tx, rx) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("ls-debuginfod".into())
            .spawn(move || {
                let got =
                    fetch::fetch_to(&client, &url, &path, limits, |p| has_build_id(p, &build_id));
                let _ = tx.send(got);
            })
            .map_err(|e| FetchError::Other(format!("starting a request thread: {e}")))?;
        loop {
            match rx.recv_timeout(CANCEL_POLL) {
                Ok(got) => return got,
                Err(RecvTimeoutError::Timeout) if is_cancelled() => {
                    return Err(FetchError::Cancelled)
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(FetchError::Other("the request thread panicked".into()))
                }
            }
        }
    }
}

/// Remove the partial files (`CACHE/*/.tmp*`, see [`fetch::PARTIAL_PREFIX`])
/// not written to for longer than `timeout`: a request of a live run ends
/// within it, so these are what runs that were killed mid-fetch left.
/// Returns how many were removed; a cache that cannot be read is left as
/// it is.
pub fn remove_stale_partials(cache_dir: &Path, timeout: Duration) -> usize {
    let Ok(ids) = std::fs::read_dir(cache_dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for dir in ids.flatten() {
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for file in files.flatten() {
            let partial = file
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(fetch::PARTIAL_PREFIX));
            let stale = file
                .metadata()
                .ok()
                .filter(std::fs::Metadata::is_file)
                .and_then(|m| m.modified().ok())
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > timeout);
            if partial && stale && std::fs::remove_file(file.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Whether `path` is an ELF file whose GNU build ID is `build_id`.
fn has_build_id(path: &Path, build_id: &[u8]) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: a read-only private mapping of a cache file.
    let Ok(map) = (unsafe { memmap2::Mmap::map(&file) }) else {
        return false;
    };
    object::File::parse(&*map).is_ok_and(|elf| elf.build_id().ok().flatten() == Some(build_id))
}

/// `$DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`,
/// else `$HOME/.cache/debuginfod_client` (elfutils' client's choices).
fn default_cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(path) = var("DEBUGINFOD_CACHE_PATH") {
        return PathBuf::from(path);
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return PathBuf::from(xdg).join("debuginfod_client");
    }
    let home = var("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache").join("debuginfod_client")
}
