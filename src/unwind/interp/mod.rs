//! Interpreter unwinders: the seam through which interpreted frames (CPython
//! today) join native stacks (docs/architecture.md, "Interpreters").
//!
//! An interpreter is one BPF file (`src/sampling/bpf/python.h`) and one module here
//! behind [`Unwinder`]. [`Interpreters`] is owned by the run beside the
//! process tracker (`crate::agent::run`) and passed in: the process follower
//! has it look at the objects a process maps when it describes the process
//! to the BPF walker ([`InterpreterSupply::attach`]); an unwinder that recognises its interpreter
//! returns the address ranges of the interpreter's eval loop and the entry
//! its BPF walker needs. Each sample then carries the interpreted frames
//! the BPF walker found (raw: object address, instruction offset, guard);
//! [`Interpreters::splice`] has the unwinder name them at once (the process
//! may exit before its window closes) and puts each run of them at the
//! native frame of the eval-loop call that ran it, leaf first.
//!
//! A named interpreted frame is a [`UserFrame`] with no mapping and an
//! address tagged with [`INTERPRETED_TAG`]: an index into a table of
//! distinct names ([`frame_name`]) that lives as long as the profiler
//! (distinct function and line pairs, bounded by the code that runs).

pub mod python;
pub mod retry;

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indexmap::IndexSet;
use rustc_hash::FxHashMap;

use crate::process::walker::InterpreterSupply;
use crate::process::{ProcessTracker, UserFrame};

/// Bit 63 of a [`UserFrame::address`] marks an interpreted frame (user
/// space addresses never have it); the low 32 bits index [`frame_name`]'s table.
pub const INTERPRETED_TAG: u64 = 1 << 63;

/// An interpreted frame's name, as formats show it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameName {
    /// The profile mapping it is shown in (`[python]`): how formats tell
    /// interpreted frames from native ones.
    pub mapping: &'static str,
    /// Qualified function name (`Class.method`, `<lambda>`, `<module>`), or
    /// a bracketed marker (`[python: unknown]`).
    pub function: Arc<str>,
    /// Source file, when known.
    pub file: Option<Arc<str>>,
    /// Line in `file`, when known.
    pub line: Option<u32>,
}

static NAMES: Mutex<Option<IndexSet<Arc<FrameName>>>> = Mutex::new(None);

/// The tagged address of `name` (added to the table when new).
pub fn intern(name: FrameName) -> u64 {
    let mut guard = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let set = guard.get_or_insert_with(IndexSet::new);
    let (index, _) = set.insert_full(Arc::new(name));
    INTERPRETED_TAG | index as u64
}

/// The name of the interpreted frame at tagged address `address`, if it is one.
pub fn frame_name(address: u64) -> Option<Arc<FrameName>> {
    if address & INTERPRETED_TAG == 0 {
        return None;
    }
    let guard = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let index = (address & u64::from(u32::MAX)) as usize;
    guard.as_ref()?.get_index(index).cloned()
}

/// Interpreted frames shown as unknown (`[python: unknown]`: the code
/// object could not be read, or its guard did not match), since the start.
pub static UNKNOWN_FRAMES: AtomicU64 = AtomicU64::new(0);
/// Interpreted frames dropped because the sample's native stack had no
/// frame in the eval loop to put them at, since the start.
pub static UNPLACED_FRAMES: AtomicU64 = AtomicU64::new(0);

/// ([`UNKNOWN_FRAMES`], [`UNPLACED_FRAMES`]) since the start: for the
/// summary and `/metrics`.
pub fn frame_counters() -> (u64, u64) {
    (
        UNKNOWN_FRAMES.load(Ordering::Relaxed),
        UNPLACED_FRAMES.load(Ordering::Relaxed),
    )
}

