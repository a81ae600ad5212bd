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
//! no FDE covers it, is given the outermost rule, so the walk ends there as
//! complete. The trampoline is recognised by its FDE starting at code that
//! sets rsp from rbx (`mov %rbx,%rsp`, where `makecontext` left the
//! address of `uc_link`), which no compiler emits as a function's first
//! instruction; distributions strip the symbol table that names it.

use super::rule::Rule;
use super::table::RuleAt;

/// `mov %rbx,%rsp` (REX.W 89 /r, ModRM rbx -> rsp): `__start_context`'s
/// first instruction.
const MOV_RBX_TO_RSP: [u8; 3] = [0x48, 0x89, 0xdc];

/// The object's code as the builder sees it: its `.text` section's
/// address and bytes.
#[derive(Debug, Clone, Copy)]
pub struct Text<'d> {
    /// Virtual address of the first byte.
    pub address: u64,
    /// The section's bytes.
    pub bytes: &'d [u8],
}

impl Text<'_> {
    /// Whether the code at virtual address `start` (an FDE's start) is
    /// glibc's `__start_context`.
    pub fn is_context_start(&self, start: u64) -> bool {
        start
            .checked_sub(self.address)
            .and_then(|off| usize::try_from(off).ok())
            .and_then(|off| self.bytes.get(off..off.checked_add(MOV_RBX_TO_RSP.len())?))
            .is_some_and(|code| code == MOV_RBX_TO_RSP)
    }
}

/// Give the byte before each of `starts` (trampolines' first bytes, as
/// [`Text::is_context_start`] found them) the outermost rule when it is in
/// a gap (`rules`: sorted, as assembled; the trampoline's own rows start at
/// it).
pub fn mark_context_starts(rules: &mut Vec<RuleAt>, starts: &[u64]) {
    for &start in starts {
        let Some(before) = start.checked_sub(1) else {
            continue;
        };
        let at = rules.partition_point(|&(addr, _)| addr <= before);
        let in_gap = at
            .checked_sub(1)
            .is_none_or(|i| rules[i].1 == Rule::EndOfFunction);
        if !in_gap || rules.get(at).map(|&(addr, _)| addr) != Some(start) {
            continue;
        }
        if at > 0 && rules[at - 1].0 == before {
            rules[at - 1].1 = Rule::Outermost;
        } else {
            rules.insert(at, (before, Rule::Outermost));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::rule::{CfaOffset, Fp};

    fn cfa8() -> Rule {
        Rule::RspOffset {
            cfa: CfaOffset::new(8).unwrap(),
            fp: Fp::Unchanged,
        }
    }

    /// The byte before a trampoline in a gap becomes outermost; one that
    /// another function's rows cover is left alone.
    #[test]
    fn the_gap_byte_before_a_trampoline_is_outermost() {
        let mut rules = vec![
            (0x100, cfa8()),
            (0x1b9, Rule::EndOfFunction),
            (0x1c0, cfa8()),
            (0x1da, Rule::EndOfFunction),
            (0x200, cfa8()),
        ];
        mark_context_starts(&mut rules, &[0x1c0, 0x200]);
        assert_eq!(
            rules,
            [
                (0x100, cfa8()),
                (0x1b9, Rule::EndOfFunction),
                (0x1bf, Rule::Outermost),
                (0x1c0, cfa8()),
                (0x1da, Rule::EndOfFunction),
                (0x1ff, Rule::Outermost),
                (0x200, cfa8()),
            ]
        );
        let mut adjacent = vec![(0x100, cfa8()), (0x1c0, cfa8())];
        mark_context_starts(&mut adjacent, &[0x1c0]);
        assert_eq!(adjacent, [(0x100, cfa8()), (0x1c0, cfa8())]);
    }

    /// Only code starting with `mov %rbx,%rsp` is a trampoline.
    #[test]
    fn trampolines_are_found_by_their_first_instruction() {
        let bytes = [0x90, 0x48, 0x89, 0xdc, 0x48, 0x8b, 0x3c, 0x24, 0x48, 0x89];
        let text = Text {
            address: 0x1000,
            bytes: &bytes,
        };
        assert!(text.is_context_start(0x1001));
        assert!(!text.is_context_start(0x1000));
        assert!(!text.is_context_start(0x1008));
        assert!(!text.is_context_start(0x0fff));
    }
}
