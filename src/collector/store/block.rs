//! The block format: the samples of one ingested window of one host, in
//! time order, as compressed columns.
//!
//! ```text
//! "LSWBLK01"  u32 LE header length  header (prost BlockHeader)  u32 LE CRC-32 of the header
//! column 0: the block's stack ids (global, ascending), delta-coded varints
//! column 1: times, ns: delta from the previous sample (the first: from
//!           header.first_time), varints
//! column 2: each sample's stack, an index into column 0, varints
//! column 3: each sample's thread, an index into header.thread_ids, varints
//! u32 LE CRC-32 of the columns
//! ```
//!
//! Each column is zstd-compressed on its own (level [`ZSTD_LEVEL`]); the
//! header gives each column's compressed and raw lengths. Ids are local to
//! the block (column 0 and `thread_ids` map them to the stack table's), so
//! most are one byte before compression. Decoding checks both CRCs, the
//! lengths and every index, and refuses the block whole on any mismatch: a
//! damaged block is skipped and counted, never half read.

use anyhow::{bail, ensure, Context, Result};
use prost::Message;

/// First bytes of every block file.
pub const MAGIC: &[u8; 8] = b"LSWBLK01";

/// zstd level of the columns: 3 (zstd's default) measured within 2% of
/// level 9's size on real 10 kHz data at a third of its CPU time.
pub const ZSTD_LEVEL: i32 = 3;

/// Most samples in one block; a larger ingest is split. Bounds what a
/// query decodes at once (about 16 bytes per sample).
pub const MAX_BLOCK_SAMPLES: usize = 1 << 20;

/// A block's header: what a listing or a time-density query needs without
/// the columns.
#[derive(Clone, PartialEq, Message)]
pub struct BlockHeader {
    /// Host the samples were taken on (as sent).
    #[prost(string, tag = "1")]
    pub host: String,
    /// The window the sender declared, ns since the Unix epoch.
    #[prost(uint64, tag = "2")]
    pub window_start: u64,
    /// End of the declared window (exclusive).
    #[prost(uint64, tag = "3")]
    pub window_end: u64,
    /// First and last sample time, ns since the Unix epoch.
    #[prost(uint64, tag = "4")]
    pub first_time: u64,
    /// Last sample time.
    #[prost(uint64, tag = "5")]
    pub last_time: u64,
    /// Samples in the block.
    #[prost(uint64, tag = "6")]
    pub samples: u64,
    /// The stack table's thread ids the block uses, ascending.
    #[prost(uint32, repeated, tag = "7")]
    pub thread_ids: Vec<u32>,
    /// Samples of each of `thread_ids`.
    #[prost(uint64, repeated, tag = "8")]
    pub thread_counts: Vec<u64>,
    /// Compressed length of each column, bytes.
    #[prost(uint32, repeated, tag = "9")]
    pub packed_lens: Vec<u32>,
    /// Raw length of each column, bytes.
    #[prost(uint32, repeated, tag = "10")]
    pub raw_lens: Vec<u32>,
    /// The sender's sampling frequency per CPU, Hz (0: unknown).
    #[prost(uint64, tag = "11")]
    pub sample_freq_hz: u64,
}

/// One stored sample: time (ns since the Unix epoch), stack id, thread id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    /// Time, ns since the Unix epoch.
    pub time: u64,
    /// Stack id (stack table).
    pub stack: u32,
    /// Thread id (stack table).
    pub thread: u32,
}

/// A block read back: its header and one entry per sample in each column.
#[derive(Debug, Default)]
pub struct Decoded {
    /// The checked header.
    pub header: BlockHeader,
    /// Each sample's time, ns since the Unix epoch, ascending.
    pub times: Vec<u64>,
    /// Each sample's stack id (stack table).
    pub stacks: Vec<u32>,
    /// Each sample's thread id (stack table).
    pub threads: Vec<u32>,
}

const COLUMNS: usize = 4;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
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
        bail!("a varint is too long")
    }
}

