//! Deferred unwinding: user space finishes the walks the BPF walker could
//! not, for want of a table or a mapping (docs/decisions/0003-stack-copies-and-deferred-walks.md).
//!
//! A walk that reaches a frame whose object's table is not loaded yet, a pc
//! in no mapping the walker knows, or a process not described yet ends as
//! `no_table`, `no_mapping` or `mappings_unknown`; the BPF program then sends
//! the registers of that frame and up to 96 KiB of the stack above them
//! ([`StackCopy`]; 8 KiB when that holds a main thread's whole stack, so
//! that more copies fit; 32 KiB when the ring has no room for 96; a
//! stack deeper than 96 KiB whose end is known is copied as its lowest
//! 32 KiB and its highest 64 KiB, where the outermost frames are; pages
//! it could not read are holes), while its CPU's ring is less than half
//! full (the others are counted: `BpfStats::stack_copies_skipped`).
//! Instead of counting such a sample at once, the agent holds it ([`DeferredWalks`]: at most [`HOLD_NS`], and [`HOLD_MAX_BYTES`]
//! of samples in all) until the rows it needs are loaded, then walks on
//! from the copy ([`walk_on`]) with the rows the BPF program reads
//! ([`Sampler::lookup_row`]) and the mappings the process tracker has for
//! the sample's time, and the sample goes on with its whole stack. perf
//! copies the stack of every sample in DWARF mode and unwinds it later;
//! here only the few samples that need it are copied.
//!
//! A walk that cannot finish (the pc is still in no mapping, the hold
//! expires) leaves the sample as the BPF program sent it; one whose copy
//! ends first keeps the frames it walked and ends in `stack_copy_ended`.
//! Each is counted by its reason ([`DeferredStats`]).
//!
//! The steps are the BPF walker's (`walk_step` in
//! `src/sampling/bpf/walker.h`): the same rules, the same frame-pointer
//! fallback where no CFI covers a pc, the same end conditions.

use std::collections::VecDeque;

use crate::process::ProcessTracker;
use crate::sampling::records::{RawSample, StackCopy, UnwindStatus};
use crate::sampling::sampler::{RowLookup, Sampler};
use crate::sampling::skel::defines;
use crate::unwind::rule::{Bx, Fp, Rule};

/// How long a sample is held at most waiting for rows, ns. A cold table of
/// a large object (`librustc_driver`, 150 MB) is loaded 0.4-0.9 s after
/// its process's exec (`bench/large_objects`).
pub const HOLD_NS: u64 = 1_500_000_000;

/// Bytes of held samples (their stack copies and frames) at most: a sample
/// that would go past it is counted at once, as the BPF program sent it.
/// 8 MiB: about 80 samples with 96 KiB copies.
pub const HOLD_MAX_BYTES: usize = 8 << 20;

/// How long a walk that met a pc in no mapping waits before it looks
/// again, ns.
const MAPPING_RETRY_NS: u64 = 100_000_000;

/// The most user frames a walk records (`MAX_USER_FRAMES` in
/// `src/sampling/bpf/profiler.h`).
const MAX_USER_FRAMES: usize = defines::MAX_USER_FRAMES as usize;

// Lowest and first-invalid user addresses a return address can have
// (`src/sampling/bpf/arch_x86_64.h`), and where the kernel's signal frame
// (`struct ucontext` at rsp) keeps the interrupted rbp, rbx, rsp and rip.
use defines::{
    UCONTEXT_RBP, UCONTEXT_RBX, UCONTEXT_RIP, UCONTEXT_RSP, USER_ADDRESS_LIMIT, USER_MIN_ADDRESS,
};

/// The code a pc is in, as a walk needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// The object whose table covers it (`page_key.object_id`); `None`:
    /// code walked by frame pointers (anonymous, JIT).
    pub object: Option<u32>,
    /// Object vaddr = pc - bias.
    pub bias: u64,
}

/// What a walk reads besides the stack copy.
pub trait WalkView {
    /// The code `pc` is in, at the sample's time; `None`: no mapping holds it.
    fn code_at(&mut self, pc: u64) -> Option<Code>;
    /// The row of `object`'s table for `vaddr`.
    fn row(&mut self, object: u32, vaddr: u64) -> RowLookup;
}

