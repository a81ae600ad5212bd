//! Tests of [`super`] (`agent/run/summary.rs`).

use super::Totals;
use crate::process::ProcessTracker;
use crate::profile::window::Windows;
use crate::sampling::records::{RawSample, Wait};

/// The summary's processes are those with on-CPU samples: one that only
/// waited (`--off-cpu`) is not among them. Before, a whole-machine
/// `--off-cpu` run said 244 processes where 33 had samples.
#[test]
fn processes_that_only_waited_are_not_counted() {
    let mut tracker = ProcessTracker::new();
    let mut windows = Windows::new(0, 0, None, None, 99);
    windows.add(&RawSample::for_test(10, 5, vec![]), &mut tracker);
    let mut wait = RawSample::for_test(20, 6, vec![]);
    wait.wait = Some(Wait {
        ns: 1_000_000,
        runnable: false,
    });
    windows.add(&wait, &mut tracker);
    let mut totals = Totals::default();
    for closed in windows.finish(100) {
        totals.account(&closed);
    }
    assert_eq!(totals.pids.into_iter().collect::<Vec<_>>(), [10]);
}
