//! The block format: the samples of one ingested window of one host, in
//! time order, as compressed columns.
//!
//! ```text
//! "LSWBLK02"  u32 LE header length  header (prost BlockHeader)  u32 LE CRC-32 of the header
//! the columns of [`super::columns`], each zstd-compressed on its own
//! u32 LE CRC-32 of the compressed columns
//! ```
//!
//! Each column is compressed at level [`ZSTD_LEVEL`]; the header gives
//! each column's compressed and raw lengths (an empty column is stored as
//! no byte at all). Version 2 (`LSWBLK02`) added off-CPU waits: the
//! column of each row's off-CPU ns and the header's `thread_waits` and
//! `off_cpu`. Version 1 blocks (`LSWBLK01`, five columns) are still read,
//! as blocks without waits. Ids are local to the block
//! (the stack list and `thread_ids` map them to the stack table's).
//! Decoding checks both CRCs, the lengths and every index, and refuses the
//! block whole on any mismatch: a damaged block is skipped and counted,
//! never half read.

use anyhow::{ensure, Context, Result};
use prost::Message;

use super::columns::{self, Row, Runs, COLUMNS, COLUMNS_V1};

/// First bytes of every block file written (format version 2).
pub const MAGIC: &[u8; 8] = b"LSWBLK02";

/// First bytes of a version-1 block (before off-CPU waits), still read.
pub const MAGIC_V1: &[u8; 8] = b"LSWBLK01";

/// zstd level of the columns: zstd's default. Level 9 was 3-5% smaller on
/// a real 10 kHz recording, level 19 8-12%, at several times the CPU.
pub const ZSTD_LEVEL: i32 = 3;

/// Most samples in one block; a larger ingest is split. Bounds what a
/// query decodes at once (about 16 bytes per row, 24 in a block with
/// off-CPU waits).
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
    /// Off-CPU waits among the rows of each of `thread_ids` (empty when
    /// the block has none; version 2).
    #[prost(uint64, repeated, tag = "12")]
    pub thread_waits: Vec<u64>,
    /// Whether the sender recorded off-CPU waits (`--off-cpu`) in the
    /// window, even if none is in this block (version 2).
    #[prost(bool, tag = "13")]
    pub off_cpu: bool,
}

impl BlockHeader {
    /// On-CPU samples (rows that are not waits) of each of `thread_ids`.
    pub fn thread_samples(&self) -> impl Iterator<Item = u64> + '_ {
        let waits = self.thread_waits.iter().chain(std::iter::repeat(&0));
        self.thread_counts.iter().zip(waits).map(|(&c, &w)| c - w)
    }
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
    /// Each row's off-CPU ns (0: an on-CPU sample); empty when the block
    /// holds no wait.
    pub off_cpu_ns: Vec<u64>,
}

/// ns between samples at `freq_hz` (1 when unknown): what time deltas are
/// counted in.
fn period_of(freq_hz: u64) -> u64 {
    1_000_000_000u64.checked_div(freq_hz).unwrap_or(1).max(1)
}

/// What a block says of the window its rows came from.
#[derive(Debug, Clone, Copy)]
pub struct WindowInfo<'a> {
    /// Host the samples were taken on (as sent).
    pub host: &'a str,
    /// The window the sender declared, `[start, end)` ns since the Unix epoch.
    pub window: (u64, u64),
    /// The sender's sampling frequency per CPU, Hz (0: unknown).
    pub freq_hz: u64,
    /// Whether the sender recorded off-CPU waits (`--off-cpu`).
    pub off_cpu: bool,
}

