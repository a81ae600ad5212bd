//! Disk cache of built tables, one file per object identity
//! (`<dir>/<ObjectKey>.unwind`), so an object's CFI is evaluated once per
//! machine rather than once per run.
//!
//! File format (all integers little-endian; `docs/unwind-tables.md`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `LSUNWIND` |
//! | 8 | 4 | format version ([`FORMAT_VERSION`]) |
//! | 12 | 4 | row count R |
//! | 16 | 4 | page count P |
//! | 20 | 4 | unsupported-kind count U |
//! | 24 | 8 | FDE count |
//! | 32 | 1 | source: 1 `.eh_frame`, 2 `.debug_frame` |
//! | 33 | 1 | key length K |
//! | 34 | K | key ([`ObjectKey`] as text) |
//! | 34+K | 8R | rows: pc_low u16, cfa_type u8, fp_type u8, cfa_offset u16, fp_offset i16 |
//! | .. | 12P | pages: page u32, first_row u32, row_count u32 |
//! | .. | 12U | unsupported: kind u32, count u64 (ascending kinds, each once) |
//! | end-4 | 4 | CRC-32 (IEEE) of everything before it |
//!
//! A file that fails any check is reported as a [`CacheError`];
//! [`get_or_build`] then rebuilds the table and replaces the file. Files are
//! written to a temporary file in the same directory and renamed into place,
//! so readers never see a partial file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use tracing::{debug, warn};

use super::identity::ObjectKey;
use super::rule::UnsupportedKind;
use super::table::{CfiSource, TableStats, UnwindTable};
use crate::sampling::unwind_row::{Page, RawRow};

/// First bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"LSUNWIND";
/// Version of the file format; bump on any change to the layout or to the
/// meaning of rows (files of another version are rebuilt). 3: rows of
/// [`super::rule::Rule::ReturnInRegister`], which version 2 stored as
/// unsupported; 4: an entry point without CFI is the outermost frame
/// (the dynamic loader's), which version 3 left without a rule; 5: the
/// byte before a `makecontext` trampoline is the outermost frame; 6: rows
/// carry the rbx rule and rbx-based CFAs ([`super::rule::Rule::RbxOffset`]),
/// which version 5 stored as unsupported.
pub const FORMAT_VERSION: u32 = 6;
/// Longest key text stored (file names are at most 255 bytes with `.unwind`).
const MAX_KEY_LEN: usize = 248;
/// Size of the fixed header before the key, bytes.
const HEADER_LEN: usize = 34;

/// Why a cache entry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// No entry for the key.
    #[error("no cache entry")]
    Missing,
    /// The entry could not be read.
    #[error("cannot read cache entry: {0}")]
    Io(#[from] std::io::Error),
    /// Not a cache file.
    #[error("bad magic")]
    BadMagic,
    /// Written by another format version.
    #[error("format version {found}, expected {FORMAT_VERSION}")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// The file's length does not match its header.
    #[error("length {found} bytes, header implies {expected}")]
    Length {
        /// Actual file length.
        found: usize,
        /// Length the header describes.
        expected: usize,
    },
    /// The checksum does not match the contents.
    #[error("checksum mismatch")]
    Checksum,
    /// The entry is for another object.
    #[error("entry is for {0}")]
    KeyMismatch(String),
    /// The contents are not a valid table.
    #[error("invalid contents: {0}")]
    Invalid(String),
}

/// What [`get_or_build`] did.
#[derive(Debug)]
pub enum CacheOutcome {
    /// The table came from the cache.
    Hit,
    /// No entry existed; the table was built (and stored when `stored`).
    Built {
        /// Whether the new entry was written.
        stored: bool,
    },
    /// The entry was unusable; the table was rebuilt (and stored when `stored`).
    Rebuilt {
        /// Why the entry was unusable.
        reason: CacheError,
        /// Whether the replacement was written.
        stored: bool,
    },
}

/// Path of `key`'s entry in `cache_dir`.
pub fn entry_path(cache_dir: &Path, key: &ObjectKey) -> PathBuf {
    cache_dir.join(format!("{key}.unwind"))
}

