//! Where an object's unwind rows go in the walker's maps: placing a
//! finished table (and the pages loaded ahead of it) in a row range of
//! `unwind_rows`, its pages in `unwind_pages`, and taking them out again on
//! eviction. The row budget is
//! [`RowAllocator`](crate::unwind::row_ranges::RowAllocator)'s; see docs/unwind-tables.md.

use rustc_hash::FxHashSet;
use std::borrow::Cow;
use std::time::Instant;

use anyhow::Result;
use tracing::{debug, warn};

use super::{EarlyRows, TableState, UnwindLoader};
use crate::sampling::sampler::Sampler;
use crate::unwind::UnwindTable;

impl UnwindLoader {
    pub(super) fn set_state(&mut self, object_id: u32, state: TableState) {
        if let Some(t) = self.tables.get_mut(&object_id) {
            t.state = state;
        }
    }

    /// Load `object_id`'s finished `table`: the pages not loaded ahead of
    /// it go into a new row range, those loaded ahead stay where they are.
    pub(super) fn load(
        &mut self,
        object_id: u32,
        name: &str,
        table: &UnwindTable,
        sampler: &Sampler<'_>,
    ) -> Result<()> {
        let mut ranges = Vec::new();
        let mut sent = FxHashSet::default();
        if let Some(TableState::Building(building)) = self.tables.get(&object_id).map(|t| &t.state)
        {
            for early in &building.early {
                ranges.push((early.base, early.rows));
                sent.extend(early.pages.iter().map(|p| p.page));
            }
        }
        let rest = if sent.is_empty() {
            Cow::Borrowed(table)
        } else {
            Cow::Owned(table.only_pages(|p| !sent.contains(&p)))
        };
        let rows = rest.rows().len() as u32;
        if rows > self.capacity_rows {
            anyhow::bail!(
                "its {rows} rows exceed the whole unwind-table budget of {} rows (raise --max-unwind-info-mb)",
                self.capacity_rows
            );
        }
        let base = loop {
            if rows == 0 {
                break 0;
            }
            if let Some(base) = self.allocator.allocate(rows) {
                break base;
            }
            if !self.evict_least_recently_used(object_id, sampler) {
                anyhow::bail!("no room for {rows} rows even after eviction");
            }
        };
        let started = Instant::now();
        sampler.write_rows(base, rest.rows())?;
        sampler.insert_pages(object_id, rest.pages(), base)?;
        sampler.set_object_loaded(object_id, true)?;
        debug!(
            "{name}: loaded {rows} rows in {} pages at row {base} in {} us ({} pages loaded ahead)",
            rest.pages().len(),
            started.elapsed().as_micros(),
            sent.len()
        );
        if rows > 0 {
            ranges.push((base, rows));
        }
        self.stats.tables_loaded += 1;
        self.stats.row_writes += 1;
        self.stats.rows_loaded += ranges.iter().map(|&(_, n)| u64::from(n)).sum::<u64>();
        self.set_state(
            object_id,
            TableState::Loaded {
                ranges,
                pages: table.pages().to_vec(),
            },
        );
        Ok(())
    }

    /// Load `pages`, some pages of `object_id`'s table sent ahead of it,
    /// while its build goes on. Never evicts for them: when the budget is
    /// full they wait for the table.
    pub(super) fn load_early(
        &mut self,
        object_id: u32,
        name: &str,
        pages: &UnwindTable,
        sampler: &Sampler<'_>,
    ) {
        let Some(TableState::Building(building)) =
            self.tables.get_mut(&object_id).map(|t| &mut t.state)
        else {
            return;
        };
        let rows = pages.rows().len() as u32;
        let Some(base) = self.allocator.allocate(rows) else {
            debug!("{name}: no room for {rows} rows ahead of its table");
            return;
        };
        let loaded = sampler
            .write_rows(base, pages.rows())
            .and_then(|()| sampler.insert_pages(object_id, pages.pages(), base));
        building.asked.extend(pages.pages().iter().map(|p| p.page));
        building.early.push(EarlyRows {
            base,
            rows,
            pages: pages.pages().to_vec(),
        });
        self.stats.row_writes += 1;
        match loaded {
            Ok(()) => debug!(
                "{name}: {} pages ({rows} rows) loaded ahead of its table",
                pages.pages().len()
            ),
            Err(err) => warn!("{name}: cannot load pages ahead of its table: {err:#}"),
        }
    }

    /// Remove the pages loaded ahead of `object_id`'s table from the
    /// walker's view (its table could not be loaded), and free their rows.
    pub(super) fn drop_early(&mut self, object_id: u32, sampler: &Sampler<'_>) {
        let early = match self.tables.get_mut(&object_id).map(|t| &mut t.state) {
            Some(TableState::Building(building)) => std::mem::take(&mut building.early),
            _ => Vec::new(),
        };
        for early in early {
            sampler.remove_pages(object_id, &early.pages);
            self.allocator.release(early.base, early.rows);
        }
    }

    /// Evict the least recently used loaded table other than `keep`. False if none.
    pub(super) fn evict_least_recently_used(&mut self, keep: u32, sampler: &Sampler<'_>) -> bool {
        let victim = self
            .tables
            .iter()
            .filter(|(&id, t)| id != keep && matches!(t.state, TableState::Loaded { .. }))
            .min_by_key(|(_, t)| t.last_used)
            .map(|(&id, _)| id);
        let Some(id) = victim else { return false };
        self.unload(id, sampler);
        self.stats.evictions += 1;
        true
    }

    /// Remove `id`'s table from the walker's maps if it is loaded (its state
    /// becomes [`TableState::Evicted`]).
    pub(super) fn unload(&mut self, id: u32, sampler: &Sampler<'_>) {
        let Some(table) = self.tables.get_mut(&id) else {
            return;
        };
        if let TableState::Loaded { ranges, pages } =
            std::mem::replace(&mut table.state, TableState::Evicted)
        {
            let _ = sampler.set_object_loaded(id, false);
            sampler.remove_pages(id, &pages);
            for (base, rows) in ranges {
                self.allocator.release(base, rows);
                self.stats.rows_loaded -= u64::from(rows);
            }
        }
    }
}
