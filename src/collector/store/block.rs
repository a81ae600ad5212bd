//! The block format: the samples of one ingested window of one host, in
//! time order, as compressed columns.
//!
//! ```text
//! "LSWBLK01"  u32 LE header length  header (prost BlockHeader)  u32 LE CRC-32 of the header
//! the columns of [`super::columns`], each zstd-compressed on its own
//! u32 LE CRC-32 of the compressed columns
//! ```
//!
//! Each column is compressed at level [`ZSTD_LEVEL`]; the header gives
//! each column's compressed and raw lengths. Ids are local to the block
//! (the stack list and `thread_ids` map them to the stack table's).
//! Decoding checks both CRCs, the lengths and every index, and refuses the
//! block whole on any mismatch: a damaged block is skipped and counted,
//! never half read.

use anyhow::{ensure, Context, Result};
use prost::Message;

use super::columns::{self, Row, COLUMNS};

/// First bytes of every block file.
pub const MAGIC: &[u8; 8] = b"LSWBLK01";

/// zstd level of the columns: zstd's default. Level 9 was 3-5% smaller on
/// a real 10 kHz recording, level 19 8-12%, at several times the CPU.
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

/// A block read back: its header and its rows (by thread, then time).
#[derive(Debug, Default)]
pub struct Decoded {
    /// The checked header.
    pub header: BlockHeader,
    /// Each row's time, ns since the Unix epoch.
    pub times: Vec<u64>,
    /// Each row's stack id (stack table).
    pub stacks: Vec<u32>,
    /// Each row's thread id (stack table).
    pub threads: Vec<u32>,
}

/// ns between samples at `freq_hz` (1 when unknown): what time deltas are
/// counted in.
fn period_of(freq_hz: u64) -> u64 {
    1_000_000_000u64.checked_div(freq_hz).unwrap_or(1).max(1)
}

/// Encode `rows` (at least one, any order; reordered here) of `host`'s
/// window `[window_start, window_end)`, sampled at `freq_hz`, as a block
/// file's bytes.
pub fn encode(host: &str, window: (u64, u64), freq_hz: u64, rows: &mut [Row]) -> Result<Vec<u8>> {
    ensure!(!rows.is_empty(), "an empty block");
    let coded = columns::code(rows, period_of(freq_hz));
    let mut packed = Vec::with_capacity(COLUMNS);
    for column in &coded.columns {
        packed.push(zstd::bulk::compress(column, ZSTD_LEVEL).context("compressing a column")?);
    }
    let header = BlockHeader {
        host: host.to_string(),
        window_start: window.0,
        window_end: window.1,
        first_time: coded.first_time,
        last_time: coded.last_time,
        samples: rows.len() as u64,
        thread_ids: coded.thread_ids,
        thread_counts: coded.thread_counts,
        packed_lens: packed.iter().map(|c| c.len() as u32).collect(),
        raw_lens: coded.columns.iter().map(|c| c.len() as u32).collect(),
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
        // At most a 10-byte varint or 4 jitter bytes per sample: a bound on
        // honest lengths.
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
    let rows = columns::decode(
        &raw,
        &header.thread_ids,
        &header.thread_counts,
        header.first_time,
        period_of(header.sample_freq_hz),
    )?;
    let (min, max) = (rows.times.iter().min(), rows.times.iter().max());
    ensure!(
        min == Some(&header.first_time) && max == Some(&header.last_time),
        "the times differ from the header's"
    );
    Ok(Decoded {
        header,
        times: rows.times,
        stacks: rows.stacks,
        threads: rows.threads,
    })
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
        let bytes = encode("h", (1, 2), 20_000, &mut rows.clone()).unwrap();
        let d = decode(&bytes).unwrap();
        assert_eq!(d.header.host, "h");
        assert_eq!(d.header.thread_counts, vec![334, 333, 333]);
        let mut back: Vec<Row> = (0..1000)
            .map(|i| Row {
                time: d.times[i],
                stack: d.stacks[i],
                thread: d.threads[i],
            })
            .collect();
        back.sort();
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
