//! `lightswitch record [OPTIONS] -- CMD [ARGS...]`: run a command under the
//! profiler, from its first instruction, with every process it starts.
//!
//! The command's process is forked first and held before `exec`
//! ([`launch`]); its pid seeds the BPF pid filter and the BPF program adds
//! every process a followed process forks or clones (`on_fork` in
//! `src/bpf/profiler.bpf.c`). Once the perf events are attached the child
//! is let go, and the run ([`crate::run::run_with`]) ends when it exits.
//! lightswitch then exits with the command's status (128 + N for signal N).

pub mod launch;

use anyhow::Result;

use crate::cli::RecordArgs;
use crate::run::Workload;
use launch::{HeldCommand, Identity};

impl Workload for HeldCommand {
    fn pid(&self) -> u32 {
        HeldCommand::pid(self)
    }

    fn release(&mut self) -> Result<()> {
        HeldCommand::release(self)
    }

    fn has_exited(&mut self) -> bool {
        HeldCommand::has_exited(self)
    }

    fn interrupt(&mut self) {
        // Ctrl-C at the terminal reached the command already (one process
        // group); a signal sent to lightswitch alone is passed on.
        if !foreground_of_terminal() {
            self.signal(libc::SIGINT);
        }
    }
}

/// Whether this process belongs to the foreground process group of its
/// controlling terminal (then the terminal's Ctrl-C reaches the command too).
fn foreground_of_terminal() -> bool {
    let Ok(tty) = std::fs::File::open("/dev/tty") else {
        return false;
    };
    // SAFETY: tcgetpgrp on an open descriptor; getpgrp cannot fail.
    unsafe { libc::tcgetpgrp(std::os::fd::AsRawFd::as_raw_fd(&tty)) == libc::getpgrp() }
}

/// Start `args.command` held, profile it until it exits, wait for it and
/// print the run's summary on stderr (stdout is the command's). Returns
/// lightswitch's exit status: the command's (128 + N for signal N); when
/// the command succeeded but the profile could not be written (e.g. a
/// flame graph of a command too short to be sampled), 1. A failing
/// command's status is never hidden behind the profile's failure, which is
/// still reported on stderr.
/// Errors before the command starts (not found, not executable, a bad
/// SUDO_UID) are returned.
pub fn record(args: &RecordArgs) -> Result<i32> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("record needs a command after --"))?;
    let path = launch::resolve_program(program)?;
    let identity = if args.as_root {
        None
    } else {
        Identity::from_sudo()?
    };
    let mut held = HeldCommand::spawn(&path, rest, identity.as_ref())?;
    let run = crate::run::run_with(&args.profile, Some(&mut held));
    let failure = match &run {
        Ok(summary) => {
            eprintln!("{summary}");
            summary.continuous.as_ref().and_then(|c| c.report.failure())
        }
        Err(err) => Some(format!("{err:#}")),
    };
    if let Some(failure) = &failure {
        eprintln!("error: {failure}");
    }
    // A run that failed before letting the command go leaves it held: it
    // exits without exec'ing when `held` is dropped.
    if !held.released() {
        return Ok(1);
    }
    if !held.has_exited() {
        // --duration (or an error) ended the run first: the command goes on unprofiled.
        eprintln!("waiting for the command to exit");
    }
    let code = held.exit_code()?;
    Ok(if failure.is_some() && code == 0 {
        1
    } else {
        code
    })
}
