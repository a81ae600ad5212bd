//! Sample density over time, per host, process and thread, for
//! `GET /v1/timeline` (the web view's timeline): on-CPU samples only; the
//! off-CPU waits of `--off-cpu` are not samples and are not counted here
//! (`merged` answers them).
//!
//! Bucket `i` covers `[from + i*step, from + (i+1)*step)`. Counts are kept
//! sparse per thread: one cell per (thread, bucket) that has samples, at
//! most [`MAX_CELLS`] in all; past that, a thread not seen yet is counted
//! in its host's `other` series (dense, one count per bucket). A block lying
//! within one bucket is counted from its header's per-thread counts, its
//! columns not read. The answer keeps the [`MAX_THREADS`] busiest threads
//! and [`MAX_PROCESSES`] busiest processes; the others are folded into a
//! thread `{"tid":0,"name":"other"}` of their process, and a process
//! `{"pid":0,"comm":"other"}` of their host, so every total still adds up.

use std::collections::{BTreeMap, HashMap};

use super::block::BlockHeader;
use super::columns::Row;
use super::dict::Dictionary;
use super::query::Visitor;
use crate::agent::page::timeline::{HostSeries, ProcessSeries, ThreadSeries, Timeline};

/// Most (thread, bucket) cells counted one by one.
pub const MAX_CELLS: usize = 4_000_000;

/// Most thread series in an answer (the rest folded into `other`).
pub const MAX_THREADS: usize = 1_000;

/// Most process series in an answer (the rest folded into `other`).
pub const MAX_PROCESSES: usize = 500;

/// Name given to folded series.
pub const OTHER: &str = "other";

/// Sparse `(bucket, count)` cells of one series.
type Cells = Vec<(u32, u64)>;

/// Counts per thread and bucket as a [`Visitor`].
#[derive(Debug)]
pub struct Density {
    from: u64,
    step: u64,
    buckets: u64,
    /// Per thread id: (bucket, count) cells, mostly in bucket order.
    cells: HashMap<u32, Vec<(u32, u64)>>,
    cell_count: usize,
    /// Per host string id: one count per bucket, for threads past the cell budget.
    overflow: HashMap<u32, Vec<u64>>,
    /// Host string id -> name, process and thread names, filled as seen.
    threads: HashMap<u32, ThreadKey>,
}

#[derive(Debug, Clone)]
struct ThreadKey {
    host: String,
    pid: u32,
    comm: String,
    tid: u32,
    name: String,
}

impl Density {
    /// Counting `buckets` buckets of `step` ns from `from`.
    pub fn new(from: u64, step: u64, buckets: u64) -> Self {
        Density {
            from,
            step,
            buckets,
            cells: HashMap::new(),
            cell_count: 0,
            overflow: HashMap::new(),
            threads: HashMap::new(),
        }
    }

    fn bucket(&self, time: u64) -> u32 {
        (((time - self.from) / self.step).min(self.buckets - 1)) as u32
    }

    fn add(&mut self, dict: Option<&Dictionary>, thread: u32, bucket: u32, n: u64) {
        if let Some(cells) = self.cells.get_mut(&thread) {
            match cells.last_mut() {
                Some((b, c)) if *b == bucket => *c += n,
                _ if self.cell_count < MAX_CELLS => {
                    cells.push((bucket, n));
                    self.cell_count += 1;
                }
                _ => self.spill(thread, bucket, n),
            }
            return;
        }
        if let Some(dict) = dict {
            self.threads.entry(thread).or_insert_with(|| {
                let t = dict.thread_rec(thread);
                ThreadKey {
                    host: dict.str(t.host).to_string(),
                    pid: t.pid,
                    comm: dict.str(t.comm).to_string(),
                    tid: t.tid,
                    name: dict.str(t.name).to_string(),
                }
            });
        }
        if self.cell_count < MAX_CELLS {
            self.cells.insert(thread, vec![(bucket, n)]);
            self.cell_count += 1;
        } else {
            self.spill(thread, bucket, n);
        }
    }

    fn spill(&mut self, thread: u32, bucket: u32, n: u64) {
        let host = self.threads.get(&thread).map_or(0, |t| host_key(&t.host));
        let buckets = self.buckets as usize;
        self.overflow
            .entry(host)
            .or_insert_with(|| vec![0; buckets])[bucket as usize] += n;
    }
}

/// A stable key of a host name for the overflow table.
fn host_key(host: &str) -> u32 {
    xxhash_rust::xxh3::xxh3_64(host.as_bytes()) as u32
}

impl Visitor for Density {
    fn whole_block(&mut self, header: &BlockHeader, wanted: &[bool]) -> bool {
        let first = self.bucket(header.first_time);
        if first != self.bucket(header.last_time) {
            return false;
        }
        // Threads not seen yet need their names: only known ones are
        // counted here (threads that only waited are not counted at all).
        let mut threads = header.thread_ids.iter().zip(header.thread_samples());
        if threads.any(|(t, n)| n > 0 && wanted[*t as usize] && !self.threads.contains_key(t)) {
            return false;
        }
        for (&t, n) in header.thread_ids.iter().zip(header.thread_samples()) {
            if wanted[t as usize] && n > 0 {
                self.add(None, t, first, n);
            }
        }
        true
    }

    fn sample(&mut self, dict: &Dictionary, row: Row) {
        if row.off_cpu_ns == 0 {
            let bucket = self.bucket(row.time);
            self.add(Some(dict), row.thread, bucket, 1);
        }
    }
}

