//! How a block's rows become its columns, before compression: the coding
//! that keeps a steady 10 kHz workload under 3 bytes per sample.
//!
//! Rows are ordered by thread, then time, so the threads need no column
//! (the header's `thread_ids` and `thread_counts` give the runs), and each
//! thread's times and stacks follow on from its previous sample:
//! - **time**: `d`, the ns since the thread's previous sample (its first:
//!   since the block's first time), as `k = round(d / period)` (mostly 1
//!   at a steady rate: column 1, varints) and the jitter `d - k * period`
//!   (zigzag, a u32 of at most period / 2: column 2, as four byte planes,
//!   so that the always-zero high bytes compress to nothing);
//! - **stack**: a move-to-front list of the thread's last [`MTF_LEN`]
//!   stacks: code `i + 1` is the list's entry `i` (column 3, varints, mostly
//!   one byte); code 0 is a stack not in the list, whose local id follows in
//!   column 4: 0 for a stack new to the block (the next local id), else how
//!   many local ids back it was given;
//! - **stack list** (column 0): the stack table's id of each local id, in
//!   order of first use, as zigzag deltas (stacks that appeared together
//!   once get neighbouring ids, so deltas are small);
//! - **off-CPU** (column 5): each row's off-CPU ns (varints; 0 for an
//!   on-CPU sample, so a wait of 0 ns is not stored), or nothing at all
//!   when the block holds no wait: on-CPU-only blocks cost no byte more.

use std::collections::HashMap;

use anyhow::{ensure, Context, Result};

/// One stored row: an on-CPU sample, or an off-CPU wait (`--off-cpu`)
/// with its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    /// Time, ns since the Unix epoch: when the sample was taken, or when
    /// the waiting thread left its CPU.
    pub time: u64,
    /// Stack id (stack table).
    pub stack: u32,
    /// Thread id (stack table).
    pub thread: u32,
    /// 0: an on-CPU sample; else an off-CPU wait of this many ns (the
    /// agent's `off_cpu/nanoseconds` value).
    pub off_cpu_ns: u64,
}

/// Stacks each thread's move-to-front list holds.
pub const MTF_LEN: usize = 64;

/// Number of columns.
pub const COLUMNS: usize = 6;

/// Columns of a version-1 block (`LSWBLK01`, before off-CPU waits): all
/// but the off-CPU column.
pub const COLUMNS_V1: usize = 5;

/// Rows coded as columns, with what the header records of them.
#[derive(Debug, Default)]
pub struct Coded {
    /// Raw (uncompressed) columns.
    pub columns: [Vec<u8>; COLUMNS],
    /// The stack table's thread ids, ascending: the order of the rows.
    pub thread_ids: Vec<u32>,
    /// Rows of each of `thread_ids`.
    pub thread_counts: Vec<u64>,
    /// Off-CPU waits among the rows of each of `thread_ids` (empty when
    /// the block has none).
    pub thread_waits: Vec<u64>,
    /// Earliest and latest time.
    pub first_time: u64,
    /// Latest time.
    pub last_time: u64,
}

/// Columns decoded back: one entry per row, rows by thread then time.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rows {
    /// Each row's time, ns since the Unix epoch.
    pub times: Vec<u64>,
    /// Each row's stack id (stack table).
    pub stacks: Vec<u32>,
    /// Each row's thread id (stack table).
    pub threads: Vec<u32>,
    /// Each row's off-CPU ns (0: an on-CPU sample); empty when the block
    /// has no wait.
    pub off_cpu_ns: Vec<u64>,
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Reads varints from a column; errors past its end or on an overlong one.
struct Varints<'a> {
    bytes: &'a [u8],
}

impl Varints<'_> {
    fn next(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.bytes.split_first().context("a column ends early")?;
            self.bytes = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        anyhow::bail!("a varint is too long")
    }
}

/// Move `value` to the front of `list` (inserting it), keeping [`MTF_LEN`].
fn to_front(list: &mut Vec<u32>, value: u32) {
    list.insert(0, value);
    list.truncate(MTF_LEN);
}

/// Code `rows` (at least one; reordered here) with `period` ns between
/// samples at the sampling rate (1 when unknown).
pub fn code(rows: &mut [Row], period: u64) -> Coded {
    rows.sort_unstable_by_key(|r| (r.thread, r.time));
    let period = period.max(1);
    let mut c = Coded {
        first_time: rows.iter().map(|r| r.time).min().unwrap_or(0),
        last_time: rows.iter().map(|r| r.time).max().unwrap_or(0),
        ..Default::default()
    };
    let mut local: HashMap<u32, u32> = HashMap::new();
    let mut previous_stack = 0u32;
    let (mut thread, mut previous, mut mtf) = (None, 0, Vec::with_capacity(MTF_LEN));
    let mut jitter = Vec::with_capacity(rows.len());
    let waits = rows.iter().any(|r| r.off_cpu_ns > 0);
    for r in rows.iter() {
        if thread != Some(r.thread) {
            thread = Some(r.thread);
            c.thread_ids.push(r.thread);
            c.thread_counts.push(0);
            if waits {
                c.thread_waits.push(0);
            }
            previous = c.first_time;
            mtf.clear();
        }
        *c.thread_counts.last_mut().unwrap_or(&mut 0) += 1;
        if waits {
            put_varint(&mut c.columns[5], r.off_cpu_ns);
            *c.thread_waits.last_mut().unwrap_or(&mut 0) += u64::from(r.off_cpu_ns > 0);
        }
        let d = r.time - previous;
        previous = r.time;
        let k = (d + period / 2) / period;
        put_varint(&mut c.columns[1], k);
        jitter.push(zigzag(d.wrapping_sub(k.wrapping_mul(period)) as i64) as u32);
        match mtf.iter().position(|&s| s == r.stack) {
            Some(i) => {
                put_varint(&mut c.columns[3], i as u64 + 1);
                mtf.remove(i);
            }
            None => {
                put_varint(&mut c.columns[3], 0);
                let next = local.len() as u32;
                let id = *local.entry(r.stack).or_insert(next);
                if id == next {
                    put_varint(
                        &mut c.columns[0],
                        zigzag(i64::from(r.stack) - i64::from(previous_stack)),
                    );
                    previous_stack = r.stack;
                }
                put_varint(&mut c.columns[4], u64::from(next - id));
            }
        }
        to_front(&mut mtf, r.stack);
    }
    for plane in 0..4 {
        c.columns[2].extend(jitter.iter().map(|j| (j >> (8 * plane)) as u8));
    }
    c
}

