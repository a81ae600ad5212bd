//! The perf-map reader (`symbolize::perf_map::PerfMap`): a perf map is
//! written by any local user's process and read by the root profiler. The
//! input's first byte chooses where it is cut into up to three appends to
//! a file, each followed by a read (a map growing while it is read), and
//! whether the file is then truncated and read again (a map replaced by a
//! shorter one). Every name the reader keeps is within its bound, and it
//! never consumes more than the file holds.
#![no_main]

use std::io::Write;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use lightswitch::process::untrusted::{CUT_MARKER, MAX_NAME_BYTES};
use lightswitch::symbolize::jit_perf_map::PerfMap;

fuzz_target!(|data: &[u8]| {
    let Some((&plan, text)) = data.split_first() else {
        return;
    };
    let mut file = tempfile::tempfile().expect("a temporary file");
    let cuts = [
        text.len() * usize::from(plan & 0x7) / 8,
        text.len() * usize::from((plan >> 3) & 0x7) / 8,
    ];
    let (first, second) = (cuts[0].min(cuts[1]), cuts[0].max(cuts[1]));
    let mut map = PerfMap::default();
    let mut written = 0;
    for piece in [&text[..first], &text[first..second], &text[second..]] {
        file.write_all(piece).expect("write");
        written += piece.len() as u64;
        read(&mut map, &file, written, text);
    }
    if plan & 0x40 != 0 {
        let shorter = written / 2;
        file.set_len(shorter).expect("truncate");
        read(&mut map, &file, shorter, text);
    }
});

fn read(map: &mut PerfMap, file: &std::fs::File, len: u64, text: &[u8]) {
    map.read_more(file, Instant::now() + Duration::from_secs(5))
        .expect("a regular file reads");
    assert!(map.consumed() <= len, "consumed past the end");
    // Look up every address a line of the input names.
    for line in text.split(|&b| b == b'\n') {
        let start = std::str::from_utf8(line)
            .ok()
            .and_then(|l| l.split(' ').next())
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
        if let Some(name) = start.and_then(|a| map.name_of(a)) {
            assert!(
                name.len() <= MAX_NAME_BYTES + CUT_MARKER.len(),
                "a name of {}",
                name.len()
            );
            assert!(!name.is_empty());
        }
    }
}
