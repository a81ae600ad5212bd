//! Walks from stack copies over a made-up process: two objects, their rows
//! given by the test, a stack laid out word by word.

use std::cell::Cell;

use super::*;
use crate::sampling::records::UpperPart;
use crate::unwind::rule::{Bx, CfaOffset};

const STACK: u64 = 0x7ffc_0000_1000;

/// Object 1 at [0x400000, 0x500000) (bias 0), object 2 at
/// [0x7f00_0000_0000, +0x100000) (bias 0x7f00_0000_0000), anonymous code
/// at [0x9000_0000, +0x1000). Rows by object: a sorted (vaddr, rule) list;
/// an object in `unloaded` has no rows yet.
struct View {
    rows: Vec<(u32, u64, Rule)>,
    unloaded: Vec<u32>,
}

impl WalkView for View {
    fn code_at(&mut self, pc: u64) -> Option<Code> {
        match pc {
            0x40_0000..0x50_0000 => Some(Code {
                object: Some(1),
                bias: 0,
            }),
            0x7f00_0000_0000..0x7f00_0010_0000 => Some(Code {
                object: Some(2),
                bias: 0x7f00_0000_0000,
            }),
            0x9000_0000..0x9000_1000 => Some(Code {
                object: None,
                bias: 0,
            }),
            _ => None,
        }
    }

    fn row(&mut self, object: u32, vaddr: u64) -> RowLookup {
        if self.unloaded.contains(&object) {
            return RowLookup::NotLoaded;
        }
        self.rows
            .iter()
            .rfind(|(o, start, _)| *o == object && *start <= vaddr)
            .map_or(RowLookup::NoCfi, |(_, start, rule)| {
                RowLookup::Row(rule.to_raw((*start & 0xffff) as u16))
            })
    }
}

fn rsp(bytes: u32) -> Rule {
    Rule::RspOffset {
        cfa: CfaOffset::new(bytes.into()).unwrap(),
        fp: Fp::Unchanged,
        bx: Bx::Unchanged,
    }
}

/// A stack copy from STACK holding `words`.
fn copy(ip: u64, bp: u64, words: &[u64]) -> StackCopy {
    StackCopy {
        ip,
        sp: STACK,
        bp,
        bx: None,
        frame: 1,
        exact_ip: true,
        bytes: words.iter().flat_map(|w| w.to_ne_bytes()).collect(),
        missing_pages: 0,
        upper: None,
    }
}

/// leaf in object 2 (CFA = rsp + 16, so its return address is at
/// STACK + 8), called from object 1 at 0x401234 (CFA = rbp + 16, rbp saved
/// at CFA - 16), called from 0x400100 whose row is outermost.
fn three_frames() -> (View, StackCopy) {
    let view = View {
        rows: vec![
            (1, 0x400000, Rule::Outermost),
            (
                1,
                0x401000,
                Rule::RbpOffset {
                    cfa: CfaOffset::new(16).unwrap(),
                    fp: Fp::AtCfaOffset(-2),
                    bx: Bx::Unchanged,
                },
            ),
            (2, 0x500, rsp(16)),
        ],
        unloaded: vec![],
    };
    // STACK+0: scratch, +8: return into object 1, +16: saved rbp (0),
    // +24: return into its caller; rbp points at +16.
    let copy = copy(0x7f00_0000_0600, STACK + 16, &[0, 0x401234, 0, 0x400100, 0]);
    (view, copy)
}

#[test]
fn a_walk_goes_on_from_the_copy_by_the_same_rules() {
    let (mut view, copy) = three_frames();
    // The CFA of the middle frame is rbp + 16 = STACK + 32: its return
    // address is at STACK + 24, and the caller at 0x400100 is outermost.
    assert_eq!(
        walk_on(&copy, &mut view),
        Replay::Finished {
            frames: vec![0x7f00_0000_0600, 0x401234, 0x400100],
            status: UnwindStatus::Complete,
        }
    );
}

