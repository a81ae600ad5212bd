//! Rows ahead of the full table: while a large object's table is built
//! (librustc_driver: 107 k FDEs, hundreds of milliseconds), samples in it
//! are walked by frame pointers and counted `no_table`. The loader notes
//! the 64 KiB pages those samples' pcs fall in ([`WantedPages`]); the
//! build, between FDEs, builds those pages alone and sends them ahead
//! ([`Ahead::serve`], through an [`EarlySink`]), so the walker can use
//! them within milliseconds. It also sends the pages its address-ordered
//! pass has finished, [`PROGRESS_PAGES`] at a time ([`Ahead::progress`]).
//! Each page is sent once; the loader keeps them, and loads only the
//! other pages of the finished table.
//!
//! The rows of a page depend only on the FDEs whose ranges overlap it (an
//! FDE with a later start wins only where it overlaps; the rule carried
//! into the page is the one in effect at its start, which an overlapping
//! FDE gives). So assembling just those FDEs, in the full build's order,
//! yields the page's rows exactly as the full table has them. Likewise a
//! page below the address where the merged stream is final
//! ([`Assembly::merged`]) has its final rows.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::assemble::{Assembly, Span};
use super::table::{CfiSource, RuleAt, UnwindTable};
use crate::sampling::unwind_row::PAGE_BITS;

/// Where an FDE is, found by the first pass over the section.
pub(super) struct FdeAt {
    /// Its first address.
    pub(super) start: u64,
    /// The first address after it.
    pub(super) end: u64,
    /// Its offset in the section.
    pub(super) offset: usize,
}

/// Where a build hears which pages samples wait on and sends their rows.
pub trait EarlySink {
    /// Page numbers (ELF virtual address >> 16) asked for since the last
    /// call, in any order.
    fn wanted(&self) -> Vec<u32>;
    /// Some pages of the table under construction, each with exactly the
    /// rows the full table will have.
    fn publish(&self, pages: UnwindTable);
}

/// Pages of one object that samples wait on while its table is built:
/// the loader adds, the build thread takes.
#[derive(Debug, Default)]
pub(crate) struct WantedPages(Mutex<Vec<u32>>);

impl WantedPages {
    /// Ask for page number `page`.
    pub(crate) fn add(&self, page: u32) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(page);
    }

    /// The pages asked for since the last call.
    pub(crate) fn take(&self) -> Vec<u32> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// How many FDEs the full build evaluates between two looks at the wanted
/// pages (about a millisecond of work).
pub(super) const CHECK_EVERY_FDES: usize = 256;

/// The address-ordered pass sends its finished pages in batches of at
/// least this many (2 MiB of code).
pub(super) const PROGRESS_PAGES: u64 = 32;

/// Serves a sink during one build: see the module documentation.
pub(super) struct Ahead<'s> {
    sink: &'s dyn EarlySink,
    /// `max_end[i]`: the largest end of `fdes[..=i]` (computed on first
    /// use), to find the FDEs that reach into a page from before it.
    max_end: Vec<u64>,
    /// Pages sent so far.
    sent: BTreeSet<u32>,
    /// Pages below this one were considered by [`Self::progress`].
    progressed: u64,
}

impl<'s> Ahead<'s> {
    pub(super) fn new(sink: &'s dyn EarlySink) -> Self {
        Ahead {
            sink,
            max_end: Vec::new(),
            sent: BTreeSet::new(),
            progressed: 0,
        }
    }

    /// Send the pages of `table` not sent before, if any.
    pub(super) fn send(&mut self, table: &UnwindTable) {
        let sent = &self.sent;
        let table = table.only_pages(|p| !sent.contains(&p));
        if !table.pages().is_empty() {
            self.sent.extend(table.pages().iter().map(|p| p.page));
            self.sink.publish(table);
        }
    }

