//! When to look again at a process whose interpreter could not be read yet
//! ([`super::NotWalked::NotYet`]: just after exec, before the loader has
//! mapped the interpreter's data). Each new mapping of the process looks
//! again anyway; a process that maps nothing more is looked at again at its
//! samples, once a back-off has passed: [`FIRST_DELAY`] after the first
//! look, doubling up to [`MAX_DELAY`], at most [`LOOKS`] timed looks (5.3 s
//! in all), after which it is given up: counted, and its eval-loop
//! frames marked `[python: unreadable]`. A look before its time (at a
//! mapping) does not count toward [`LOOKS`], so that a burst of mappings
//! cannot use them up.

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// Wait before the first look again.
pub const FIRST_DELAY: Duration = Duration::from_millis(10);
/// Longest wait between two looks.
pub const MAX_DELAY: Duration = Duration::from_secs(1);
/// Looks (the first included) after which a process is given up.
pub const LOOKS: u32 = 12;

/// What to do after a look that could not read the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Look again once [`Retries::due`] says so.
    Later,
    /// Give up: [`LOOKS`] looks could not read it.
    GiveUp,
}

/// The processes to look at again, and when.
#[derive(Debug, Default)]
pub struct Retries {
    /// By pid: timed looks so far, and when the next one is due.
    pending: FxHashMap<u32, (u32, Instant)>,
}

impl Retries {
    /// A look at `pid` at `now` could not read it: when to look again, or
    /// to give up.
    pub fn not_yet(&mut self, pid: u32, now: Instant) -> Next {
        let (looks, due) = self.pending.entry(pid).or_insert((0, now));
        if now < *due {
            // Looked before its time (a mapping): the schedule stands.
            return Next::Later;
        }
        *looks += 1;
        if *looks >= LOOKS {
            self.pending.remove(&pid);
            return Next::GiveUp;
        }
        let delay = FIRST_DELAY
            .saturating_mul(1 << (*looks - 1).min(16))
            .min(MAX_DELAY);
        *due = now + delay;
        Next::Later
    }

    /// Whether `pid` is waiting to be looked at again and its time has come.
    pub fn due(&self, pid: u32, now: Instant) -> bool {
        self.pending.get(&pid).is_some_and(|&(_, due)| now >= due)
    }

    /// Whether no process waits to be looked at again.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// `pid` got a verdict, exited or exec'd: no more looks.
    pub fn forget(&mut self, pid: u32) {
        self.pending.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_then_gives_up() {
        let mut r = Retries::default();
        let start = Instant::now();
        let mut now = start;
        let mut waits = Vec::new();
        loop {
            match r.not_yet(7, now) {
                Next::GiveUp => break,
                Next::Later => {
                    // Not due a moment before its time, due at it.
                    let mut wait = Duration::from_millis(1);
                    while !r.due(7, now + wait) {
                        wait += Duration::from_millis(1);
                    }
                    waits.push(wait.as_millis());
                    now += wait;
                }
            }
        }
        assert_eq!(
            waits,
            [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000]
        );
        assert_eq!(waits.len() as u32 + 1, LOOKS);
        assert!(!r.due(7, now + MAX_DELAY), "given up: no more looks");
        assert!((now - start) < Duration::from_secs(7));
    }

    #[test]
    fn early_looks_do_not_count() {
        let mut r = Retries::default();
        let now = Instant::now();
        assert_eq!(r.not_yet(1, now), Next::Later);
        // A burst of mappings within the first wait.
        for _ in 0..100 {
            assert_eq!(r.not_yet(1, now + Duration::from_millis(1)), Next::Later);
        }
        assert!(!r.due(1, now + Duration::from_millis(9)));
        assert!(r.due(1, now + FIRST_DELAY));
        assert!(
            !r.due(2, now + FIRST_DELAY),
            "another pid was never pending"
        );
        r.forget(1);
        assert!(!r.due(1, now + MAX_DELAY));
    }
}
