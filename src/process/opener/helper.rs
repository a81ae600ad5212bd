//! The opener's helper: what does the opening ([`super::job`]) behind a
//! `SOCK_SEQPACKET` socket pair, one request and one reply (JSON, an opened
//! file's descriptor with it as `SCM_RIGHTS`) at a time.
//!
//! The lightswitch binary runs it as a process of its own: `/proc/self/exe`
//! executed again with [`HELPER_ARG`] (`main` calls
//! [`super::serve_if_helper`] before anything else), its end of the pair as
//! its standard input. A process, not a thread, because a read the FUSE
//! server has already taken cannot be interrupted, not even by SIGKILL
//! (`request_wait_answer` in the kernel's `fs/fuse/dev.c`), and a process
//! exits only once all its threads have: a helper stuck there is killed and
//! left behind, and the profiler itself still exits. A program that links
//! the library without calling [`super::serve_if_helper`] (tests, library
//! users) gets the same helper on a thread, which keeps sampling from
//! stalling but not the exit.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::job::{self, Reply, Request};

/// The first argument that makes the lightswitch binary a helper.
pub const HELPER_ARG: &str = "__lightswitch-opener-helper";

/// The helper process's name (`comm`), as `ps` and `top` show it.
const HELPER_COMM: &std::ffi::CStr = c"ls-opener";

/// Largest message either side sends, bytes (a request's paths, a reply's
/// segments and build ID fit many times over).
const MAX_MESSAGE: usize = 64 << 10;

/// The pids of this process's helper processes not yet reaped: their
/// samples are the profiler's own ([`is_helper`]).
static HELPER_PIDS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Whether `pid` is one of this profiler's helper processes, started and
/// not yet reaped (`--exclude-self` leaves their samples out too).
pub fn is_helper(pid: u32) -> bool {
    let pids = HELPER_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    pids.contains(&pid)
}

/// `child` was reaped: its pid may be reused.
fn reaped(child: &Child) {
    let mut pids = HELPER_PIDS.lock().unwrap_or_else(|e| e.into_inner());
    pids.retain(|&pid| pid != child.id());
}

/// Where a helper runs.
#[derive(Debug)]
enum Host {
    /// A process of its own (the lightswitch binary).
    Process(Child),
    /// A thread of this process, with the flag it sets when it ends.
    Thread(Arc<AtomicBool>),
}

/// A helper and this side's end of its socket pair.
#[derive(Debug)]
pub struct Helper {
    socket: OwnedFd,
    host: Host,
}

/// Why a helper gave no answer.
#[derive(Debug)]
pub enum AskError {
    /// Not within the deadline.
    TimedOut,
    /// The helper ended or its socket failed.
    Broken(std::io::Error),
}

impl Helper {
    /// A helper process running `program` (the lightswitch binary), or one
    /// on a thread of this process when `program` is `None`.
    pub fn start(program: Option<&Path>) -> std::io::Result<Helper> {
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        let (ours, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let host = match program {
            Some(program) => {
                use std::os::unix::process::CommandExt;
                let child = Command::new(program)
                    .arg0("lightswitch-opener")
                    .arg(HELPER_ARG)
                    // One thread, no heap profiling: it only opens files.
                    .env("_RJEM_MALLOC_CONF", "prof:false,background_thread:false")
                    .stdin(Stdio::from(theirs))
                    // Nothing of the profiler's: a helper stuck in a read
                    // must not hold the profiler's output pipes open.
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()?;
                let mut pids = HELPER_PIDS.lock().unwrap_or_else(|e| e.into_inner());
                pids.push(child.id());
                Host::Process(child)
            }
            None => {
                let ended = Arc::new(AtomicBool::new(false));
                let flag = ended.clone();
                std::thread::Builder::new()
                    .name("ls-opener".into())
                    .stack_size(256 << 10)
                    .spawn(move || {
                        serve(theirs);
                        flag.store(true, Ordering::Release);
                    })?;
                Host::Thread(ended)
            }
        };
        Ok(Helper { socket: ours, host })
    }

    /// Ask the helper to open the first of `paths` that opens; its reply
    /// and the file that came with it, waiting at most `deadline`.
    pub fn ask(
        &mut self,
        request: &Request,
        deadline: Duration,
    ) -> Result<(Reply, Option<File>), AskError> {
        let started = Instant::now();
        let message = serde_json::to_vec(request).map_err(|e| AskError::Broken(e.into()))?;
        send(&self.socket, &message, None).map_err(AskError::Broken)?;
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(AskError::TimedOut);
            }
            let timeout = rustix::event::Timespec::try_from(left).ok();
            let mut fds = [rustix::event::PollFd::new(
                &self.socket,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(0) => return Err(AskError::TimedOut),
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(err) => return Err(AskError::Broken(err.into())),
            }
        }
        let (message, file) = receive(&self.socket, RecvFlags::DONTWAIT)
            .map_err(AskError::Broken)?
            .ok_or_else(|| AskError::Broken(std::io::Error::other("the helper ended")))?;
        let reply = serde_json::from_slice(&message).map_err(|e| AskError::Broken(e.into()))?;
        Ok((reply, file))
    }

    /// Leave the helper: a process is killed (it ends at once, or when the
    /// read it waits in is answered), a thread is left to end when its job
    /// does. [`Abandoned::ended`] tells when it has.
    pub fn abandon(mut self) -> Abandoned {
        let ended = Host::Thread(Arc::new(AtomicBool::new(true)));
        let host = match std::mem::replace(&mut self.host, ended) {
            Host::Process(mut child) => {
                let _ = child.kill();
                Host::Process(child)
            }
            thread => thread,
        };
        // Dropping `self` closes our end: a thread ends once its job does.
        Abandoned { host }
    }
}