/// Interpreter processes by verdict since the start (a process counted
/// again after an exec into another interpreter image), for the summary
/// and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdicts {
    /// Walked by the BPF walker (version supported, checks passed).
    pub walked: u64,
    /// Found, not walked: version, build or layout not supported.
    pub unsupported: u64,
    /// Given up after their memory could not be read ([`retry::LOOKS`] looks).
    pub unreadable: u64,
    /// The distinct frames the unsupported ones got (`[python:
    /// unsupported 3.14.0]`), the first [`MAX_LABELS`] met.
    pub labels: Vec<Arc<str>>,
}

/// Most distinct unsupported labels [`Verdicts::labels`] keeps.
pub const MAX_LABELS: usize = 8;

static VERDICTS: Mutex<Verdicts> = Mutex::new(Verdicts {
    walked: 0,
    unsupported: 0,
    unreadable: 0,
    labels: Vec::new(),
});

/// The interpreter processes' verdicts since the start.
pub fn verdicts() -> Verdicts {
    VERDICTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The frame shown at the eval-loop frames of a process given up as unreadable.
const UNREADABLE_LABEL: &str = "[python: unreadable]";

/// An object file a process maps, as unwinders look at it.
#[derive(Debug, Clone)]
pub struct MappedObject {
    /// A path that opens the file from the profiler (`/proc/self/fd/N`).
    pub open_path: PathBuf,
    /// The path the process mapped it from.
    pub path: String,
    /// Device and inode, as `/proc/PID/maps` shows them.
    pub file_key: (u64, u64),
    /// Absolute address = object vaddr + `bias`.
    pub bias: u64,
}

/// What an unwinder found in a process.
#[derive(Debug, Clone)]
pub struct Attachment {
    /// Absolute address ranges of the eval loop (every part of it).
    pub eval: Vec<Range<u64>>,
    /// `eval` is the interpreter's whole code, not its eval loop (an
    /// interpreter whose eval loop has no symbol: PyPy). Its unsupported
    /// frame then goes once per stack, leaf-ward of the outermost frame in
    /// it (at the outermost frame of a stack with none: a walk that stopped
    /// in its JIT code), not at each.
    pub whole_code: bool,
    /// The BPF walker's entry for the process (the bytes of the
    /// interpreter's map value), or why there is none.
    pub walker: Result<Vec<u8>, NotWalked>,
}

/// Why the BPF walker does not walk an interpreter found in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotWalked {
    /// Its version or layout is not one this supports: the frame
    /// (`[python: unsupported 3.9]`) its eval-loop frames get instead.
    Unsupported(String),
    /// Its memory could not be read yet (just after exec, before the
    /// loader mapped its data): no verdict; its eval-loop frames stay
    /// native until it is looked at again (its next mapping or description).
    NotYet,
}

/// One interpreter's unwinder (user-space side).
pub trait Unwinder: Send {
    /// Look at the objects `pid` maps; `Some` if it runs this interpreter.
    fn attach(&mut self, pid: u32, objects: &[MappedObject]) -> Option<Attachment>;

    /// Name the raw frames the BPF walker recorded for one sample of `pid`
    /// (its walker's record words), innermost first, into `out` as
    /// (tagged address, ends its eval-loop call).
    fn name_frames(&mut self, pid: u32, raw: &[u64], out: &mut Vec<(u64, bool)>);

    /// `pid` exited or exec'd: forget what was kept for it.
    fn forget(&mut self, pid: u32);
}

/// What is known of one process's interpreter.
#[derive(Debug)]
struct Attached {
    eval: Vec<Range<u64>>,
    /// See [`Attachment::whole_code`].
    whole_code: bool,
    /// The frame shown at each eval-loop frame when the walker cannot walk
    /// this process (tagged address): `[python: unsupported …]`,
    /// `[python: unreadable]`.
    unsupported: Option<u64>,
    /// The BPF walker's entry, when the walker walks it.
    entry: Option<Vec<u8>>,
    /// How it was judged.
    verdict: Verdict,
}

