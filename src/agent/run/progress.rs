//! What a run tells the person at the terminal while it goes: one status
//! line on stderr (only when stderr is a terminal), and what the first and
//! second Ctrl-C (or SIGTERM, SIGHUP) do.

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::sampling::records::UnwindStatus;
use crate::util::text::plural;

/// Exit status of a run ended by a second interrupt (128 + SIGINT).
pub const INTERRUPTED_EXIT_STATUS: i32 = 130;

/// What the first and the second interrupt say.
#[derive(Debug, Clone, Copy)]
pub struct StopWords {
    /// After `stopping, `: what happens now, e.g. `writing the profile once
    /// the command exits`.
    pub first: &'static str,
    /// After `interrupted again: exiting now`: what is lost, e.g. `, no
    /// profile written` (empty when nothing is).
    pub again: &'static str,
}

impl StopWords {
    /// A run that writes a profile (or windows) when it stops; `what` says
    /// what happens (e.g. `writing the profile once the command exits`).
    pub const fn writing(what: &'static str) -> StopWords {
        StopWords {
            first: what,
            again: ", no profile written",
        }
    }
}

/// Install the stop handler for a run: the first SIGINT, SIGTERM or SIGHUP
/// sets the returned flag (the run then stops and writes its profile, if
/// it writes one), cuts debuginfod requests ([`crate::symbolize::debuginfod::cancel`])
/// and prints `stopping, ` and `words.first`; a second one
/// ends the process at once with status 130 and says so (with
/// `words.again`). The process's handler is installed by the first run
/// and serves every later one (a library may run several, one at a time):
/// each call points it at a new flag and starts the count afresh. Errors
/// if the process has another handler (ctrlc's) already.
///
/// An interrupt that arrives within [`SAME_INTERRUPT`] of the first is the
/// first one delivered again (to the whole process group: `timeout -s INT`,
/// `kill -INT -PGID`), not a second: it is counted
/// ([`interrupt_reached_group`]) and otherwise ignored.
pub fn install_stop_handler(words: StopWords) -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    INTERRUPTS.store(0, Ordering::SeqCst);
    FIRST_INTERRUPT_NS.store(0, Ordering::SeqCst);
    REPEATED_INTERRUPTS.store(0, Ordering::SeqCst);
    *lock_current() = Some((stop.clone(), words));
    crate::symbolize::debuginfod::resume();
    // With the "termination" feature this covers SIGINT, SIGTERM and SIGHUP;
    // the handler runs on a thread of its own.
    INSTALLED
        .get_or_init(|| ctrlc::set_handler(on_interrupt).map_err(|err| err.to_string()))
        .clone()
        .map_err(anyhow::Error::msg)
        .context("installing the SIGINT/SIGTERM handler")?;
    Ok(stop)
}

/// The stop flag and words of the run the handler serves now.
static CURRENT: Mutex<Option<(Arc<AtomicBool>, StopWords)>> = Mutex::new(None);

/// Interrupts since the current run installed the handler.
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Whether the process's handler was installed, or why it could not be.
static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

fn lock_current() -> std::sync::MutexGuard<'static, Option<(Arc<AtomicBool>, StopWords)>> {
    CURRENT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The process's handler: what an interrupt does to the current run
/// ([`install_stop_handler`]).
fn on_interrupt() {
    let Some((flag, words)) = lock_current().clone() else {
        return;
    };
    let clear = if std::io::stderr().is_terminal() {
        "\r\x1b[K"
    } else {
        ""
    };
    let now = crate::util::timefmt::monotonic_ns();
    if INTERRUPTS.fetch_add(1, Ordering::SeqCst) == 0 {
        FIRST_INTERRUPT_NS.store(now, Ordering::SeqCst);
        flag.store(true, Ordering::SeqCst);
        // A stop is never delayed by a debuginfod server (docs/symbols.md).
        crate::symbolize::debuginfod::cancel();
        eprintln!(
            "{clear}stopping, {} (interrupt again to quit at once)",
            words.first
        );
    } else if now.saturating_sub(FIRST_INTERRUPT_NS.load(Ordering::SeqCst))
        < SAME_INTERRUPT.as_nanos() as u64
    {
        REPEATED_INTERRUPTS.fetch_add(1, Ordering::SeqCst);
    } else {
        eprintln!("{clear}interrupted again: exiting now{}", words.again);
        std::process::exit(INTERRUPTED_EXIT_STATUS);
    }
}