    /// Send the pages the address-ordered pass has finished since the
    /// last call, once they are [`PROGRESS_PAGES`] or more: `merged` is
    /// its rule stream and the address below which that is final.
    pub(super) fn progress(&mut self, merged: (&[RuleAt], Option<u64>), source: CfiSource) {
        let (rules, Some(final_below)) = merged else {
            return;
        };
        let (first, end) = (self.progressed, final_below >> PAGE_BITS);
        if end < first + PROGRESS_PAGES {
            return;
        }
        self.progressed = end;
        // From the rule carried into page `first`.
        let from = rules
            .partition_point(|r| r.0 <= first << PAGE_BITS)
            .saturating_sub(1);
        let to = rules.partition_point(|r| r.0 < final_below);
        // An invalid stream is the full build's error to report.
        if let Ok(table) = UnwindTable::from_rules(&rules[from..to], 0, BTreeMap::new(), source) {
            self.send(&table.only_pages(|p| (first..end).contains(&u64::from(p))));
        }
    }

    /// Build and publish the pages wanted since the last call: `fdes` are
    /// the object's FDEs as the full build orders them, `evaluate` puts an
    /// FDE's spans into the vector (as the full build does).
    pub(super) fn serve(
        &mut self,
        fdes: &[FdeAt],
        source: CfiSource,
        mut evaluate: impl FnMut(&FdeAt, &mut Vec<Span>),
    ) {
        let mut pages = self.sink.wanted();
        pages.retain(|p| !self.sent.contains(p));
        if pages.is_empty() {
            return;
        }
        pages.sort_unstable();
        pages.dedup();
        if self.max_end.len() != fdes.len() {
            self.max_end = fdes
                .iter()
                .scan(0, |max, f| {
                    *max = f.end.max(*max);
                    Some(*max)
                })
                .collect();
        }
        let selected = overlapping(fdes, &self.max_end, &pages);
        let mut assembly = Assembly::default();
        let mut spans = Vec::new();
        for &i in &selected {
            spans.clear();
            evaluate(&fdes[i], &mut spans);
            assembly.add_fde(&spans, fdes[i].start, fdes[i].end);
        }
        let rules = assembly.finish();
        // An invalid stream is the full build's error to report.
        if let Ok(table) =
            UnwindTable::from_rules(&rules, selected.len() as u64, BTreeMap::new(), source)
        {
            self.send(&table.only_pages(|p| pages.binary_search(&p).is_ok()));
        }
    }
}