/// The interpreter unwinders and the processes they attached to. Owned
/// beside the process tracker by whoever owns that (the run); the
/// follower reaches it as an [`InterpreterSupply`], the aggregator through
/// [`crate::profile::aggregate::resolve_placed`].
#[derive(Default)]
pub struct Interpreters {
    python: python::Python,
    procs: FxHashMap<u32, Attached>,
    named: Vec<(u64, bool)>,
    /// Processes whose interpreter could not be read yet.
    retries: retry::Retries,
    /// The frame given instead when this run's BPF programs have no
    /// interpreter walker ([`Interpreters::for_run`]).
    no_walker: Option<&'static str>,
}

impl std::fmt::Debug for Interpreters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interpreters")
            .field("procs", &self.procs.len())
            .finish()
    }
}

impl Interpreters {
    /// Interpreters for a run whose BPF programs have the interpreter
    /// walker (`walker`: the bpf_loop variant, Linux 5.17+) or not (the
    /// compat variant): without it every interpreter found is judged
    /// unsupported, counted once as such, its eval-loop frames shown as
    /// `[python: not walked before Linux 5.17]`.
    pub fn for_run(walker: bool) -> Self {
        Self {
            no_walker: (!walker).then_some("[python: not walked before Linux 5.17]"),
            ..Self::default()
        }
    }

    /// Look for an interpreter in `pid`'s objects; the BPF walker's entry
    /// when one is found and supported (`None`: nothing for the walker).
    /// One whose memory cannot be read yet is looked at again
    /// ([`Interpreters::retry_due`]) until [`retry::LOOKS`] looks fail.
    pub fn attach(&mut self, pid: u32, objects: &[MappedObject]) -> Option<Vec<u8>> {
        let Some(mut found) = self.python.attach(pid, objects) else {
            self.forget(pid);
            return None;
        };
        if let (Some(label), Ok(_)) = (self.no_walker, &found.walker) {
            found.walker = Err(NotWalked::Unsupported(label.to_string()));
        }
        if found.walker.is_err() {
            // Checked before, it fails now only because its memory can no
            // longer be read: it is exiting, and its samples still on their
            // way were walked while it lived. They keep their names.
            if let Some(kept) = self.procs.get(&pid).and_then(|a| a.entry.clone()) {
                return Some(kept);
            }
        }
        if found.walker == Err(NotWalked::NotYet) {
            // Judged before: the verdict stands (its memory is going away).
            if let Some(known) = self.procs.get(&pid) {
                return known.entry.clone();
            }
        }
        let label = match &found.walker {
            Ok(_) => None,
            Err(NotWalked::Unsupported(label)) => Some(label.clone()),
            Err(NotWalked::NotYet) => match self.retries.not_yet(pid, Instant::now()) {
                retry::Next::GiveUp => Some(UNREADABLE_LABEL.to_string()),
                retry::Next::Later => {
                    // Not known, so that its next mapping looks again.
                    self.forget_found(pid);
                    return None;
                }
            },
        };
        self.retries.forget(pid);
        let verdict = match &found.walker {
            Ok(_) => Verdict::Walked,
            Err(NotWalked::NotYet) => Verdict::Unreadable,
            Err(NotWalked::Unsupported(_)) => Verdict::Unsupported,
        };
        let unsupported = label.map(|label| {
            intern(FrameName {
                mapping: python::MAPPING_NAME,
                function: label.into(),
                file: None,
                line: None,
            })
        });
        let entry = found.walker.ok();
        let before = self.procs.insert(
            pid,
            Attached {
                eval: found.eval,
                whole_code: found.whole_code,
                unsupported,
                entry: entry.clone(),
                verdict,
            },
        );
        if before.is_none_or(|b| b.verdict != verdict) {
            count(verdict, unsupported);
        }
        entry
    }

