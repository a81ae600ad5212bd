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
//! of one. A build ID no server had is not asked for again for
//! [`NEGATIVE_TTL`]. Requests time out ([`CONNECT_TIMEOUT`], and
//! `DEBUGINFOD_TIMEOUT` seconds or [`DEFAULT_TIMEOUT`] for the whole
//! transfer). Fetching happens where windows are symbolized, on the
//! symbolizing thread, never on the sampling one.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use object::Object;
use tracing::{debug, info, warn};

use super::kernel::hex;

/// Longest wait for a server to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest one request (transfer included) may take, unless
/// `DEBUGINFOD_TIMEOUT` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a build ID no server had is not asked for again.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(600);

/// Largest debug file fetched, bytes.
const MAX_DEBUG_FILE_BYTES: u64 = 4 << 30;

/// Counts of what the debuginfod client did, since start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DebuginfodStats {
    /// Debug files fetched and cached.
    pub fetched: u64,
    /// Debug files found in the cache.
    pub cached: u64,
    /// Build IDs no server could serve (each counted once per attempt).
    pub failed: u64,
}

/// A debuginfod client: servers, cache directory, negative cache, counts.
pub struct Debuginfod {
    urls: Vec<String>,
    cache_dir: PathBuf,
    timeout: Duration,
    client: OnceLock<Option<reqwest::blocking::Client>>,
    /// Build IDs (hex) that failed, with when.
    failures: Mutex<HashMap<String, Instant>>,
    fetched: AtomicU64,
    cached: AtomicU64,
    failed: AtomicU64,
}

static CLIENT: OnceLock<Option<Arc<Debuginfod>>> = OnceLock::new();

/// Sets the servers (`urls`; empty: `DEBUGINFOD_URLS`) and cache directory
/// (`None`: the default, see the module docs) every symbolizer uses. Call
/// once at start-up, before any symbolizer exists; returns `false` if the
/// client was already set up.
pub fn configure(urls: &[String], cache_dir: Option<PathBuf>) -> bool {
    CLIENT
        .set(Debuginfod::new(urls, cache_dir).map(Arc::new))
        .is_ok()
}

/// The configured client (from the environment if [`configure`] was not
/// called); `None` when no server is set.
pub fn client() -> Option<Arc<Debuginfod>> {
    CLIENT
        .get_or_init(|| Debuginfod::new(&[], None).map(Arc::new))
        .clone()
}

/// What the client did so far; `None` when no server is set.
pub fn stats() -> Option<DebuginfodStats> {
    CLIENT.get()?.as_ref().map(|c| c.stats())
}

