//! The lines of addresses symbolized in earlier windows, so that continuous
//! mode symbolizes each address once, not once per window.
//!
//! Under process churn the same programs run again and again, and their
//! samples fall on the same file offsets of the same objects: after a few
//! windows nearly every address of a window has been seen before. Without
//! this cache every window parsed the DWARF of the objects it sampled
//! (the agent's own binary, libpython: 0.2-1.2 s of CPU and 30-60 MiB of
//! heap per window), which is what made 1 s windows fall behind and kept
//! the agent's memory high (docs/decisions/0008-symbols-kept-across-windows.md).
//!
//! An object's file offset keeps its meaning for the whole run: the process
//! tracker interns objects by device and inode and holds each one open, so
//! an object id names one file's content. Kernel addresses are those of
//! `/proc/kallsyms`. Names, source files and function names are interned,
//! so thousands of addresses in one function share its strings.
//!
//! The cache is bounded by an entry count ([`LineCache::new`]): after each
//! window, if it holds more, the entries unused for the longest are dropped.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::lines::{Lines, SharedLines, Site};
use crate::profile::Line;

/// What an entry of the cache is the lines of: a site of a symbol source
/// (the source's index in [`super::Symbolizer`]'s list, and the site it
/// located the frame at). Only sources whose sites keep their names for the
/// whole run are cached ([`super::symbol_source::SymbolSource::cacheable`]).
pub(super) type AddressKey = (usize, Site);

/// 24 bytes besides the lines (48 with the key), so that a full cache
/// stays within a few MiB.
struct Entry {
    lines: Arc<[Line]>,
    symbolized: bool,
    /// [`LineCache::window`] (its low 32 bits) when it was last looked up
    /// or stored.
    last_used: u32,
}

/// Lines by address, kept across windows (see the module docs). A cache of
/// capacity 0 keeps nothing (one-shot runs).
pub(super) struct LineCache {
    entries: HashMap<AddressKey, Entry>,
    strings: HashSet<Arc<str>>,
    /// Windows ended so far (wrapping: only the order of recent ones
    /// matters, and 2^32 windows are 136 years of 1 s windows).
    window: u32,
    max_entries: usize,
    hits: u64,
    misses: u64,
}

/// What [`LineCache::end_window`] reports about the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CacheStats {
    /// Addresses held.
    pub entries: usize,
    /// Distinct strings held.
    pub strings: usize,
    /// Lookups answered during the window.
    pub hits: u64,
    /// Lookups not answered during the window.
    pub misses: u64,
}

impl LineCache {
    /// A cache holding at most `max_entries` addresses between windows.
    pub fn new(max_entries: usize) -> Self {
        LineCache {
            entries: HashMap::new(),
            strings: HashSet::new(),
            window: 0,
            max_entries,
            hits: 0,
            misses: 0,
        }
    }

