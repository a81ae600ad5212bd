//! Starting `record`'s command held at the door: the child process exists
//! (so its pid can go into the BPF filter) but waits, before `exec`, until
//! the profiler is attached and [`HeldCommand::release`] lets it go. Then
//! waiting for it, passing interrupts on, and turning how it ended into an
//! exit status.
//!
//! The child is started by `std::process::Command` with a `pre_exec` hook
//! that writes the child's pid into one pipe and blocks reading another.
//! `Command::spawn` only returns once the child has exec'd, so it runs on a
//! thread of its own while the caller reads the pid from the first pipe;
//! that thread then waits for the child and reports its exit.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::mpsc::{self, Receiver, TryRecvError};

use anyhow::{anyhow, bail, Context, Result};

use crate::output::sudo::Identity;

/// Exit status for a command that was not found, as shells give it.
pub const NOT_FOUND_EXIT_STATUS: i32 = 127;

/// Exit status for a command that was found but cannot be executed (no
/// execute permission, a directory, not a program the kernel runs), as
/// shells give it.
pub const NOT_EXECUTABLE_EXIT_STATUS: i32 = 126;

/// Why the command could not be run, with the exit status a shell gives for
/// it ([`NOT_FOUND_EXIT_STATUS`] or [`NOT_EXECUTABLE_EXIT_STATUS`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CannotRun {
    /// 127 (not found) or 126 (found, not executable).
    pub status: i32,
    /// What was wrong, naming the command.
    pub message: String,
}

impl CannotRun {
    pub(super) fn not_found(message: String) -> anyhow::Error {
        CannotRun {
            status: NOT_FOUND_EXIT_STATUS,
            message,
        }
        .into()
    }

    pub(super) fn not_executable(message: String) -> anyhow::Error {
        CannotRun {
            status: NOT_EXECUTABLE_EXIT_STATUS,
            message,
        }
        .into()
    }

    /// The [`CannotRun`] for an error of `execve` itself (the command's
    /// file went between the check and the exec, or is not a program the
    /// kernel can run): `ENOENT` is not found, `EACCES`, `ENOEXEC`, ... not
    /// executable. `None` when `err` has no such cause.
    pub fn of_exec_error(err: &anyhow::Error) -> Option<CannotRun> {
        let errno = err
            .chain()
            .find_map(|e| e.downcast_ref::<ExecFailed>()?.0.raw_os_error())?;
        let status = match errno {
            libc::ENOENT => NOT_FOUND_EXIT_STATUS,
            libc::EACCES | libc::ENOEXEC | libc::EISDIR | libc::ETXTBSY | libc::EPERM => {
                NOT_EXECUTABLE_EXIT_STATUS
            }
            _ => return None,
        };
        Some(CannotRun {
            status,
            message: format!("{err:#}"),
        })
    }
}

