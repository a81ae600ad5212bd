//! Tests of the tracker against this test process's own maps.

use super::*;

#[test]
fn finds_own_code_mapping_and_object() {
    let mut tracker = ProcessTracker::new();
    let pid = std::process::id();
    let addr = finds_own_code_mapping_and_object as *const () as usize as u64;
    let id = tracker
        .find_mapping(pid, 0, addr)
        .expect("own code is mapped");
    let mapping = tracker.mapping(id).expect("held").clone();
    assert!(mapping.start <= addr && addr < mapping.end);
    let object = tracker
        .object(mapping.object.expect("test binary is a file"))
        .expect("held");
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    assert_eq!(object.path, exe.to_string_lossy());
    assert!(object.open_path.exists());
    // Our own function's vaddr, through the load bias, is in the symbol table.
    let vaddr = addr.wrapping_sub(tracker.load_bias(id).expect("held"));
    assert!(vaddr < addr, "a PIE test binary is loaded above its vaddrs");
    assert!(!object.load_segments.is_empty());
    assert_eq!(tracker.process_count(), 1);
}

#[test]
fn exited_processes_are_retired_only_after_the_promise_point() {
    let mut tracker = ProcessTracker::new();
    let pid = std::process::id();
    let addr =
        exited_processes_are_retired_only_after_the_promise_point as *const () as usize as u64;
    let id = tracker
        .find_mapping(pid, 500, addr)
        .expect("own code is mapped");
    let held = tracker.mapping_count();
    assert!(held > 0);
    // Not exited: nothing goes.
    assert_eq!(tracker.retire_exited(u64::MAX), 0);
    // An exec of the same image keeps the ids that are mapped again.
    let before_exec = tracker.process_mappings(pid).to_vec();
    tracker.process_exec(pid, 600);
    assert_eq!(tracker.find_mapping(pid, 700, addr), Some(id));
    assert_eq!(tracker.retire_exited(u64::MAX), 0);
    assert_eq!(tracker.process_mappings(pid), &before_exec[..]);
    assert_eq!(tracker.mapping_count(), held);
    tracker.process_exited(pid, 1_000);
    // A sample taken before the exit, drained after it, still resolves.
    assert_eq!(tracker.find_mapping(pid, 900, addr), Some(id));
    // Windows open since before the exit may still refer to it.
    assert_eq!(tracker.retire_exited(1_000), 0);
    assert_eq!(tracker.mapping(id).map(|m| m.pid), Some(pid));
    assert_eq!(tracker.retire_exited(1_001), 1);
    assert_eq!(tracker.mapping_count(), 0);
    assert_eq!(tracker.mapping(id), None);
    assert_eq!(tracker.process_count(), 0);
    // A later sample of the same pid reads its maps afresh, with new ids.
    let again = tracker.find_mapping(pid, 2_000, addr).expect("read again");
    assert_ne!(again, id);
    assert_eq!(tracker.mapping_count(), held);
}

#[test]
fn unknown_address_and_missing_process_are_none() {
    let mut tracker = ProcessTracker::new();
    assert_eq!(tracker.find_mapping(std::process::id(), 0, 8), None);
    assert_eq!(tracker.find_mapping(u32::MAX - 1, 0, 0x400000), None);
    assert_eq!(tracker.stats().maps_unreadable, 1);
}
