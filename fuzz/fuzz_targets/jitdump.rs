//! The jitdump cursor (`process::jit::JitdumpCursor`): a jitdump file is
//! written by any local user's process and read by the root profiler as it
//! grows. The input (after a valid file header, so that mutations reach the
//! records) is appended to a file in up to three pieces chosen by its first
//! byte, each followed by a read; the file may then shrink and be read
//! again. The cursor never hands out a record larger than its budget, never
//! consumes past the file's end, and hands out each byte at most once.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use lightswitch::process::jit::{JitdumpCursor, JitdumpRecord, MAX_RECORD_BYTES};

/// A jitdump file header (x86-64, version 1, 40 bytes).
fn header() -> Vec<u8> {
    let mut h = Vec::new();
    for v in [0x4A69_5444u32, 1, 40, 62, 0, 1] {
        h.extend_from_slice(&v.to_ne_bytes());
    }
    h.extend_from_slice(&[0; 16]);
    h
}

fuzz_target!(|data: &[u8]| {
    let Some((&plan, body)) = data.split_first() else {
        return;
    };
    let bytes = if plan & 0x80 != 0 {
        body.to_vec()
    } else {
        [header(), body.to_vec()].concat()
    };
    let mut file = tempfile::tempfile().expect("a temporary file");
    let cuts = [
        bytes.len() * usize::from(plan & 0x7) / 8,
        bytes.len() * usize::from((plan >> 3) & 0x7) / 8,
    ];
    let (first, second) = (cuts[0].min(cuts[1]), cuts[0].max(cuts[1]));
    let mut cursor = JitdumpCursor::default();
    let (mut written, mut handed_out) = (0u64, 0u64);
    for piece in [&bytes[..first], &bytes[first..second], &bytes[second..]] {
        file.write_all(piece).expect("write");
        written += piece.len() as u64;
        let _ = cursor.read_new(&file, |record| {
            if let JitdumpRecord::Record { body, .. } = record {
                assert!(
                    body.len() as u64 + 16 <= MAX_RECORD_BYTES,
                    "an oversized record"
                );
                handed_out += body.len() as u64 + 16;
            }
        });
        assert!(cursor.consumed() <= written, "consumed past the end");
        assert!(handed_out <= written, "a byte handed out twice");
    }
    if plan & 0x40 != 0 {
        file.set_len(written / 2).expect("truncate");
        let _ = cursor.read_new(&file, |_| {});
        assert!(
            cursor.consumed() <= written / 2,
            "consumed past the shrunk end"
        );
    }
});
