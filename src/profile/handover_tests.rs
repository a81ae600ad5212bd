//! Retirement of exited processes against window hand-over (decision 0007),
//! driven deterministically through the orders that broke the promise of
//! [`ProcessTracker::retire_exited`]: a sample read late from the ring after
//! its window closed, an exit noticed before the process's last samples are
//! drained, a pid reused while the old process is still held, and an image
//! exec'd twice. Each case runs the run loop's steps in a fixed order on the
//! real tracker and windows, and checks that every window is captured with
//! all its mappings ([`TrackerSnapshot::missing_samples`] is 0). The last
//! cases add [`ProcessTracker::trim_departed`], which forgets gone
//! processes' unsampled mappings as soon as every sample before a time has
//! been drained, ahead of the windows.
//!
//! The processes are fictitious pids with maps given by the test
//! ([`ProcessTracker::apply_maps`]), so nothing depends on timing or on
//! which pids the machine has.

use crate::process::maps::MapsEntry;
use crate::process::ProcessTracker;
use crate::profile::window::{ClosedWindow, Windows, CLOSE_SLACK_NS};
use crate::sampling::records::RawSample;
use crate::symbolize::mapping_source::{ObjectCache, TrackerSnapshot};

const S: u64 = 1_000_000_000;
/// No such process: its maps come only from the test.
const PID: u32 = u32::MAX - 7;
const TEXT_A: u64 = 0x5555_0000_0000;
const TEXT_B: u64 = 0x7777_0000_0000;

/// An executable range of 64 KiB at `start` named `path` (inode 0: no file
/// is opened for it).
fn text(start: u64, path: &str) -> MapsEntry {
    MapsEntry {
        start,
        end: start + 0x10000,
        executable: true,
        file_offset: 0,
        dev: 0,
        inode: 0,
        path: path.to_string(),
        deleted: false,
    }
}

/// The run loop's steps over one tracker and one set of 1 s windows from 0.
struct Loop {
    tracker: ProcessTracker,
    windows: Windows,
    objects: ObjectCache,
    /// Samples captured so far whose mappings were gone.
    missing: u64,
    captured: u64,
    /// Samples drained with a mapping for their frame.
    resolved: u64,
}

impl Loop {
    fn new() -> Self {
        Loop {
            tracker: ProcessTracker::new(),
            windows: Windows::new(0, 0, Some(S), None, 99),
            objects: ObjectCache::new(),
            missing: 0,
            captured: 0,
            resolved: 0,
        }
    }

    /// A sample of `pid` taken at `ts` with one frame at `pc`, drained now.
    fn drain_sample(&mut self, pid: u32, ts: u64, pc: u64) {
        let sample = RawSample::for_test(pid, ts, vec![pc]);
        let frames = crate::profile::aggregate::resolve(&sample, &mut self.tracker);
        self.resolved += u64::from(frames.iter().any(|f| f.mapping.is_some()));
        self.windows.add_resolved(&sample, &frames);
    }

    fn hand_over(&mut self, closed: Vec<ClosedWindow>) {
        for window in closed {
            let snapshot =
                TrackerSnapshot::capture(&window.aggregator, &self.tracker, &mut self.objects);
            self.missing += snapshot.missing_samples();
            self.captured += window.aggregator.total();
        }
    }

    /// Close the windows due at `now` and hand them over.
    fn close(&mut self, now: u64) {
        let closed = self.windows.close_due(now);
        self.hand_over(closed);
    }

    /// Retire what the open windows no longer need (the loop's cut-off).
    fn retire(&mut self) -> usize {
        let since = self
            .windows
            .open_since_ns()
            .expect("windows have an interval");
        self.tracker.retire_exited(since)
    }

    /// Close and hand over the windows due at `now`, then retire.
    fn close_and_retire(&mut self, now: u64) -> usize {
        self.close(now);
        self.retire()
    }

    fn finish(&mut self, now: u64) {
        let closed = self.windows.finish(now);
        self.hand_over(closed);
    }
}

#[test]
fn a_late_sample_keeps_its_exited_process_until_its_window_is_handed_over() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S / 2, TEXT_A + 0x10);
    // The process exits, noticed at 0.97 s; window 0 closes with a sample
    // taken at 0.95 s still unread, which then arrives late, into window 1.
    l.tracker.process_exited(PID, S * 97 / 100);
    l.close(S + CLOSE_SLACK_NS);
    l.drain_sample(PID, S * 95 / 100, TEXT_A + 0x20);
    assert_eq!(l.windows.late(), 1);
    // Window 1 starts (1 s) after the exit was noticed, but holds a sample
    // resolved through the process: it stays until window 1 is handed over.
    assert_eq!(l.retire(), 0);
    assert_eq!(l.close_and_retire(2 * S + CLOSE_SLACK_NS), 1);
    assert_eq!(l.tracker.mapping_count(), 0);
    l.finish(2 * S + S / 2);
    assert_eq!((l.captured, l.missing), (2, 0));
}

