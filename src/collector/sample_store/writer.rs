//! Ingest: one window of one host into the stack table and new blocks.

use std::sync::atomic::Ordering;

use anyhow::{Context, Result};

use super::block::{self, WindowInfo, MAX_BLOCK_SAMPLES};
use super::columns::Row;
use super::dict::Dictionary;
use super::health::write_file;
use super::identity::{PartOf, WindowId};
use super::{block_name, BlockMeta, SampleStore};
use crate::collector::archive::{create_dirs, sanitize_host};
use crate::profile::Profile;

/// One window of one host, as an ingest hands it to the store.
#[derive(Debug)]
pub struct Batch<'a> {
    /// The host the samples were taken on (as sent).
    pub host: &'a str,
    /// The window the sender declared, `[start, end)` ns since the Unix epoch.
    pub window: (u64, u64),
    /// The window's stacks, processes and threads ([`Profile::samples`]).
    pub profile: &'a Profile,
    /// Every on-CPU sample: its time (ns since the Unix epoch) and its
    /// index into `profile.samples`; any order.
    pub times: Vec<(u64, u32)>,
    /// Every off-CPU wait (`--off-cpu`); any order.
    pub waits: Vec<Wait>,
}

/// One off-CPU wait of a [`Batch`], as the agent's off_cpu/nanoseconds
/// values give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// When the thread left its CPU, ns since the Unix epoch.
    pub time: u64,
    /// Its index into the batch's `profile.samples` (its stack and thread).
    pub sample: u32,
    /// How long it waited, ns (at least 1: a wait of 0 ns is not stored).
    pub ns: u64,
}

/// What an ingest stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ingested {
    /// On-CPU samples stored.
    pub samples: u64,
    /// Off-CPU waits stored.
    pub waits: u64,
    /// Blocks written.
    pub blocks: usize,
    /// The request's window was stored before: nothing was stored now.
    pub duplicate: bool,
}

/// A block encoded and named, not yet in the index.
struct Pending {
    meta: BlockMeta,
    waits: u64,
}

impl SampleStore {
    /// Store `batch` as a request of its own without an identity (see
    /// [`SampleStore::ingest_request`]).
    pub fn ingest(&self, batch: Batch<'_>) -> Result<Ingested> {
        self.ingest_request(vec![batch], None)
    }

