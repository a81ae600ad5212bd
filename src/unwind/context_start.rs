//! The root of a `makecontext` stack. glibc's x86-64 `makecontext` puts the
//! address of `__start_context` on the new stack as the return address of
//! the context's function, so that returning from it switches to
//! `uc_link` (or exits). That return address is the trampoline's first
//! byte, not the byte after a call, and a walker looks up the byte before
//! it (the call instruction of an ordinary return address): padding
//! between two functions, where no FDE holds. The walk then fell back to
//! frame pointers from an rbp the coroutine never set up, and ended as
//! `frame_pointer` or, from a stack copy, `stack_copy_ended`.
//!
//! Nothing is below the trampoline on that stack: the byte before it, when
//! no FDE covers it, is given the outermost rule (a one-byte mark laid
//! among the FDEs, so that pages sent ahead of the table have it too), and
//! the walk ends there as complete. The trampoline is recognised by its
//! FDE starting at code that sets rsp from rbx (`mov %rbx,%rsp`, where `makecontext` left the
//! address of `uc_link`), which no compiler emits as a function's first
//! instruction; distributions strip the symbol table that names it.

use object::{Object, ObjectSegment};

use super::early::FdeAt;

/// `mov %rbx,%rsp` (REX.W 89 /r, ModRM rbx -> rsp): `__start_context`'s
/// first instruction.
const MOV_RBX_TO_RSP: [u8; 3] = [0x48, 0x89, 0xdc];

/// The section offset of an [`FdeAt`] that is no FDE but the outermost
/// mark before a trampoline ([`add_context_start_marks`]): evaluated as
/// one [`Rule::Outermost`](super::rule::Rule::Outermost) span, in the full build and in early pages alike.
pub const OUTERMOST_MARK: usize = usize::MAX;

/// The object's code as the builder sees it: its `PT_LOAD` segments'
/// addresses and file bytes (found without section headers too).
#[derive(Debug, Default)]
pub struct Code<'d> {
    segments: Vec<(u64, &'d [u8])>,
}

impl<'d> Code<'d> {
    /// The loaded segments of `file`.
    pub fn of(file: &impl Object<'d>) -> Code<'d> {
        let segments = file
            .segments()
            .filter_map(|s| Some((s.address(), s.data().ok()?)))
            .collect();
        Code { segments }
    }

    /// Whether the code at virtual address `start` (an FDE's start) is
    /// glibc's `__start_context`.
    pub fn is_context_start(&self, start: u64) -> bool {
        self.segments.iter().any(|&(address, bytes)| {
            start
                .checked_sub(address)
                .and_then(|off| usize::try_from(off).ok())
                .and_then(|off| bytes.get(off..off.checked_add(MOV_RBX_TO_RSP.len())?))
                .is_some_and(|code| code == MOV_RBX_TO_RSP)
        })
    }
}

/// Add to `fdes` (sorted by start) an [`OUTERMOST_MARK`] over the byte
/// before each of `starts` (trampolines' first bytes, as
/// [`Code::is_context_start`] found them) that no FDE covers.
pub fn add_context_start_marks(fdes: &mut Vec<FdeAt>, starts: &[u64]) {
    for &start in starts {
        let Some(before) = start.checked_sub(1) else {
            continue;
        };
        let at = fdes.partition_point(|f| f.start <= before);
        if fdes[..at].iter().any(|f| f.end > before) {
            continue;
        }
        let mark = FdeAt {
            start: before,
            end: start,
            offset: OUTERMOST_MARK,
        };
        fdes.insert(at, mark);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fde(start: u64, end: u64) -> FdeAt {
        FdeAt {
            start,
            end,
            offset: 0,
        }
    }

    fn ranges(fdes: &[FdeAt]) -> Vec<(u64, u64, bool)> {
        fdes.iter()
            .map(|f| (f.start, f.end, f.offset == OUTERMOST_MARK))
            .collect()
    }

    /// The byte before a trampoline in a gap gets a mark; one that another
    /// function's FDE covers does not.
    #[test]
    fn the_gap_byte_before_a_trampoline_is_marked() {
        let mut fdes = vec![fde(0x100, 0x1b9), fde(0x1c0, 0x1da), fde(0x1e0, 0x200)];
        add_context_start_marks(&mut fdes, &[0x1c0, 0x1e0]);
        assert_eq!(
            ranges(&fdes),
            [
                (0x100, 0x1b9, false),
                (0x1bf, 0x1c0, true),
                (0x1c0, 0x1da, false),
                (0x1df, 0x1e0, true),
                (0x1e0, 0x200, false),
            ]
        );
        let mut adjacent = vec![fde(0x100, 0x1c0), fde(0x1c0, 0x1da)];
        add_context_start_marks(&mut adjacent, &[0x1c0]);
        assert_eq!(
            ranges(&adjacent),
            [(0x100, 0x1c0, false), (0x1c0, 0x1da, false)]
        );
    }

    /// Only code starting with `mov %rbx,%rsp` is a trampoline.
    #[test]
    fn trampolines_are_found_by_their_first_instruction() {
        let bytes = [0x90, 0x48, 0x89, 0xdc, 0x48, 0x8b, 0x3c, 0x24, 0x48, 0x89];
        let code = Code {
            segments: vec![(0x1000, &bytes[..])],
        };
        assert!(code.is_context_start(0x1001));
        assert!(!code.is_context_start(0x1000));
        assert!(!code.is_context_start(0x1008));
        assert!(!code.is_context_start(0x0fff));
    }
}
