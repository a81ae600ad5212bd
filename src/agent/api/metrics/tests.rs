//! Tests of [`super`] (`metrics.rs`).

use super::families::render_debuginfod;
use super::*;
use crate::symbolize::debuginfod::DebuginfodStats;

#[test]
fn renders_every_family_with_help_type_and_values() {
    let m = Metrics::default();
    m.sample(UnwindStatus::Complete);
    m.sample(UnwindStatus::Complete);
    m.sample(UnwindStatus::NoTable);
    m.set_lost(4);
    m.set_tracker(3, 40, 7);
    m.set_bpf_variant("compat");
    m.profile_request("served");
    m.set_deferred(DeferredStats {
        held: 3,
        finished: 2,
        no_room: 1,
        ..DeferredStats::default()
    });
    let heap = HeapStats {
        allocated: 10,
        active: 20,
        metadata: 3,
        resident: 30,
        retained: 40,
    };
    let text = m.render(Some(4096), Some(heap));
    assert!(text.contains("lightswitch_heap_bytes{kind=\"allocated\"} 10\n"));
    assert!(text.contains("lightswitch_heap_bytes{kind=\"resident\"} 30\n"));
    assert!(
        text.contains("# TYPE lightswitch_samples_total counter\nlightswitch_samples_total 3\n")
    );
    assert!(text.contains("lightswitch_samples_lost_total 4\n"));
    assert!(text.contains("lightswitch_bpf_program_variant{variant=\"compat\"} 1\n"));
    assert!(text.contains("lightswitch_tracker_entries{kind=\"mappings\"} 40\n"));
    assert!(text.contains("lightswitch_tracker_entries{kind=\"objects\"} 7\n"));
    assert!(text.contains("lightswitch_unwind_results_total{result=\"complete\"} 2\n"));
    assert!(text.contains("lightswitch_unwind_results_total{result=\"no_table\"} 1\n"));
    assert!(text.contains("lightswitch_profile_requests_total{outcome=\"served\"} 1\n"));
    assert!(text.contains("lightswitch_stack_copy_walks_total{outcome=\"walked_on\"} 2\n"));
    assert!(text.contains("lightswitch_stack_copy_walks_total{outcome=\"not_held\"} 1\n"));
    assert!(text.contains("process_resident_memory_bytes 4096\n"));
    assert!(text.contains("# TYPE lightswitch_jit_files_total counter\n"));
    assert!(text.contains("lightswitch_jit_files_total{kind=\"records_skipped\"} "));
    assert!(text.contains("lightswitch_jit_file_bytes_unread_total "));
    assert!(!text.contains("lightswitch_sender_"));
    assert!(resident_memory_bytes().is_some_and(|b| b > 0));
}

#[test]
fn renders_debuginfod_counts_only_when_a_server_is_set() {
    let mut text = String::new();
    render_debuginfod(&mut text, None);
    assert_eq!(text, "");
    let stats = DebuginfodStats {
        fetched: 1,
        timed_out: 2,
        too_large: 3,
        skipped: 4,
        cancelled: 5,
        ..DebuginfodStats::default()
    };
    render_debuginfod(&mut text, Some(stats));
    assert!(text.contains("# TYPE lightswitch_debuginfod_total counter\n"));
    assert!(text.contains("lightswitch_debuginfod_total{outcome=\"fetched\"} 1\n"));
    assert!(text.contains("lightswitch_debuginfod_total{outcome=\"timed_out\"} 2\n"));
    assert!(text.contains("lightswitch_debuginfod_total{outcome=\"too_large\"} 3\n"));
    assert!(text.contains("lightswitch_debuginfod_total{outcome=\"skipped\"} 4\n"));
    assert!(text.contains("lightswitch_debuginfod_total{outcome=\"cancelled\"} 5\n"));
    assert!(text.contains("lightswitch_debuginfod_total{outcome=\"failed\"} 0\n"));
}