/// The table for `key` from `cache_dir`, else `build()`'s table, which is
/// then written to the cache. A failure to write is logged, not returned:
/// the cache only saves time.
pub fn get_or_build<E>(
    cache_dir: &Path,
    key: &ObjectKey,
    build: impl FnOnce() -> Result<UnwindTable, E>,
) -> Result<(UnwindTable, CacheOutcome), E> {
    match load(cache_dir, key) {
        Ok(table) => Ok((table, CacheOutcome::Hit)),
        Err(reason) => build_and_store(cache_dir, key, reason, build),
    }
}

/// The second half of [`get_or_build`], for a caller that already tried
/// [`load`] and got `reason`: `build()`'s table, written to the cache as
/// `key`'s entry (a failure to write is logged, not returned).
pub fn build_and_store<E>(
    cache_dir: &Path,
    key: &ObjectKey,
    reason: CacheError,
    build: impl FnOnce() -> Result<UnwindTable, E>,
) -> Result<(UnwindTable, CacheOutcome), E> {
    let table = build()?;
    let stored = match store(cache_dir, key, &table) {
        Ok(()) => true,
        Err(e) => {
            // Once per run: an unusable directory fails for every object.
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                warn!(
                    "cannot write unwind cache entries in {} ({e}): tables are built but not cached (--unwind-cache-dir none silences this)",
                    cache_dir.display()
                );
            } else {
                debug!("cannot write unwind cache entry for {key}: {e}");
            }
            false
        }
    };
    let outcome = match reason {
        CacheError::Missing => CacheOutcome::Built { stored },
        reason => CacheOutcome::Rebuilt { reason, stored },
    };
    Ok((table, outcome))
}

/// Reads and verifies `key`'s entry.
pub fn load(cache_dir: &Path, key: &ObjectKey) -> Result<UnwindTable, CacheError> {
    match std::fs::read(entry_path(cache_dir, key)) {
        Ok(bytes) => decode(key, &bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CacheError::Missing),
        Err(e) => Err(CacheError::Io(e)),
    }
}

/// Writes `table` as `key`'s entry (creating `cache_dir`), atomically.
pub fn store(cache_dir: &Path, key: &ObjectKey, table: &UnwindTable) -> std::io::Result<()> {
    if key.to_string().len() > MAX_KEY_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("object key {key} is too long for a file name"),
        ));
    }
    std::fs::create_dir_all(cache_dir)?;
    let mut file = tempfile::NamedTempFile::new_in(cache_dir)?;
    file.write_all(&encode(key, table))?;
    file.as_file().sync_all()?;
    file.persist(entry_path(cache_dir, key))?;
    Ok(())
}