#[test]
fn samples_drained_after_the_exit_event_keep_their_mappings() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    // The exit event is handled before the samples of the same drain.
    l.tracker.process_exited(PID, S / 2 + 1_000);
    l.drain_sample(PID, S / 2, TEXT_A + 0x10);
    l.drain_sample(PID, S / 2 + 500, TEXT_A + 0x30);
    assert_eq!(l.close_and_retire(S / 2 + 2_000), 0);
    // Window 0 is handed over, then the process can go.
    assert_eq!(l.close_and_retire(S + CLOSE_SLACK_NS), 1);
    l.finish(2 * S);
    assert_eq!((l.captured, l.missing), (2, 0));
}

/// Samples from the kernel's exit path (after the exit event was handled,
/// within the grace) are the exiting process's: resolved, and it stays
/// until their window is handed over.
#[test]
fn samples_from_the_exit_path_after_the_exit_was_noticed_are_the_process_own() {
    use crate::process::EXIT_GRACE_NS;
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    l.tracker.process_exited(PID, S / 5);
    // 5 ms after: the exit path (closing files, releasing memory) is still
    // running; once the grace is over, the pid is another process's.
    l.drain_sample(PID, S / 5 + 5_000_000, TEXT_A + 0x20);
    assert_eq!(l.resolved, 2);
    l.drain_sample(PID, S / 5 + EXIT_GRACE_NS + 1, TEXT_A + 0x20);
    assert_eq!(l.resolved, 2);
    assert_eq!(l.close_and_retire(S + CLOSE_SLACK_NS), 1);
    l.finish(2 * S);
    assert_eq!((l.captured, l.missing), (3, 0));
}

#[test]
fn a_reused_pid_is_not_resolved_with_the_exited_process_mappings() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    l.tracker.process_exited(PID, S / 5);
    // Another process gets the pid and is sampled at the same address
    // before the first is retired: its maps cannot be read (no such pid
    // here), and the dead process's mappings must not stand in for them.
    l.drain_sample(PID, S * 3 / 10, TEXT_A + 0x10);
    // Window 0 is handed over with both samples; then the old process goes.
    assert_eq!(l.close_and_retire(S + CLOSE_SLACK_NS), 1);
    assert_eq!(l.tracker.mapping_count(), 0);
    l.drain_sample(PID, S + S / 10, TEXT_A + 0x10);
    assert_eq!(l.close_and_retire(2 * S + CLOSE_SLACK_NS), 0);
    l.finish(2 * S + S / 2);
    assert_eq!((l.captured, l.missing), (3, 0));
    // Only the first sample was resolved (to the process that took it).
    assert_eq!(l.resolved, 1);
}

#[test]
fn a_reused_pid_whose_maps_are_read_moves_the_old_mappings_to_the_orphans() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    l.tracker.process_exited(PID, S / 5);
    // The new process's maps are read (its first sample, at 0.3 s).
    l.tracker.apply_maps(PID, &[text(TEXT_B, "/t/b")]);
    l.drain_sample(PID, S * 3 / 10, TEXT_B + 0x10);
    assert_eq!(l.close_and_retire(S + CLOSE_SLACK_NS), 0);
    assert_eq!(l.tracker.mapping_count(), 1, "the old image is retired");
    l.finish(S + S / 2);
    assert_eq!((l.captured, l.missing), (2, 0));
}

#[test]
fn an_image_execd_twice_keeps_its_mappings_until_the_second_exec_retires() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    // exec of the same image at the same address: the same mapping ids.
    l.tracker.process_exec(PID, S / 5);
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S + S / 10, TEXT_A + 0x10);
    // exec of another image during window 1.
    l.tracker.process_exec(PID, S + S / 5);
    l.tracker.apply_maps(PID, &[text(TEXT_B, "/t/b")]);
    l.drain_sample(PID, S + S / 2, TEXT_B + 0x10);
    // Window 0 goes; the first exec's orphans are due, but the same mapping
    // was orphaned again by the second exec, which window 1 still needs.
    assert_eq!(l.close_and_retire(S + CLOSE_SLACK_NS), 0);
    assert_eq!(l.tracker.mapping_count(), 2);
    assert_eq!(l.close_and_retire(2 * S + CLOSE_SLACK_NS), 0);
    assert_eq!(l.tracker.mapping_count(), 1);
    l.finish(2 * S + S / 2);
    assert_eq!((l.captured, l.missing), (3, 0));
}

#[test]
fn a_retired_mapping_is_an_unsymbolized_frame_and_a_count_not_a_panic() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &[text(TEXT_A, "/t/a")]);
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    l.tracker.process_exited(PID, S / 5);
    // A caller that breaks the promise: retire while window 0 is open.
    assert_eq!(l.tracker.retire_exited(S), 1);
    let closed = l.windows.finish(S);
    let snapshot = TrackerSnapshot::capture(&closed[0].aggregator, &l.tracker, &mut l.objects);
    assert_eq!(snapshot.missing_samples(), 1);
    let profile = crate::symbolize::Symbolizer::new().build_profile(
        &closed[0].aggregator,
        &snapshot,
        closed[0].window,
    );
    let user = &profile.samples[0].frames.last().copied().unwrap();
    let frame = &profile.frames[*user];
    assert_eq!(frame.address, TEXT_A + 0x10);
    assert_eq!(frame.mapping, None);
    assert!(frame.lines[0].function.starts_with("[unknown]"));
}

