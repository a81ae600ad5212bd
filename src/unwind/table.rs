//! [`UnwindTable`]: one object's rows split into 64 KiB pages, the shape the
//! BPF maps hold (`docs/unwind-tables.md`).
//!
//! A table is only made by the builder (`UnwindTable::from_rules`) or
//! [`UnwindTable::from_parts`] (the disk cache), which both check the page
//! invariants the BPF lookup relies on.

use std::collections::BTreeMap;
use std::fmt;

use super::rule::{Rule, UnsupportedKind};
use crate::sampling::unwind_row::{Page, RawRow, PAGE_BITS, PAGE_SIZE};

/// Bytes one page costs in the BPF page index (`struct page_key` +
/// `struct page_value`).
pub const PAGE_INDEX_BYTES: u64 = 16;
/// Bytes of one row (`struct unwind_row`).
pub const ROW_BYTES: u64 = 8;
/// Highest address a table can describe (exclusive): page numbers are u32.
pub const MAX_ADDRESS: u64 = 1 << (32 + PAGE_BITS);
/// Most pages one table may have: 4 GiB of code (the largest objects
/// known have a few hundred MiB). Rules that would need more (an FDE
/// claiming a range of terabytes, from a damaged or hostile object) are an
/// error, not gigabytes of pages each holding one carried row.
pub const MAX_PAGES: usize = 1 << 16;

/// Which section the rows were built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CfiSource {
    /// `.eh_frame` of the object itself.
    EhFrame,
    /// `.debug_frame`, of the object or of its separate debug file.
    DebugFrame,
}

impl fmt::Display for CfiSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CfiSource::EhFrame => ".eh_frame",
            CfiSource::DebugFrame => ".debug_frame",
        })
    }
}

/// Counts describing a built table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableStats {
    /// FDEs read from the CFI section (including empty and left-out ones).
    pub fdes: u64,
    /// Rows in the table, all pages together (page-start copies included).
    pub rows: u64,
    /// Pages in the table.
    pub pages: u64,
    /// BPF map memory: `rows * 8 + pages * 16` bytes.
    pub bytes: u64,
    /// Most rows in one page: bounds the BPF binary search
    /// (`ceil(log2(max_page_rows + 1))` steps).
    pub max_page_rows: u64,
    /// Unsupported rules by kind: CFI rows (gimli rows, before merging) for
    /// kinds 1-5, FDEs for kinds 6-7.
    pub unsupported: BTreeMap<UnsupportedKind, u64>,
    /// Section the rows came from.
    pub source: CfiSource,
}

impl TableStats {
    /// The figures read from the CFI (or a cache file); the ones measured
    /// on the assembled table (rows, pages, bytes, most rows in a page) are
    /// zero until [`UnwindTable::from_parts`] fills them in.
    pub fn from_cfi(
        fdes: u64,
        unsupported: BTreeMap<UnsupportedKind, u64>,
        source: CfiSource,
    ) -> Self {
        TableStats {
            fdes,
            rows: 0,
            pages: 0,
            bytes: 0,
            max_page_rows: 0,
            unsupported,
            source,
        }
    }
}

/// One row with its absolute range, as [`UnwindTable::iter_rows`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableRow {
    /// First address (ELF virtual address) the rule applies to.
    pub start: u64,
    /// End of the range (exclusive): the next row in the page, else the page end.
    pub end: u64,
    /// The rule.
    pub rule: Rule,
}

/// An object's unwind table: rows of all pages concatenated in page order,
/// and the page index. Addresses are the object's ELF virtual addresses (the
/// addresses its FDEs use); a pc in a process maps to `pc - load bias`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwindTable {
    rows: Vec<RawRow>,
    pages: Vec<Page>,
    stats: TableStats,
}

/// A row array and page index that break the table invariants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid unwind table: {0}")]
pub struct InvalidTable(pub String);

/// A rule starting at an absolute address: the builder's merged row stream.
pub(crate) type RuleAt = (u64, Rule);