/// `execve`'s own failure, as the child reported it: kept apart from the
/// run's other I/O errors (an output file that cannot be written is not a
/// command that cannot run).
#[derive(Debug, thiserror::Error)]
#[error("executing the command")]
struct ExecFailed(#[source] std::io::Error);

/// What the spawner thread reports about the child.
#[derive(Debug)]
enum ChildEvent {
    /// It exec'd the command.
    Started,
    /// It could not (the hook failed, or exec did).
    Failed(std::io::Error),
    /// It exited (reaped by the spawner thread).
    Exited(std::io::Result<ExitStatus>),
}

/// A started child process waiting to exec its command.
///
/// The thread that forks the child (the spawner) stays with it until it
/// exits and reaps it: a child that asked to die with its parent
/// (`PR_SET_PDEATHSIG`) is signalled when the thread that forked it ends.
#[derive(Debug)]
pub struct HeldCommand {
    pid: u32,
    /// The program it execs, as resolved (`PATH` searched).
    program: PathBuf,
    /// The command as typed and its arguments, as a shell would take them
    /// (quoted where needed), for titles.
    command_line: String,
    /// Write end of the "go" pipe: one byte releases the child, closing it
    /// without one makes the child exit without exec'ing.
    go: Option<File>,
    events: Receiver<ChildEvent>,
    started: bool,
    status: Option<std::io::Result<ExitStatus>>,
}

/// A pipe's (read, write) ends, both close-on-exec.
fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating a pipe");
    }
    // SAFETY: the kernel just returned these and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl HeldCommand {
    /// Start `program` (a path from [`super::program::resolve_program`]) with `argv0` (the
    /// name as the user typed it, as a shell passes it: `ls`, not
    /// `/usr/bin/ls`) and `args`, the caller's stdin/stdout/stderr and
    /// environment, as `identity` when given (then with its `HOME`, `USER`
    /// and `LOGNAME`); the child waits before exec until
    /// [`HeldCommand::release`]. With `stdout_to_stderr` (the profile is
    /// written to standard output) the command's standard output is the
    /// caller's standard error, so that the two do not mix.
    pub fn spawn(
        program: &Path,
        argv0: &OsStr,
        args: &[OsString],
        identity: Option<&Identity>,
        stdout_to_stderr: bool,
    ) -> Result<Self> {
        let (pid_read, pid_write) = pipe()?;
        let (go_read, go_write) = pipe()?;
        let mut command = Command::new(program);
        command.arg0(argv0).args(args);
        if stdout_to_stderr {
            let stderr = std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .context("duplicating standard error")?;
            command.stdout(std::process::Stdio::from(stderr));
        }
        // As `sudo -u USER` would: the user's own HOME, USER and LOGNAME.
        if let Some(id) = identity {
            if let Some(home) = &id.home {
                command.env("HOME", home);
            }
            if let Some(name) = &id.name {
                command.env("USER", name).env("LOGNAME", name);
            }
        }
        let identity = identity.cloned();
        let (pid_read_fd, pid_write_fd) = (pid_read.as_raw_fd(), pid_write.as_raw_fd());
        let (go_read_fd, go_write_fd) = (go_read.as_raw_fd(), go_write.as_raw_fd());
        // SAFETY: the hook runs in the forked child and calls only
        // async-signal-safe functions (close, setgroups, setgid, setuid,
        // getpid, write, read); it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                child_wait_for_go(
                    pid_read_fd,
                    pid_write_fd,
                    go_read_fd,
                    go_write_fd,
                    identity.as_ref(),
                )
            });
        }
        // The child's ends stay open until the fork has happened (spawn
        // returns after it), so that the child inherits them; closing the
        // pid pipe's write end then lets a child that died early show as
        // end-of-file below.
        let (tx, events) = mpsc::channel();
        // The thread's name is the child's comm until exec: samples taken
        // in the kernel during exec then carry the command's name.
        let mut comm: String = program
            .file_name()
            .map_or_else(|| "record".into(), |n| n.to_string_lossy().into_owned());
        while comm.len() > 15 {
            comm.pop();
        }
        std::thread::Builder::new()
            .name(comm)
            .spawn(move || {
                let spawned = command.spawn();
                drop((pid_write, go_read));
                match spawned {
                    Ok(mut child) => {
                        let _ = tx.send(ChildEvent::Started);
                        let _ = tx.send(ChildEvent::Exited(child.wait()));
                    }
                    Err(err) => {
                        let _ = tx.send(ChildEvent::Failed(err));
                    }
                }
            })
            .context("starting the command's spawner thread")?;
        let mut pid_bytes = [0u8; 4];
        let read = File::from(pid_read).read_exact(&mut pid_bytes);
        let parts: Vec<String> = std::iter::once(argv0)
            .chain(args.iter().map(OsString::as_os_str))
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        // Quoted as a shell would need it (`./bench --name 'a b'`); an
        // argument cannot hold the NUL that would make quoting fail.
        let command_line =
            shlex::try_join(parts.iter().map(String::as_str)).unwrap_or_else(|_| parts.join(" "));
        let mut held = HeldCommand {
            pid: u32::from_ne_bytes(pid_bytes),
            program: program.to_path_buf(),
            command_line,
            go: Some(File::from(go_write)),
            events,
            started: false,
            status: None,
        };
        if read.is_err() {
            // The child never reached the hook: spawn failed before or at fork.
            let err = held.wait_started().err();
            return Err(err.unwrap_or_else(|| anyhow!("the command's process did not start")))
                .with_context(|| format!("starting {}", program.display()));
        }
        Ok(held)
    }

    /// The child's pid (its process id before and after exec).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The program the child execs, as resolved (`PATH` searched).
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The command as typed and its arguments, quoted where a shell would
    /// need it (`make -j2`, `./bench --name 'a b'`).
    pub fn command_line(&self) -> &str {
        &self.command_line
    }

    /// Let the child exec its command; errors when exec failed.
    pub fn release(&mut self) -> Result<()> {
        if let Some(mut go) = self.go.take() {
            go.write_all(&[1]).context("releasing the command")?;
        }
        self.wait_started()
    }

    /// Wait for the spawner's first report: started, or why not.
    fn wait_started(&mut self) -> Result<()> {
        if self.started {
            return Ok(());
        }
        match self.events.recv() {
            Ok(ChildEvent::Started) => {
                self.started = true;
                Ok(())
            }
            Ok(ChildEvent::Failed(err)) => Err(ExecFailed(err).into()),
            Ok(ChildEvent::Exited(_)) | Err(_) => bail!("the command's spawner thread ended early"),
        }
    }

    /// Whether the command was let go and exec'd.
    pub fn released(&self) -> bool {
        self.started
    }

    /// Whether the command has exited (its status is then
    /// [`HeldCommand::exit_code`]'s).
    pub fn has_exited(&mut self) -> bool {
        if self.started && self.status.is_none() {
            match self.events.try_recv() {
                Ok(ChildEvent::Exited(status)) => self.status = Some(status),
                Ok(_) | Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    self.status = Some(Err(std::io::Error::other("the spawner thread ended")))
                }
            }
        }
        self.status.is_some()
    }

    /// Send `signal` to the command (nothing if it has exited).
    pub fn signal(&mut self, signal: libc::c_int) {
        if self.started && !self.has_exited() {
            // SAFETY: kill(2) of our child, which the spawner thread has not
            // reported reaped (a narrow window remains between its reaping
            // and this check).
            unsafe { libc::kill(self.pid as libc::pid_t, signal) };
        }
    }

    /// Wait for the command to exit and return lightswitch's exit status
    /// for it: its exit code, or 128 + N when signal N killed it.
    pub fn exit_code(&mut self) -> Result<i32> {
        if !self.started {
            bail!("the command never started");
        }
        while self.status.is_none() {
            match self.events.recv() {
                Ok(ChildEvent::Exited(status)) => self.status = Some(status),
                Ok(_) => {}
                Err(_) => bail!("the command's spawner thread ended early"),
            }
        }
        match self.status.as_ref().context("the command's status")? {
            Ok(status) => Ok(exit_code(*status)),
            Err(err) => Err(anyhow!("waiting for the command: {err}")),
        }
    }
}

