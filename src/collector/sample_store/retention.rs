//! Retention: `--retention DURATION` deletes what is older than that,
//! `--max-storage BYTES` the oldest data until the storage fits, both
//! checked every [`RETENTION_INTERVAL`] while the collector runs (and once
//! at start). "Data" is the store's blocks and the pprof archive's files
//! ([`crate::collector::archive`]), ordered together by their last sample
//! (a block) or their window's end (a pprof file). The stack table is not
//! trimmed: it grows with distinct stacks, not with time, and counts
//! towards `--max-storage`. Each pass that deletes logs what and why, and
//! the totals are in the collector's `/metrics`.

use std::fs;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::SampleStore;
use crate::collector::archive::{Filter, Storage};

/// How often retention runs.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(10);

/// What to keep (`None`: no limit of that kind).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete data whose last sample is older than this, ns.
    pub max_age_ns: Option<u64>,
    /// Delete the oldest data while the storage is larger than this, bytes.
    pub max_bytes: Option<u64>,
}

/// What one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Blocks and archived pprof files deleted for their age.
    pub by_age: u64,
    /// Deleted to fit `--max-storage`.
    pub by_size: u64,
    /// Bytes freed.
    pub bytes: u64,
}

/// One deletable piece of data.
struct Item {
    time: u64,
    bytes: u64,
    path: std::path::PathBuf,
    block: bool,
}

impl SampleStore {
    /// Apply `retention` at `now` (ns since the Unix epoch) to the store and
    /// to `archive`'s pprof files. Files that cannot be deleted are logged
    /// and left (and no longer counted as deleted).
    pub fn enforce(&self, retention: Retention, archive: &Storage, now: u64) -> Deleted {
        let mut items: Vec<Item> = {
            let index = self.index.read().unwrap_or_else(|e| e.into_inner());
            index
                .iter()
                .map(|b| Item {
                    time: b.last_time,
                    bytes: b.bytes,
                    path: b.path.clone(),
                    block: true,
                })
                .collect()
        };
        if let Ok(files) = archive.list(&Filter::default()) {
            items.extend(files.into_iter().map(|f| Item {
                time: f.end_unix_ns,
                bytes: f.size,
                path: f.path,
                block: false,
            }));
        }
        items.sort_by_key(|i| i.time);
        let fixed = self
            .dict
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .disk_bytes();
        let mut total = fixed + items.iter().map(|i| i.bytes).sum::<u64>();
        let cutoff = retention.max_age_ns.map(|age| now.saturating_sub(age));
        let mut deleted = Deleted::default();
        for item in &items {
            let old = cutoff.is_some_and(|c| item.time < c);
            let over = retention.max_bytes.is_some_and(|max| total > max);
            if !old && !over {
                break;
            }
            if !self.delete(item) {
                continue;
            }
            total -= item.bytes;
            deleted.bytes += item.bytes;
            if old {
                deleted.by_age += 1;
            } else {
                deleted.by_size += 1;
            }
        }
        let stats = &self.stats;
        stats
            .deleted_by_age
            .fetch_add(deleted.by_age, Ordering::Relaxed);
        stats
            .deleted_by_size
            .fetch_add(deleted.by_size, Ordering::Relaxed);
        stats
            .deleted_bytes
            .fetch_add(deleted.bytes, Ordering::Relaxed);
        if deleted != Deleted::default() {
            info!(
                "retention: deleted {} files older than --retention and {} to fit --max-storage \
                 ({} bytes); storage now {total} bytes",
                deleted.by_age, deleted.by_size, deleted.bytes
            );
        }
        deleted
    }

    /// Delete one item (a block leaves the index first, so no new query
    /// lists it); its directory too when it was the last file there.
    fn delete(&self, item: &Item) -> bool {
        if item.block {
            let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
            let mut gone = None;
            index.retain(|b| {
                let keep = b.path != item.path;
                if !keep {
                    gone = b.part_of;
                }
                keep
            });
            drop(index);
            if let Some(p) = gone {
                self.forget(p.id);
            }
        }
        match fs::remove_file(&item.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!("retention: cannot delete {}: {e}", item.path.display());
                return false;
            }
        }
        if let Some(dir) = item.path.parent() {
            remove_if_empty(dir);
        }
        true
    }
}

/// Remove `dir` (a day directory) if it is empty; failures are ignored.
fn remove_if_empty(dir: &Path) {
    if fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) {
        let _ = fs::remove_dir(dir);
    }
}

/// Run `retention` now and then every [`RETENTION_INTERVAL`] on a thread of
/// its own, for as long as the process lives. Nothing when it sets no limit.
pub fn spawn(store: Arc<SampleStore>, archive: Arc<Storage>, retention: Retention) {
    if retention == Retention::default() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("lsw-retention".into())
        .spawn(move || loop {
            store.enforce(retention, &archive, crate::util::timefmt::now_unix_ns());
            std::thread::sleep(RETENTION_INTERVAL);
        });
    if let Err(e) = spawned {
        warn!("retention: cannot start its thread: {e}");
    }
}
