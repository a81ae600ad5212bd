//! Running the profiler from a test: to completion with a timeout
//! ([`run`], [`Lightswitch`]), as a server that says where it listens
//! ([`spawn_listening`]), or beside a workload ([`profile_workload`]).

use super::*;

/// Start `cmd` (an agent with `--listen`, or `lightswitch collector`) with
/// its stdout piped, and wait at most `timeout` for its first stdout line,
/// the banner `listening on http://127.0.0.1:PORT[, ...]`. Returns the
/// child, the `http://127.0.0.1:PORT` URL and the stdout lines after the
/// banner (read until the child closes its stdout, whether or not anyone
/// receives them, so that the child never writes into a closed pipe).
/// Panics when no banner comes in time or it names no such URL.
pub fn spawn_listening(
    mut cmd: Command,
    timeout: Duration,
) -> (Child, String, mpsc::Receiver<String>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let banner = rx
        .recv_timeout(timeout)
        .unwrap_or_else(|_| panic!("{cmd:?} did not say where it listens within {timeout:?}"));
    let url = banner
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("unexpected banner {banner:?}"))
        .trim_end_matches(',')
        .to_string();
    (child, url, rx)
}

/// The environment variable that forces the BPF programs' variant
/// (`src/sampling/sampler/variant.rs`): `compat` loads the build for kernels without
/// `bpf_loop` on this machine's kernel, which has everything.
pub const FORCE_VARIANT_ENV: &str = "LIGHTSWITCH_BPF_VARIANT";

thread_local! {
    /// The variant every profiler this thread starts is forced to load.
    static FORCED_VARIANT: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// Run `f` with every profiler it starts on this thread forced to load the
/// BPF programs' `variant` (through [`FORCE_VARIANT_ENV`]); each of them
/// that exits successfully must have said on stderr that it loaded it.
/// The existing tests of stacks run inside it check the compat variant on
/// every CI run, not only under qemu on an old kernel.
pub fn with_bpf_variant<R>(variant: &'static str, f: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FORCED_VARIANT.with(|v| v.set(None));
        }
    }
    FORCED_VARIANT.with(|v| v.set(Some(variant)));
    let _reset = Reset;
    f()
}

/// A running `lightswitch`; killed and reaped on drop.
pub struct Lightswitch {
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    done: bool,
    /// The BPF programs' variant it was forced to load ([`with_bpf_variant`]).
    forced_variant: Option<&'static str>,
}

fn collect<R: Read + Send + 'static>(mut reader: R) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = reader.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

impl Lightswitch {
    /// Start the profiler with `args`.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(args);
        Self::spawn_command(cmd)
    }

    /// Start `cmd` (the profiler, possibly behind a wrapper like `setpriv`).
    pub fn spawn_command(mut cmd: Command) -> Self {
        let forced_variant = FORCED_VARIANT.with(|v| v.get());
        if let Some(variant) = forced_variant {
            cmd.env(FORCE_VARIANT_ENV, variant);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let stdout = collect(child.stdout.take().unwrap());
        let stderr = collect(child.stderr.take().unwrap());
        Lightswitch {
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
            done: false,
            forced_variant,
        }
    }

    /// The profiler's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Wait until the profiler holds perf event file descriptors, that is,
    /// it is starting to sample (its signal handler is installed before;
    /// the BPF program is attached to the events right after, so callers
    /// that need samples flowing wait a little longer). Returns false if it
    /// exited or `timeout` passed first.
    pub fn wait_sampling(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let fd_dir = format!("/proc/{}/fd", self.pid());
        while Instant::now() < deadline {
            if !self.is_running() {
                return false;
            }
            let perf_fds = fs::read_dir(&fd_dir)
                .map(|dir| {
                    dir.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
                        .filter(|target| target.to_string_lossy().contains("[perf_event]"))
                        .count()
                })
                .unwrap_or(0);
            if perf_fds > 0 {
                return true;
            }
            thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Send `signal` to the profiler.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: plain kill(2) on our own child.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal}) failed", self.pid());
    }

    /// Panic (with the profiler's output) unless it starts sampling
    /// within 30 s.
    pub fn expect_sampling(&mut self) {
        if !self.wait_sampling(Duration::from_secs(30)) {
            let out = self.finish(Duration::from_secs(5));
            panic!("lightswitch did not start sampling:\n{out}");
        }
    }

    /// Wait for the profiler to exit; panic (after killing it) if it runs
    /// longer than `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let output = self.finish(timeout);
        assert!(
            Instant::now() < deadline,
            "lightswitch did not exit within {timeout:?} (killed):\n{output}"
        );
        output
    }

    /// Wait at most `timeout` for the profiler to exit, then kill it, and
    /// collect what it printed.
    fn finish(&mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break self.child.wait().expect("wait");
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.done = true;
        let output = Output {
            status,
            stdout: self.stdout.take().unwrap().join().unwrap(),
            stderr: self.stderr.take().unwrap().join().unwrap(),
        };
        if let Some(variant) = self.forced_variant.filter(|_| output.status.success()) {
            let said = format!("loading the {variant} BPF programs: forced by {FORCE_VARIANT_ENV}");
            assert!(
                output.stderr.contains(&said),
                "the profiler did not say {said:?}:\n{output}"
            );
        }
        output
    }
}