    /// The lines stored for `key`, if any.
    pub fn get(&mut self, key: AddressKey) -> Option<SharedLines> {
        let window = self.window;
        match self.entries.get_mut(&key) {
            Some(entry) => {
                entry.last_used = window;
                self.hits += 1;
                Some((entry.lines.clone(), entry.symbolized))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Store `lines` for `key` (their strings interned) and return them.
    pub fn insert(&mut self, key: AddressKey, lines: Lines) -> SharedLines {
        if self.max_entries == 0 {
            return (lines.0.into(), lines.1);
        }
        let (lines, symbolized) = lines;
        let lines: Arc<[Line]> = lines
            .into_iter()
            .map(|line| Line {
                function: self.intern(line.function),
                system_name: self.intern(line.system_name),
                file: line.file.map(|f| self.intern(f)),
                line: line.line,
            })
            .collect();
        let copy = lines.clone();
        let entry = Entry {
            lines,
            symbolized,
            last_used: self.window,
        };
        self.entries.insert(key, entry);
        (copy, symbolized)
    }

    fn intern(&mut self, s: Arc<str>) -> Arc<str> {
        match self.strings.get(&s) {
            Some(known) => known.clone(),
            None => {
                self.strings.insert(s.clone());
                s
            }
        }
    }

    /// Close a window: if more than the capacity is held, drop the entries
    /// unused for the longest (down to three quarters of the capacity), and
    /// the strings only they used. Returns the cache's figures for the
    /// window that ends.
    pub fn end_window(&mut self) -> CacheStats {
        if self.entries.len() > self.max_entries {
            let target = self.max_entries * 3 / 4;
            let mut excess = self.entries.len() - target;
            let mut ages: Vec<u32> = self.entries.values().map(|e| e.last_used).collect();
            // The `excess`-th oldest use: fewer than `excess` entries are
            // older, and those all go; then as many of its ties as needed.
            let (_, &mut threshold, _) = ages.select_nth_unstable(excess - 1);
            self.entries.retain(|_, e| e.last_used >= threshold);
            excess -= ages.iter().filter(|&&age| age < threshold).count();
            self.entries.retain(|_, e| {
                let drop = excess > 0 && e.last_used == threshold;
                excess -= usize::from(drop);
                !drop
            });
            // A string held only by the set is no longer used.
            self.strings.retain(|s| Arc::strong_count(s) > 1);
        }
        // A window of many new addresses grows the table past what the
        // capacity needs (to 131,072 buckets, 7 MiB, in a churn soak's heap
        // profile), and it keeps that size until told: over hours such
        // bursts left the agent's heap a step higher each time (decision 0008).
        if self.entries.capacity() > 2 * self.max_entries.max(16) {
            self.entries.shrink_to(self.max_entries);
        }
        if self.strings.capacity() > 2 * self.strings.len().max(16) {
            self.strings.shrink_to(self.strings.len());
        }
        let stats = CacheStats {
            entries: self.entries.len(),
            strings: self.strings.len(),
            hits: self.hits,
            misses: self.misses,
        };
        self.window = self.window.wrapping_add(1);
        self.hits = 0;
        self.misses = 0;
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(function: &str, file: &str) -> Lines {
        let line = Line {
            function: Arc::from(function),
            system_name: Arc::from(function),
            file: Some(Arc::from(file)),
            line: Some(7),
        };
        (vec![line], true)
    }

    #[test]
    fn answers_what_it_stored_and_shares_strings() {
        let mut cache = LineCache::new(10);
        let a = (1, (1, 0x10));
        let b = (1, (1, 0x14));
        assert!(cache.get(a).is_none());
        cache.insert(a, lines("f", "f.rs"));
        cache.insert(b, lines("f", "f.rs"));
        let (la, symbolized) = cache.get(a).unwrap();
        let (lb, _) = cache.get(b).unwrap();
        assert!(symbolized);
        assert_eq!(&*la[0].function, "f");
        assert!(Arc::ptr_eq(&la[0].function, &lb[0].function));
        assert!(cache.get((1, (2, 0x10))).is_none());
        assert!(cache.get((0, (0, 0x10))).is_none());
        let stats = cache.end_window();
        assert_eq!((stats.entries, stats.strings), (2, 2));
        assert_eq!((stats.hits, stats.misses), (2, 3));
    }

    #[test]
    fn drops_the_entries_unused_for_the_longest_past_its_capacity() {
        let mut cache = LineCache::new(4);
        for offset in 0..4 {
            cache.insert((0, (0, offset)), lines(&format!("k{offset}"), "k.c"));
        }
        cache.end_window();
        // Addresses 2 and 3 are used again; 4 and 5 are new.
        for offset in 2..4 {
            assert!(cache.get((0, (0, offset))).is_some());
        }
        for offset in 4..6 {
            cache.insert((0, (0, offset)), lines(&format!("k{offset}"), "k.c"));
        }
        let stats = cache.end_window();
        assert_eq!(stats.entries, 3);
        assert!(cache.get((0, (0, 0))).is_none());
        assert!(cache.get((0, (0, 1))).is_none());
        let kept = (2..6).filter(|&o| cache.get((0, (0, o))).is_some()).count();
        assert_eq!(kept, 3);
        // The evicted functions' names are gone, the shared file name stays.
        let stats = cache.end_window();
        assert_eq!(stats.strings, 3 + 1);
    }

    #[test]
    fn a_burst_of_new_addresses_does_not_leave_the_table_large() {
        let mut cache = LineCache::new(100);
        for offset in 0..5_000 {
            cache.insert((0, (0, offset)), lines(&format!("f{offset}"), "f.c"));
        }
        assert!(cache.entries.capacity() >= 5_000);
        let stats = cache.end_window();
        assert_eq!(stats.entries, 75);
        assert!(
            cache.entries.capacity() < 200,
            "{}",
            cache.entries.capacity()
        );
        assert!(
            cache.strings.capacity() < 200,
            "{}",
            cache.strings.capacity()
        );
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        let mut cache = LineCache::new(0);
        let key = (2, (0, 0x800));
        assert_eq!(cache.insert(key, lines("g", "g.c")).0.len(), 1);
        assert!(cache.get(key).is_none());
        assert_eq!(cache.end_window().entries, 0);
    }
}