/// How a block's rows run: the threads in order, with their rows and
/// their off-CPU waits (the header's lists).
#[derive(Debug, Clone, Copy)]
pub struct Runs<'a> {
    /// The stack table's thread ids, in the rows' order.
    pub thread_ids: &'a [u32],
    /// Rows of each thread.
    pub thread_counts: &'a [u64],
    /// Off-CPU waits among each thread's rows (empty: the block has none).
    pub thread_waits: &'a [u64],
}

/// Decode `columns` of the rows that run as `runs`, times from
/// `first_time`, `period` ns apart. Errors: any column too short or too
/// long, an index out of range, or waits that differ from `runs`.
pub fn decode(columns: &[Vec<u8>], runs: Runs<'_>, first_time: u64, period: u64) -> Result<Rows> {
    ensure!(columns.len() == COLUMNS, "a block needs {COLUMNS} columns");
    let Runs {
        thread_ids,
        thread_counts,
        thread_waits,
    } = runs;
    let n: usize = thread_counts.iter().map(|&c| c as usize).sum();
    let period = period.max(1);
    ensure!(
        columns[2].len() == 4 * n,
        "the jitter column has the wrong length"
    );
    let mut list = Vec::new();
    let mut ids = Varints { bytes: &columns[0] };
    let mut previous = 0i64;
    while !ids.bytes.is_empty() {
        previous = previous
            .checked_add(unzigzag(ids.next()?))
            .filter(|id| (0..=i64::from(u32::MAX)).contains(id))
            .context("a stack id is out of range")?;
        list.push(previous as u32);
    }
    let (mut ks, mut codes, mut escapes) = (
        Varints { bytes: &columns[1] },
        Varints { bytes: &columns[3] },
        Varints { bytes: &columns[4] },
    );
    let mut out = Rows {
        times: Vec::with_capacity(n),
        stacks: Vec::with_capacity(n),
        threads: Vec::with_capacity(n),
        off_cpu_ns: Vec::new(),
    };
    if !thread_waits.is_empty() {
        out.off_cpu_ns = off_cpu_column(&columns[5], thread_counts, thread_waits)?;
    } else {
        ensure!(
            columns[5].is_empty(),
            "off-CPU waits the header does not count"
        );
    }
    let mut assigned = 0usize;
    let mut mtf: Vec<u32> = Vec::with_capacity(MTF_LEN);
    let mut row = 0;
    for (&thread, &count) in thread_ids.iter().zip(thread_counts) {
        let mut time = first_time;
        mtf.clear();
        for _ in 0..count {
            let plane = |p: usize| u32::from(columns[2][p * n + row]) << (8 * p);
            let jitter = unzigzag(u64::from(plane(0) | plane(1) | plane(2) | plane(3)));
            let d = i128::from(ks.next()?) * i128::from(period) + i128::from(jitter);
            time = u64::try_from(i128::from(time) + d).context("a time is out of range")?;
            let stack = match codes.next()? {
                0 => {
                    let back = escapes.next()? as usize;
                    let id = if back == 0 {
                        assigned += 1;
                        assigned - 1
                    } else {
                        assigned
                            .checked_sub(back)
                            .context("a stack escape is out of range")?
                    };
                    *list.get(id).context("a stack index is out of range")?
                }
                c => {
                    let i = c as usize - 1;
                    ensure!(i < mtf.len(), "a stack code is out of range");
                    mtf.remove(i)
                }
            };
            to_front(&mut mtf, stack);
            out.times.push(time);
            out.stacks.push(stack);
            out.threads.push(thread);
            row += 1;
        }
    }
    ensure!(
        ks.bytes.is_empty()
            && codes.bytes.is_empty()
            && escapes.bytes.is_empty()
            && assigned == list.len(),
        "a column is longer than its rows"
    );
    Ok(out)
}

/// Column 5 of rows that run as `thread_counts`, checked against
/// `thread_waits` (the rows of each thread that are waits).
fn off_cpu_column(column: &[u8], thread_counts: &[u64], thread_waits: &[u64]) -> Result<Vec<u64>> {
    ensure!(
        thread_waits.len() == thread_counts.len(),
        "the header's waits do not match its threads"
    );
    let mut values = Varints { bytes: column };
    let mut out = Vec::new();
    for (&count, &waits) in thread_counts.iter().zip(thread_waits) {
        let mut seen = 0;
        for _ in 0..count {
            let ns = values.next()?;
            seen += u64::from(ns > 0);
            out.push(ns);
        }
        ensure!(seen == waits, "a thread's waits differ from the header's");
    }
    ensure!(
        values.bytes.is_empty(),
        "the off-CPU column is longer than its rows"
    );
    Ok(out)
}
