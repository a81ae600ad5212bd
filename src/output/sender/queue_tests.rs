//! Tests of [`super`] (`queue.rs`).

use super::*;

struct Script {
    outcomes: Arc<Mutex<VecDeque<Attempt>>>,
    seen: Arc<Mutex<Vec<String>>>,
    delay: Duration,
}

impl Transport for Script {
    fn send(&mut self, item: &Item, timeout: Duration) -> Attempt {
        std::thread::sleep(self.delay.min(timeout));
        self.seen.lock().unwrap().push(item.description.clone());
        self.outcomes
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Attempt::Delivered)
    }
    fn destination(&self) -> String {
        "script".into()
    }
}

fn item(name: &str, size: usize) -> Item {
    Item {
        body: vec![0; size],
        headers: Vec::new(),
        description: name.into(),
    }
}

fn fast() -> Backoff {
    Backoff {
        initial: Duration::from_millis(5),
        max: Duration::from_millis(20),
    }
}

fn script(outcomes: Vec<Attempt>, delay: Duration) -> (Script, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    (
        Script {
            outcomes: Arc::new(Mutex::new(outcomes.into())),
            seen: seen.clone(),
            delay,
        },
        seen,
    )
}

#[test]
fn retries_transient_failures_then_delivers_once() {
    let (t, seen) = script(
        vec![Attempt::Retry("500".into()), Attempt::Retry("500".into())],
        Duration::ZERO,
    );
    let d = Delivery::start(t, 1 << 20, Duration::from_secs(1), fast(), None).unwrap();
    d.queue().push(item("w1", 10));
    let stats = d.finish(Instant::now() + Duration::from_secs(5));
    assert_eq!(stats.sent, 1);
    assert_eq!(stats.retried, 2);
    assert_eq!(stats.bytes, 10);
    assert_eq!(stats.dropped, 0);
    assert_eq!(*seen.lock().unwrap(), vec!["w1", "w1", "w1"]);
}

#[test]
fn rejected_is_not_retried_and_the_next_goes_on() {
    let (t, seen) = script(vec![Attempt::Rejected("401".into())], Duration::ZERO);
    let d = Delivery::start(t, 1 << 20, Duration::from_secs(1), fast(), None).unwrap();
    d.queue().push(item("w1", 10));
    d.queue().push(item("w2", 10));
    let stats = d.finish(Instant::now() + Duration::from_secs(5));
    assert_eq!((stats.sent, stats.rejected, stats.retried), (1, 1, 0));
    assert_eq!(*seen.lock().unwrap(), vec!["w1", "w2"]);
}

#[test]
fn retry_after_is_waited_for_and_partial_counts_as_sent() {
    let (t, seen) = script(
        vec![
            Attempt::RetryAfter("503".into(), Duration::from_millis(400)),
            Attempt::Partial("1 profile rejected".into()),
        ],
        Duration::ZERO,
    );
    let d = Delivery::start(t, 1 << 20, Duration::from_secs(1), fast(), None).unwrap();
    let start = Instant::now();
    d.queue().push(item("w1", 10));
    let stats = d.finish(Instant::now() + Duration::from_secs(5));
    // The backoff alone would have waited at most 5 ms.
    assert!(start.elapsed() >= Duration::from_millis(400));
    assert_eq!((stats.sent, stats.partial, stats.retried), (1, 1, 1));
    assert_eq!(*seen.lock().unwrap(), vec!["w1", "w1"]);
}

#[test]
fn full_queue_drops_oldest_but_not_the_one_in_flight() {
    let (t, seen) = script(vec![], Duration::from_millis(200));
    let d = Delivery::start(t, 25, Duration::from_secs(1), fast(), None).unwrap();
    d.queue().push(item("w1", 10));
    std::thread::sleep(Duration::from_millis(50)); // w1 is in flight
    d.queue().push(item("w2", 10));
    d.queue().push(item("w3", 10)); // 30 > 25: w2 goes, w1 is in flight
    assert_eq!(d.queue().stats().dropped, 1);
    let stats = d.finish(Instant::now() + Duration::from_secs(5));
    assert_eq!((stats.sent, stats.dropped, stats.queued), (2, 1, 3));
    assert_eq!(*seen.lock().unwrap(), vec!["w1", "w3"]);
}

#[test]
fn flush_deadline_bounds_shutdown() {
    let outcomes = vec![Attempt::Retry("down".into()); 1000];
    let (t, _) = script(outcomes, Duration::from_millis(1));
    let d = Delivery::start(t, 1 << 20, Duration::from_secs(1), fast(), None).unwrap();
    d.queue().push(item("w1", 10));
    d.queue().push(item("w2", 10));
    let start = Instant::now();
    let stats = d.finish(Instant::now() + Duration::from_millis(300));
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!((stats.sent, stats.dropped), (0, 2));
    assert!(stats.retried >= 2);
}

#[test]
fn backoff_grows_to_its_cap_with_jitter() {
    let b = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(1000),
    };
    assert_eq!(b.delay(1, 0.0), Duration::from_millis(50));
    assert_eq!(b.delay(1, 1.0), Duration::from_millis(100));
    assert_eq!(b.delay(3, 1.0), Duration::from_millis(400));
    assert_eq!(b.delay(30, 1.0), Duration::from_millis(1000));
    let mut j = Jitter::new();
    for _ in 0..1000 {
        let x = j.next_f64();
        assert!((0.0..1.0).contains(&x));
    }
}
