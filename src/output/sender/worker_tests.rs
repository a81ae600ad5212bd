use std::sync::atomic::AtomicU64;
use std::sync::mpsc::{channel, Receiver, Sender as ChannelSender};
use std::sync::Mutex;

use super::*;
use crate::profile::{Profile, Window};
use crate::sampling::records::RawSample;

const SECOND: u64 = 1_000_000_000;

/// A sender that tells when a profile arrives and then waits for the test
/// to let it go on: the worker stays behind for as long as the test wants.
struct GatedSender {
    arrived: ChannelSender<(u64, u64, u64)>,
    gate: Mutex<Receiver<()>>,
}

impl Sender for GatedSender {
    fn send(&mut self, profile: &Profile) -> Result<()> {
        let seen = (
            profile.start_unix_ns,
            profile.duration_ns,
            profile.total_samples(),
        );
        self.arrived.send(seen).unwrap();
        // The test dropping its end of the gate opens it for good.
        let _ = self.gate.lock().unwrap().recv();
        Ok(())
    }

    fn finish(self: Box<Self>, _deadline: Instant) -> SenderReport {
        SenderReport::default()
    }
}

#[derive(Default)]
struct Counts {
    closed: AtomicU64,
    merged: AtomicU64,
    written: AtomicU64,
}

impl WindowCounters for Counts {
    fn window_closed(&self) {
        self.closed.fetch_add(1, Ordering::Relaxed);
    }
    fn window_merged(&self) {
        self.merged.fetch_add(1, Ordering::Relaxed);
    }
    fn window_dropped(&self) {}
    fn window_written(&self) {
        self.written.fetch_add(1, Ordering::Relaxed);
    }
    fn window_failed(&self) {}
    fn window_panicked(&self) {}
    fn add_samples_missing_mapping(&self, _n: u64) {}
}

/// Window `index` of a run of 1 s windows, with `index + 1` samples.
fn window(index: u64, tracker: &mut ProcessTracker) -> ClosedWindow {
    let start = index * SECOND;
    let mut aggregator = crate::profile::aggregate::Aggregator::new();
    for i in 0..=index {
        let sample = RawSample::for_test(u32::MAX - 2, start + i, vec![0x10 + i, 0x20]);
        aggregator.add(&sample, tracker);
    }
    ClosedWindow {
        index,
        aggregator,
        window: Window {
            start_unix_ns: start,
            duration_ns: SECOND,
            sample_freq_hz: 1000,
            off_cpu: false,
        },
    }
}

#[test]
fn windows_closing_while_the_worker_is_behind_are_merged_not_lost() {
    let (arrived_tx, arrived) = channel();
    let (gate_tx, gate) = channel();
    let sender = GatedSender {
        arrived: arrived_tx,
        gate: Mutex::new(gate),
    };
    let counts = Arc::new(Counts::default());
    let provenance = Provenance {
        subject: "test".into(),
        host: "host".into(),
        pids: Arc::new([]),
    };
    let mut worker = WindowWorker::start(
        Box::new(sender),
        counts.clone(),
        provenance,
        SymbolContext::default(),
    )
    .unwrap();
    let mut tracker = ProcessTracker::new();
    // Window 0 reaches the sender, which holds the worker there.
    worker.submit(window(0, &mut tracker), &tracker);
    assert_eq!(arrived.recv().unwrap(), (0, SECOND, 1));
    // 1-4 fill the channel; 5 is held; 6 and 7 join it.
    for index in 1..=7 {
        worker.submit(window(index, &mut tracker), &tracker);
    }
    assert_eq!(counts.merged.load(Ordering::Relaxed), 2);
    drop(gate_tx);
    let report = worker.finish(Duration::from_secs(1));
    let mut seen: Vec<(u64, u64, u64)> = arrived.try_iter().collect();
    seen.insert(0, (0, SECOND, 1));
    // Windows 0-4 as they were; then 5 with 6 and 7: 3 s and 6 + 7 + 8 samples.
    let mut expected: Vec<(u64, u64, u64)> = (0..5).map(|i| (i * SECOND, SECOND, i + 1)).collect();
    expected.push((5 * SECOND, 3 * SECOND, 21));
    assert_eq!(seen, expected);
    let total: u64 = seen.iter().map(|s| s.2).sum();
    assert_eq!(total, (1..=8).sum::<u64>(), "every sample of the 8 windows");
    assert_eq!(
        (
            report.windows_sent,
            report.windows_merged,
            report.windows_dropped
        ),
        (6, 2, 0)
    );
    assert!(report.failure().is_none(), "{:?}", report.failure());
    assert_eq!(counts.closed.load(Ordering::Relaxed), 8);
    assert_eq!(counts.written.load(Ordering::Relaxed), 6);
}