impl Drop for HeldCommand {
    fn drop(&mut self) {
        // Never released: closing the go pipe makes the child exit.
        self.go.take();
    }
}

/// A shell's exit status for how a process ended: its exit code, or
/// 128 + N for signal N.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|n| 128 + n))
        .unwrap_or(1)
}

/// The name (`comm`, at most 15 bytes) of the command's process from fork
/// to exec: samples of it before the command's first instruction (the
/// launcher waiting for the go byte, the old image torn down in `execve`)
/// are under this name, as perf puts its own under `perf-exec`.
pub const HELD_COMM: &std::ffi::CStr = c"lightswitch-exe";

/// The `pre_exec` hook: in the forked child, drop the descriptors of the
/// parent's ends, take on `identity`, rename itself [`HELD_COMM`], report our pid, wait for the go
/// byte, and set SIGINT and SIGQUIT to their default action. A closed go pipe (the profiler failed to start) fails the hook,
/// so the child exits without exec'ing.
fn child_wait_for_go(
    pid_read: libc::c_int,
    pid_write: libc::c_int,
    go_read: libc::c_int,
    go_write: libc::c_int,
    identity: Option<&Identity>,
) -> std::io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: async-signal-safe system calls on descriptors and buffers this
    // child owns; `groups` was allocated before the fork.
    unsafe {
        libc::close(pid_read);
        libc::close(go_write);
        if let Some(id) = identity {
            check(libc::setgroups(id.groups.len(), id.groups.as_ptr()))?;
            check(libc::setgid(id.gid))?;
            check(libc::setuid(id.uid))?;
        }
        // Until exec names it after the command, the held process is the
        // launcher's: its few samples (waiting, exec'ing) are not the
        // command's.
        libc::prctl(libc::PR_SET_NAME, HELD_COMM.as_ptr());
        let pid = libc::getpid().to_ne_bytes();
        check(libc::write(pid_write, pid.as_ptr().cast(), pid.len()) as libc::c_int)?;
        libc::close(pid_write);
        let mut byte = 0u8;
        loop {
            let n = libc::read(go_read, (&mut byte as *mut u8).cast(), 1);
            if n == 1 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if n < 0 && err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            // The profiler did not start: leave at once. Returning an error
            // would have the standard library report it to a parent that
            // may already be exiting (an abort message on stderr).
            libc::_exit(1);
        }
        libc::close(go_read);
        // The command starts with interrupts at their default action, as
        // from an interactive shell, even when lightswitch was started with
        // them ignored (a background job of a script inherits SIG_IGN, and
        // exec keeps it): the SIGINT lightswitch forwards must stop it.
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGQUIT, libc::SIG_DFL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_errors_get_a_shells_status() {
        let exec_error = |errno| {
            anyhow::Error::from(ExecFailed(std::io::Error::from_raw_os_error(errno)))
                .context("starting the run")
        };
        let status = |errno| CannotRun::of_exec_error(&exec_error(errno)).map(|c| c.status);
        assert_eq!(status(libc::ENOENT), Some(NOT_FOUND_EXIT_STATUS));
        assert_eq!(status(libc::EACCES), Some(NOT_EXECUTABLE_EXIT_STATUS));
        assert_eq!(status(libc::ENOEXEC), Some(NOT_EXECUTABLE_EXIT_STATUS));
        assert_eq!(status(libc::ECANCELED), None);
        // The same errno from anything but execve is not the command's.
        let output_error = Err::<(), _>(std::io::Error::from_raw_os_error(libc::ENOENT))
            .context("output file x.svg is not writable")
            .unwrap_err();
        assert!(CannotRun::of_exec_error(&output_error).is_none());
        let message = CannotRun::of_exec_error(&exec_error(libc::EACCES))
            .unwrap()
            .message;
        assert!(
            message.starts_with("starting the run: executing the command: "),
            "{message}"
        );
    }
}
