//! Which parsed objects a continuous [`super::Symbolizer`] keeps when
//! their measured cost is only known once they are symbolized.

use std::sync::atomic::{AtomicI64, Ordering};

use super::tests::{address_in, kept_objects};
use super::*;
use crate::sampling::records::RawSample;

/// Symbolize one window of one stack through libc, ld.so and this test
/// binary with `symbolizer`; the paths of the objects it keeps parsed.
fn kept_after_one_window(symbolizer: &Symbolizer) -> Vec<String> {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let exe = exe.to_string_lossy().into_owned();
    let stack = vec![
        address_in(|p| p.contains("/libc.so"), 4),
        address_in(|p| p.contains("/ld-linux"), 4),
        address_in(|p| p == exe, 4),
    ];
    let mut tracker = crate::process::ProcessTracker::new();
    let mut aggregator = Aggregator::new();
    aggregator.add(
        &RawSample::for_test(std::process::id(), 0, stack),
        &mut tracker,
    );
    let window = Window {
        start_unix_ns: 0,
        duration_ns: 1_000_000_000,
        sample_freq_hz: 99,
        off_cpu: false,
    };
    let profile = symbolizer.build_profile(&aggregator, &tracker, window);
    assert_eq!(profile.samples.len(), 1);
    kept_objects(symbolizer, &tracker)
}

/// Objects first seen are chosen by file size; the heap their parsing
/// took, measured right after, decides whether they stay. Each parse here
/// "takes" 9 MiB (a fake meter), more than [`KEPT_OBJECT_MAX_BYTES`]: libc
/// and ld.so, small files, are dropped within the window, not kept for
/// the next ones.
#[test]
fn an_object_measured_too_costly_is_dropped_in_its_first_window() {
    fn nine_mib_a_parse() -> Option<i64> {
        static NET: AtomicI64 = AtomicI64::new(0);
        Some(NET.fetch_add(9 << 20, Ordering::Relaxed))
    }
    const { assert!(9 << 20 > KEPT_OBJECT_MAX_BYTES) };
    let mut symbolizer = Symbolizer::new();
    symbolizer.objects.heap_meter = nine_mib_a_parse;
    assert_eq!(kept_after_one_window(&symbolizer), Vec::<String>::new());
}

/// The same with 1 MiB a parse: libc and ld.so fit, and stay.
#[test]
fn objects_measured_within_the_budget_stay() {
    fn one_mib_a_parse() -> Option<i64> {
        static NET: AtomicI64 = AtomicI64::new(0);
        Some(NET.fetch_add(1 << 20, Ordering::Relaxed))
    }
    let mut symbolizer = Symbolizer::new();
    symbolizer.objects.heap_meter = one_mib_a_parse;
    let kept = kept_after_one_window(&symbolizer);
    assert!(kept.iter().any(|p| p.contains("/libc.so")), "{kept:?}");
    assert!(kept.iter().any(|p| p.contains("/ld-linux")), "{kept:?}");
}
