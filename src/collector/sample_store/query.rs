//! Reading the store: the samples of a time range and filters, one block
//! at a time (memory holds one decoded block, however long the range).

use std::fs::File;
use std::io::Read;
use std::sync::atomic::Ordering;

use anyhow::{ensure, Context, Result};
use tracing::warn;

use super::block::{self, BlockHeader, Decoded};
use super::columns::Row;
use super::dict::Dictionary;
use super::{BlockMeta, SampleStore};
use crate::collector::archive::sanitize_host;

/// Which samples a query wants: time in `[from, to)` (ns since the Unix
/// epoch), and optionally only one host, process, thread or process name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// First ns of the range (inclusive).
    pub from: u64,
    /// End of the range (exclusive).
    pub to: u64,
    /// Only samples of this host (compared as sanitized for the file system).
    pub host: Option<String>,
    /// Only this process id.
    pub pid: Option<u32>,
    /// Only this thread id.
    pub tid: Option<u32>,
    /// Only processes of this name (`comm`, exact).
    pub comm: Option<String>,
}

/// What a scan read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scanned {
    /// On-CPU samples selected.
    pub samples: u64,
    /// Off-CPU waits selected.
    pub waits: u64,
    /// Whether any block that gave a sample or wait was recorded with
    /// off-CPU waits (`--off-cpu`), even if none of them waited.
    pub off_cpu: bool,
    /// Blocks (ingested windows) that gave at least one sample or wait.
    pub windows: usize,
    /// Blocks that could not be read or did not check (logged, counted).
    pub skipped: usize,
    /// Earliest declared window start and latest window end of those blocks.
    pub span: Option<(u64, u64)>,
    /// Sampling frequency of the first of them that knew it, Hz (0: none did).
    pub freq_hz: u64,
}

/// A block's samples as the visitor of [`SampleStore::scan`] gets them.
pub trait Visitor {
    /// Whether the block whose header this is can be counted from its
    /// header alone (then its columns are not read). `wanted[t]`: thread
    /// `t` is selected.
    fn whole_block(&mut self, _header: &BlockHeader, _wanted: &[bool]) -> bool {
        false
    }

    /// One selected row (an on-CPU sample, or an off-CPU wait when its
    /// `off_cpu_ns` is not 0), with the stack table to resolve its ids.
    fn sample(&mut self, dict: &Dictionary, row: Row);
}

/// Rows of one block a scan selected.
#[derive(Debug, Clone, Copy, Default)]
struct Selected {
    samples: u64,
    waits: u64,
}

impl Selection {
    /// Whether every filter but time passes `thread` of `dict`.
    fn wants(&self, dict: &Dictionary, thread: u32) -> bool {
        let t = dict.thread_rec(thread);
        self.pid.is_none_or(|p| p == t.pid)
            && self.tid.is_none_or(|p| p == t.tid)
            && self
                .comm
                .as_deref()
                .is_none_or(|c| c == &**dict.str(t.comm))
            && self
                .host
                .as_deref()
                .is_none_or(|h| sanitize_host(h) == sanitize_host(dict.str(t.host)))
    }
}

impl SampleStore {
    /// The blocks a selection must read, oldest first.
    pub fn blocks_for(&self, selection: &Selection) -> Vec<BlockMeta> {
        let host = selection.host.as_deref().map(sanitize_host);
        self.blocks(selection.from, selection.to, host.as_deref())
    }

    /// Pass every sample of `blocks` that `selection` selects to `visitor`,
    /// block by block (each block's samples by thread, then time; blocks
    /// in the given order). Damaged blocks are skipped, logged and counted.
    pub fn scan(
        &self,
        selection: &Selection,
        blocks: &[BlockMeta],
        visitor: &mut dyn Visitor,
    ) -> Scanned {
        let wanted: Vec<bool> = {
            let dict = self.dict.read().unwrap_or_else(|e| e.into_inner());
            (0..dict.sizes().1)
                .map(|t| selection.wants(&dict, t))
                .collect()
        };
        let mut out = Scanned::default();
        for meta in blocks {
            match self.scan_block(selection, meta, &wanted, visitor) {
                Ok(Some((n, header))) => {
                    if n.samples + n.waits > 0 {
                        out.samples += n.samples;
                        out.waits += n.waits;
                        out.off_cpu |= header.off_cpu;
                        out.windows += 1;
                        let (s, e) = out.span.unwrap_or((u64::MAX, 0));
                        out.span = Some((s.min(header.window_start), e.max(header.window_end)));
                        if out.freq_hz == 0 {
                            out.freq_hz = header.sample_freq_hz;
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!("skipping block {}: {e:#}", meta.path.display());
                    self.stats.blocks_skipped.fetch_add(1, Ordering::Relaxed);
                    out.skipped += 1;
                }
            }
        }
        out
    }

    /// One block: the samples and waits it gave and its header (`None`:
    /// deleted meanwhile by retention).
    fn scan_block(
        &self,
        selection: &Selection,
        meta: &BlockMeta,
        wanted: &[bool],
        visitor: &mut dyn Visitor,
    ) -> Result<Option<(Selected, BlockHeader)>> {
        let mut file = match File::open(&meta.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context("opening it"),
        };
        let mut bytes = vec![0; 12];
        file.read_exact(&mut bytes).context("reading its start")?;
        let span = block::header_span(&bytes)?;
        bytes.resize(span, 0);
        file.read_exact(&mut bytes[12..])
            .context("reading its header")?;
        let (header, _) = block::decode_header(&bytes)?;
        ensure!(
            header
                .thread_ids
                .iter()
                .all(|&t| (t as usize) < wanted.len()),
            "it names threads the stack table lacks"
        );
        let inside = header.first_time >= selection.from && header.last_time < selection.to;
        if inside && visitor.whole_block(&header, wanted) {
            let mut n = Selected::default();
            let threads = header.thread_ids.iter().zip(&header.thread_counts);
            for ((&t, &rows), samples) in threads.zip(header.thread_samples()) {
                if wanted[t as usize] {
                    n.samples += samples;
                    n.waits += rows - samples;
                }
            }
            return Ok(Some((n, header)));
        }
        file.read_to_end(&mut bytes).context("reading it")?;
        let decoded = block::decode(&bytes)?;
        drop(bytes);
        let n = self.visit(selection, &decoded, wanted, visitor)?;
        Ok(Some((n, decoded.header)))
    }

    fn visit(
        &self,
        selection: &Selection,
        d: &Decoded,
        wanted: &[bool],
        visitor: &mut dyn Visitor,
    ) -> Result<Selected> {
        let dict = self.dict.read().unwrap_or_else(|e| e.into_inner());
        let stacks = dict.sizes().0;
        ensure!(
            d.stacks.iter().all(|&s| s < stacks),
            "it names stacks the stack table lacks"
        );
        let mut n = Selected::default();
        for i in 0..d.times.len() {
            let time = d.times[i];
            if (selection.from..selection.to).contains(&time) && wanted[d.threads[i] as usize] {
                let off_cpu_ns = d.off_cpu_ns.get(i).copied().unwrap_or(0);
                visitor.sample(
                    &dict,
                    Row {
                        time,
                        stack: d.stacks[i],
                        thread: d.threads[i],
                        off_cpu_ns,
                    },
                );
                if off_cpu_ns > 0 {
                    n.waits += 1;
                } else {
                    n.samples += 1;
                }
            }
        }
        Ok(n)
    }
}