impl Debuginfod {
    /// A client for `urls` (or `DEBUGINFOD_URLS` when empty) caching in
    /// `cache_dir` (or the default); `None` when there is no server.
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
        let timeout = std::env::var("DEBUGINFOD_TIMEOUT")
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&t| t > 0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
        let cache_dir = cache_dir.unwrap_or_else(default_cache_dir);
        info!(
            "debuginfod: servers {}, cache {}",
            urls.join(" "),
            cache_dir.display()
        );
        Some(Debuginfod {
            urls,
            cache_dir,
            timeout,
            client: OnceLock::new(),
            failures: Mutex::new(HashMap::new()),
            fetched: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// What this client did so far.
    pub fn stats(&self) -> DebuginfodStats {
        DebuginfodStats {
            fetched: self.fetched.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    /// The debug file of the object with GNU build ID `build_id`: from the
    /// cache, else fetched from the first server that has it. `None` when
    /// no server has it, none answers in time, or it failed recently.
    pub fn debuginfo(&self, build_id: &[u8]) -> Option<PathBuf> {
        if build_id.is_empty() {
            return None;
        }
        let id = hex(build_id);
        let path = self.cache_dir.join(&id).join("debuginfo");
        if has_build_id(&path, build_id) {
            self.cached.fetch_add(1, Ordering::Relaxed);
            return Some(path);
        }
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if failures
            .get(&id)
            .is_some_and(|t| t.elapsed() < NEGATIVE_TTL)
        {
            return None;
        }
        for url in &self.urls {
            match self.fetch(url, &id, build_id, &path) {
                Ok(()) => {
                    failures.remove(&id);
                    self.fetched.fetch_add(1, Ordering::Relaxed);
                    debug!("debuginfod: {id} from {url}");
                    return Some(path);
                }
                Err(err) => debug!("debuginfod: {id} from {url}: {err}"),
            }
        }
        if failures.insert(id.clone(), Instant::now()).is_none()
            && self.failed.fetch_add(1, Ordering::Relaxed) == 0
        {
            warn!("debuginfod: no server had the debug file of build ID {id} (further misses are counted)");
        }
        None
    }

    fn http(&self) -> Result<&reqwest::blocking::Client, String> {
        self.client
            .get_or_init(|| {
                reqwest::blocking::Client::builder()
                    .user_agent(concat!("lightswitch/", env!("CARGO_PKG_VERSION")))
                    .connect_timeout(CONNECT_TIMEOUT)
                    .timeout(self.timeout)
                    .build()
                    .map_err(|err| warn!("debuginfod: creating the HTTP client: {err}"))
                    .ok()
            })
            .as_ref()
            .ok_or_else(|| "no HTTP client".to_string())
    }

    /// `GET URL/buildid/ID/debuginfo` into `path`, checked to be an ELF
    /// file with build ID `build_id`.
    fn fetch(&self, url: &str, id: &str, build_id: &[u8], path: &Path) -> Result<(), String> {
        let mut response = self
            .http()?
            .get(format!("{url}/buildid/{id}/debuginfo"))
            .send()
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_DEBUG_FILE_BYTES)
        {
            return Err("larger than the limit".to_string());
        }
        let dir = path.parent().ok_or("no cache directory")?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut file = tempfile::NamedTempFile::new_in(dir).map_err(|e| e.to_string())?;
        let copied = std::io::copy(
            &mut (&mut response).take(MAX_DEBUG_FILE_BYTES + 1),
            &mut file,
        )
        .map_err(|e| e.to_string())?;
        if copied > MAX_DEBUG_FILE_BYTES {
            return Err("larger than the limit".to_string());
        }
        file.flush().map_err(|e| e.to_string())?;
        if !has_build_id(file.path(), build_id) {
            return Err("not an ELF file with that build ID".to_string());
        }
        file.persist(path).map_err(|e| e.to_string())?;
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    #[test]
    fn cache_hits_and_a_negative_cache_for_what_no_server_has() {
        let Ok(libc) = std::fs::read(LIBC) else {
            eprintln!("skipped: {LIBC} is absent");
            return;
        };
        let id = object::File::parse(&*libc)
            .ok()
            .and_then(|f| f.build_id().ok().flatten().map(<[u8]>::to_vec))
            .expect("libc has a build ID");
        let cache = tempfile::tempdir().expect("tempdir");
        // Nothing listens on port 1: every request fails at once.
        let urls = ["http://127.0.0.1:1/".to_string()];
        let client = Debuginfod::new(&urls, Some(cache.path().to_path_buf())).expect("a server");
        assert_eq!(client.urls, ["http://127.0.0.1:1"]);
        assert_eq!(client.debuginfo(&id), None);
        assert_eq!(client.debuginfo(&id), None, "not asked again");
        let counts = client.stats();
        assert_eq!((counts.fetched, counts.cached, counts.failed), (0, 0, 1));
        // A file in the cache (any ELF file with that build ID) is used.
        let cached = cache.path().join(hex(&id)).join("debuginfo");
        std::fs::create_dir_all(cached.parent().expect("dir")).expect("mkdir");
        std::fs::write(&cached, &libc).expect("write");
        assert_eq!(client.debuginfo(&id), Some(cached.clone()));
        assert_eq!(client.stats().cached, 1);
        // A file with another build ID is not.
        std::fs::write(&cached, b"\x7fELF but not really").expect("write");
        assert_eq!(client.debuginfo(&id), None);
        assert!(Debuginfod::new(&[], None).is_none() || std::env::var("DEBUGINFOD_URLS").is_ok());
    }
}