/// glibc's lazy-binding trampoline: the leaf in object 2 (CFA = rsp + 16)
/// saved rbx at CFA - 16 and returns into object 1 at 0x401234, whose CFA
/// is rbx + 16 (the rsp it kept in rbx before realigning its own), and
/// whose caller at 0x400100 is outermost.
fn rbx_based_frames(leaf_saves_rbx: bool) -> (View, StackCopy) {
    let leaf = Rule::RspOffset {
        cfa: CfaOffset::new(16).unwrap(),
        fp: Fp::Unchanged,
        bx: if leaf_saves_rbx {
            Bx::BelowCfa(2)
        } else {
            Bx::Unchanged
        },
    };
    let resolver = Rule::RbxOffset {
        cfa: CfaOffset::new(16).unwrap(),
        fp: Fp::Unchanged,
        bx: Bx::BelowCfa(2),
    };
    let view = View {
        rows: vec![
            (1, 0x400000, Rule::Outermost),
            (1, 0x401000, resolver),
            (2, 0x500, leaf),
        ],
        unloaded: vec![],
    };
    // STACK+0: the leaf's save of rbx (STACK + 0x20), +8: return into
    // object 1, +16/+24: the trampoline's realigned area, +32: its save of
    // its caller's rbx, +40: return to 0x400100. rbp is never used.
    let words = [STACK + 0x20, 0x401234, 0xdead, 0xdead, 0, 0x400100, 0];
    (view, copy(0x7f00_0000_0600, 0, &words))
}

#[test]
fn an_rbx_based_cfa_uses_the_rbx_the_walk_carried() {
    let complete = Replay::Finished {
        frames: vec![0x7f00_0000_0600, 0x401234, 0x400100],
        status: UnwindStatus::Complete,
    };
    // rbx from the leaf's save slot.
    let (mut view, copy) = rbx_based_frames(true);
    assert_eq!(walk_on(&copy, &mut view), complete);
    // rbx kept by the leaf: the copy's own (the BPF walker's) value.
    let (mut view, mut copy) = rbx_based_frames(false);
    copy.bx = Some(STACK + 0x20);
    assert_eq!(walk_on(&copy, &mut view), complete);
    // Lost below the copy's frame: the walk stops there, as unsupported.
    copy.bx = None;
    assert_eq!(
        walk_on(&copy, &mut view),
        Replay::Finished {
            frames: vec![0x7f00_0000_0600, 0x401234],
            status: UnwindStatus::UnsupportedRule,
        }
    );
}

/// A split copy: the leaf's frame in the lower part (CFA = rsp + 16), a
/// 1 MiB frame in object 1 at 0x401234 whose return address is in the
/// upper part, and an outermost caller at 0x400100.
#[test]
fn a_split_copy_reaches_the_outermost_frames_across_its_gap() {
    let huge = 1 << 20;
    let mut view = View {
        rows: vec![
            (1, 0x400000, Rule::Outermost),
            (1, 0x401000, rsp(huge + 8)),
            (2, 0x500, rsp(16)),
        ],
        unloaded: vec![],
    };
    let mut split = copy(0x7f00_0000_0600, 0, &[0, 0x401234]);
    let cfa = STACK + 16 + u64::from(huge) + 8;
    let upper: Vec<u64> = vec![0x400100, 0];
    split.upper = Some(UpperPart {
        start: cfa - 8,
        bytes: upper.iter().flat_map(|w| w.to_ne_bytes()).collect(),
        missing_pages: 0,
    });
    let complete = Replay::Finished {
        frames: vec![0x7f00_0000_0600, 0x401234, 0x400100],
        status: UnwindStatus::Complete,
    };
    assert_eq!(walk_on(&split, &mut view), complete);
    // Without its upper part the walk ends with the lower one.
    split.upper = None;
    assert_eq!(
        walk_on(&split, &mut view),
        Replay::CopyEnded {
            frames: vec![0x7f00_0000_0600, 0x401234]
        }
    );
}