impl Loop {
    /// Forget what no window can refer to of processes gone before
    /// `drained_before` (every sample taken before it has been drained).
    fn trim(&mut self, drained_before: u64) -> usize {
        self.tracker.trim_departed(drained_before)
    }
}

/// Two executable ranges: `TEXT_A` (sampled in these tests) and `TEXT_B`.
fn two_texts() -> [MapsEntry; 2] {
    [text(TEXT_A, "/t/a"), text(TEXT_B, "/t/b")]
}

#[test]
fn a_gone_process_keeps_only_its_sampled_mappings_until_its_window_is_handed_over() {
    use crate::process::EXIT_GRACE_NS;
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &two_texts());
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    l.tracker.process_exited(PID, S / 5);
    // Not before the samples of its exit path are all drained.
    assert_eq!(l.trim(S / 5 + EXIT_GRACE_NS), 0);
    assert_eq!(l.tracker.process_count(), 1);
    assert_eq!(l.trim(S / 5 + EXIT_GRACE_NS + 1), 1);
    assert_eq!(l.tracker.process_count(), 0);
    assert_eq!(l.tracker.mapping_count(), 1, "the unsampled TEXT_B goes");
    // The sampled one stays for window 0, then retires with it.
    assert_eq!(l.retire(), 0);
    assert_eq!(l.tracker.mapping_count(), 1);
    l.close_and_retire(S + CLOSE_SLACK_NS);
    assert_eq!(l.tracker.mapping_count(), 0);
    l.finish(2 * S);
    assert_eq!((l.captured, l.missing), (1, 0));
}

#[test]
fn a_mapping_first_sampled_on_the_exit_path_is_kept() {
    use crate::process::EXIT_GRACE_NS;
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &two_texts());
    l.drain_sample(PID, S / 10, TEXT_A + 0x10);
    l.tracker.process_exited(PID, S / 5);
    // Taken within the grace, drained before the trim that follows it.
    l.drain_sample(PID, S / 5 + EXIT_GRACE_NS / 2, TEXT_B + 0x10);
    assert_eq!(l.trim(S / 5 + EXIT_GRACE_NS + 1), 1);
    assert_eq!(l.tracker.mapping_count(), 2);
    l.close_and_retire(S + CLOSE_SLACK_NS);
    assert_eq!(l.tracker.mapping_count(), 0);
    l.finish(2 * S);
    assert_eq!((l.captured, l.missing), (2, 0));
}

#[test]
fn an_execd_image_unsampled_mappings_go_once_drained_past_the_exec() {
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &two_texts());
    l.drain_sample(PID, S / 10, TEXT_B + 0x10);
    l.tracker.process_exec(PID, S / 5);
    l.tracker
        .apply_maps(PID, &[text(TEXT_A + 0x100_0000, "/t/c")]);
    l.drain_sample(PID, S / 4, TEXT_A + 0x100_0010);
    assert_eq!(l.tracker.mapping_count(), 3);
    // A live process is not trimmed; the old image's unsampled TEXT_A goes
    // once every sample taken before the exec has been drained.
    assert_eq!(l.trim(S / 5), 0);
    assert_eq!(l.tracker.mapping_count(), 3);
    assert_eq!(l.trim(S / 5 + 1), 0);
    assert_eq!(l.tracker.mapping_count(), 2);
    assert_eq!(l.tracker.process_count(), 1);
    l.close_and_retire(S + CLOSE_SLACK_NS);
    assert_eq!(l.tracker.mapping_count(), 1, "the live image stays");
    l.finish(2 * S);
    assert_eq!((l.captured, l.missing), (2, 0));
}

#[test]
fn a_forked_child_trimmed_leaves_its_parent_mappings() {
    use crate::process::EXIT_GRACE_NS;
    let child = PID - 1;
    let mut l = Loop::new();
    l.tracker.apply_maps(PID, &two_texts());
    l.tracker.process_forked(child, PID, S / 10);
    l.drain_sample(child, S / 5, TEXT_A + 0x10);
    l.tracker.process_exited(child, S / 4);
    assert_eq!(l.trim(S / 4 + EXIT_GRACE_NS + 1), 1);
    assert_eq!(l.tracker.mapping_count(), 2, "the parent maps both");
    // The parent is sampled later through the same, unretired mappings.
    l.drain_sample(PID, S / 2, TEXT_B + 0x10);
    l.close_and_retire(S + CLOSE_SLACK_NS);
    assert_eq!(l.tracker.mapping_count(), 2);
    l.finish(2 * S);
    assert_eq!((l.captured, l.missing), (2, 0));
    assert_eq!(l.resolved, 2);
}