/// Encode `rows` (sorted by time, at least one) of `host`'s window
/// `[window_start, window_end)`, sampled at `freq_hz`, as a block file's bytes.
pub fn encode(host: &str, window: (u64, u64), freq_hz: u64, rows: &[Row]) -> Result<Vec<u8>> {
    ensure!(!rows.is_empty(), "an empty block");
    let mut stack_ids: Vec<u32> = rows.iter().map(|r| r.stack).collect();
    stack_ids.sort_unstable();
    stack_ids.dedup();
    let mut thread_ids: Vec<u32> = rows.iter().map(|r| r.thread).collect();
    thread_ids.sort_unstable();
    thread_ids.dedup();
    let local_stack: std::collections::HashMap<u32, u64> = stack_ids
        .iter()
        .enumerate()
        .map(|(i, &s)| (s, i as u64))
        .collect();
    let local_thread: std::collections::HashMap<u32, usize> = thread_ids
        .iter()
        .enumerate()
        .map(|(i, &t)| (t, i))
        .collect();
    let mut raw: [Vec<u8>; COLUMNS] = Default::default();
    let mut previous = 0;
    for &s in &stack_ids {
        put_varint(&mut raw[0], u64::from(s - previous));
        previous = s;
    }
    let mut thread_counts = vec![0u64; thread_ids.len()];
    let mut last = rows[0].time;
    for r in rows {
        ensure!(r.time >= last, "block rows out of time order");
        put_varint(&mut raw[1], r.time - last);
        last = r.time;
        put_varint(&mut raw[2], local_stack[&r.stack]);
        let t = local_thread[&r.thread];
        put_varint(&mut raw[3], t as u64);
        thread_counts[t] += 1;
    }
    let mut packed = Vec::with_capacity(COLUMNS);
    for column in &raw {
        packed.push(zstd::bulk::compress(column, ZSTD_LEVEL).context("compressing a column")?);
    }
    let header = BlockHeader {
        host: host.to_string(),
        window_start: window.0,
        window_end: window.1,
        first_time: rows[0].time,
        last_time: last,
        samples: rows.len() as u64,
        thread_ids,
        thread_counts,
        packed_lens: packed.iter().map(|c| c.len() as u32).collect(),
        raw_lens: raw.iter().map(|c| c.len() as u32).collect(),
        sample_freq_hz: freq_hz,
    };
    let header = header.encode_to_vec();
    let mut out =
        Vec::with_capacity(16 + header.len() + packed.iter().map(Vec::len).sum::<usize>());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&crc32fast::hash(&header).to_le_bytes());
    let columns_start = out.len();
    for c in &packed {
        out.extend_from_slice(c);
    }
    let crc = crc32fast::hash(&out[columns_start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// The header of a block from its first bytes (at least
/// [`header_span`]'s), checked. Returns it and where the columns start.
pub fn decode_header(bytes: &[u8]) -> Result<(BlockHeader, usize)> {
    let end = header_span(bytes)?;
    ensure!(bytes.len() >= end, "the file ends inside its header");
    let header = &bytes[12..end - 4];
    let crc = u32::from_le_bytes(bytes[end - 4..end].try_into().unwrap_or_default());
    ensure!(
        crc32fast::hash(header) == crc,
        "the header's checksum does not match"
    );
    let header = BlockHeader::decode(header).context("the header does not decode")?;
    ensure!(
        header.packed_lens.len() == COLUMNS
            && header.raw_lens.len() == COLUMNS
            && header.thread_counts.len() == header.thread_ids.len()
            && header.samples > 0
            && header.samples <= MAX_BLOCK_SAMPLES as u64
            && header.first_time <= header.last_time
            && header.thread_counts.iter().sum::<u64>() == header.samples,
        "the header is inconsistent"
    );
    Ok((header, end))
}

/// Bytes from the start of a block file to the end of its header's CRC,
/// from its first 12 bytes. Errors: not a block file.
pub fn header_span(bytes: &[u8]) -> Result<usize> {
    ensure!(
        bytes.len() >= 12 && bytes.starts_with(MAGIC),
        "not a block file"
    );
    let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default()) as usize;
    ensure!(len <= 64 << 20, "the header's length is implausible");
    Ok(12 + len + 4)
}

/// Decode a whole block file, checking everything (see the module docs).
pub fn decode(bytes: &[u8]) -> Result<Decoded> {
    let (header, start) = decode_header(bytes)?;
    let packed_total: usize = header.packed_lens.iter().map(|&l| l as usize).sum();
    ensure!(
        bytes.len() == start + packed_total + 4,
        "the file is {} bytes, its header says {}",
        bytes.len(),
        start + packed_total + 4
    );
    let columns = &bytes[start..start + packed_total];
    let crc = u32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap_or_default());
    ensure!(
        crc32fast::hash(columns) == crc,
        "the columns' checksum does not match"
    );
    let n = header.samples as usize;
    let mut raw = Vec::with_capacity(COLUMNS);
    let mut at = 0;
    for (i, (&packed, &len)) in header.packed_lens.iter().zip(&header.raw_lens).enumerate() {
        // A varint of a u64 is at most 10 bytes: a bound on honest lengths.
        ensure!(
            len as usize <= (n + 1) * 10,
            "column {i} is implausibly long"
        );
        let column = &columns[at..at + packed as usize];
        at += packed as usize;
        let bytes = zstd::bulk::decompress(column, len as usize)
            .with_context(|| format!("column {i} does not decompress"))?;
        ensure!(
            bytes.len() == len as usize,
            "column {i} has the wrong length"
        );
        raw.push(bytes);
    }
    let mut stack_list = Vec::new();
    let mut ids = Varints { bytes: &raw[0] };
    let mut previous = 0u32;
    while !ids.bytes.is_empty() {
        let delta = u32::try_from(ids.next()?).context("a stack id is too large")?;
        previous = previous
            .checked_add(delta)
            .context("a stack id is too large")?;
        stack_list.push(previous);
    }
    let mut out = Decoded {
        times: Vec::with_capacity(n),
        stacks: Vec::with_capacity(n),
        threads: Vec::with_capacity(n),
        header,
    };
    let (mut times, mut stacks, mut threads) = (
        Varints { bytes: &raw[1] },
        Varints { bytes: &raw[2] },
        Varints { bytes: &raw[3] },
    );
    let mut time = out.header.first_time;
    for _ in 0..n {
        time = time
            .checked_add(times.next()?)
            .context("a time is too large")?;
        let stack = stack_list
            .get(stacks.next()? as usize)
            .context("a stack index is out of range")?;
        let thread = out
            .header
            .thread_ids
            .get(threads.next()? as usize)
            .context("a thread index is out of range")?;
        out.times.push(time);
        out.stacks.push(*stack);
        out.threads.push(*thread);
    }
    ensure!(
        time == out.header.last_time,
        "the last time differs from the header's"
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let rows: Vec<Row> = (0..1000u64)
            .map(|i| Row {
                time: 1_700_000_000_000_000_000 + i * 50_017,
                stack: (i % 7) as u32 * 1000,
                thread: (i % 3) as u32 + 5,
            })
            .collect();
        let bytes = encode("h", (1, 2), 99, &rows).unwrap();
        let d = decode(&bytes).unwrap();
        assert_eq!(d.header.host, "h");
        assert_eq!(d.header.thread_counts, vec![334, 333, 333]);
        let back: Vec<Row> = (0..1000)
            .map(|i| Row {
                time: d.times[i],
                stack: d.stacks[i],
                thread: d.threads[i],
            })
            .collect();
        assert_eq!(back, rows);
        for cut in [0, 5, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        let at = flipped.len() - 10;
        flipped[at] ^= 1;
        assert!(decode(&flipped).is_err());
    }
}