    /// Whether `pid`'s interpreter could not be read yet and it is time to
    /// look again (cheap when no process waits).
    pub fn retry_due(&self, pid: u32) -> bool {
        !self.retries.is_empty() && self.retries.due(pid, Instant::now())
    }

    /// Whether an interpreter was found in `pid`.
    pub fn knows(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Whether the BPF walker walks `pid`'s interpreter (found and supported).
    pub fn walks(&self, pid: u32) -> bool {
        self.procs
            .get(&pid)
            .is_some_and(|a| a.unsupported.is_none())
    }

    /// `pid` exited or exec'd.
    pub fn forget(&mut self, pid: u32) {
        self.retries.forget(pid);
        self.forget_found(pid);
    }

    /// Forget what was found of `pid`'s interpreter (not its retries).
    fn forget_found(&mut self, pid: u32) {
        if self.procs.remove(&pid).is_some() {
            self.python.forget(pid);
        }
    }

    /// Put the interpreted frames of a sample of `pid` (`raw`: its walker's
    /// record words; `walked`: whether the walker found the thread) among
    /// its native `frames` (leaf first): each run of them, up to the frame
    /// that began its eval-loop call, goes right before (leaf-ward of) the
    /// next native frame in the eval loop. Runs left when the eval-loop
    /// frames are used up go at the last one; with no eval-loop frame at
    /// all they are dropped and counted ([`UNPLACED_FRAMES`]).
    pub fn splice(&mut self, pid: u32, raw: &[u64], walked: bool, frames: &mut Vec<UserFrame>) {
        let Some(attached) = self.procs.get(&pid) else {
            return;
        };
        let in_eval = |f: &UserFrame| attached.eval.iter().any(|r| r.contains(&f.address));
        if let Some(label) = attached.unsupported {
            if attached.whole_code {
                // Once, leaf-ward of the outermost frame in its code; a
                // walk that stopped before reaching its code (in its JIT
                // code) has it at its outermost frame.
                if !frames.is_empty() {
                    let at = frames.iter().rposition(in_eval).unwrap_or(frames.len());
                    frames.insert(
                        at,
                        UserFrame {
                            mapping: None,
                            address: label,
                        },
                    );
                }
            } else {
                insert_before_each(frames, in_eval, |_| vec![label]);
            }
            return;
        }
        self.named.clear();
        if walked {
            self.python.name_frames(pid, raw, &mut self.named);
        }
        let eval_frames = frames.iter().filter(|f| in_eval(f)).count();
        if eval_frames == 0 {
            UNPLACED_FRAMES.fetch_add(self.named.len() as u64, Ordering::Relaxed);
            return;
        }
        if !walked {
            let unknown = unknown_frame();
            UNKNOWN_FRAMES.fetch_add(eval_frames as u64, Ordering::Relaxed);
            insert_before_each(frames, in_eval, |_| vec![unknown]);
            return;
        }
        let mut runs = runs_of(&self.named, eval_frames).into_iter();
        insert_before_each(frames, in_eval, |_| runs.next().unwrap_or_default());
    }
}

/// Split `named` (innermost first: tagged address, ends its eval-loop
/// call) into one run per eval-loop call, for `eval_frames` (at least 1)
/// eval-loop frames: runs past the last one join its run.
fn runs_of(named: &[(u64, bool)], eval_frames: usize) -> Vec<Vec<u64>> {
    let mut runs: Vec<Vec<u64>> = Vec::new();
    let mut run = Vec::new();
    for &(address, entry) in named {
        run.push(address);
        if entry {
            runs.push(std::mem::take(&mut run));
        }
    }
    if !run.is_empty() {
        runs.push(run);
    }
    if runs.len() > eval_frames {
        let rest: Vec<u64> = runs.drain(eval_frames..).flatten().collect();
        runs[eval_frames - 1].extend(rest);
    }
    runs
}

/// Put the interpreted frames of `sample` (of a process
/// [`Interpreters::knows`]) among its native `frames` (leaf first,
/// resolved through `tracker`): [`Interpreters::splice`]. Where the
/// walker walks the process, frames in anonymous executable memory are
/// dropped first: those are CPython's `-X perf` / `-X perf_jit`
/// trampolines, which would name each Python function a second time
/// (docs/python.md: the walker's frames win).
pub fn place(
    sample: &crate::sampling::records::RawSample,
    interpreters: &mut Interpreters,
    tracker: &ProcessTracker,
    frames: &mut Vec<UserFrame>,
) {
    if interpreters.walks(sample.pid) {
        frames.retain(|f| {
            f.mapping
                .and_then(|m| tracker.mapping(m))
                .is_none_or(|m| m.object.is_some() || m.name == "[vdso]")
        });
    }
    let walked = sample.python_walked;
    interpreters.splice(sample.pid, &sample.python, walked, frames);
}

/// How a process's interpreter was judged ([`Verdicts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Walked,
    Unsupported,
    Unreadable,
}

