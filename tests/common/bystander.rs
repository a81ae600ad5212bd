//! A root bystander for whole-machine runs beside hostile neighbours: it
//! runs the known chain ([`super::CHAIN`], frame pointers) while the
//! neighbours try to stall or starve the profiler, and must keep its
//! samples.

use std::time::Duration;

use super::{Program, Stack, Workload, CHAIN};

/// The bystander program running, with its CPU time when it started.
pub struct Bystander {
    workload: Workload,
    cpu_at_start: Duration,
}

impl Bystander {
    /// Compile the chain program (named `bystander`) and start it.
    pub fn start() -> Bystander {
        let program: Program =
            super::compile("bystander", &super::chain_forever_source(), super::FP_FLAGS);
        let workload = Workload::spawn(&program);
        let cpu_at_start = workload.cpu_time();
        Bystander {
            workload,
            cpu_at_start,
        }
    }

    /// Count its CPU time from now on (call when the profiler starts).
    pub fn restart_clock(&mut self) {
        self.cpu_at_start = self.workload.cpu_time();
    }

    /// The CPU time it used since it started (or [`Self::restart_clock`]).
    pub fn cpu_so_far(&self) -> Duration {
        self.workload.cpu_time() - self.cpu_at_start
    }

    /// Stop it; the CPU time it used since it started (or
    /// [`Self::restart_clock`]).
    pub fn stop(self) -> Duration {
        self.workload.cpu_time() - self.cpu_at_start
    }
}

/// The bystander's samples in `stacks` whose user frames end with the
/// chain.
pub fn samples(stacks: &[Stack]) -> u64 {
    super::of_process(stacks, "bystander")
        .iter()
        .filter(|(frames, _)| super::ends_with_chain(&super::user_frames(frames), CHAIN))
        .map(|(_, count)| count)
        .sum()
}

/// Panic (with `context`) unless `samples` is at least 40% of `cpu` at
/// `freq_hz`: a stalled run gives none, a starved one far fewer, and a
/// loaded machine's tick placement takes some.
pub fn assert_kept(samples: u64, cpu: Duration, freq_hz: f64, context: &dyn std::fmt::Display) {
    let expected = cpu.as_secs_f64() * freq_hz;
    assert!(
        samples as f64 >= 0.4 * expected,
        "bystander: {samples} samples for {cpu:?} of CPU\n{context}"
    );
}
