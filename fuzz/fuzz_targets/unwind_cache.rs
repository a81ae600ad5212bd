//! The unwind-cache decoder (`unwind::cache::decode`): cache files sit in a
//! directory on disk and are read back by every later run, so a damaged or
//! planted file must be refused, never crash the agent. Each input is tried
//! as given (magic, version, length and checksum checks) and "resealed",
//! its last 4 bytes replaced by the CRC-32 of the rest, so that mutations
//! get past the checksum to the field checks and the table's own
//! validation. The key checked against is the one the file names (as
//! `buildid-<hex>` or `xxh3-<hex>`), so real cache entries are valid seeds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lightswitch::unwind::{cache, ObjectKey};

/// Offset of the key length byte, then the key (see `src/unwind/cache.rs`).
const KEY_LEN_OFFSET: usize = 33;

fuzz_target!(|data: &[u8]| {
    let key = key_named_in(data);
    check(&key, data);
    if data.len() >= 4 {
        let mut sealed = data.to_vec();
        let body = sealed.len() - 4;
        let crc = crc32fast::hash(&sealed[..body]);
        sealed[body..].copy_from_slice(&crc.to_le_bytes());
        check(&key, &sealed);
    }
});

/// A file the decoder accepts encodes back to the same bytes, and every
/// row of the table is found by lookup.
fn check(key: &ObjectKey, bytes: &[u8]) {
    if let Ok(table) = cache::decode(key, bytes) {
        assert_eq!(
            cache::encode(key, &table),
            bytes,
            "accepted entry does not round-trip"
        );
        for row in table.iter_rows() {
            assert_eq!(table.lookup(row.start), row.rule);
        }
    }
}

/// The key the entry claims to be for, else a fixed one.
fn key_named_in(data: &[u8]) -> ObjectKey {
    let named = data.get(KEY_LEN_OFFSET).and_then(|&len| {
        let text = data.get(KEY_LEN_OFFSET + 1..KEY_LEN_OFFSET + 1 + usize::from(len))?;
        let text = std::str::from_utf8(text).ok()?;
        if let Some(hex) = text.strip_prefix("buildid-") {
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()?;
            Some(ObjectKey::BuildId(bytes))
        } else {
            let hex = text.strip_prefix("xxh3-")?;
            Some(ObjectKey::ContentHash(u128::from_str_radix(hex, 16).ok()?))
        }
    });
    named.unwrap_or(ObjectKey::BuildId(vec![0xde, 0xad, 0xbe, 0xef]))
}