/// Count a process's new `verdict` (`label`: the tagged address of its
/// unsupported frame).
fn count(verdict: Verdict, label: Option<u64>) {
    let mut v = VERDICTS.lock().unwrap_or_else(|e| e.into_inner());
    match verdict {
        Verdict::Walked => v.walked += 1,
        Verdict::Unreadable => v.unreadable += 1,
        Verdict::Unsupported => {
            v.unsupported += 1;
            if let Some(name) = label.and_then(frame_name) {
                if v.labels.len() < MAX_LABELS && !v.labels.contains(&name.function) {
                    v.labels.push(name.function.clone());
                }
            }
        }
    }
}

impl InterpreterSupply for Interpreters {
    /// Look for an interpreter among the objects `tracker` knows `pid` maps
    /// (each object once): [`Interpreters::attach`].
    fn attach(&mut self, pid: u32, tracker: &ProcessTracker) -> Option<Vec<u8>> {
        let mut objects: Vec<MappedObject> = Vec::new();
        let mut seen = Vec::new();
        for &id in tracker.process_mappings(pid) {
            let Some(object) = tracker.mapping(id).and_then(|m| m.object) else {
                continue;
            };
            let (Some(file), Some(bias)) = (tracker.object(object), tracker.load_bias(id)) else {
                continue;
            };
            if !seen.contains(&object) {
                seen.push(object);
                objects.push(MappedObject {
                    open_path: file.open_path.clone(),
                    path: file.path.clone(),
                    file_key: file.file_key,
                    bias,
                });
            }
        }
        Interpreters::attach(self, pid, &objects)
    }

    fn knows(&self, pid: u32) -> bool {
        Interpreters::knows(self, pid)
    }

    fn retry_due(&self, pid: u32) -> bool {
        Interpreters::retry_due(self, pid)
    }

    fn forget(&mut self, pid: u32) {
        Interpreters::forget(self, pid)
    }
}

/// The tagged address of `[python: unknown]`.
pub fn unknown_frame() -> u64 {
    intern(FrameName {
        mapping: python::MAPPING_NAME,
        function: "[python: unknown]".into(),
        file: None,
        line: None,
    })
}

/// Insert, before each frame of `frames` that `select` picks, the tagged
/// addresses `insert` gives for it (the n-th picked frame: `insert(n)`).
fn insert_before_each(
    frames: &mut Vec<UserFrame>,
    select: impl Fn(&UserFrame) -> bool,
    mut insert: impl FnMut(usize) -> Vec<u64>,
) {
    let mut out = Vec::with_capacity(frames.len() + 8);
    let mut picked = 0;
    for frame in frames.drain(..) {
        if select(&frame) {
            out.extend(insert(picked).into_iter().map(|address| UserFrame {
                mapping: None,
                address,
            }));
            picked += 1;
        }
        out.push(frame);
    }
    *frames = out;
}

#[cfg(test)]
mod tests;