    /// Store one request's `batches` durably, all or nothing: their new
    /// stack-table entries, then their samples as blocks of at most
    /// [`MAX_BLOCK_SAMPLES`], each renamed into place only when complete,
    /// and queries see them only once all are. A request whose identity
    /// `id` was stored before is not stored again ([`Ingested::duplicate`]).
    /// One ingest at a time; queries go on meanwhile. Errors: the file
    /// system's, naming the path; what the request wrote before the failure
    /// is removed again (blocks and the stack-table segment, see
    /// [`super::dict::Dictionary::undo`]), so a later request does not
    /// depend on it, and the failure is counted in [`SampleStore::health`].
    pub fn ingest_request(
        &self,
        batches: Vec<Batch<'_>>,
        id: Option<WindowId>,
    ) -> Result<Ingested> {
        let mut seq = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        if id.is_some_and(|id| {
            self.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&id)
        }) {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            return Ok(Ingested {
                duplicate: true,
                ..Default::default()
            });
        }
        let mark = self.dict.read().unwrap_or_else(|e| e.into_inner()).mark();
        let mut written = Vec::new();
        let pending = match self.write_request(&batches, id, &mut seq, &mut written) {
            Ok(pending) => pending,
            Err(e) => {
                self.undo(mark, &written);
                self.health.failed(&e);
                return Err(e);
            }
        };
        self.health.succeeded();
        let mut done = Ingested::default();
        for p in pending {
            done.waits += p.waits;
            done.samples += p.meta.samples - p.waits;
            done.blocks += 1;
            self.add_to_index(p.meta);
        }
        if let Some(id) = id {
            self.seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id);
        }
        let stats = &self.stats;
        stats
            .samples_stored
            .fetch_add(done.samples, Ordering::Relaxed);
        stats.waits_stored.fetch_add(done.waits, Ordering::Relaxed);
        stats
            .blocks_written
            .fetch_add(done.blocks as u64, Ordering::Relaxed);
        Ok(done)
    }

    /// Remove what a failed request wrote: its block files (`written`) and
    /// its stack-table entries.
    fn undo(&self, mark: super::dict::Mark, written: &[std::path::PathBuf]) {
        for path in written {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("cannot remove {} of a failed request: {e}", path.display());
                }
                _ => {
                    if let Some(dir) = path.parent() {
                        let _ = crate::util::files::sync_dir(dir);
                    }
                }
            }
        }
        self.dict
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .undo(mark);
    }

    /// Intern the batches' stacks and threads, persist the table, then
    /// write every block; `written` gets each block path as it is tried.
    fn write_request(
        &self,
        batches: &[Batch<'_>],
        id: Option<WindowId>,
        seq: &mut u64,
        written: &mut Vec<std::path::PathBuf>,
    ) -> Result<Vec<Pending>> {
        let rows: Vec<Vec<Row>> = {
            let mut dict = self.dict.write().unwrap_or_else(|e| e.into_inner());
            let rows = batches.iter().map(|b| rows_of(&mut dict, b)).collect();
            dict.persist()?;
            rows
        };
        let parts: usize = rows
            .iter()
            .map(|r| r.len().div_ceil(MAX_BLOCK_SAMPLES))
            .sum();
        let blocks_dir = self.root.join("blocks");
        let mut pending = Vec::with_capacity(parts);
        for (batch, mut rows) in batches.iter().zip(rows) {
            let host_dir = sanitize_host(batch.host);
            for chunk in rows.chunks_mut(MAX_BLOCK_SAMPLES) {
                // Sorted by time: the chunk's first and last are its extremes.
                let (first, last) = (chunk[0].time, chunk[chunk.len() - 1].time);
                let info = WindowInfo {
                    host: batch.host,
                    window: batch.window,
                    freq_hz: batch.profile.sample_freq_hz,
                    off_cpu: batch.profile.off_cpu,
                };
                let bytes = block::encode(info, chunk)?;
                let dir = blocks_dir
                    .join(&host_dir)
                    .join(crate::util::timefmt::day(first));
                create_dirs(&blocks_dir, &dir, self.file_mode)?;
                let part_of = id.map(|id| PartOf {
                    id,
                    part: pending.len() as u32,
                    parts: parts as u32,
                });
                let name = block_name(first, last, chunk.len(), *seq, part_of);
                let path = dir.join(name);
                written.push(path.clone());
                write_file(&path, &bytes, self.file_mode)
                    .with_context(|| format!("storing a block of {} samples", chunk.len()))?;
                *seq += 1;
                pending.push(Pending {
                    meta: BlockMeta {
                        path,
                        host: host_dir.clone(),
                        first_time: first,
                        last_time: last,
                        samples: chunk.len() as u64,
                        bytes: bytes.len() as u64,
                        part_of,
                    },
                    waits: chunk.iter().filter(|r| r.off_cpu_ns > 0).count() as u64,
                });
            }
        }
        Ok(pending)
    }
}

/// `batch`'s samples and waits as rows (stacks and threads interned into
/// `dict`), sorted by time.
fn rows_of(dict: &mut Dictionary, batch: &Batch<'_>) -> Vec<Row> {
    let profile = batch.profile;
    let frames = dict.frames_of(profile);
    let mut stacks = Vec::with_capacity(profile.samples.len());
    let mut threads = Vec::with_capacity(profile.samples.len());
    for s in &profile.samples {
        let ids = s.frames.iter().filter_map(|&f| frames.get(f).copied());
        stacks.push(dict.stack(ids.collect(), s.unwind_status));
        threads.push(dict.thread(batch.host, s.pid, s.tid, &s.process_comm, &s.thread_comm));
    }
    let row = |time, i: u32, off_cpu_ns| {
        Some(Row {
            time,
            stack: *stacks.get(i as usize)?,
            thread: threads[i as usize],
            off_cpu_ns,
        })
    };
    let samples = batch.times.iter().filter_map(|&(t, i)| row(t, i, 0));
    let waits = batch.waits.iter().filter(|w| w.ns > 0);
    let mut rows: Vec<Row> = samples
        .chain(waits.filter_map(|w| row(w.time, w.sample, w.ns)))
        .collect();
    rows.sort_unstable();
    rows
}