/// Sum sparse series into `into` (both ascending by bucket).
fn merge_into(into: &mut Vec<(u32, u64)>, cells: &[(u32, u64)]) {
    into.extend_from_slice(cells);
    *into = normalized(std::mem::take(into));
}

/// Cells sorted by bucket, equal buckets summed.
fn normalized(mut cells: Vec<(u32, u64)>) -> Vec<(u32, u64)> {
    cells.sort_unstable_by_key(|c| c.0);
    cells.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
    cells
}

impl Density {
    /// The answer for `[from, to)` (see the module docs for the folding).
    pub fn finish(self, to: u64) -> Timeline {
        let mut threads: Vec<(ThreadKey, Cells, u64)> = self
            .cells
            .into_iter()
            .filter_map(|(id, cells)| {
                let key = self.threads.get(&id)?.clone();
                let cells = normalized(cells);
                let total = cells.iter().map(|c| c.1).sum();
                Some((key, cells, total))
            })
            .collect();
        threads.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.tid.cmp(&b.0.tid)));
        // host -> (pid, comm) -> process series
        let mut hosts: BTreeMap<String, BTreeMap<(u32, String), ProcessSeries>> = BTreeMap::new();
        for (rank, (key, cells, total)) in threads.into_iter().enumerate() {
            let process = hosts
                .entry(key.host.clone())
                .or_default()
                .entry((key.pid, key.comm.clone()))
                .or_insert_with(|| ProcessSeries {
                    pid: key.pid,
                    comm: key.comm.clone(),
                    total: 0,
                    counts: Vec::new(),
                    threads: Vec::new(),
                });
            process.total += total;
            merge_into(&mut process.counts, &cells);
            if rank < MAX_THREADS {
                process.threads.push(ThreadSeries {
                    tid: key.tid,
                    name: key.name,
                    total,
                    counts: cells,
                });
            } else {
                fold_thread(process, &cells, total);
            }
        }
        let mut overflow = self.overflow;
        let mut out: Vec<HostSeries> = hosts
            .into_iter()
            .map(|(host, processes)| {
                let spilled = overflow.remove(&host_key(&host));
                host_series(host, processes.into_values().collect(), spilled)
            })
            .collect();
        for (_, spilled) in overflow {
            out.push(host_series(OTHER.to_string(), Vec::new(), Some(spilled)));
        }
        fold_processes(&mut out);
        Timeline {
            from: self.from.to_string(),
            to: to.to_string(),
            step: self.step.to_string(),
            buckets: self.buckets,
            hosts: out,
        }
    }
}

/// Add `cells` to `process`'s thread `other` (created last).
fn fold_thread(process: &mut ProcessSeries, cells: &[(u32, u64)], total: u64) {
    if process
        .threads
        .last()
        .is_none_or(|t| t.name != OTHER || t.tid != 0)
    {
        process.threads.push(ThreadSeries {
            tid: 0,
            name: OTHER.to_string(),
            total: 0,
            counts: Vec::new(),
        });
    }
    if let Some(other) = process.threads.last_mut() {
        other.total += total;
        merge_into(&mut other.counts, cells);
    }
}

fn host_series(
    host: String,
    mut processes: Vec<ProcessSeries>,
    spilled: Option<Vec<u64>>,
) -> HostSeries {
    if let Some(dense) = spilled {
        let cells: Vec<(u32, u64)> = dense
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i as u32, c))
            .collect();
        let total = cells.iter().map(|c| c.1).sum();
        let mut other = ProcessSeries {
            pid: 0,
            comm: OTHER.to_string(),
            total: 0,
            counts: Vec::new(),
            threads: Vec::new(),
        };
        other.total = total;
        other.counts = cells.clone();
        fold_thread(&mut other, &cells, total);
        processes.push(other);
    }
    let mut counts = Vec::new();
    for p in &processes {
        merge_into(&mut counts, &p.counts);
    }
    processes.sort_by(|a, b| b.total.cmp(&a.total).then(a.pid.cmp(&b.pid)));
    HostSeries {
        host,
        total: processes.iter().map(|p| p.total).sum(),
        counts,
        processes,
    }
}

/// Keep the [`MAX_PROCESSES`] busiest processes over all hosts; fold each
/// host's others into its process `other`.
fn fold_processes(hosts: &mut [HostSeries]) {
    let mut totals: Vec<u64> = hosts
        .iter()
        .flat_map(|h| h.processes.iter().map(|p| p.total))
        .collect();
    if totals.len() <= MAX_PROCESSES {
        return;
    }
    totals.sort_unstable_by(|a, b| b.cmp(a));
    let threshold = totals[MAX_PROCESSES - 1];
    let mut kept = 0;
    for host in hosts {
        let mut other = ProcessSeries {
            pid: 0,
            comm: OTHER.to_string(),
            total: 0,
            counts: Vec::new(),
            threads: Vec::new(),
        };
        host.processes.retain(|p| {
            let keep = p.total > threshold || (p.total == threshold && kept < MAX_PROCESSES);
            if keep {
                kept += 1;
            } else {
                other.total += p.total;
                merge_into(&mut other.counts, &p.counts);
            }
            keep
        });
        if other.total > 0 {
            let (cells, total) = (other.counts.clone(), other.total);
            fold_thread(&mut other, &cells, total);
            host.processes.push(other);
        }
    }
}