impl UnwindTable {
    /// Splits a row stream into pages. `rules` must be sorted by strictly
    /// increasing address below [`MAX_ADDRESS`]; each rule holds until the
    /// next one, the last until the end of its page. Pages whose rules are
    /// all [`Rule::EndOfFunction`] are left out; every other page starts with
    /// a row at `pc_low` 0 carrying the rule in effect at the page start.
    pub(crate) fn from_rules(
        rules: &[RuleAt],
        fdes: u64,
        unsupported: BTreeMap<UnsupportedKind, u64>,
        source: CfiSource,
    ) -> Result<Self, InvalidTable> {
        let mut rows = Vec::with_capacity(rules.len() + rules.len() / 64);
        let mut pages = Vec::new();
        let mut carried = Rule::EndOfFunction;
        let mut i = 0;
        let mut page = match rules.first() {
            Some(&(addr, _)) => addr >> PAGE_BITS,
            None => 0,
        };
        while i < rules.len() {
            let page_start = page << PAGE_BITS;
            let page_end = page_start + PAGE_SIZE;
            let first_row = rows.len();
            if rules[i].0 != page_start {
                rows.push(carried.to_raw(0));
            }
            while i < rules.len() && rules[i].0 < page_end {
                let (addr, rule) = rules[i];
                if addr < page_start || addr >= MAX_ADDRESS {
                    return Err(InvalidTable(format!("row at {addr:#x} out of order")));
                }
                rows.push(rule.to_raw((addr - page_start) as u16));
                carried = rule;
                i += 1;
            }
            let end_of_function = Rule::EndOfFunction.to_raw(0).cfa_type;
            if rows[first_row..]
                .iter()
                .all(|r| r.cfa_type == end_of_function)
            {
                rows.truncate(first_row);
            } else {
                if pages.len() == MAX_PAGES {
                    return Err(InvalidTable(format!(
                        "more than {MAX_PAGES} pages (4 GiB of code) from {:#x}",
                        rules[0].0
                    )));
                }
                pages.push(Page {
                    page: u32::try_from(page)
                        .map_err(|_| InvalidTable("page above 2^32".into()))?,
                    first_row: u32::try_from(first_row)
                        .map_err(|_| InvalidTable("more than 2^32 rows".into()))?,
                    row_count: (rows.len() - first_row) as u32,
                });
            }
            page = match rules.get(i) {
                Some(_) if carried != Rule::EndOfFunction => page + 1,
                Some(&(addr, _)) => addr >> PAGE_BITS,
                None => break,
            };
        }
        Self::from_parts(rows, pages, TableStats::from_cfi(fdes, unsupported, source))
    }

    /// Assembles a table from its parts (as stored in the disk cache),
    /// checking that every row decodes, pages are sorted and contiguous, each
    /// page's rows start at `pc_low` 0 and increase strictly. `stats.rows`,
    /// `pages`, `bytes` and `max_page_rows` are recomputed.
    pub fn from_parts(
        rows: Vec<RawRow>,
        pages: Vec<Page>,
        mut stats: TableStats,
    ) -> Result<Self, InvalidTable> {
        let mut next_row = 0u64;
        let mut max_page_rows = 0;
        for (i, p) in pages.iter().enumerate() {
            if i > 0 && pages[i - 1].page >= p.page {
                return Err(InvalidTable(format!("page {:#x} out of order", p.page)));
            }
            if u64::from(p.first_row) != next_row || p.row_count == 0 {
                return Err(InvalidTable(format!(
                    "page {:#x} rows not contiguous",
                    p.page
                )));
            }
            next_row += u64::from(p.row_count);
            let page_rows = rows
                .get(p.first_row as usize..next_row as usize)
                .ok_or_else(|| InvalidTable(format!("page {:#x} past the rows", p.page)))?;
            if page_rows[0].pc_low != 0 || page_rows.windows(2).any(|w| w[0].pc_low >= w[1].pc_low)
            {
                return Err(InvalidTable(format!("page {:#x} rows unsorted", p.page)));
            }
            max_page_rows = max_page_rows.max(u64::from(p.row_count));
        }
        if next_row != rows.len() as u64 {
            return Err(InvalidTable("rows outside every page".into()));
        }
        if let Some(raw) = rows.iter().find(|r| Rule::from_raw(**r).is_err()) {
            return Err(InvalidTable(format!("undecodable row {raw:?}")));
        }
        stats.rows = rows.len() as u64;
        stats.pages = pages.len() as u64;
        stats.bytes = stats.rows * ROW_BYTES + stats.pages * PAGE_INDEX_BYTES;
        stats.max_page_rows = max_page_rows;
        Ok(UnwindTable { rows, pages, stats })
    }