/// Interrupts closer together than this are one interrupt delivered twice:
/// `timeout -s INT` and `kill -INT -PGID` signal lightswitch and its whole
/// process group (lightswitch again, and `record`'s command) within
/// microseconds; a person pressing Ctrl-C twice takes longer.
pub const SAME_INTERRUPT: Duration = Duration::from_millis(250);

/// When the first interrupt arrived (CLOCK_MONOTONIC ns; 0: none yet).
static FIRST_INTERRUPT_NS: AtomicU64 = AtomicU64::new(0);

/// Interrupts that arrived within [`SAME_INTERRUPT`] of the first.
static REPEATED_INTERRUPTS: AtomicU32 = AtomicU32::new(0);

/// Time since the first interrupt ([`install_stop_handler`]); `None`
/// before one arrived.
pub fn since_first_interrupt() -> Option<Duration> {
    match FIRST_INTERRUPT_NS.load(Ordering::SeqCst) {
        0 => None,
        first => Some(Duration::from_nanos(
            crate::util::timefmt::monotonic_ns().saturating_sub(first),
        )),
    }
}

/// Whether the first interrupt was delivered again within
/// [`SAME_INTERRUPT`]: it was sent to the whole process group, so a command
/// in that group has had it too.
pub fn interrupt_reached_group() -> bool {
    REPEATED_INTERRUPTS.load(Ordering::SeqCst) > 0
}

/// How often the status line is redrawn, at most.
const REFRESH: Duration = Duration::from_secs(1);

/// The status line: elapsed time, samples, lost samples, processes sampled
/// and the share of complete stacks, redrawn at most once a second.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    last_drawn: Instant,
    samples: u64,
    complete: u64,
    pids: HashSet<u32>,
    drawn: bool,
}

impl Progress {
    /// A status line on stderr, or `None` when stderr is not a terminal
    /// (then nothing extra is printed).
    pub fn on_terminal(start: Instant) -> Option<Self> {
        std::io::stderr().is_terminal().then(|| Progress {
            start,
            last_drawn: start,
            samples: 0,
            complete: 0,
            pids: HashSet::new(),
            drawn: false,
        })
    }

    /// Count one sample of process `pid` whose user walk ended with `status`.
    pub fn sample(&mut self, pid: u32, status: UnwindStatus) {
        self.samples += 1;
        if matches!(status, UnwindStatus::Complete | UnwindStatus::NoUserStack) {
            self.complete += 1;
        }
        self.pids.insert(pid);
    }

    /// Redraw the line if a second has passed since the last time; `lost`
    /// gives the samples lost so far (only called when drawing).
    pub fn tick(&mut self, lost: impl FnOnce() -> u64) {
        if self.last_drawn.elapsed() < REFRESH {
            return;
        }
        self.last_drawn = Instant::now();
        let line = self.line(lost());
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[K{line}");
        let _ = stderr.flush();
        self.drawn = true;
    }

    /// The text of the status line.
    fn line(&self, lost: u64) -> String {
        let complete = if self.samples == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", 100.0 * self.complete as f64 / self.samples as f64)
        };
        format!(
            "lightswitch: {:.0}s, {}, {lost} lost, {}, {complete} complete stacks",
            self.start.elapsed().as_secs_f64(),
            plural(self.samples, "sample", "samples"),
            plural(self.pids.len() as u64, "process", "processes"),
        )
    }

    /// Erase the line (before the summary is printed).
    pub fn clear(&mut self) {
        if self.drawn {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[K");
            let _ = stderr.flush();
            self.drawn = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_counts_processes_and_complete_share() {
        let mut p = Progress {
            start: Instant::now(),
            last_drawn: Instant::now(),
            samples: 0,
            complete: 0,
            pids: HashSet::new(),
            drawn: false,
        };
        assert!(p
            .line(0)
            .contains("0 samples, 0 lost, 0 processes, - complete"));
        p.sample(7, UnwindStatus::Complete);
        p.sample(7, UnwindStatus::NoTable);
        p.sample(7, UnwindStatus::NoUserStack);
        p.sample(7, UnwindStatus::Truncated);
        let line = p.line(3);
        assert!(
            line.contains("4 samples, 3 lost, 1 process, 50.0% complete stacks"),
            "{line}"
        );
    }
}
