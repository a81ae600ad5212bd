//! `lightswitch record [OPTIONS] -- CMD [ARGS...]`: run a command under the
//! profiler, from its first instruction, with every process it starts.
//!
//! The command's process is forked first and held before `exec`
//! ([`launch`]); its pid seeds the BPF pid filter and the BPF program adds
//! every process a followed process forks or clones (`on_fork` in
//! `src/sampling/bpf/process.h`). Once the perf events are attached the child
//! is let go, and the run ([`crate::agent::run::run_with`]) ends when it exits.
//! lightswitch then exits with the command's status (128 + N for signal N).

mod images;
pub mod launch;
mod program;

use std::ffi::OsString;

use anyhow::Result;

use crate::agent::run::{RunPlan, Workload};
use crate::output::sudo::{give_outputs_to, Identity};
use launch::{CannotRun, HeldCommand};

impl Workload for HeldCommand {
    fn pid(&self) -> u32 {
        HeldCommand::pid(self)
    }

    fn release(&mut self) -> Result<()> {
        HeldCommand::release(self)
    }

    fn describe(&self) -> String {
        self.command_line().to_string()
    }

    fn images(&self) -> Vec<std::path::PathBuf> {
        images::exec_images(self.program())
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

/// What `record` does: the command it runs and the run's plan (built from
/// `lightswitch record`'s flags by `crate::commands::cli`, or in code).
#[derive(Debug, Clone)]
pub struct RecordPlan {
    /// How to profile. Its `pids` must be empty: the command's process,
    /// and every process it starts, are profiled instead.
    pub run: RunPlan,
    /// The command and its arguments (the program is looked up in `PATH`).
    pub command: Vec<OsString>,
    /// Run the command as root even when started through sudo (by default
    /// it runs as the invoking user, `SUDO_UID`/`SUDO_GID`).
    pub as_root: bool,
}

/// `record`'s exit status when it failed itself (the profile could not be
/// made or written, or the command could not be started for a reason other
/// than those of 126 and 127), as `env`, `nice` and `timeout` exit 125: a
/// status a command rarely has, so that a script can tell it from the
/// command's own failure.
pub const OWN_FAILURE_STATUS: i32 = 125;

/// Start `plan.command` held, profile it until it exits, wait for it and
/// print the run's summary on stderr (stdout is the command's). Returns
/// lightswitch's exit status: the command's (128 + N for signal N; 126 or
/// 127 when it could not be executed or found, as shells give); when
/// the command succeeded but the profile could not be written (e.g. a
/// flame graph of a command too short to be sampled),
/// [`OWN_FAILURE_STATUS`]. A failing
/// command's status is never hidden behind the profile's failure, which is
/// still reported on stderr.
/// Errors before the command starts are returned: a [`CannotRun`] (not
/// found, not executable, an empty name) or another error (a bad
/// SUDO_UID). Started through sudo, the files written are given to the
/// invoking user.
pub fn record(plan: &RecordPlan) -> Result<i32> {
    if !plan.run.pids.is_empty() {
        anyhow::bail!("record profiles its command and what it starts: --pids does not apply");
    }
    let (program, rest) = plan.command.split_first().ok_or_else(|| {
        anyhow::anyhow!("record needs a command: lightswitch record [OPTIONS] [--] CMD [ARGS...]")
    })?;
    let path = program::resolve_program(program)?;
    let identity = if plan.as_root {
        None
    } else {
        Identity::from_sudo()?
    };
    // The profile on standard output (`--profile-name -`): the command's
    // own output goes to standard error instead.
    let profile_on_stdout = plan
        .run
        .outputs
        .iter()
        .any(|(_, path)| crate::util::files::is_stdout(path));
    let mut held = HeldCommand::spawn(&path, program, rest, identity.as_ref(), profile_on_stdout)?;
    let created = identity
        .as_ref()
        .map(|_| plan.run.directories_to_create())
        .unwrap_or_default();
    let run = crate::agent::run::run_with(&plan.run, Some(&mut held));
    let failure = match &run {
        Ok(summary) => {
            eprintln!("{summary}");
            if let Some(id) = &identity {
                give_outputs_to(id, &summary.outputs, &created);
            }
            summary.continuous.as_ref().and_then(|c| c.report.failure())
        }
        Err(err)
            if err
                .chain()
                .any(|e| e.is::<crate::profile::format::EmptyProfile>()) =>
        {
            Some(format!(
            "{err:#}: the command ran too briefly to be sampled at {} Hz (raise --sample-freq, \
             or write folded stacks or pprof, which can hold an empty profile)",
            plan.run.sample_freq_hz
        ))
        }
        Err(err) => Some(format!("{err:#}")),
    };
    if let Some(failure) = &failure {
        eprintln!("error: {failure}");
    }
    // A run that failed before letting the command go leaves it held: it
    // exits without exec'ing when `held` is dropped. When exec itself
    // failed, the status is a shell's for it (126, 127).
    if !held.released() {
        let exec_failure = run.as_ref().err().and_then(CannotRun::of_exec_error);
        return Ok(exec_failure.map_or(OWN_FAILURE_STATUS, |e| e.status));
    }
    if !held.has_exited() {
        // --duration (or an error) ended the run first: the command goes on unprofiled.
        eprintln!("waiting for the command to exit");
    }
    let code = held.exit_code()?;
    Ok(if failure.is_some() && code == 0 {
        OWN_FAILURE_STATUS
    } else {
        code
    })
}
