//! The timeline reader of `report` and `diff`
//! (`compare::timeline::parse_timeline`, Firefox Profiler JSON): any JSON
//! must give a profile or an error naming what is wrong, never a panic.
//! An accepted profile is consistent (every timed sample names a sample,
//! every sample's frames exist, one timed sample per count), its counts
//! add up per function, and `report --from/--to` (`slice`) keeps exactly
//! the timed samples of its span.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lightswitch::commands::compare::{function_table, report, timeline};

fuzz_target!(|data: &[u8]| {
    let Ok(profile) = timeline::parse_timeline(data) else {
        return;
    };
    assert_eq!(profile.timeline.len() as u64, profile.total_samples());
    for timed in &profile.timeline {
        assert!((timed.sample as usize) < profile.samples.len());
    }
    for sample in &profile.samples {
        assert!(sample.frames.iter().all(|&f| f < profile.frames.len()));
    }
    for frame in &profile.frames {
        assert!(frame.mapping.is_none_or(|m| m < profile.mappings.len()));
    }
    let table = function_table(&profile, false).expect("counts fit");
    report::render_top(&profile, &table, 0);
    // The first half of its span, as `report --from 0 --to HALF` cuts it.
    let half = (profile.duration_ns / 2).min(i64::MAX as u64) as i64;
    let cut = lightswitch::profile::slice::slice(&profile, 0, half);
    let inside = profile
        .timeline
        .iter()
        .filter(|t| {
            // TimedSample is packed: copy the field out.
            let offset = t.offset_ns;
            (0..half).contains(&offset)
        })
        .count();
    assert_eq!(cut.timeline.len(), inside);
    assert_eq!(cut.total_samples(), inside as u64);
});