/// The file contents for `table` under `key` (the layout in the module
/// docs; keys longer than 248 bytes are refused by [`store`], not here).
pub fn encode(key: &ObjectKey, table: &UnwindTable) -> Vec<u8> {
    let key = key.to_string();
    let stats = table.stats();
    let (rows, pages) = (table.rows(), table.pages());
    let mut out = Vec::with_capacity(
        HEADER_LEN
            + key.len()
            + rows.len() * 8
            + pages.len() * 12
            + stats.unsupported.len() * 12
            + 4,
    );
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
    out.extend_from_slice(&(stats.unsupported.len() as u32).to_le_bytes());
    out.extend_from_slice(&stats.fdes.to_le_bytes());
    out.push(match stats.source {
        CfiSource::EhFrame => 1,
        CfiSource::DebugFrame => 2,
    });
    // `store` checked that the key fits a file name, hence a u8.
    out.push(key.len() as u8);
    out.extend_from_slice(key.as_bytes());
    for row in rows {
        out.extend_from_slice(&row.pc_low.to_le_bytes());
        out.push(row.cfa_type);
        out.push(row.fp_type);
        out.extend_from_slice(&row.cfa_offset.to_le_bytes());
        out.extend_from_slice(&row.fp_offset.to_le_bytes());
    }
    for page in pages {
        for v in [page.page, page.first_row, page.row_count] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for (kind, count) in &stats.unsupported {
        out.extend_from_slice(&u32::from(kind.code()).to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Little-endian field reader over a verified buffer.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().expect("split_at returned N bytes")
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

/// Parses and verifies a cache file's contents (`bytes`, the layout in the
/// module docs) for `key`: every check of [`load`] without the file system.
/// Errors name the first check that failed; no input panics (fuzzed by
/// `fuzz/fuzz_targets/unwind_cache.rs`).
pub fn decode(key: &ObjectKey, bytes: &[u8]) -> Result<UnwindTable, CacheError> {
    if bytes.len() < HEADER_LEN + 4 || bytes[..8] != MAGIC {
        return Err(CacheError::BadMagic);
    }
    let mut header = Fields(&bytes[8..HEADER_LEN]);
    let version = header.u32();
    if version != FORMAT_VERSION {
        return Err(CacheError::Version { found: version });
    }
    let (row_count, page_count, kind_count) = (header.u32(), header.u32(), header.u32());
    let fdes = header.u64();
    let [source, key_len] = header.take();
    let expected = [
        HEADER_LEN,
        usize::from(key_len),
        row_count as usize * 8,
        page_count as usize * 12,
        kind_count as usize * 12,
        4,
    ]
    .iter()
    .sum();
    if bytes.len() != expected {
        return Err(CacheError::Length {
            found: bytes.len(),
            expected,
        });
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32fast::hash(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err(CacheError::Checksum);
    }
    let mut f = Fields(&body[HEADER_LEN..]);
    let (stored_key, rest) = f.0.split_at(usize::from(key_len));
    f.0 = rest;
    if stored_key != key.to_string().as_bytes() {
        return Err(CacheError::KeyMismatch(
            String::from_utf8_lossy(stored_key).into(),
        ));
    }
    let source = match source {
        1 => CfiSource::EhFrame,
        2 => CfiSource::DebugFrame,
        other => return Err(CacheError::Invalid(format!("source {other}"))),
    };
    let rows = (0..row_count)
        .map(|_| RawRow {
            pc_low: f.u16(),
            cfa_type: f.u8(),
            fp_type: f.u8(),
            cfa_offset: f.u16(),
            fp_offset: f.u16() as i16,
        })
        .collect();
    let pages = (0..page_count)
        .map(|_| Page {
            page: f.u32(),
            first_row: f.u32(),
            row_count: f.u32(),
        })
        .collect();
    // `encode` writes the kinds in ascending order, each once: any other
    // order or a repeated kind is not a file we wrote.
    let mut unsupported = BTreeMap::new();
    for _ in 0..kind_count {
        let code = f.u32();
        let count = f.u64();
        let kind = u16::try_from(code)
            .ok()
            .and_then(UnsupportedKind::from_code)
            .ok_or_else(|| CacheError::Invalid(format!("unsupported kind {code}")))?;
        if unsupported
            .last_key_value()
            .is_some_and(|(last, _)| *last >= kind)
        {
            return Err(CacheError::Invalid(format!(
                "unsupported kind {code} out of order"
            )));
        }
        unsupported.insert(kind, count);
    }
    UnwindTable::from_parts(rows, pages, TableStats::from_cfi(fdes, unsupported, source))
        .map_err(|e| CacheError::Invalid(e.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::rule::{Bx, CfaOffset, Fp, Rule};

    fn sample() -> UnwindTable {
        let rsp = |off| Rule::RspOffset {
            cfa: CfaOffset::new(off).expect("fits"),
            fp: Fp::AtCfaOffset(-2),
            bx: Bx::Unchanged,
        };
        let rules = [
            (0x1_fff0, rsp(8)),
            (0x2_0004, rsp(102416)),
            (0x2_0100, Rule::Unsupported(UnsupportedKind::CfaExpression)),
            (0x2_0200, Rule::EndOfFunction),
        ];
        let unsupported = BTreeMap::from([
            (UnsupportedKind::CfaExpression, 1),
            (UnsupportedKind::RbpRule, 7),
        ]);
        UnwindTable::from_rules(&rules, 3, unsupported, CfiSource::DebugFrame).expect("valid")
    }

    fn key() -> ObjectKey {
        ObjectKey::BuildId(vec![0xde, 0xad, 0xbe, 0xef])
    }

    fn never_built() -> Result<UnwindTable, String> {
        Err("the cached entry should have been used".into())
    }

    #[test]
    fn round_trip_and_hit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("nested/unwind");
        let (table, outcome) =
            get_or_build(&cache, &key(), || Ok::<_, String>(sample())).expect("built");
        assert!(
            matches!(outcome, CacheOutcome::Built { stored: true }),
            "{outcome:?}"
        );
        assert_eq!(table, sample());
        assert!(entry_path(&cache, &key()).ends_with("buildid-deadbeef.unwind"));
        let (cached, outcome) = get_or_build(&cache, &key(), never_built).expect("hit");
        assert!(matches!(outcome, CacheOutcome::Hit), "{outcome:?}");
        assert_eq!(cached, sample());
        assert_eq!(cached.stats().unsupported, sample().stats().unsupported);
        assert_eq!(cached.stats().source, CfiSource::DebugFrame);
        assert_eq!(cached.stats().fdes, 3);
    }

    /// Stores the sample, applies `damage` to the file, and expects a rebuild
    /// for `expected` followed by a hit on the rewritten entry.
    fn rebuilt_after(damage: impl FnOnce(&mut Vec<u8>), expected: fn(&CacheError) -> bool) {
        let dir = tempfile::tempdir().expect("tempdir");
        store(dir.path(), &key(), &sample()).expect("store");
        let path = entry_path(dir.path(), &key());
        let mut bytes = std::fs::read(&path).expect("read");
        damage(&mut bytes);
        std::fs::write(&path, &bytes).expect("write");
        let (table, outcome) =
            get_or_build(dir.path(), &key(), || Ok::<_, String>(sample())).expect("rebuilt");
        assert_eq!(table, sample());
        match &outcome {
            CacheOutcome::Rebuilt {
                reason,
                stored: true,
            } if expected(reason) => {}
            other => panic!("unexpected outcome {other:?}"),
        }
        assert_eq!(load(dir.path(), &key()).expect("rewritten"), sample());
    }

    #[test]
    fn corrupt_byte_is_rebuilt() {
        rebuilt_after(
            |b| b[HEADER_LEN + 20] ^= 0x10,
            |e| matches!(e, CacheError::Checksum),
        );
    }

    #[test]
    fn wrong_version_is_rebuilt() {
        rebuilt_after(
            |b| b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes()),
            |e| matches!(e, CacheError::Version { found } if *found == FORMAT_VERSION + 1),
        );
    }

    #[test]
    fn truncated_or_foreign_files_are_rebuilt() {
        rebuilt_after(
            |b| b.truncate(b.len() - 9),
            |e| matches!(e, CacheError::Length { .. }),
        );
        rebuilt_after(|b| b.truncate(10), |e| matches!(e, CacheError::BadMagic));
        rebuilt_after(|b| b[0] = b'X', |e| matches!(e, CacheError::BadMagic));
        // A valid entry of another object under this key's name.
        let other = encode(&ObjectKey::ContentHash(42), &sample());
        rebuilt_after(|b| *b = other, |e| matches!(e, CacheError::KeyMismatch(_)));
    }

    /// Found by the fuzz smoke in CI: an entry whose unsupported kinds are
    /// out of order (or repeated) was accepted, and so was not the file
    /// `encode` would write for the table it decoded to.
    #[test]
    fn unsupported_kinds_out_of_order_or_repeated_are_refused() {
        let bytes = encode(&key(), &sample());
        let kinds_at = bytes.len() - 4 - 2 * 12;
        let reseal = |mut b: Vec<u8>| {
            let body = b.len() - 4;
            let crc = crc32fast::hash(&b[..body]);
            b[body..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut swapped = bytes.clone();
        swapped[kinds_at..kinds_at + 24].rotate_left(12);
        let mut repeated = bytes.clone();
        repeated.copy_within(kinds_at..kinds_at + 12, kinds_at + 12);
        for damaged in [swapped, repeated] {
            let err = decode(&key(), &reseal(damaged)).expect_err("refused");
            assert!(
                matches!(&err, CacheError::Invalid(why) if why.contains("out of order")),
                "{err:?}"
            );
        }
        assert_eq!(decode(&key(), &bytes).expect("the original"), sample());
    }

    #[test]
    fn unwritable_cache_still_returns_the_table() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"x").expect("write");
        let (table, outcome) =
            get_or_build(&not_a_dir, &key(), || Ok::<_, String>(sample())).expect("built");
        assert_eq!(table, sample());
        assert!(
            matches!(outcome, CacheOutcome::Rebuilt { stored: false, .. }),
            "{outcome:?}"
        );
        let err =
            get_or_build(dir.path(), &key(), never_built).expect_err("build error passes through");
        assert!(err.contains("cached entry"));
    }
}