#[test]
fn a_walk_waits_for_rows_not_loaded_and_stops_where_the_copy_ends() {
    let (mut view, copy) = three_frames();
    view.unloaded = vec![1];
    assert_eq!(
        walk_on(&copy, &mut view),
        Replay::Waiting {
            object: 1,
            vaddr: 0x401233
        }
    );
    view.unloaded.clear();
    let mut short = copy.clone();
    short.bytes.truncate(24);
    assert_eq!(
        walk_on(&short, &mut view),
        Replay::CopyEnded {
            frames: vec![0x7f00_0000_0600, 0x401234]
        }
    );
    // A pc in no mapping even now.
    let mut lost = copy;
    lost.ip = 0x1234;
    assert_eq!(walk_on(&lost, &mut view), Replay::NoMapping);
}

#[test]
fn code_without_cfi_is_walked_by_frame_pointers() {
    let mut view = View {
        rows: vec![],
        unloaded: vec![],
    };
    // rbp = STACK + 8: saved rbp 0 at +8, return address at +16 into
    // object 1, which has no CFI either; its rbp (0) ends the chain.
    let copy = copy(0x9000_0010, STACK + 8, &[0, 0, 0x400500, 0]);
    assert_eq!(
        walk_on(&copy, &mut view),
        Replay::Finished {
            frames: vec![0x9000_0010, 0x400500],
            status: UnwindStatus::FramePointer,
        }
    );
}

/// Whether `view` has rows for an object, as it is now.
fn rows_of(view: &View) -> impl FnMut(u32, u64) -> bool {
    let unloaded = view.unloaded.clone();
    move |object, _| !unloaded.contains(&object)
}

/// A walk over `view` that counts its calls in `walks`.
fn counting<'a>(
    view: &'a mut View,
    walks: &'a Cell<u32>,
) -> impl FnMut(&RawSample, &StackCopy) -> Replay + 'a {
    move |_, c| {
        walks.set(walks.get() + 1);
        walk_on(c, view)
    }
}

fn held_sample(ts: u64, copy: StackCopy) -> RawSample {
    let mut s = RawSample::for_test(7, ts, vec![0x400010, 0x9999]);
    s.user_status = UnwindStatus::NoTable;
    s.stack_copy = Some(Box::new(copy));
    s
}

