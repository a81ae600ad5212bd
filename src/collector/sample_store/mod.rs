//! The collector's sample store: every received sample with its own time
//! (ns since the Unix epoch), stack, host, process and thread, so that any
//! range `[from, to)` is answered at sample resolution.
//!
//! Layout under `STORAGE/.samples/` (a dot name, so it never collides with
//! a host directory of the pprof archive beside it):
//! - `stacks/SEQ.seg`: the stack table ([`dict`]): strings, mappings,
//!   frames, stacks and threads, each once, across all windows;
//! - `blocks/HOST/DAY/FIRST-LAST-SAMPLES-SEQ-ID-PART-PARTS.blk`: one block
//!   per ingested window and host ([`block`]; FIRST/LAST: its first and
//!   last sample's time, ns; SAMPLES: how many; SEQ: a sequence number;
//!   ID: the request's identity ([`identity`]), PART of PARTS: the block's
//!   place among the request's blocks), so that a listing reads directories
//!   only. Blocks of older stores are named without `-ID-PART-PARTS`.
//!
//! Every file is written atomically (temporary file, fsync, rename, fsync
//! of the directory: [`crate::util::files::write_atomic`]); a block's stack-table
//! entries are on disk before the block. One request is stored all or
//! nothing: what it wrote before a failure is removed again ([`writer`]),
//! and a request whose blocks are not all on disk at start-up (the
//! collector died while renaming them) is removed then. Temporary files
//! (`.tmp-*`) and files whose names or contents do not check are ignored
//! and counted. Ingest is [`writer`], queries [`query`] and [`timeline`],
//! deletion [`retention`], failures that may pass [`health`].

pub mod assemble;
pub mod block;
pub mod columns;
pub mod dict;
pub mod health;
pub mod identity;
pub mod query;
pub mod records;
pub mod retention;
pub mod timeline;
pub mod writer;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, RwLock};

use anyhow::{Context, Result};

use crate::util::files::TMP_PREFIX;
use dict::Dictionary;
use identity::{PartOf, WindowId};

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
    /// The request it came with (`None`: a block of an older store).
    pub part_of: Option<PartOf>,
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
    /// Requests whose window was stored before (a re-sent window), answered
    /// as stored and not stored again.
    pub duplicates: AtomicU64,
    /// Blocks of requests found incomplete at start-up and removed.
    pub incomplete_removed: AtomicU64,
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
    /// The identities of the requests stored (of the blocks in the index).
    seen: Mutex<HashSet<WindowId>>,
    /// Counters for `/metrics`.
    pub stats: StoreStats,
    /// Failed writes and their episodes.
    pub health: health::Health,
}

/// Create `dir` and its missing parents with the store's directory mode.
pub(crate) fn create_dir(dir: &Path, file_mode: u32) -> Result<()> {
    super::archive::dir_builder(file_mode)
        .recursive(true)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// A block's file name: `FIRST-LAST-SAMPLES-SEQ[-ID-PART-PARTS].blk`.
fn block_name(first: u64, last: u64, samples: usize, seq: u64, part_of: Option<PartOf>) -> String {
    match part_of {
        Some(p) => format!(
            "{first}-{last}-{samples}-{seq}-{}-{}-{}.blk",
            p.id, p.part, p.parts
        ),
        None => format!("{first}-{last}-{samples}-{seq}.blk"),
    }
}

/// A parsed block name: (first, last, samples, seq) and the request it
/// belongs to ([`block_name`]).
type ParsedName = ((u64, u64, u64, u64), Option<PartOf>);

/// `FIRST-LAST-SAMPLES-SEQ[-ID-PART-PARTS].blk` -> its fields.
fn parse_block_name(name: &str) -> Option<ParsedName> {
    let fields: Vec<&str> = name.strip_suffix(".blk")?.split('-').collect();
    let num = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let parsed = (num(0)?, num(1)?, num(2)?, num(3)?);
    if parsed.0 > parsed.1 || parsed.2 == 0 {
        return None;
    }
    let part_of = match fields.len() {
        4 => None,
        7 => {
            let p = PartOf {
                id: fields[4].parse().ok()?,
                part: fields[5].parse().ok()?,
                parts: fields[6].parse().ok()?,
            };
            Some(p).filter(|p| p.part < p.parts)
        }
        _ => return None,
    };
    Some((parsed, part_of))
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
        let (mut index, max_seq) = list_blocks(&root.join("blocks"))?;
        let stats = StoreStats::default();
        let seen = complete_requests(&mut index, &stats);
        Ok(SampleStore {
            root,
            file_mode,
            dict: RwLock::new(dict),
            index: RwLock::new(index),
            writer: Mutex::new(max_seq + 1),
            seen: Mutex::new(seen),
            stats,
            health: health::Health::default(),
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

    /// Forget `id` (its blocks are being deleted): a window sent again
    /// after retention removed it is stored again.
    fn forget(&self, id: WindowId) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// The identities of the requests whose blocks are all in `index`; the
/// blocks of the others (a collector killed while renaming a request's
/// blocks into place: the request was never answered, and its sender sends
/// it again) are deleted and left out of `index`.
fn complete_requests(index: &mut Vec<BlockMeta>, stats: &StoreStats) -> HashSet<WindowId> {
    let mut parts: HashMap<WindowId, (u32, HashSet<u32>)> = HashMap::new();
    for p in index.iter().filter_map(|b| b.part_of) {
        let entry = parts.entry(p.id).or_insert((p.parts, HashSet::new()));
        entry.1.insert(p.part);
    }
    let complete: HashSet<WindowId> = parts
        .iter()
        .filter(|(_, (n, have))| have.len() == *n as usize)
        .map(|(id, _)| *id)
        .collect();
    index.retain(|b| {
        let Some(p) = b.part_of.filter(|p| !complete.contains(&p.id)) else {
            return true;
        };
        tracing::warn!(
            "removing {}: part {} of a request whose other blocks are missing (never acknowledged)",
            b.path.display(),
            p.part
        );
        stats
            .incomplete_removed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = fs::remove_file(&b.path) {
            tracing::warn!("cannot remove {}: {e}", b.path.display());
        }
        false
    });
    complete
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
            let Some(((first, last, samples, seq), part_of)) = parse_block_name(&name) else {
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
                part_of,
            });
        },
    )?;
    out.sort_by(|a, b| (a.first_time, &a.path).cmp(&(b.first_time, &b.path)));
    Ok((out, max_seq))
}

#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod tests;
