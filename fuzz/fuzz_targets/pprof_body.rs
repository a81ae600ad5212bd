//! The collector's reading of a request body (`POST /v1/profiles`): gzip or
//! raw pprof, decoded and validated (`collector::merge::decode_body`), then
//! converted, merged and encoded the way `GET /v1/profiles/merged` treats a
//! stored profile. Any panic is a bug: the collector must answer 400/413.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lightswitch::profile::format::{folded, pprof};
use lightswitch::profile::merge;

/// Decoded-size bound: small, so that the bound's own path is reached.
const MAX_DECODED_BYTES: usize = 1 << 20;

fuzz_target!(|body: &[u8]| {
    let Ok((proto, raw)) = merge::decode_body(body, MAX_DECODED_BYTES) else {
        return;
    };
    assert!(raw.len() <= MAX_DECODED_BYTES);
    let profile = merge::profile_from_pprof(&proto);
    // One input: what the merge answers with is a pprof that validates again.
    let single = merge::merge([profile.clone()]);
    merge::validate(&pprof::to_proto(&single.profile)).expect("merged pprof is consistent");
    // Two inputs: counts add up (beyond one body's value limit, so the
    // value-total rule of `validate` no longer applies) and still encode.
    let merged = merge::merge([profile.clone(), profile]);
    assert_eq!(merged.inputs, 2);
    assert_eq!(
        merged.profile.total_samples(),
        2 * single.profile.total_samples()
    );
    let _ = pprof::to_proto(&merged.profile);
    let _ = folded::encode(&merged.profile);
});