#[test]
fn held_samples_go_once_walked_when_due_or_when_their_hold_ends() {
    let (view, copy) = three_frames();
    let mut view = view;
    view.unloaded = vec![1];
    let mut held = DeferredWalks::default();
    assert!(held.hold(held_sample(10, copy.clone()), 1_000).is_none());
    assert!(held.hold(held_sample(20, copy.clone()), 1_000).is_none());
    let plain = RawSample::for_test(7, 30, vec![0x400010]);
    assert_eq!(held.hold(plain.clone(), 1_000), Some(plain));
    assert_eq!(held.earliest_ns(), Some(10));

    let walks = Cell::new(0);
    let release = |held: &mut DeferredWalks, view: &mut View, now, due, writes| {
        held.release(now, due, writes, rows_of(view), counting(view, &walks))
    };
    // Rows not loaded: both stay.
    assert!(release(&mut held, &mut view, 2_000, 0, 1).is_empty());
    assert_eq!(walks.get(), 2);
    // Nothing written since, or written but not theirs: not walked again.
    assert!(release(&mut held, &mut view, 3_000, 0, 1).is_empty());
    assert!(release(&mut held, &mut view, 3_500, 0, 2).is_empty());
    assert_eq!(walks.get(), 2);
    // The first one's window closes: walked once more, it goes as it came.
    let gone = release(&mut held, &mut view, 4_000, 15, 2);
    assert_eq!(walks.get(), 3);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].user_stack, vec![0x400010, 0x9999]);
    assert_eq!(gone[0].user_status, UnwindStatus::NoTable);
    assert!(gone[0].stack_copy.is_none());
    // Its rows written: the second one is walked on from its frame 1.
    view.unloaded.clear();
    let gone = release(&mut held, &mut view, 5_000, 0, 3);
    assert_eq!(
        gone[0].user_stack,
        vec![0x400010, 0x7f00_0000_0600, 0x401234, 0x400100]
    );
    assert_eq!(gone[0].user_status, UnwindStatus::Complete);
    assert!(held.is_empty());
    let stats = held.stats();
    assert_eq!((stats.held, stats.finished, stats.expired), (2, 1, 1));

    // A pc in no mapping: looked at again MAPPING_RETRY_NS later, rows
    // written or not.
    let (_, mut unmapped) = three_frames();
    unmapped.ip = 0x1234;
    held.hold(held_sample(30, unmapped), 6_000);
    assert!(release(&mut held, &mut view, 6_000, 0, 3).is_empty());
    let before = walks.get();
    assert!(release(&mut held, &mut view, 6_000 + MAPPING_RETRY_NS - 1, 0, 4).is_empty());
    assert_eq!(walks.get(), before);
    assert!(release(&mut held, &mut view, 6_000 + MAPPING_RETRY_NS, 0, 4).is_empty());
    assert_eq!(walks.get(), before + 1);
    let gone = release(&mut held, &mut view, 7_000, 31, 4);
    assert_eq!(gone[0].user_status, UnwindStatus::NoTable);
    assert_eq!(held.stats().no_mapping, 1);

    // A hold ends HOLD_NS after the sample arrived.
    view.unloaded = vec![1];
    held.hold(held_sample(40, copy), 10_000);
    assert!(release(&mut held, &mut view, 10_000 + HOLD_NS - 1, 0, 5).is_empty());
    assert_eq!(
        release(&mut held, &mut view, 10_000 + HOLD_NS, 0, 5).len(),
        1
    );
}

#[test]
fn a_walk_past_its_copy_keeps_its_frames_unless_the_sample_goes_further_the_same_way() {
    let (mut view, mut copy) = three_frames();
    copy.bytes.truncate(24);
    let mut held = DeferredWalks::default();
    let release = |held: &mut DeferredWalks, view: &mut View| {
        held.release(0, u64::MAX, 1, |_, _| true, |_, c| walk_on(c, view))
            .remove(0)
    };
    // The BPF program's frame-pointer fallback went elsewhere.
    held.hold(held_sample(1, copy.clone()), 0);
    let sample = release(&mut held, &mut view);
    assert_eq!(
        sample.user_stack,
        vec![0x400010, 0x7f00_0000_0600, 0x401234]
    );
    assert_eq!(sample.user_status, UnwindStatus::StackCopyEnded);
    // It went the same way, and further: its frames stay.
    let mut further = held_sample(2, copy);
    further.user_stack = vec![0x400010, 0x7f00_0000_0600, 0x401234, 0x400100];
    held.hold(further, 0);
    let sample = release(&mut held, &mut view);
    assert_eq!(
        sample.user_stack,
        vec![0x400010, 0x7f00_0000_0600, 0x401234, 0x400100]
    );
    assert_eq!(sample.user_status, UnwindStatus::NoTable);
    assert_eq!(held.stats().copy_ended, 2);
}

#[test]
fn samples_past_the_byte_budget_are_not_held() {
    let (_, mut copy) = three_frames();
    copy.bytes = vec![0; 8192];
    let mut held = DeferredWalks::default();
    let mut taken = 0;
    while held.hold(held_sample(1, copy.clone()), 0).is_none() {
        taken += 1;
    }
    // Each costs its copy and a little more (its frames, the sample).
    assert!((HOLD_MAX_BYTES / (8192 + 1024)..=HOLD_MAX_BYTES / 8192).contains(&taken));
    assert_eq!(held.stats().no_room, 1);
}