impl Drop for Lightswitch {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A profiler run on a busy workload, with the CPU time the workload used.
pub struct Profiled {
    pub out: Output,
    /// Workload CPU time from just before the profiler started to its exit.
    pub cpu_total: Duration,
    /// Workload CPU time in the first `window` seconds after the profiler
    /// opened its perf events (it samples at least that long).
    pub cpu_window: Duration,
}

impl Profiled {
    /// Assert that `samples` of the workload is plausible at `freq` Hz given
    /// the CPU time the workload used: well below twice what its CPU time
    /// allows (nothing counted twice), and not far below what it used while
    /// certainly sampled. Robust on a loaded machine, where the workload gets
    /// less CPU and so fewer samples, and where which task a CPU-wide timer
    /// tick lands on is statistical (under heavy overload a spinning task
    /// was seen to get only 0.35x its share).
    pub fn assert_plausible(&self, samples: u64, freq: f64) {
        let upper = self.cpu_total.as_secs_f64() * freq * 1.5 + 20.0;
        let lower = 0.25 * freq * self.cpu_window.as_secs_f64();
        let n = samples as f64;
        assert!(
            n <= upper && n >= lower,
            "{samples} samples is implausible for a workload that used {:?} of CPU ({:?} while \
             certainly sampled) at {freq} Hz: expected {lower:.0} ..= {upper:.0}\n{}",
            self.cpu_total,
            self.cpu_window,
            self.out
        );
    }
}

/// Run the profiler with `args`, which profile `workload` with
/// `--duration window`, and measure the workload's CPU time meanwhile.
pub fn profile_workload<S: AsRef<std::ffi::OsStr>>(
    workload: &Workload,
    args: &[S],
    window: f64,
) -> Profiled {
    let cpu_start = workload.cpu_time();
    let mut profiler = Lightswitch::spawn(args);
    profiler.expect_sampling();
    let cpu_window_start = workload.cpu_time();
    thread::sleep(Duration::from_secs_f64(window));
    let cpu_window = workload.cpu_time() - cpu_window_start;
    let out = profiler.wait(Duration::from_secs(60));
    let cpu_end = workload.cpu_time();
    Profiled {
        out,
        cpu_total: cpu_end - cpu_start,
        cpu_window,
    }
}

/// The arguments of a whole-machine run of `seconds` at 999 Hz that writes
/// folded stacks into the directory `out` (as `folded.txt`), with no unwind-table
/// disk cache, so nothing is shared with other runs.
pub fn folded_run_args<'a>(seconds: &'a str, out: &'a Path) -> [&'a str; 10] {
    let out = out.to_str().expect("UTF-8 path");
    [
        "--duration",
        seconds,
        "-F",
        "999",
        "--profile-format",
        "folded",
        "--unwind-cache-dir",
        "none",
        "--profile-path",
        out,
    ]
}

/// Run the profiler with `args` to completion (at most `timeout`).
pub fn run<S: AsRef<std::ffi::OsStr>>(args: &[S], timeout: Duration) -> Output {
    Lightswitch::spawn(args).wait(timeout)
}

/// Run `cmd` (the profiler behind a wrapper) to completion.
pub fn run_command(cmd: Command, timeout: Duration) -> Output {
    Lightswitch::spawn_command(cmd).wait(timeout)
}