    /// All rows, pages concatenated in page order (the `unwind_rows` map content).
    pub fn rows(&self) -> &[RawRow] {
        &self.rows
    }

    /// The page index, sorted by page number (the `unwind_pages` map content).
    pub fn pages(&self) -> &[Page] {
        &self.pages
    }

    /// Counts describing the table.
    pub fn stats(&self) -> &TableStats {
        &self.stats
    }

    fn page_rows(&self, page: &Page) -> &[RawRow] {
        let first = page.first_row as usize;
        &self.rows[first..first + page.row_count as usize]
    }

    /// The rule for ELF virtual address `vaddr`, found the way the BPF
    /// program does: the page `vaddr >> 16`, then the last row whose `pc_low`
    /// is at most `vaddr & 0xffff`. No page means [`Rule::EndOfFunction`].
    pub fn lookup(&self, vaddr: u64) -> Rule {
        let Ok(page_number) = u32::try_from(vaddr >> PAGE_BITS) else {
            return Rule::EndOfFunction;
        };
        let Ok(index) = self.pages.binary_search_by_key(&page_number, |p| p.page) else {
            return Rule::EndOfFunction;
        };
        let rows = self.page_rows(&self.pages[index]);
        let low = (vaddr & (PAGE_SIZE - 1)) as u16;
        // Every page's first row is at pc_low 0, so at least one row matches.
        let row = rows[rows.partition_point(|r| r.pc_low <= low) - 1];
        decode(row)
    }

    /// The table restricted to the pages whose numbers `keep` accepts:
    /// those pages' rows, rebased; the counts measured on the table
    /// (rows, pages, bytes, most rows in a page) are the kept pages'.
    pub(crate) fn only_pages(&self, keep: impl Fn(u32) -> bool) -> UnwindTable {
        let mut rows = Vec::new();
        let mut pages = Vec::new();
        for page in self.pages.iter().filter(|p| keep(p.page)) {
            pages.push(Page {
                first_row: rows.len() as u32,
                ..*page
            });
            rows.extend_from_slice(self.page_rows(page));
        }
        let mut stats = self.stats.clone();
        stats.rows = rows.len() as u64;
        stats.pages = pages.len() as u64;
        stats.bytes = stats.rows * ROW_BYTES + stats.pages * PAGE_INDEX_BYTES;
        stats.max_page_rows = pages
            .iter()
            .map(|p| u64::from(p.row_count))
            .max()
            .unwrap_or(0);
        UnwindTable { rows, pages, stats }
    }

    /// Every row with its absolute address range, in address order.
    pub fn iter_rows(&self) -> impl Iterator<Item = TableRow> + '_ {
        self.pages.iter().flat_map(move |page| {
            let base = u64::from(page.page) << PAGE_BITS;
            let rows = self.page_rows(page);
            rows.iter().enumerate().map(move |(i, row)| TableRow {
                start: base + u64::from(row.pc_low),
                end: rows
                    .get(i + 1)
                    .map_or(base + PAGE_SIZE, |next| base + u64::from(next.pc_low)),
                rule: decode(*row),
            })
        })
    }
}

