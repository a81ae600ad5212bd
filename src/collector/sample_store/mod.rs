//! The collector's sample store: every received sample with its own time
//! (ns since the Unix epoch), stack, host, process and thread, so that any
//! range `[from, to)` is answered at sample resolution.
//!
//! Layout under `STORAGE/.samples/` (a dot name, so it never collides with
//! a host directory of the pprof archive beside it):
//! - `stacks/SEQ.seg`: the stack table ([`dict`]): strings, mappings,
//!   frames, stacks and threads, each once, across all windows;
//! - `blocks/HOST/DAY/FIRST-LAST-SAMPLES-SEQ.blk`: one block per ingested
//!   window and host ([`block`]; FIRST/LAST: its first and last sample's
//!   time, ns; SAMPLES: how many; SEQ: a sequence number), so that a
//!   listing reads directories only.
//!
//! Every file is written atomically (temporary file, fsync, rename, fsync
//! of the directory: [`crate::util::files::write_atomic`]); a block's stack-table
//! entries are on disk before the block. Temporary files (`.tmp-*`) and
//! files whose names or contents do not check are ignored and counted.
//! Ingest is [`writer`], queries [`query`] and [`timeline`], deletion
//! [`retention`].

pub mod assemble;
pub mod block;
pub mod columns;
pub mod dict;
pub mod query;
pub mod retention;
pub mod timeline;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, RwLock};

use anyhow::{Context, Result};

use crate::util::files::TMP_PREFIX;
use dict::Dictionary;

/// Name of the store's directory under the storage root.
pub const STORE_DIR: &str = ".samples";

/// Most stack-table segment files kept before start-up compacts them into one.
const MAX_SEGMENTS: usize = 256;

/// One block as the index knows it (from its file name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    /// The file.
    pub path: PathBuf,
    /// Host directory (the sanitized host name).
    pub host: String,
    /// First sample's time, ns since the Unix epoch.
    pub first_time: u64,
    /// Last sample's time, ns since the Unix epoch.
    pub last_time: u64,
    /// Samples in it.
    pub samples: u64,
    /// Its size, bytes.
    pub bytes: u64,
}

/// What the store counts for `/metrics` (monotonic unless said otherwise).
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Samples stored.
    pub samples_stored: AtomicU64,
    /// Off-CPU waits stored.
    pub waits_stored: AtomicU64,
    /// Blocks written.
    pub blocks_written: AtomicU64,
    /// Blocks a query found damaged or unreadable and skipped.
    pub blocks_skipped: AtomicU64,
    /// Blocks deleted by `--retention` (age).
    pub deleted_by_age: AtomicU64,
    /// Blocks deleted by `--max-storage` (size).
    pub deleted_by_size: AtomicU64,
    /// Bytes deleted by retention (both causes).
    pub deleted_bytes: AtomicU64,
}

/// The sample store (see the module docs).
#[derive(Debug)]
pub struct SampleStore {
    root: PathBuf,
    file_mode: u32,
    dict: RwLock<Dictionary>,
    /// Every block, sorted by first time.
    index: RwLock<Vec<BlockMeta>>,
    /// Held by an ingest from interning to the block's rename: one writer at a time.
    writer: Mutex<u64>,
    /// Counters for `/metrics`.
    pub stats: StoreStats,
}

/// Create `dir` and its missing parents with the store's directory mode.
pub(crate) fn create_dir(dir: &Path, file_mode: u32) -> Result<()> {
    super::archive::dir_builder(file_mode)
        .recursive(true)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// `FIRST-LAST-SAMPLES-SEQ.blk` -> (first, last, samples, seq).
fn parse_block_name(name: &str) -> Option<(u64, u64, u64, u64)> {
    let mut parts = name.strip_suffix(".blk")?.split('-');
    let mut next = || parts.next()?.parse().ok();
    let parsed = (next()?, next()?, next()?, next()?);
    (parsed.0 <= parsed.1 && parsed.2 > 0).then_some(parsed)
}

impl SampleStore {
    /// Open (creating if missing) the store under `storage_root`, loading
    /// the stack table and listing the blocks. Errors: directories that
    /// cannot be created or listed.
    pub fn open(storage_root: &Path, file_mode: u32) -> Result<Self> {
        let root = storage_root.join(STORE_DIR);
        create_dir(&root.join("blocks"), file_mode)?;
        let mut dict = Dictionary::open(&root.join("stacks"), file_mode)?;
        if let Err(e) = dict.compact(MAX_SEGMENTS) {
            tracing::warn!("compacting the stack table failed: {e:#}");
        }
        let (index, max_seq) = list_blocks(&root.join("blocks"))?;
        Ok(SampleStore {
            root,
            file_mode,
            dict: RwLock::new(dict),
            index: RwLock::new(index),
            writer: Mutex::new(max_seq + 1),
            stats: StoreStats::default(),
        })
    }

    /// The store's directory (`STORAGE/.samples`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The blocks whose samples may lie in `[from, to)` of `host` (the
    /// sanitized name; `None`: every host), oldest first.
    pub fn blocks(&self, from: u64, to: u64, host: Option<&str>) -> Vec<BlockMeta> {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        // Sorted by first time: everything from here on starts at or after `to`.
        let end = index.partition_point(|b| b.first_time < to);
        index[..end]
            .iter()
            .filter(|b| b.last_time >= from && host.is_none_or(|h| h == b.host))
            .cloned()
            .collect()
    }

    /// Each host directory with its first and last sample time and sample
    /// count, sorted by name.
    pub fn hosts(&self) -> Vec<(String, u64, u64, u64)> {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        let mut hosts: std::collections::BTreeMap<&str, (u64, u64, u64)> = Default::default();
        for b in index.iter() {
            let e = hosts.entry(&b.host).or_insert((u64::MAX, 0, 0));
            e.0 = e.0.min(b.first_time);
            e.1 = e.1.max(b.last_time);
            e.2 += b.samples;
        }
        hosts
            .into_iter()
            .map(|(h, (first, last, n))| (h.to_string(), first, last, n))
            .collect()
    }

    /// Bytes on disk: blocks and stack table.
    pub fn disk_bytes(&self) -> u64 {
        let blocks: u64 = self
            .index
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|b| b.bytes)
            .sum();
        let dict = self.dict.read().unwrap_or_else(|e| e.into_inner());
        blocks + dict.disk_bytes()
    }

    /// Number of blocks.
    pub fn block_count(&self) -> usize {
        self.index.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn add_to_index(&self, meta: BlockMeta) {
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        let at = index.partition_point(|b| b.first_time <= meta.first_time);
        index.insert(at, meta);
    }
}

/// Every block file under `blocks` (`HOST/DAY/NAME`), sorted by first
/// time, and the highest sequence number seen. Names that do not parse and
/// temporary files are skipped.
fn list_blocks(blocks: &Path) -> Result<(Vec<BlockMeta>, u64)> {
    let mut out = Vec::new();
    let mut max_seq = 0;
    super::archive::walk_host_days(
        blocks,
        |_| true,
        |host, file| {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) {
                return;
            }
            let Some((first, last, samples, seq)) = parse_block_name(&name) else {
                return;
            };
            max_seq = max_seq.max(seq);
            out.push(BlockMeta {
                path: file.path(),
                host: host.to_string(),
                first_time: first,
                last_time: last,
                samples,
                bytes: file.metadata().map_or(0, |m| m.len()),
            });
        },
    )?;
    out.sort_by(|a, b| (a.first_time, &a.path).cmp(&(b.first_time, &b.path)));
    Ok((out, max_seq))
}

#[cfg(test)]
mod tests;