/// How a walk from a stack copy went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// It ended: the frames from the copy's frame on (its pc first), and how.
    Finished {
        /// Frames, leaf first, starting with [`StackCopy::ip`].
        frames: Vec<u64>,
        /// How the walk ended.
        status: UnwindStatus,
    },
    /// A frame's rows are not loaded yet: try again once they are.
    Waiting {
        /// The object whose rows are missing.
        object: u32,
        /// The address (object vaddr) that needs them.
        vaddr: u64,
    },
    /// The copy ends before the walk does (a stack deeper than the copy):
    /// the frames walked until then, the copy's pc first.
    CopyEnded {
        /// Frames, leaf first, starting with [`StackCopy::ip`].
        frames: Vec<u64>,
    },
    /// A pc is in no mapping the tracker knows, even now.
    NoMapping,
}

/// Registers of the frame being walked.
struct Regs {
    ip: u64,
    sp: u64,
    bp: u64,
    bx: BxAt,
    exact_ip: bool,
}

/// Where the frame's rbx is, as the BPF walker keeps it (`bx`, `bx_addr`,
/// `bx_unknown` of `struct walk_state`): read only when an rbx-based CFA
/// needs it.
#[derive(Debug, Clone, Copy)]
enum BxAt {
    /// Its value.
    Value(u64),
    /// The stack word at this address (a caller's save slot).
    Slot(u64),
    /// Lost: a frame-pointer step or an rbx rule not followed.
    Unknown,
}

/// Walk on from `copy`'s frame with the rows and mappings `view` gives, as
/// the BPF walker would have with every table loaded.
pub fn walk_on(copy: &StackCopy, view: &mut impl WalkView) -> Replay {
    let mut r = Regs {
        ip: copy.ip,
        sp: copy.sp,
        bp: copy.bp,
        bx: copy.bx.map_or(BxAt::Unknown, BxAt::Value),
        exact_ip: copy.exact_ip,
    };
    let mut frames = Vec::new();
    let (mut used_fp, mut last_step_fp) = (false, false);
    let end = |frames: Vec<u64>, used_fp: bool| Replay::Finished {
        frames,
        status: if used_fp {
            UnwindStatus::FramePointer
        } else {
            UnwindStatus::Complete
        },
    };
    loop {
        if copy.frame + frames.len() >= MAX_USER_FRAMES {
            return Replay::Finished {
                frames,
                status: UnwindStatus::Truncated,
            };
        }
        frames.push(r.ip);
        let Some(code) = view.code_at(r.ip) else {
            if last_step_fp {
                // The chain ended a frame earlier: rbp held other data.
                frames.pop();
                return end(frames, true);
            }
            return Replay::NoMapping;
        };
        let rule = match code.object {
            None => None,
            Some(object) => {
                let vaddr =
                    r.ip.wrapping_sub(code.bias)
                        .wrapping_sub(u64::from(!r.exact_ip));
                match view.row(object, vaddr) {
                    RowLookup::NotLoaded => return Replay::Waiting { object, vaddr },
                    RowLookup::NoCfi => None,
                    RowLookup::Row(raw) => Some(Rule::from_raw(raw).unwrap_or(Rule::EndOfFunction)),
                }
            }
        };
        last_step_fp = false;
        let step = match rule {
            None | Some(Rule::EndOfFunction) => {
                used_fp = true;
                last_step_fp = true;
                frame_pointer_step(copy, &mut r)
            }
            Some(rule) => cfi_step(copy, &mut r, rule),
        };
        match step {
            Step::Next => {}
            Step::End => return end(frames, used_fp),
            Step::Unsupported => {
                return Replay::Finished {
                    frames,
                    status: UnwindStatus::UnsupportedRule,
                }
            }
            Step::OutOfCopy => return Replay::CopyEnded { frames },
        }
    }
}

/// What one step did.
enum Step {
    /// The caller's registers are in place.
    Next,
    /// The walk reached its end (the outermost frame, or the end of a
    /// frame-pointer chain).
    End,
    /// A rule the walker does not evaluate.
    Unsupported,
    /// A word it needs is outside the copy.
    OutOfCopy,
}

