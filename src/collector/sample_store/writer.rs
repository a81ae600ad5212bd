//! Ingest: one window of one host into the stack table and new blocks.

use std::sync::atomic::Ordering;

use anyhow::{Context, Result};

use super::block::{self, WindowInfo, MAX_BLOCK_SAMPLES};
use super::columns::Row;
use super::{BlockMeta, SampleStore};
use crate::collector::archive::{create_dirs, sanitize_host};
use crate::profile::Profile;
use crate::util::files::write_atomic;

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
}

impl SampleStore {
    /// Store `batch` durably: its new stack-table entries, then its samples
    /// as blocks of at most [`MAX_BLOCK_SAMPLES`], each renamed into place
    /// only when complete. One ingest at a time; queries go on meanwhile.
    /// Errors: the file system's, naming the path (what was renamed into
    /// place before stays, and is found by queries).
    pub fn ingest(&self, batch: Batch<'_>) -> Result<Ingested> {
        let mut seq = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let profile = batch.profile;
        let (stacks, threads) = {
            let mut dict = self.dict.write().unwrap_or_else(|e| e.into_inner());
            let frames = dict.frames_of(profile);
            let mut stacks = Vec::with_capacity(profile.samples.len());
            let mut threads = Vec::with_capacity(profile.samples.len());
            for s in &profile.samples {
                let ids = s.frames.iter().filter_map(|&f| frames.get(f).copied());
                stacks.push(dict.stack(ids.collect(), s.unwind_status));
                threads.push(dict.thread(
                    batch.host,
                    s.pid,
                    s.tid,
                    &s.process_comm,
                    &s.thread_comm,
                ));
            }
            dict.persist()?;
            (stacks, threads)
        };
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
        let host_dir = sanitize_host(batch.host);
        let blocks_dir = self.root.join("blocks");
        let mut done = Ingested::default();
        for chunk in rows.chunks_mut(MAX_BLOCK_SAMPLES) {
            // Sorted by time: the chunk's first and last are its extremes.
            let (first, last) = (chunk[0].time, chunk[chunk.len() - 1].time);
            let info = WindowInfo {
                host: batch.host,
                window: batch.window,
                freq_hz: profile.sample_freq_hz,
                off_cpu: profile.off_cpu,
            };
            let bytes = block::encode(info, chunk)?;
            let dir = blocks_dir
                .join(&host_dir)
                .join(crate::util::timefmt::day(first));
            create_dirs(&blocks_dir, &dir, self.file_mode)?;
            let path = dir.join(format!("{first}-{last}-{}-{}.blk", chunk.len(), *seq));
            write_atomic(&path, &bytes, self.file_mode)
                .with_context(|| format!("storing a block of {} samples", chunk.len()))?;
            *seq += 1;
            self.add_to_index(BlockMeta {
                path,
                host: host_dir.clone(),
                first_time: first,
                last_time: last,
                samples: chunk.len() as u64,
                bytes: bytes.len() as u64,
            });
            let waits = chunk.iter().filter(|r| r.off_cpu_ns > 0).count() as u64;
            done.waits += waits;
            done.samples += chunk.len() as u64 - waits;
            done.blocks += 1;
        }
        self.stats
            .samples_stored
            .fetch_add(done.samples, Ordering::Relaxed);
        self.stats
            .waits_stored
            .fetch_add(done.waits, Ordering::Relaxed);
        self.stats
            .blocks_written
            .fetch_add(done.blocks as u64, Ordering::Relaxed);
        Ok(done)
    }
}
