//! The walker's unwind tables as BPF maps: rows in `unwind_rows` (written
//! through its shared memory), each object's pages in `unwind_pages`, and
//! the objects whose tables are whole in `loaded_objects`. Written by the
//! unwind loader; read back row by row for walks user space finishes
//! ([`crate::unwind::deferred`]).

use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags};

use super::Sampler;
use crate::sampling::unwind_row::{Page, RawRow, PAGE_BITS};

/// What the walker's maps hold for one address of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLookup {
    /// The rule in effect there: the last row of its page at or below it.
    Row(RawRow),
    /// The table is loaded and no CFI covers the address.
    NoCfi,
    /// Neither the address's page nor the whole table is loaded yet.
    NotLoaded,
}

impl Sampler<'_> {
    /// Write `rows` into the `unwind_rows` map starting at index `first`
    /// (a copy into the map's shared memory). Errors if they do not fit.
    pub fn write_rows(&self, first: u32, rows: &[RawRow]) -> Result<()> {
        self.rows.write(first, rows)
    }

    /// Make `pages` of `object_id` visible to the walker; their rows start
    /// at `base_row` in `unwind_rows` (page.first_row is relative to it).
    pub fn insert_pages(&self, object_id: u32, pages: &[Page], base_row: u32) -> Result<()> {
        for page in pages {
            let mut value = [0u8; 8];
            value[0..4].copy_from_slice(&(base_row + page.first_row).to_ne_bytes());
            value[4..8].copy_from_slice(&page.row_count.to_ne_bytes());
            self.skel
                .maps
                .unwind_pages
                .update(&page_key(object_id, page.page), &value, MapFlags::ANY)
                .context("inserting an unwind page (too many pages loaded?)")?;
        }
        Ok(())
    }

    /// Remove `pages` of `object_id` from the walker's view.
    pub fn remove_pages(&self, object_id: u32, pages: &[Page]) {
        for page in pages {
            let _ = self
                .skel
                .maps
                .unwind_pages
                .delete(&page_key(object_id, page.page));
        }
    }

    /// Mark `object_id`'s table as complete (or no longer present) for the walker.
    pub fn set_object_loaded(&self, object_id: u32, loaded: bool) -> Result<()> {
        let key = object_id.to_ne_bytes();
        if loaded {
            self.skel
                .maps
                .loaded_objects
                .update(&key, &[1u8], MapFlags::ANY)
                .context("marking an unwind table loaded")
        } else {
            let _ = self.skel.maps.loaded_objects.delete(&key);
            Ok(())
        }
    }

    /// Whether the walker has rows for `vaddr` of `object_id`'s table: its
    /// page is in `unwind_pages`, or the whole table is loaded (where no
    /// page is, no CFI covers the address). One or two map lookups; a
    /// lookup that fails counts as no rows.
    pub fn has_rows(&self, object_id: u32, vaddr: u64) -> bool {
        matches!(
            self.find_page(object_id, vaddr),
            Ok(PageLookup::Rows { .. } | PageLookup::Whole)
        )
    }

    /// Where the walker finds the rows of `vaddr` of `object_id`'s table,
    /// as the BPF program looks: its page in `unwind_pages`, else whether
    /// the table is whole (`loaded_objects`). Errors: a map lookup fails.
    fn find_page(&self, object_id: u32, vaddr: u64) -> Result<PageLookup> {
        let maps = &self.skel.maps;
        let Ok(page) = u32::try_from(vaddr >> PAGE_BITS) else {
            // Beyond every table's pages: no CFI there.
            return Ok(PageLookup::Whole);
        };
        if let Some(value) = maps
            .unwind_pages
            .lookup(&page_key(object_id, page), MapFlags::ANY)
            .context("looking up an unwind page")?
        {
            let word =
                |at: usize| u32::from_ne_bytes(value[at..at + 4].try_into().expect("4 bytes"));
            return Ok(PageLookup::Rows {
                first: word(0),
                count: word(4),
            });
        }
        let loaded = maps
            .loaded_objects
            .lookup(&object_id.to_ne_bytes(), MapFlags::ANY)
            .context("looking up a loaded table")?;
        Ok(if loaded.is_some() {
            PageLookup::Whole
        } else {
            PageLookup::NotLoaded
        })
    }

    /// The row the BPF walker would use for `vaddr` (an address in the
    /// object's ELF virtual address space) of `object_id`'s table, looked
    /// up the same way: its page ([`Self::find_page`]), then a binary
    /// search of the page's rows in `unwind_rows`, one map lookup each
    /// (about 17 for a full page). Errors: a map lookup fails.
    pub fn lookup_row(&self, object_id: u32, vaddr: u64) -> Result<RowLookup> {
        let (first, count) = match self.find_page(object_id, vaddr)? {
            PageLookup::Rows { first, count } if count > 0 => (first, count),
            PageLookup::Rows { .. } | PageLookup::Whole => return Ok(RowLookup::NoCfi),
            PageLookup::NotLoaded => return Ok(RowLookup::NotLoaded),
        };
        let row = |index: u32| -> Result<RawRow> {
            let bytes = self
                .skel
                .maps
                .unwind_rows
                .lookup(&index.to_ne_bytes(), MapFlags::ANY)
                .context("reading an unwind row")?
                .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                .context("an unwind row outside the map")?;
            Ok(RawRow::from_bytes(bytes))
        };
        let pc_low = (vaddr & ((1 << PAGE_BITS) - 1)) as u16;
        // The last row whose pc_low <= pc_low: a page's first row starts at 0.
        let (mut lo, mut hi) = (0, count);
        while hi > lo + 1 {
            let mid = lo + (hi - lo) / 2;
            if row(first + mid)?.pc_low <= pc_low {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(RowLookup::Row(row(first + lo)?))
    }
}

/// Where an address's rows are ([`Sampler::find_page`]).
enum PageLookup {
    /// Its page: `count` rows from index `first` of `unwind_rows`.
    Rows { first: u32, count: u32 },
    /// No page, but the table is whole: no CFI covers the address.
    Whole,
    /// Neither its page nor the whole table is loaded yet.
    NotLoaded,
}

/// The `unwind_pages` key of page `page` (vaddr >> PAGE_BITS) of
/// `object_id`'s table (`struct page_key`).
fn page_key(object_id: u32, page: u32) -> [u8; 8] {
    let mut key = [0u8; 8];
    key[0..4].copy_from_slice(&object_id.to_ne_bytes());
    key[4..8].copy_from_slice(&page.to_ne_bytes());
    key
}
