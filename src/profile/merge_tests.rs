//! Tests of [`super`] (`collector/merge.rs`).

use super::*;
use crate::profile::format::folded;
use crate::profile::format::pprof::{encode, to_proto, Compression};

/// The folded tests' profile, with its kernel frames in a kernel mapping
/// (as the symbolizer makes them).
fn sample_profile() -> Profile {
    let mut p = folded::tests::sample_profile();
    p.mappings.push(ProfileMapping {
        start: 0xffff_0000,
        limit: 0xffff_1000,
        file_offset: 0,
        filename: KERNEL_MAPPING_NAME.into(),
        build_id: Some("abcd".into()),
    });
    for f in &mut p.frames {
        if f.kind == FrameKind::Kernel {
            f.mapping = Some(0);
        }
    }
    p
}

#[test]
fn pprof_round_trips_through_the_model() {
    let original = sample_profile();
    let back = profile_from_pprof(&to_proto(&original));
    assert_eq!(folded::encode(&back), folded::encode(&original));
    assert_eq!(back.total_samples(), original.total_samples());
    assert_eq!(back.sample_freq_hz, original.sample_freq_hz);
    assert_eq!(back.start_unix_ns, original.start_unix_ns);
}

#[test]
fn merging_adds_counts_and_spans_the_windows() {
    let mut a = sample_profile();
    a.start_unix_ns = 1_000;
    a.duration_ns = 100;
    let mut b = sample_profile();
    b.start_unix_ns = 1_100;
    b.duration_ns = 100;
    let total = a.total_samples() + b.total_samples();
    let merged = merge([a.clone(), b].map(|p| profile_from_pprof(&to_proto(&p))));
    assert_eq!(merged.inputs, 2);
    assert!(!merged.mixed_frequencies);
    assert_eq!(merged.profile.total_samples(), total);
    assert_eq!(merged.profile.start_unix_ns, 1_000);
    assert_eq!(merged.profile.duration_ns, 200);
    // Same stacks: no more distinct samples or frames than one input.
    assert_eq!(merged.profile.samples.len(), a.samples.len());
    assert_eq!(merged.profile.frames.len(), a.frames.len());
    let doubled: Vec<String> = folded::folded_stacks(&a)
        .into_iter()
        .map(|(k, v)| format!("{k} {}", 2 * v))
        .collect();
    let got: Vec<String> = folded::folded_stacks(&merged.profile)
        .into_iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    assert_eq!(got, doubled);
}

#[test]
fn bodies_are_decoded_raw_or_gzip_and_garbage_is_refused() {
    let p = sample_profile();
    let raw = encode(&p, Compression::None).unwrap();
    let gz = encode(&p, Compression::Gzip).unwrap();
    assert!(decode_body(&raw, 1 << 20).is_ok());
    let (decoded, bytes) = decode_body(&gz, 1 << 20).unwrap();
    assert_eq!(bytes, raw);
    assert_eq!(decoded.sample.len(), p.samples.len());
    for garbage in [
        &b"hello, world"[..],
        b"",
        &[0x1f, 0x8b, 1, 2, 3],
        &[0x0a, 0x02, 0x08],
    ] {
        assert!(
            matches!(decode_body(garbage, 1 << 20), Err(BodyError::Malformed(_))),
            "{garbage:?}"
        );
    }
    assert!(matches!(decode_body(&gz, 16), Err(BodyError::TooLarge(_))));
}

#[test]
fn counts_that_could_overflow_a_merge_are_refused() {
    let mut proto = to_proto(&sample_profile());
    for s in &mut proto.sample {
        s.value = vec![i64::MAX; s.value.len()];
    }
    let error = validate(&proto).expect_err("i64::MAX counts");
    assert!(error.contains("add up to more than"), "{error}");
    // Only counts are limited: nanoseconds of CPU may add up to more.
    for s in &mut proto.sample {
        s.value = vec![1 << 30, 1 << 41];
    }
    validate(&proto).expect("2^30 per sample");
    let p = profile_from_pprof(&proto);
    // The largest totals a valid input may have merge without overflow.
    let merged = merge(std::iter::repeat_n(p, 3));
    assert_eq!(
        merged.profile.total_samples(),
        3 * (1 << 30) * proto.sample.len() as u64
    );
}