/// Indices (increasing) of the FDEs of `fdes` (sorted by start, with
/// `max_end` their running largest end) whose ranges overlap any page of
/// `pages`.
fn overlapping(fdes: &[FdeAt], max_end: &[u64], pages: &[u32]) -> Vec<usize> {
    let mut selected = Vec::new();
    for &page in pages {
        let low = u64::from(page) << PAGE_BITS;
        let high = (u64::from(page) + 1) << PAGE_BITS;
        let first = max_end.partition_point(|&end| end <= low);
        let last = fdes.partition_point(|f| f.start < high);
        selected.extend((first..last).filter(|&i| fdes[i].end > low));
    }
    selected.sort_unstable();
    selected.dedup();
    selected
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind::cfi::{build_table, build_table_early};
    use std::cell::RefCell;

    /// A sink answering one list of pages once and keeping what it gets.
    struct Recorder {
        asked: RefCell<Vec<u32>>,
        got: RefCell<Vec<UnwindTable>>,
    }

    impl EarlySink for Recorder {
        fn wanted(&self) -> Vec<u32> {
            self.asked.take()
        }
        fn publish(&self, pages: UnwindTable) {
            self.got.borrow_mut().push(pages);
        }
    }

    /// Rows of each page of `table`, by page number.
    fn rows_by_page(
        table: &UnwindTable,
    ) -> BTreeMap<u32, Vec<crate::sampling::unwind_row::RawRow>> {
        table
            .pages()
            .iter()
            .map(|p| {
                let first = p.first_row as usize;
                let rows = table.rows()[first..first + p.row_count as usize].to_vec();
                (p.page, rows)
            })
            .collect()
    }

    /// Builds `path`'s table with early pages asked for (every third page,
    /// the first and last, one past the end) and checks them against the
    /// full build; returns how many pages were sent before the build's
    /// last batch (which sends all the others) and how many asked for were
    /// in the table.
    fn check(path: &std::path::Path) -> Option<(usize, usize)> {
        let Ok(elf) = std::fs::read(path) else {
            eprintln!("skipped: {} is absent", path.display());
            return None;
        };
        let full = build_table(&elf).expect("full table");
        let full_pages = rows_by_page(&full);
        let mut asked: Vec<u32> = full.pages().iter().step_by(3).map(|p| p.page).collect();
        let last = full.pages().last().expect("pages").page;
        asked.extend([full.pages()[0].page, last, last + 7]);
        let recorder = Recorder {
            asked: RefCell::new(asked.clone()),
            got: RefCell::new(Vec::new()),
        };
        let built = build_table_early(None, &elf, &recorder, &[]).expect("table");
        // The full table is the same as without early pages...
        assert_eq!(built, full, "{}", path.display());
        // ...each page sent has exactly its rows, and is sent once...
        let got = recorder.got.take();
        let first_sent: BTreeSet<u32> = got[0].pages().iter().map(|p| p.page).collect();
        let before_last: usize = got[..got.len() - 1].iter().map(|t| t.pages().len()).sum();
        let mut sent = BTreeMap::new();
        for table in got {
            for (page, rows) in rows_by_page(&table) {
                assert_eq!(Some(&rows), full_pages.get(&page), "page {page:#x}");
                assert!(sent.insert(page, rows).is_none(), "page {page:#x} twice");
            }
        }
        // ...and every page was sent, the ones asked for first.
        assert_eq!(sent.len(), full_pages.len(), "{}", path.display());
        let asked: BTreeSet<u32> = asked
            .into_iter()
            .filter(|p| full_pages.contains_key(p))
            .collect();
        assert_eq!(first_sent, asked, "{}", path.display());
        Some((before_last, asked.len()))
    }

    #[test]
    fn early_pages_have_the_full_tables_rows() {
        check("/lib/x86_64-linux-gnu/libc.so.6".as_ref());
        check("/lib/x86_64-linux-gnu/libstdc++.so.6".as_ref());
    }

    /// A large object: the finished pages are sent as the pass goes too.
    #[test]
    fn a_large_tables_finished_pages_are_sent_as_it_is_built() {
        let sysroot = std::process::Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok());
        let driver = sysroot.and_then(|root| {
            std::fs::read_dir(std::path::Path::new(root.trim()).join("lib"))
                .ok()?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    let name = p.file_name().unwrap_or_default().to_string_lossy();
                    name.starts_with("librustc_driver-") && name.ends_with(".so")
                })
        });
        let Some(driver) = driver else {
            eprintln!("skipped: no librustc_driver in rustc's sysroot");
            return;
        };
        let (before_last, asked) = check(&driver).expect("readable");
        assert!(
            before_last > asked,
            "{before_last} pages sent before the last batch, {asked} asked for"
        );
    }

    #[test]
    fn overlapping_finds_fdes_reaching_into_a_page_from_before() {
        let fde = |start, end| FdeAt {
            start,
            end,
            offset: 0,
        };
        // A long FDE from page 0 into page 2, a short one in page 0, one in page 3.
        let fdes = [
            fde(0x100, 0x2_0010),
            fde(0x200, 0x300),
            fde(0x3_0000, 0x3_0100),
        ];
        let max_end = [0x2_0010, 0x2_0010, 0x3_0100];
        assert_eq!(overlapping(&fdes, &max_end, &[2]), [0]);
        assert_eq!(overlapping(&fdes, &max_end, &[0, 3]), [0, 1, 2]);
        assert!(overlapping(&fdes, &max_end, &[5]).is_empty());
    }
}