impl Drop for Helper {
    /// A helper not left behind waits for no file system: a process is
    /// killed and reaped at once, a thread ends when it sees the socket
    /// closed.
    fn drop(&mut self) {
        if let Host::Process(child) = &mut self.host {
            let _ = child.kill();
            if child.wait().is_ok() {
                reaped(child);
            }
        }
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        // A process still in its read is reaped by init once we exit.
        let _ = self.ended();
    }
}

/// A helper left behind: killed, or (a thread) left to end.
#[derive(Debug)]
pub struct Abandoned {
    host: Host,
}

impl Abandoned {
    /// Whether it has ended (a process is reaped here, without waiting).
    pub fn ended(&mut self) -> bool {
        match &mut self.host {
            Host::Process(child) => {
                let ended = !matches!(child.try_wait(), Ok(None));
                if ended {
                    reaped(child);
                }
                ended
            }
            Host::Thread(ended) => ended.load(Ordering::Acquire),
        }
    }
}

/// The helper's loop: answer requests on `socket` until the other end
/// closes it (or a message cannot be read or sent).
pub fn serve(socket: OwnedFd) {
    loop {
        let message = match receive(&socket, RecvFlags::empty()) {
            Ok(Some((message, _))) => message,
            Ok(None) | Err(_) => return,
        };
        let (reply, file) = match serde_json::from_slice::<Request>(&message) {
            Ok(request) => job::open_object(&request, job::MAX_COPY_BYTES),
            Err(err) => (
                Reply::Failed {
                    errno: None,
                    message: format!("malformed request: {err}"),
                },
                None,
            ),
        };
        let Ok(reply) = serde_json::to_vec(&reply) else {
            return;
        };
        if send(&socket, &reply, file.as_ref().map(|f| f.as_fd())).is_err() {
            return;
        }
    }
}

/// Send `message`, with `fd` as `SCM_RIGHTS` if given (no SIGPIPE when
/// the other end is gone: an error).
fn send(
    socket: &OwnedFd,
    message: &[u8],
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    loop {
        match rustix::net::sendmsg(
            socket,
            &[IoSlice::new(message)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// Receive one message and the descriptor that came with it; `None` when
/// the other end has closed.
fn receive(socket: &OwnedFd, flags: RecvFlags) -> std::io::Result<Option<(Vec<u8>, Option<File>)>> {
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        match rustix::net::recvmsg(
            socket,
            &mut [IoSliceMut::new(&mut buffer)],
            &mut control,
            flags | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(received) => break received,
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    };
    let mut file = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            // Any descriptor past the first is closed here.
            for fd in fds {
                file.get_or_insert(File::from(fd));
            }
        }
    }
    if received.bytes == 0 {
        return Ok(None);
    }
    if received
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        return Err(std::io::Error::other("a message was cut"));
    }
    buffer.truncate(received.bytes);
    Ok(Some((buffer, file)))
}

/// The helper process's `main`: name itself, answer requests on its
/// standard input (its end of the socket pair) until the profiler closes
/// it, exit.
pub fn process_main() -> ! {
    use std::os::fd::FromRawFd;
    let _ = rustix::thread::set_name(HELPER_COMM);
    // SAFETY: the helper's standard input is its socket (`Helper::start`),
    // used by nothing else in this process.
    let socket = unsafe { OwnedFd::from_raw_fd(0) };
    serve(socket);
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_helper_opens_and_ends_when_left() {
        let mut helper = Helper::start(None).unwrap();
        let exe = std::env::current_exe().unwrap();
        let request = Request {
            paths: vec![b"/nonexistent".to_vec(), {
                use std::os::unix::ffi::OsStrExt;
                exe.as_os_str().as_bytes().to_vec()
            }],
        };
        let (reply, file) = helper.ask(&request, Duration::from_secs(10)).unwrap();
        let Reply::Opened {
            bytes,
            load_segments,
            copied_from,
            ..
        } = reply
        else {
            panic!("{reply:?}");
        };
        assert_eq!(file.unwrap().metadata().unwrap().len(), bytes);
        assert!(!load_segments.is_empty() && copied_from.is_none());
        let mut left = helper.abandon();
        let started = Instant::now();
        while !left.ended() {
            assert!(started.elapsed() < Duration::from_secs(10), "never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A helper process is known as the profiler's own (`--exclude-self`)
    /// from its start until it is reaped, whether dropped or left behind.
    #[test]
    fn helper_processes_are_known_until_reaped() {
        // `sleep` stands for the binary: it refuses the helper's argument
        // and ends, but stays a helper of ours until reaped all the same.
        let sleep = Path::new("/bin/sleep");
        let pid_of = |helper: &Helper| match &helper.host {
            Host::Process(child) => child.id(),
            Host::Thread(_) => panic!("a process was asked for"),
        };
        let dropped = Helper::start(Some(sleep)).unwrap();
        let pid = pid_of(&dropped);
        assert!(is_helper(pid));
        drop(dropped);
        assert!(!is_helper(pid));
        let left = Helper::start(Some(sleep)).unwrap();
        let pid = pid_of(&left);
        let mut left = left.abandon();
        assert!(is_helper(pid), "until reaped");
        let started = Instant::now();
        while !left.ended() {
            assert!(started.elapsed() < Duration::from_secs(10), "never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!is_helper(pid));
    }
}
