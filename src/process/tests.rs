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
    // A sample taken before the exit, drained after it, still resolves;
    // so does one from the exit path, shortly after the exit was noticed.
    assert_eq!(tracker.find_mapping(pid, 900, addr), Some(id));
    assert_eq!(
        tracker.find_mapping(pid, 1_000 + EXIT_GRACE_NS, addr),
        Some(id)
    );
    // Windows open since before the exit (and its grace) may still refer to it.
    assert_eq!(tracker.retire_exited(1_000 + EXIT_GRACE_NS), 0);
    assert_eq!(tracker.mapping(id).map(|m| m.pid), Some(pid));
    assert_eq!(tracker.retire_exited(1_001 + EXIT_GRACE_NS), 1);
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

fn anon_text(start: u64) -> maps::MapsEntry {
    maps::MapsEntry {
        start,
        end: start + 0x10000,
        executable: true,
        file_offset: 0,
        dev: 0,
        inode: 0,
        path: String::new(),
        deleted: false,
    }
}

#[test]
fn samples_resolve_through_the_image_of_their_time() {
    // A pid no process has: re-reads fail, only what is applied counts.
    const PID: u32 = u32::MAX - 7;
    const CHILD: u32 = u32::MAX - 8;
    let (a, b, c) = (0x10_0000, 0x20_0000, 0x30_0000);
    let mut tracker = ProcessTracker::new();
    tracker.apply_maps(PID, &[anon_text(a)]);
    let in_a = tracker.find_mapping(PID, 50, a + 1).expect("image 1");
    // exec at 100: image 2 has b.
    tracker.process_exec(PID, 100);
    tracker.apply_maps(PID, &[anon_text(b)]);
    let in_b = tracker.find_mapping(PID, 150, b + 1).expect("image 2");
    // A sample taken before the exec, drained after it: image 1.
    assert_eq!(tracker.find_mapping(PID, 99, a + 1), Some(in_a));
    // Or, this close to the exec's time, one of the new image.
    assert_eq!(tracker.find_mapping(PID, 99, b + 1), Some(in_b));
    // After it, image 1's mappings are gone.
    assert_eq!(tracker.find_mapping(PID, 150, a + 1), None);
    // An older exec than the image's start changes nothing.
    tracker.process_exec(PID, 90);
    assert_eq!(tracker.find_mapping(PID, 150, b + 1), Some(in_b));
    // A fork at 200: the child has the parent's image from then on; its
    // exec at 300 ends it.
    tracker.process_forked(CHILD, PID, 200);
    assert_eq!(tracker.find_mapping(CHILD, 250, b + 1), Some(in_b));
    tracker.process_exec(CHILD, 300);
    tracker.apply_maps(CHILD, &[anon_text(c)]);
    let in_c = tracker
        .find_mapping(CHILD, 350, c + 1)
        .expect("child's image");
    assert_eq!(tracker.find_mapping(CHILD, 250, b + 1), Some(in_b));
    assert_eq!(tracker.find_mapping(CHILD, 350, b + 1), None);
    assert_ne!(in_c, in_b);
    // Once no window can hold samples from before 300, image 1 and the
    // child's inherited image go; the current ones stay.
    tracker.retire_exited(301);
    assert_eq!(tracker.find_mapping(PID, 99, a + 1), None);
    assert_eq!(tracker.find_mapping(CHILD, 350, c + 1), Some(in_c));
}

/// The kernel installs a new image before the exec tracepoint that times
/// the exec: a sample in between has the new image's pc (its entry point)
/// and a time before the exec's. Only then is a pc the old image lacks
/// looked up in the new one.
#[test]
fn a_sample_just_before_the_exec_time_may_have_the_new_image_pc() {
    use super::images::EXEC_SWITCH_NS;
    const PID: u32 = u32::MAX - 9;
    let (a, b) = (0x10_0000, 0x20_0000);
    let exec = 10 * EXEC_SWITCH_NS;
    let mut tracker = ProcessTracker::new();
    tracker.apply_maps(PID, &[anon_text(a)]);
    let in_a = tracker.find_mapping(PID, 1, a + 1).expect("image 1");
    tracker.process_exec(PID, exec);
    tracker.apply_maps(PID, &[anon_text(b)]);
    let in_b = tracker.find_mapping(PID, exec, b + 1).expect("image 2");
    let switching = exec - EXEC_SWITCH_NS;
    assert_eq!(tracker.find_mapping(PID, switching, a + 1), Some(in_a));
    assert_eq!(tracker.find_mapping(PID, switching, b + 1), Some(in_b));
    assert_eq!(tracker.find_mapping(PID, switching - 1, b + 1), None);
    assert_eq!(tracker.find_mapping(PID, switching - 1, a + 1), Some(in_a));
}

