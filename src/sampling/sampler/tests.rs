use super::events::parse_cpu_list;
use super::WalkerMaps;
use super::*;

#[test]
fn ring_buffers_grow_with_frequency() {
    assert_eq!(samples_ring_bytes_per_cpu(1), 256 << 10);
    assert_eq!(samples_ring_bytes_per_cpu(99), 256 << 10);
    assert_eq!(samples_ring_bytes_per_cpu(999), 256 << 10);
    assert_eq!(samples_ring_bytes_per_cpu(4_000), 1 << 20);
    assert_eq!(samples_ring_bytes_per_cpu(10_000), 4 << 20);
    assert_eq!(samples_ring_bytes_per_cpu(1_000_000), 64 << 20);
}

#[test]
fn cpu_list_parses_ranges_and_singles() {
    assert_eq!(
        parse_cpu_list("0-3,6,8-9").unwrap(),
        vec![0, 1, 2, 3, 6, 8, 9]
    );
    assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
    assert!(parse_cpu_list("a-b").is_err());
}

/// Records the real BPF program wrote parse into the values the kernel
/// knows: a thread of this process spinning under its own name, and the
/// exit of a child process described to the walker. Needs root.
#[test]
fn records_written_by_the_bpf_program_parse() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let me = std::process::id();
    let config = SamplerConfig {
        sample_freq_hz: 999,
        pids: vec![me],
        max_unwind_rows: 1024,
        ..SamplerConfig::default()
    };
    let mut object = MaybeUninit::uninit();
    let sampler = Sampler::start(&config, &mut object).unwrap();
    let samples = Rc::new(RefCell::new(Vec::new()));
    let events = Rc::new(RefCell::new(Vec::new()));
    let malformed = Rc::new(RefCell::new(0));
    let ring = sampler
        .ring_buffer(samples.clone(), events.clone(), malformed.clone())
        .unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("0.3")
        .spawn()
        .unwrap();
    sampler.set_process(child.id(), &[], 0).unwrap();

    let started = crate::util::timefmt::monotonic_ns();
    let stop = Arc::new(AtomicBool::new(false));
    let spinning = stop.clone();
    let spinner = std::thread::Builder::new()
        .name("ls-spinner".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            // 300 ms of this thread's own CPU time (about 300 samples at
            // 999 Hz), however busy the machine is.
            let cpu_ns = || {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: ts is a valid timespec to write.
                unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
            };
            while cpu_ns() < 300_000_000 && !spinning.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            tid
        })
        .unwrap();
    // The stop flag only bounds a machine too busy to give 300 ms in 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !spinner.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let tid = spinner.join().unwrap();
    child.wait().unwrap();
    poll(&ring, Duration::from_millis(100)).unwrap();
    let ended = crate::util::timefmt::monotonic_ns();

    assert_eq!(*malformed.borrow(), 0);
    let samples = samples.borrow();
    let spun: Vec<_> = samples.iter().filter(|s| s.tid == tid).collect();
    assert!(spun.len() >= 100, "{} samples of the spinner", spun.len());
    let cpus = online_cpus().unwrap();
    for s in spun {
        assert_eq!(s.pid, me);
        assert_eq!(s.thread_comm, "ls-spinner");
        assert!(!s.kernel_thread);
        assert!(cpus.contains(&s.cpu), "cpu {}", s.cpu);
        assert!((started..=ended).contains(&s.timestamp_ns));
        assert!(!s.user_stack.is_empty());
    }
    assert!(
        events.borrow().iter().any(|e| e.event
            == crate::sampling::records::ProcessEvent::Exit { pid: child.id() }
            && (started..=crate::util::timefmt::monotonic_ns()).contains(&e.timestamp_ns)),
        "{:?}",
        events.borrow()
    );
}