/// The caller's rbp is at [rbp], its return address at [rbp + 8].
fn frame_pointer_step(copy: &StackCopy, r: &mut Regs) -> Step {
    if r.bp == 0 {
        return Step::End;
    }
    let (Some(saved_bp), Some(ra)) = (copy.word(r.bp), copy.word(r.bp.wrapping_add(8))) else {
        // The BPF walker reads the process's memory here: whether the
        // chain goes on is unknown from the copy alone.
        return Step::OutOfCopy;
    };
    if !(USER_MIN_ADDRESS..USER_ADDRESS_LIMIT).contains(&ra) || (saved_bp != 0 && saved_bp <= r.bp)
    {
        return Step::End;
    }
    r.sp = r.bp.wrapping_add(16);
    r.bp = saved_bp;
    r.bx = BxAt::Unknown;
    r.ip = ra;
    r.exact_ip = false;
    Step::Next
}

/// One step by the CFI row `rule`.
fn cfi_step(copy: &StackCopy, r: &mut Regs, rule: Rule) -> Step {
    let (cfa, fp, bx) = match rule {
        Rule::RspOffset { cfa, fp, bx } => (r.sp.wrapping_add(u64::from(cfa.bytes())), fp, bx),
        Rule::RbpOffset { cfa, fp, bx } => (r.bp.wrapping_add(u64::from(cfa.bytes())), fp, bx),
        Rule::RbxOffset { cfa, fp, bx } => {
            let base = match r.bx {
                BxAt::Value(value) => value,
                BxAt::Slot(addr) => match copy.word(addr) {
                    Some(value) => value,
                    None => return Step::OutOfCopy,
                },
                BxAt::Unknown => return Step::Unsupported,
            };
            (base.wrapping_add(u64::from(cfa.bytes())), fp, bx)
        }
        Rule::Plt { threshold, fp, bx } => {
            let pushed = if r.ip & 15 >= u64::from(threshold) {
                8
            } else {
                0
            };
            (r.sp.wrapping_add(8 + pushed), fp, bx)
        }
        Rule::Outermost => return Step::End,
        // The copy holds ip, sp, bp and rbx only: the return-address register is
        // not known here (the BPF walker follows the rule in the interrupted frame).
        Rule::Unsupported(_) | Rule::ReturnInRegister { .. } => return Step::Unsupported,
        Rule::SignalFrame => {
            let word = |offset| copy.word(r.sp.wrapping_add(offset));
            let (Some(bp), Some(sp), Some(ip)) =
                (word(UCONTEXT_RBP), word(UCONTEXT_RSP), word(UCONTEXT_RIP))
            else {
                return Step::OutOfCopy;
            };
            *r = Regs {
                ip,
                sp,
                bp,
                bx: BxAt::Slot(r.sp.wrapping_add(UCONTEXT_RBX)),
                exact_ip: true,
            };
            return Step::Next;
        }
        Rule::EndOfFunction => unreachable!("walked by frame pointers"),
    };
    let Some(ra) = copy.word(cfa.wrapping_sub(8)) else {
        return Step::OutOfCopy;
    };
    match bx {
        Bx::Unchanged => {}
        Bx::BelowCfa(slots) => r.bx = BxAt::Slot(cfa.wrapping_sub(8 * u64::from(slots))),
        Bx::Unknown => r.bx = BxAt::Unknown,
    }
    if let Fp::AtCfaOffset(slots) = fp {
        let Some(bp) = copy.word(cfa.wrapping_add_signed(i64::from(slots) * 8)) else {
            return Step::OutOfCopy;
        };
        r.bp = bp;
    }
    if ra == 0 {
        return Step::End;
    }
    r.sp = cfa;
    r.ip = ra;
    r.exact_ip = false;
    Step::Next
}

/// Put the `frames` a walk from `sample`'s stack copy reached before the
/// copy ended in place of the BPF program's frames from `first` on, unless
/// those go on the same way and further (its frame-pointer fallback
/// happened to follow the right chain): then the sample keeps its own.
fn take_partial_walk(sample: &mut RawSample, first: usize, frames: Vec<u64>) {
    let sent = sample.user_stack.get(first..).unwrap_or_default();
    if sent.len() > frames.len() && sent.starts_with(&frames) {
        return;
    }
    sample.user_stack.truncate(first);
    sample.user_stack.extend(frames);
    sample.user_status = UnwindStatus::StackCopyEnded;
}