#[test]
fn tables_grown_by_a_burst_of_processes_shrink_once_they_are_retired() {
    let mut tracker = ProcessTracker::new();
    // Pids above the kernel's limit (2^22): no /proc entries, anonymous
    // executable mappings (no object to open).
    let pids = 5_000_000..5_020_000u32;
    for pid in pids.clone() {
        tracker.apply_maps(pid, &[anon_text(0x10000), anon_text(0x40000)]);
        tracker.process_exited(pid, 10);
    }
    let after_10 = 11 + EXIT_GRACE_NS;
    assert_eq!(tracker.mapping_count(), 40_000);
    let grown = tracker.mappings.capacity();
    assert!(grown >= 40_000);
    // One process stays.
    tracker.apply_maps(1, &[anon_text(0x10000)]);
    assert_eq!(tracker.retire_exited(after_10), 20_000);
    assert_eq!(tracker.mapping_count(), 1);
    assert!(
        tracker.mappings.capacity() <= 4 * 4096,
        "{}",
        tracker.mappings.capacity()
    );
    assert!(tracker.mapping_index.capacity() <= 4 * 4096);
    assert!(tracker.processes.capacity() <= 4 * 4096);
    // Mappings given up by an exec wait in the orphans list: it shrinks too.
    for pid in pids.clone() {
        tracker.apply_maps(pid, &[anon_text(0x10000), anon_text(0x40000)]);
        tracker.process_exec(pid, after_10 + 20);
    }
    assert!(tracker.orphans.len() >= 40_000);
    for pid in pids.clone() {
        tracker.process_exited(pid, after_10 + 21);
    }
    tracker.retire_exited(after_10 + 22 + EXIT_GRACE_NS);
    assert!(
        tracker.orphans.capacity() <= 4 * 4096,
        "{}",
        tracker.orphans.capacity()
    );
    assert_eq!(tracker.mapping_count(), 1);
    // What stays is still found.
    assert_eq!(tracker.process_mappings(1).len(), 1);
}

/// A maps entry of `pid` mapping `path` (a real file) executable at `start`.
fn file_text(start: u64, path: &std::path::Path) -> maps::MapsEntry {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    maps::MapsEntry {
        start,
        end: start + 0x1000,
        executable: true,
        file_offset: 0,
        dev: meta.dev(),
        inode: meta.ino(),
        path: path.to_string_lossy().into_owned(),
        deleted: false,
    }
}

