//! Assembles the unwind rows of FDEs into one sorted rule stream, as a
//! stream: FDEs arrive sorted by start address, each with its rows as
//! spans; an FDE with a later start wins where ranges overlap (on equal
//! starts, the one that arrives later), gaps between FDEs get
//! [`Rule::EndOfFunction`], and identical consecutive rules are merged.
//!
//! Only the spans a later FDE could still overlap are held (those ending
//! after the latest FDE's start); the rest are merged into the output as
//! soon as they are final. So building the table of a large object
//! (librustc_driver: 107 k FDEs, 1.15 M rows) holds one FDE's spans and the
//! merged rules, not every span of the object twice over.

use super::rule::Rule;
use super::table::RuleAt;

/// One rule over the address range `[start, end)` (object virtual
/// addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    /// First address the rule applies to.
    pub(super) start: u64,
    /// First address after the range.
    pub(super) end: u64,
    /// The rule.
    pub(super) rule: Rule,
}

/// The rule stream under construction: see the module documentation.
#[derive(Default)]
pub(super) struct Assembly {
    /// Sorted, disjoint spans that a later FDE may still overlap.
    laid: Vec<Span>,
    /// The merged output: (first address, rule), sorted by address.
    rules: Vec<RuleAt>,
    /// End of the last span merged into `rules`.
    previous_end: Option<u64>,
}

impl Assembly {
    /// Adds the spans of an FDE covering `[start, end)`. `start` must be at
    /// least the start of every FDE added before; `new` must be sorted,
    /// disjoint and within `[start, end)`.
    pub(super) fn add_fde(&mut self, new: &[Span], start: u64, end: u64) {
        // Disjoint sorted spans have increasing ends: the spans ending at or
        // before `start` are a prefix, and no later FDE (start >= this one's)
        // can cut them any more.
        let done = self.laid.partition_point(|s| s.end <= start);
        for i in 0..done {
            let span = self.laid[i];
            self.emit(span);
        }
        self.laid.drain(..done);
        overlay(&mut self.laid, new, start, end);
    }

    /// The rules merged so far, and the address below which they are
    /// final: no FDE still to come can add or change a rule below it (it
    /// is the end of the last span merged; `None` before the first).
    pub(super) fn merged(&self) -> (&[RuleAt], Option<u64>) {
        (&self.rules, self.previous_end)
    }

    /// The merged rule stream, ending with an end-of-function row after
    /// the last span.
    pub(super) fn finish(mut self) -> Vec<RuleAt> {
        for span in std::mem::take(&mut self.laid) {
            self.emit(span);
        }
        if let Some(end) = self.previous_end {
            self.push(end, Rule::EndOfFunction);
        }
        self.rules
    }

    fn emit(&mut self, span: Span) {
        if let Some(end) = self.previous_end.filter(|&end| end < span.start) {
            self.push(end, Rule::EndOfFunction);
        }
        self.push(span.start, span.rule);
        self.previous_end = Some(span.end);
    }

    fn push(&mut self, addr: u64, rule: Rule) {
        if self.rules.last().is_none_or(|&(_, last)| last != rule) {
            self.rules.push((addr, rule));
        }
    }
}

/// Lays the spans of an FDE covering `[start, end)` over `laid` (sorted,
/// disjoint spans of FDEs with earlier or equal starts): they replace
/// whatever `laid` had in that range.
fn overlay(laid: &mut Vec<Span>, new: &[Span], start: u64, end: u64) {
    if laid.last().is_none_or(|last| last.end <= start) {
        laid.extend_from_slice(new);
        return;
    }
    // Disjoint sorted spans have increasing ends: the overlapped ones are a suffix.
    let tail = laid.split_off(laid.partition_point(|s| s.end <= start));
    laid.extend(
        tail.iter()
            .filter(|s| s.start < start)
            .map(|s| Span { end: start, ..*s }),
    );
    laid.extend_from_slice(new);
    laid.extend(tail.iter().filter(|s| s.end > end).map(|s| Span {
        start: s.start.max(end),
        ..*s
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::rule::{Bx, CfaOffset, Fp};

    fn rsp(off: i64) -> Rule {
        Rule::RspOffset {
            cfa: CfaOffset::new(off).expect("fits"),
            fp: Fp::Unchanged,
            bx: Bx::Unchanged,
        }
    }

    fn span(start: u64, end: u64, rule: Rule) -> Span {
        Span { start, end, rule }
    }

    /// FDEs (spans, start, end) in arrival order, assembled.
    fn assemble(fdes: &[(&[Span], u64, u64)]) -> Vec<RuleAt> {
        let mut assembly = Assembly::default();
        for (spans, start, end) in fdes {
            assembly.add_fde(spans, *start, *end);
        }
        assembly.finish()
    }

    #[test]
    fn later_fde_start_wins_and_earlier_fde_resumes_after_it() {
        let rules = assemble(&[
            (&[span(0, 50, rsp(8)), span(50, 100, rsp(16))], 0, 100),
            (&[span(40, 60, rsp(24))], 40, 60),
            (&[span(60, 70, rsp(32))], 60, 70),
            // Same start as the previous FDE: the later one replaces it.
            (&[span(60, 65, rsp(40))], 60, 65),
            (&[span(200, 210, rsp(8))], 200, 210),
        ]);
        assert_eq!(
            rules,
            [
                (0, rsp(8)),
                (40, rsp(24)),
                (60, rsp(40)),
                (65, rsp(32)),
                (70, rsp(16)),
                (100, Rule::EndOfFunction),
                (200, rsp(8)),
                (210, Rule::EndOfFunction),
            ]
        );
    }

    #[test]
    fn an_fde_inside_one_already_flushed_past_still_splits_it() {
        // The second FDE starts after the first's first span ended (so that
        // span is final) and inside its second span.
        let rules = assemble(&[
            (&[span(0, 10, rsp(8)), span(10, 100, rsp(16))], 0, 100),
            (&[span(20, 30, rsp(24))], 20, 30),
            (&[span(150, 160, rsp(8))], 150, 160),
        ]);
        assert_eq!(
            rules,
            [
                (0, rsp(8)),
                (10, rsp(16)),
                (20, rsp(24)),
                (30, rsp(16)),
                (100, Rule::EndOfFunction),
                (150, rsp(8)),
                (160, Rule::EndOfFunction),
            ]
        );
    }

    #[test]
    fn adjacent_identical_rules_merge_and_gaps_end_functions() {
        let rules = assemble(&[
            (&[span(0x10, 0x20, rsp(8))], 0x10, 0x20),
            (
                &[span(0x20, 0x30, rsp(8)), span(0x30, 0x40, rsp(16))],
                0x20,
                0x40,
            ),
            (&[span(0x40, 0x48, rsp(8))], 0x40, 0x48),
            (&[span(0x50, 0x58, rsp(8))], 0x50, 0x58),
        ]);
        assert_eq!(
            rules,
            [
                (0x10, rsp(8)),
                (0x30, rsp(16)),
                (0x40, rsp(8)),
                (0x48, Rule::EndOfFunction),
                (0x50, rsp(8)),
                (0x58, Rule::EndOfFunction),
            ]
        );
        assert!(assemble(&[]).is_empty());
    }
}