/// The view of a live run: mappings from the process tracker at the
/// sample's time, rows from the walker's maps.
pub struct LiveView<'a, 's> {
    /// The run's process tracker.
    pub tracker: &'a mut ProcessTracker,
    /// The sampler whose maps hold the rows.
    pub sampler: &'a Sampler<'s>,
    /// The sample's process.
    pub pid: u32,
    /// The sample's time, CLOCK_MONOTONIC ns.
    pub timestamp_ns: u64,
    /// Rows already looked up, by (object, vaddr): the walks of one release
    /// share them (samples of one program share most frames), and rows do
    /// not change within it.
    pub rows: &'a mut RowMemo,
}

/// Rows looked up during one [`DeferredWalks::release`].
pub type RowMemo = rustc_hash::FxHashMap<(u32, u64), RowLookup>;

impl WalkView for LiveView<'_, '_> {
    fn code_at(&mut self, pc: u64) -> Option<Code> {
        let mut found = None;
        self.tracker
            .find_mappings(self.pid, self.timestamp_ns, 1, |_| pc, |_, m| found = m);
        let id = found?;
        let mapping = self.tracker.mapping(id)?;
        Some(Code {
            object: mapping.object.map(|o| o.0),
            bias: self.tracker.load_bias(id)?,
        })
    }

    fn row(&mut self, object: u32, vaddr: u64) -> RowLookup {
        // A map that cannot be read is as good as rows not loaded: the
        // hold expires and the sample goes on as it came.
        *self.rows.entry((object, vaddr)).or_insert_with(|| {
            self.sampler
                .lookup_row(object, vaddr)
                .unwrap_or(RowLookup::NotLoaded)
        })
    }
}

/// Counters of deferred walks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeferredStats {
    /// Samples that came with a stack copy and were held.
    pub held: u64,
    /// Of those, walks finished from the copy.
    pub finished: u64,
    /// Of those, walks that ended with the copy (a stack deeper than it):
    /// the sample has the frames walked until then and ends in
    /// [`UnwindStatus::StackCopyEnded`], unless the BPF program's own
    /// frames go on the same way and further.
    pub copy_ended: u64,
    /// Of those, walks left as the BPF program sent them because a pc was
    /// in no mapping until the hold ended.
    pub no_mapping: u64,
    /// Of those, walks left as the BPF program sent them because the rows
    /// were not loaded before the hold ended (or the sample's window closed).
    pub expired: u64,
    /// Samples with a stack copy not held, for want of room.
    pub no_room: u64,
    /// Samples whose walk stopped for want of a table or mapping but came
    /// without a copy ([`crate::sampling::sampler::BpfStats::stack_copies_skipped`]:
    /// their CPU's ring was too full, or the stack could not be read); set
    /// by the caller from the BPF program's counter.
    pub not_sent: u64,
    /// Walks tried (a held sample is tried again after new rows are written).
    pub walks: u64,
    /// Time spent in those walks, ns: mostly map lookups, about 17 per frame
    /// ([`Sampler::lookup_row`]).
    pub walk_ns: u64,
}

/// One held sample.
struct Held {
    sample: RawSample,
    /// Release it as it is from this time on, CLOCK_MONOTONIC ns.
    until_ns: u64,
    bytes: usize,
    /// The rows its last try lacked (object, vaddr).
    waiting_for: Option<(u32, u64)>,
    /// [`crate::unwind::loader::UnwindLoaderStats::row_writes`] when it was
    /// last seen waiting: rows can only have come with a later write.
    checked_at: u64,
    /// Without rows to wait for: try (again) from this time on,
    /// CLOCK_MONOTONIC ns (0: at once; after a pc in no mapping, later).
    retry_ns: u64,
}

/// Samples waiting for the rows their walk needs, in arrival order.
#[derive(Default)]
pub struct DeferredWalks {
    held: VecDeque<Held>,
    bytes: usize,
    stats: DeferredStats,
}