#[test]
fn objects_no_mapping_refers_to_are_closed_after_a_grace() {
    use super::lifetime::OBJECT_GRACE_NS;
    // This process's pid, so that the file opens through /proc/PID/root;
    // the tracker is told it exits and comes back (a reused pid).
    let pid = std::process::id();
    let path = std::env::temp_dir().join(format!("lightswitch-object-retire-{pid}"));
    std::fs::write(&path, b"not an ELF file").unwrap();
    let mut tracker = ProcessTracker::new();
    tracker.apply_maps(pid, &[file_text(0x10_0000, &path)]);
    let mapping = tracker.process_mappings(pid)[0];
    let id = tracker.mapping(mapping).unwrap().object.expect("opened");
    let fd = tracker.object(id).unwrap().open_path.clone();
    assert_eq!(tracker.object_count(), 1);
    // The process exits: its mapping goes, the object waits out the grace.
    const G: u64 = EXIT_GRACE_NS;
    tracker.process_exited(pid, 1_000);
    assert_eq!(tracker.retire_exited(1_001 + G), 1);
    assert_eq!(tracker.mapping_count(), 0);
    assert!(tracker.object(id).is_some());
    assert!(tracker.take_retired_objects().is_empty());
    // Mapped again within the grace: the same object, and the grace starts
    // over once it is unused again.
    tracker.apply_maps(pid, &[file_text(0x20_0000, &path)]);
    let again = tracker.process_mappings(pid)[0];
    assert_eq!(tracker.mapping(again).unwrap().object, Some(id));
    tracker.process_exited(pid, 2_000 + G);
    assert_eq!(tracker.retire_exited(2_001 + 2 * G), 1);
    tracker.retire_exited(1_001 + G + OBJECT_GRACE_NS);
    assert!(tracker.object(id).is_some(), "the grace started over");
    assert!(tracker.take_retired_objects().is_empty());
    tracker.retire_exited(2_001 + 2 * G + OBJECT_GRACE_NS);
    assert!(tracker.object(id).is_none());
    assert_eq!(tracker.object_count(), 0);
    assert_eq!(tracker.unused_objects.len(), 0);
    // The caller takes it (to make the walker forget its file), then it closes.
    let retired = tracker.take_retired_objects();
    assert_eq!(retired.len(), 1);
    assert_eq!(retired[0].0, id);
    assert!(std::fs::read_link(&fd).is_ok_and(|target| target == path));
    drop(retired);
    assert!(std::fs::read_link(&fd).map_or(true, |target| target != path));
    // Mapped once more: opened again, under a new id.
    tracker.apply_maps(pid, &[file_text(0x30_0000, &path)]);
    let third = tracker.process_mappings(pid)[0];
    let reopened = tracker.mapping(third).unwrap().object.expect("opened");
    assert_ne!(reopened, id);
    assert_eq!(tracker.object_count(), 1);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn processes_gone_from_proc_without_an_exit_event_are_retired() {
    use super::lifetime::VANISHED_SWEEP_NS;
    // Above the kernel's pid limit: never in /proc. This process is.
    const GONE: u32 = 5_100_000;
    let own = std::process::id();
    let mut tracker = ProcessTracker::new();
    tracker.apply_maps(GONE, &[anon_text(0x10000)]);
    tracker.apply_maps(own, &[anon_text(0x10000)]);
    // No exit event came: nothing retires.
    assert_eq!(tracker.retire_exited(u64::MAX), 0);
    let now = VANISHED_SWEEP_NS + 10;
    assert_eq!(tracker.notice_vanished(now), vec![GONE]);
    // Not again before the next sweep is due.
    tracker.apply_maps(GONE + 1, &[anon_text(0x10000)]);
    assert!(tracker.notice_vanished(now + 1).is_empty());
    // Windows open since before `now` may still hold its samples.
    assert_eq!(tracker.retire_exited(now + EXIT_GRACE_NS), 0);
    assert_eq!(tracker.retire_exited(now + EXIT_GRACE_NS + 1), 1);
    assert_eq!(tracker.process_mappings(GONE).len(), 0);
    assert_eq!(tracker.process_mappings(own).len(), 1);
    assert_eq!(
        tracker.notice_vanished(now + VANISHED_SWEEP_NS),
        vec![GONE + 1]
    );
}

/// A read of the maps of a process whose exit was noticed, showing no
/// executable mapping (here: its zombie), replaces nothing: samples from
/// its exit path still resolve through its mappings.
#[test]
fn the_empty_maps_of_an_exiting_process_replace_nothing() {
    let mut zombie = std::process::Command::new("true").spawn().unwrap();
    let pid = zombie.id();
    while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|t| {
        t.rsplit(')')
            .next()
            .is_some_and(|rest| rest.starts_with(" Z"))
    }) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        maps::read_maps(pid).unwrap().is_empty(),
        "a zombie has no maps"
    );
    let mut tracker = ProcessTracker::new();
    tracker.apply_maps(pid, &[anon_text(0x10000)]);
    let id = tracker.process_mappings(pid)[0];
    let exit = crate::util::timefmt::monotonic_ns();
    tracker.process_exited(pid, exit);
    let during_exit = exit + EXIT_GRACE_NS / 2;
    assert_eq!(tracker.find_mapping(pid, during_exit, 0x10008), Some(id));
    // An address in no known mapping: the maps are read again (once the
    // shortest re-read interval has passed), and show nothing executable.
    std::thread::sleep(MIN_REREAD_INTERVAL * 2);
    assert_eq!(tracker.find_mapping(pid, during_exit, 0x90000), None);
    assert_eq!(tracker.find_mapping(pid, during_exit, 0x10010), Some(id));
    // After the grace, the pid's samples are another process's.
    assert_eq!(
        tracker.find_mapping(pid, exit + 2 * EXIT_GRACE_NS, 0x10008),
        None
    );
    zombie.wait().unwrap();
}
