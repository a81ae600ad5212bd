//! A command the run starts itself and follows (`lightswitch record`): the
//! run puts its pid in the BPF filter (children followed), lets it start
//! once sampling is attached, and ends when it exits. The process handling
//! lives in [`crate::commands::record`]; this trait is all the run needs of it.

use anyhow::Result;

use super::progress::{self, SAME_INTERRUPT};

/// A process started held (not yet exec'd), to be profiled from its first
/// instruction.
pub trait Workload {
    /// Its process id: the first pid of the BPF filter.
    fn pid(&self) -> u32;
    /// Sampling is attached: let it exec. Errors when it could not.
    fn release(&mut self) -> Result<()>;
    /// What it is, in words, for the profile's title: its command line.
    fn describe(&self) -> String;
    /// The files its exec maps before its first instruction (its
    /// executable and ld.so), whose unwind tables the run loads before
    /// [`Self::release`].
    fn images(&self) -> Vec<std::path::PathBuf>;
    /// Whether it has exited (the run then ends).
    fn has_exited(&mut self) -> bool;
    /// A stop was asked for (SIGINT, SIGTERM): pass it on. The run goes on
    /// until the workload exits.
    fn interrupt(&mut self);
}

/// Whether the run ends now, given whether a stop was asked for (`stop`).
/// Without a workload a stop ends it. With one, the first stop is passed on
/// to it (`interrupted` remembers that) and the run ends when it exits.
/// A stop that came from an interrupt is passed on only once
/// [`SAME_INTERRUPT`] has gone by, and not at all if the interrupt was
/// delivered to the whole process group, which the workload is in: it has
/// had it already ([`progress::interrupt_reached_group`]).
pub fn ends_run(
    workload: &mut Option<&mut dyn Workload>,
    stop: bool,
    interrupted: &mut bool,
) -> bool {
    let Some(workload) = workload.as_mut() else {
        return stop;
    };
    let settled = progress::since_first_interrupt().is_none_or(|t| t >= SAME_INTERRUPT);
    if stop && !*interrupted && settled {
        *interrupted = true;
        if !progress::interrupt_reached_group() {
            workload.interrupt();
        }
    }
    workload.has_exited()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A workload that records what the run asked of it.
    #[derive(Default)]
    struct Recorded {
        interrupts: u32,
        exited: bool,
    }

    impl Workload for Recorded {
        fn pid(&self) -> u32 {
            1
        }
        fn release(&mut self) -> Result<()> {
            Ok(())
        }
        fn describe(&self) -> String {
            "recorded".into()
        }
        fn images(&self) -> Vec<std::path::PathBuf> {
            Vec::new()
        }
        fn has_exited(&mut self) -> bool {
            self.exited
        }
        fn interrupt(&mut self) {
            self.interrupts += 1;
        }
    }

    #[test]
    fn a_stop_is_passed_on_once_and_the_run_waits_for_the_exit() {
        let mut interrupted = false;
        assert!(ends_run(&mut None, true, &mut interrupted));
        assert!(!ends_run(&mut None, false, &mut interrupted));
        let mut command = Recorded::default();
        {
            let mut workload: Option<&mut dyn Workload> = Some(&mut command);
            assert!(!ends_run(&mut workload, false, &mut interrupted));
            assert!(!ends_run(&mut workload, true, &mut interrupted));
            assert!(!ends_run(&mut workload, true, &mut interrupted));
        }
        assert_eq!(command.interrupts, 1);
        command.exited = true;
        let mut workload: Option<&mut dyn Workload> = Some(&mut command);
        assert!(ends_run(&mut workload, false, &mut interrupted));
    }
}