impl DeferredWalks {
    /// Hold `sample` (received at `now_ns`, CLOCK_MONOTONIC) if its walk can
    /// go on from a stack copy and there is room; otherwise hand it back.
    pub fn hold(&mut self, sample: RawSample, now_ns: u64) -> Option<RawSample> {
        let Some(copy) = sample.stack_copy.as_deref() else {
            return Some(sample);
        };
        let bytes = copy.stack_bytes() + 8 * sample.user_stack.len() + size_of::<RawSample>();
        if self.bytes + bytes > HOLD_MAX_BYTES {
            self.stats.no_room += 1;
            let mut sample = sample;
            sample.stack_copy = None;
            return Some(sample);
        }
        self.bytes += bytes;
        self.stats.held += 1;
        self.held.push_back(Held {
            sample,
            until_ns: now_ns.saturating_add(HOLD_NS),
            bytes,
            waiting_for: None,
            checked_at: 0,
            retry_ns: 0,
        });
        None
    }

    /// Walk on the held samples that may go further now, and hand back, in
    /// arrival order, those that are done: walked to their end or past
    /// their copy, held until their time (`now_ns`), or taken before
    /// `due_before_ns` (their window closes now: they are walked once more,
    /// then go as they are). A sample that waits for rows is walked again
    /// once `has_rows(object, vaddr)` says they are there, asked only after
    /// new rows were written (`row_writes`: the loader's count); one that
    /// met a pc in no mapping, [`MAPPING_RETRY_NS`] later. `walk` walks one
    /// sample's copy on.
    pub fn release(
        &mut self,
        now_ns: u64,
        due_before_ns: u64,
        row_writes: u64,
        mut has_rows: impl FnMut(u32, u64) -> bool,
        mut walk: impl FnMut(&RawSample, &StackCopy) -> Replay,
    ) -> Vec<RawSample> {
        let mut done = Vec::new();
        let mut kept = VecDeque::with_capacity(self.held.len());
        for mut held in self.held.drain(..) {
            let due = held.sample.timestamp_ns < due_before_ns || now_ns >= held.until_ns;
            if !due {
                let wait = match held.waiting_for {
                    Some((object, vaddr)) => {
                        let unchanged = held.checked_at == row_writes;
                        held.checked_at = row_writes;
                        unchanged || !has_rows(object, vaddr)
                    }
                    None => now_ns < held.retry_ns,
                };
                if wait {
                    kept.push_back(held);
                    continue;
                }
            }
            let copy = held
                .sample
                .stack_copy
                .as_deref()
                .expect("held samples have copies");
            let started = std::time::Instant::now();
            let replay = walk(&held.sample, copy);
            self.stats.walks += 1;
            self.stats.walk_ns += started.elapsed().as_nanos() as u64;
            if !due {
                // Rows come with a write; a mapping once the process
                // tracker reads the process's maps, which it does on its
                // own schedule: look again a little later.
                match replay {
                    Replay::Waiting { object, vaddr } => {
                        held.waiting_for = Some((object, vaddr));
                        held.checked_at = row_writes;
                        kept.push_back(held);
                        continue;
                    }
                    Replay::NoMapping => {
                        held.waiting_for = None;
                        held.retry_ns = now_ns.saturating_add(MAPPING_RETRY_NS);
                        kept.push_back(held);
                        continue;
                    }
                    _ => {}
                }
            }
            let mut sample = held.sample;
            let copy = sample.stack_copy.take().expect("held samples have copies");
            match replay {
                Replay::Finished { frames, status } => {
                    self.stats.finished += 1;
                    sample.user_stack.truncate(copy.frame);
                    sample.user_stack.extend(frames);
                    sample.user_status = status;
                }
                Replay::CopyEnded { frames } => {
                    self.stats.copy_ended += 1;
                    take_partial_walk(&mut sample, copy.frame, frames);
                }
                Replay::NoMapping => self.stats.no_mapping += 1,
                Replay::Waiting { .. } => self.stats.expired += 1,
            }
            self.bytes -= held.bytes;
            done.push(sample);
        }
        self.held = kept;
        done
    }

    /// The earliest timestamp of a held sample (CLOCK_MONOTONIC ns): what
    /// it refers to must not be retired yet.
    pub fn earliest_ns(&self) -> Option<u64> {
        self.held.iter().map(|h| h.sample.timestamp_ns).min()
    }

    /// Whether any sample is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The counters so far.
    pub fn stats(&self) -> DeferredStats {
        self.stats
    }
}

#[cfg(test)]
#[path = "deferred_tests.rs"]
mod tests;