/// Encode `rows` (at least one, any order; reordered here) of the window
/// `info` as a block file's bytes.
pub fn encode(info: WindowInfo<'_>, rows: &mut [Row]) -> Result<Vec<u8>> {
    ensure!(!rows.is_empty(), "an empty block");
    let coded = columns::code(rows, period_of(info.freq_hz));
    let mut packed = Vec::with_capacity(COLUMNS);
    for column in &coded.columns {
        packed.push(if column.is_empty() {
            Vec::new()
        } else {
            zstd::bulk::compress(column, ZSTD_LEVEL).context("compressing a column")?
        });
    }
    let header = BlockHeader {
        host: info.host.to_string(),
        window_start: info.window.0,
        window_end: info.window.1,
        first_time: coded.first_time,
        last_time: coded.last_time,
        samples: rows.len() as u64,
        thread_ids: coded.thread_ids,
        thread_counts: coded.thread_counts,
        packed_lens: packed.iter().map(|c| c.len() as u32).collect(),
        raw_lens: coded.columns.iter().map(|c| c.len() as u32).collect(),
        sample_freq_hz: info.freq_hz,
        thread_waits: coded.thread_waits,
        off_cpu: info.off_cpu,
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

/// Columns of the block whose file starts with `bytes` (checked by
/// [`header_span`]): [`COLUMNS_V1`] for version 1, else [`COLUMNS`].
fn columns_of(bytes: &[u8]) -> usize {
    if bytes.starts_with(MAGIC_V1) {
        COLUMNS_V1
    } else {
        COLUMNS
    }
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
    let columns = columns_of(bytes);
    let waits = &header.thread_waits;
    ensure!(
        header.packed_lens.len() == columns
            && header.raw_lens.len() == columns
            && header.thread_counts.len() == header.thread_ids.len()
            && (waits.is_empty() || waits.len() == header.thread_ids.len())
            && waits.iter().zip(&header.thread_counts).all(|(w, c)| w <= c)
            && header.samples > 0
            && header.samples <= MAX_BLOCK_SAMPLES as u64
            && header.first_time <= header.last_time
            && header.thread_counts.iter().sum::<u64>() == header.samples,
        "the header is inconsistent"
    );
    Ok((header, end))
}

/// Bytes from the start of a block file to the end of its header's CRC,
/// from its first 12 bytes. Errors: not a block file (of version 1 or 2).
pub fn header_span(bytes: &[u8]) -> Result<usize> {
    ensure!(
        bytes.len() >= 12 && (bytes.starts_with(MAGIC) || bytes.starts_with(MAGIC_V1)),
        "not a block file of a version this collector reads (LSWBLK01 or LSWBLK02)"
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
        let bytes = if packed == 0 {
            Vec::new()
        } else {
            zstd::bulk::decompress(column, len as usize)
                .with_context(|| format!("column {i} does not decompress"))?
        };
        ensure!(
            bytes.len() == len as usize,
            "column {i} has the wrong length"
        );
        raw.push(bytes);
    }
    // A version-1 block has no off-CPU column: it holds no wait.
    raw.resize(COLUMNS, Vec::new());
    let runs = Runs {
        thread_ids: &header.thread_ids,
        thread_counts: &header.thread_counts,
        thread_waits: &header.thread_waits,
    };
    let rows = columns::decode(
        &raw,
        runs,
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
        off_cpu_ns: rows.off_cpu_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1000 rows over 3 threads and 7 stacks; every `waits_every`-th an
    /// off-CPU wait (0: none).
    fn rows(waits_every: u64) -> Vec<Row> {
        (0..1000u64)
            .map(|i| Row {
                time: 1_700_000_000_000_000_000 + i * 50_017,
                stack: (i % 7) as u32 * 1000,
                thread: (i % 3) as u32 + 5,
                off_cpu_ns: match waits_every {
                    0 => 0,
                    n if i % n == 0 => 1_000 + i * 977,
                    _ => 0,
                },
            })
            .collect()
    }

    fn info(off_cpu: bool) -> WindowInfo<'static> {
        WindowInfo {
            host: "h",
            window: (1, 2),
            freq_hz: 20_000,
            off_cpu,
        }
    }

    /// The rows of `d`, sorted.
    fn rows_of(d: &Decoded) -> Vec<Row> {
        let mut back: Vec<Row> = (0..d.times.len())
            .map(|i| Row {
                time: d.times[i],
                stack: d.stacks[i],
                thread: d.threads[i],
                off_cpu_ns: d.off_cpu_ns.get(i).copied().unwrap_or(0),
            })
            .collect();
        back.sort();
        back
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let rows = rows(0);
        let bytes = encode(info(false), &mut rows.clone()).unwrap();
        let d = decode(&bytes).unwrap();
        assert_eq!(d.header.host, "h");
        assert_eq!(d.header.thread_counts, vec![334, 333, 333]);
        assert!(d.header.thread_waits.is_empty() && d.off_cpu_ns.is_empty());
        assert_eq!(*d.header.packed_lens.last().unwrap(), 0, "no off-CPU bytes");
        assert_eq!(rows_of(&d), rows);
        for cut in [0, 5, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut flipped = bytes.clone();
        let at = flipped.len() - 10;
        flipped[at] ^= 1;
        assert!(decode(&flipped).is_err());
    }

    #[test]
    fn off_cpu_waits_round_trip_with_their_counts_per_thread() {
        let rows = rows(10);
        let bytes = encode(info(true), &mut rows.clone()).unwrap();
        let d = decode(&bytes).unwrap();
        assert!(d.header.off_cpu);
        // Rows 0, 10, 20, ...: i % 3 gives the thread.
        assert_eq!(d.header.thread_waits, vec![34, 33, 33]);
        assert_eq!(
            d.header.thread_samples().collect::<Vec<_>>(),
            [300, 300, 300]
        );
        assert_eq!(rows_of(&d), rows);
    }

    #[test]
    fn version_1_blocks_are_read_as_blocks_without_waits() {
        let rows = rows(0);
        let bytes = encode(info(false), &mut rows.clone()).unwrap();
        // The same block as version 1 wrote it: five columns, the old magic.
        let (mut header, start) = decode_header(&bytes).unwrap();
        header.packed_lens.pop();
        header.raw_lens.pop();
        let header_bytes = header.encode_to_vec();
        let mut v1 = MAGIC_V1.to_vec();
        v1.extend_from_slice(&(header_bytes.len() as u32).to_le_bytes());
        v1.extend_from_slice(&header_bytes);
        v1.extend_from_slice(&crc32fast::hash(&header_bytes).to_le_bytes());
        v1.extend_from_slice(&bytes[start..]);
        let d = decode(&v1).unwrap();
        assert_eq!(rows_of(&d), rows);
        // Without waits, version 2 costs two header bytes per block (the
        // off-CPU column's two lengths, 0), nothing per sample.
        assert_eq!(bytes.len() - v1.len(), 2);
        let mut other = v1.clone();
        other[7] = b'9';
        let e = decode(&other).unwrap_err().to_string();
        assert!(e.contains("LSWBLK01 or LSWBLK02"), "{e}");
    }
}