/// Decodes a row of a constructed table (validated by `from_parts`).
fn decode(row: RawRow) -> Rule {
    Rule::from_raw(row).expect("table rows are validated on construction")
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

    fn table(rules: &[RuleAt]) -> UnwindTable {
        UnwindTable::from_rules(rules, 1, BTreeMap::new(), CfiSource::EhFrame).expect("valid")
    }

    /// Found by fuzzing (`fuzz/seeds/unwind_builder/oom-debug-frame-huge-fde`):
    /// a 177-byte `.debug_frame` whose FDE claims nearly 2^48 bytes made
    /// one page per 64 KiB, over 2 GB before the fuzzer's limit stopped it.
    #[test]
    fn a_rule_spanning_terabytes_is_an_error_not_a_page_per_64_kib() {
        let rules = [(0, rsp(8)), (MAX_ADDRESS - 1, Rule::EndOfFunction)];
        let err = UnwindTable::from_rules(&rules, 1, BTreeMap::new(), CfiSource::DebugFrame)
            .expect_err("2^32 pages");
        assert!(err.0.contains("more than 65536 pages"), "{err}");
        // Exactly MAX_PAGES pages of one function are still a table.
        let end = (MAX_PAGES as u64) << PAGE_BITS;
        let t = table(&[(0, rsp(8)), (end, Rule::EndOfFunction)]);
        assert_eq!(t.pages().len(), MAX_PAGES);
    }

    #[test]
    fn pages_start_with_the_rule_in_effect_and_skip_empty_ones() {
        let eof = Rule::EndOfFunction;
        let t = table(&[
            (0x1_fff0, rsp(8)),
            // A function spanning pages 2..=4 with no row in page 3.
            (0x2_0010, rsp(16)),
            (0x4_0004, rsp(8)),
            (0x4_0008, eof),
            // Far away: pages in between are all end-of-function.
            (0x9_0000, rsp(8)),
            (0x9_0001, eof),
        ]);
        let pages: Vec<u32> = t.pages().iter().map(|p| p.page).collect();
        assert_eq!(pages, [1, 2, 3, 4, 9]);
        let rows: Vec<(u64, Rule)> = t.iter_rows().map(|r| (r.start, r.rule)).collect();
        assert_eq!(
            rows,
            [
                (0x1_0000, eof),
                (0x1_fff0, rsp(8)),
                (0x2_0000, rsp(8)),
                (0x2_0010, rsp(16)),
                (0x3_0000, rsp(16)),
                (0x4_0000, rsp(16)),
                (0x4_0004, rsp(8)),
                (0x4_0008, eof),
                (0x9_0000, rsp(8)),
                (0x9_0001, eof),
            ]
        );
        assert_eq!(t.lookup(0x3_ffff), rsp(16));
        assert_eq!(t.lookup(0x1_fff0), rsp(8));
        assert_eq!(t.lookup(0x1_ffef), eof);
        assert_eq!(t.lookup(0x5_0000), eof);
        assert_eq!(t.lookup(u64::MAX), eof);
        assert_eq!(t.stats().rows, 10);
        assert_eq!(t.stats().bytes, 10 * 8 + 5 * 16);
        assert_eq!(t.stats().max_page_rows, 3);
    }

    #[test]
    fn from_parts_rejects_broken_invariants() {
        let t = table(&[(0x1000, rsp(8)), (0x1010, Rule::EndOfFunction)]);
        let (rows, pages, stats) = (t.rows().to_vec(), t.pages().to_vec(), t.stats().clone());
        assert_eq!(
            UnwindTable::from_parts(rows.clone(), pages.clone(), stats.clone()),
            Ok(t)
        );
        let mut unsorted = rows.clone();
        unsorted.swap(1, 2);
        assert!(UnwindTable::from_parts(unsorted, pages.clone(), stats.clone()).is_err());
        let mut short = pages.clone();
        short[0].row_count = 5;
        assert!(UnwindTable::from_parts(rows.clone(), short, stats.clone()).is_err());
        let mut garbage = rows;
        garbage[1].cfa_type = 0x7f;
        assert!(UnwindTable::from_parts(garbage, pages, stats).is_err());
    }
}
