//! JIT perf maps as a symbol source: runtimes that generate code (node
//! `--perf-basic-prof`, CPython `-X perf`, the JVM's perf-map agent, LuaJIT,
//! ...) write `/tmp/perf-PID.map`, one line per piece of code:
//! `START SIZE name`, START and SIZE in hex (an optional `0x` prefix is
//! accepted), the name the rest of the line. A later line for a range
//! replaces the earlier ones it overlaps (code re-generated at the same
//! place), as perf treats them.
//!
//! The file is the one the process sees: under its root
//! (`/proc/PID/root/tmp/...`), named by its pid in its own PID namespace
//! (the last `NSpid` of `/proc/PID/status`), so that containers' maps are
//! found; the process tracker opens it while the process lives
//! ([`crate::process::jit`]: without following a symlink or blocking on a
//! FIFO, only a regular file of the process's user or root), which keeps
//! it readable after the process and its mount namespace are gone.
//!
//! A local user writes this file and the profiler runs as root, so it is
//! read on a reader thread within a deadline, a bounded number of bytes a
//! window, into bounded memory ([`crate::process::untrusted`]). Maps are
//! read on from where the last read stopped when they grew, from the start
//! when they shrank; a process's map is kept while the windows name frames
//! of it (after its exit too, since its last map is still right for its
//! samples).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lines::{line_of, Lines};
use super::symbol_source::{Batch, FrameRef, Site, SymbolSource};
use super::vdso::VDSO_MAPPING_NAME;
use super::MappingSource;
use crate::process::jit::JitFile;
use crate::process::untrusted::{
    self, bounded_name, read_span, Allowance, Count, Held, ENTRY_OVERHEAD, MAX_NAME_BYTES,
    READ_CHUNK, READ_DEADLINE,
};

/// Most bytes of one perf map read (a long-running node process writes a
/// few MB; this bounds what a runaway map costs).
const MAX_PERF_MAP_BYTES: u64 = 256 << 20;
/// Longest a read of one map goes on for one window before it stops with
/// what it has (well within the reader's deadline, so that it is never cut).
pub(super) const READ_TIME: Duration = Duration::from_millis(100);
/// Longest the perf maps (and, apart, the jitdumps) of all processes are
/// read for one window: the maps not reached by then wait for the next (a
/// 1 s window must not spend most of its second on them: the 3-minute
/// hostile soak fell 4 windows behind with 1 s here).
pub(super) const WINDOW_READ_TIME: Duration = Duration::from_millis(150);
/// Longest line parsed whole: a longer one is parsed from its first this
/// many bytes (its name cut) and the rest skipped.
const MAX_LINE_BYTES: usize = MAX_NAME_BYTES + 64;

/// Names frames in memory no object file backs (anonymous executable
/// mappings) from the process's perf map; sites are `(pid, address)`.
/// Each map is read on a reader thread within [`READ_DEADLINE`]
/// ([`untrusted::run`]); a process whose read passed it is read no more.
#[derive(Default)]
pub(super) struct PerfMaps {
    maps: RefCell<HashMap<u32, PerfMap>>,
    stalled: RefCell<HashSet<u32>>,
}

impl SymbolSource for PerfMaps {
    fn locate(&self, _tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site> {
        match frame {
            FrameRef::User { address, mapping }
                if mapping.object.is_none() && mapping.name != VDSO_MAPPING_NAME =>
            {
                Some((u64::from(mapping.pid), address))
            }
            _ => None,
        }
    }

    /// JIT code moves: an address may name another function later.
    fn cacheable(&self) -> bool {
        false
    }

    fn symbolize(&self, tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines> {
        let mut maps = self.maps.borrow_mut();
        let mut stalled = self.stalled.borrow_mut();
        maps.retain(|&pid, _| batch.contains_key(&u64::from(pid)));
        let mut lines = HashMap::new();
        let window_until = Instant::now() + WINDOW_READ_TIME;
        for (&group, addresses) in batch {
            let Ok(pid) = u32::try_from(group) else {
                continue;
            };
            if stalled.contains(&pid) || Instant::now() >= window_until {
                continue;
            }
            // The tracker's file, else (it had none when the maps were
            // read) the process's map opened now, on the reader.
            let file = tracker.perf_map(pid).and_then(|f| f.file.try_clone().ok());
            let mut map = maps.remove(&pid).unwrap_or_default();
            let read = untrusted::run(READ_DEADLINE, move || {
                let file = match file {
                    Some(file) => file,
                    None => JitFile::perf_map(pid)?.file,
                };
                map.read_more(&file, window_until.min(Instant::now() + READ_TIME))
                    .inspect_err(|err| tracing::debug!("pid {pid}'s perf map: {err}"))
                    .ok()?;
                Some(map)
            });
            let map = match read {
                Some(Some(map)) => map,
                Some(None) => continue,
                None => {
                    tracing::debug!("pid {pid}'s perf map: no answer within {READ_DEADLINE:?}");
                    stalled.insert(pid);
                    continue;
                }
            };
            for &address in addresses {
                if let Some(name) = map.name_of(address) {
                    lines.insert((group, address), (vec![line_of(name, None)], true));
                }
            }
            maps.insert(pid, map);
        }
        lines
    }
}

/// Named ranges of generated code, none overlapping: a range added later
/// replaces the earlier ones it overlaps (code generated again where other
/// code was). What it holds is within the budgets of [`Held`].
#[derive(Debug, Default)]
pub(super) struct CodeRanges {
    /// By start: `(end, name)`.
    entries: BTreeMap<u64, (u64, Arc<str>)>,
    held: Held,
}

impl CodeRanges {
    /// Adds `[start, end)` named `name` (cut to [`MAX_NAME_BYTES`]),
    /// dropping the earlier ranges it overlaps; not kept when the budget is
    /// full.
    pub(super) fn insert(&mut self, start: u64, end: u64, name: &str) {
        self.insert_arc(start, end, || Arc::from(bounded_name(name).as_ref()));
    }

    fn insert_arc(&mut self, start: u64, end: u64, name: impl FnOnce() -> Arc<str>) {
        if end <= start {
            return;
        }
        let overlapped: Vec<u64> = self
            .entries
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(&s, _)| s)
            .collect();
        for s in overlapped {
            self.take(s);
        }
        let name = name();
        if self.held.take(name.len() + ENTRY_OVERHEAD) {
            self.entries.insert(start, (end, name));
        }
    }

    /// Moves the range starting at `old` to start at `new`, `size` bytes
    /// long (code moved); nothing when there is none at `old`.
    pub(super) fn relocate(&mut self, old: u64, new: u64, size: u64) {
        if let Some((_, name)) = self.take(old) {
            self.insert_arc(new, new.saturating_add(size), || name);
        }
    }

    /// The range starting at `start`, removed: `(end, name)`.
    fn take(&mut self, start: u64) -> Option<(u64, Arc<str>)> {
        let (end, name) = self.entries.remove(&start)?;
        self.held.give_back(name.len() + ENTRY_OVERHEAD);
        Some((end, name))
    }

    /// The name of the code holding `address`.
    pub(super) fn name_of(&self, address: u64) -> Option<&str> {
        let (_, (end, name)) = self.entries.range(..=address).next_back()?;
        (address < *end).then_some(name.as_ref())
    }

    /// Forget every range.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
        let held = self.held.bytes();
        self.held.give_back(held);
    }
}

/// One process's perf map as read so far: named code ranges, within the
/// budgets of [`crate::process::untrusted`].
#[derive(Debug, Default)]
pub struct PerfMap {
    /// Bytes consumed: up to the end of the last complete line, or into an
    /// over-long line being skipped.
    consumed: u64,
    /// Inside a line longer than [`MAX_LINE_BYTES`], whose rest is skipped.
    skipping: bool,
    /// Bytes past [`MAX_PERF_MAP_BYTES`] already counted as unread.
    unread_counted: u64,
    /// How much more may be read now.
    allowance: Allowance,
    ranges: CodeRanges,
}

impl PerfMap {
    /// Brings this map up to date with `file`: the lines added since the
    /// last read, or the whole file again if it shrank; at most what its
    /// [`Allowance`] lets be read, a [`READ_CHUNK`] at a time, until
    /// `until`. Lines are `START SIZE name` (hex, optional `0x`); a name
    /// is cut to [`MAX_NAME_BYTES`]; malformed lines are skipped; a line
    /// the file ends inside waits for its end. Errors: the file cannot be
    /// read.
    pub fn read_more(&mut self, file: &File, until: Instant) -> std::io::Result<()> {
        let len = file.metadata()?.len();
        if len < self.consumed {
            let allowance = self.allowance.clone();
            *self = PerfMap::default();
            self.allowance = allowance;
        }
        if len > MAX_PERF_MAP_BYTES && len - MAX_PERF_MAP_BYTES > self.unread_counted {
            untrusted::add(
                Count::BytesUnread,
                len - MAX_PERF_MAP_BYTES - self.unread_counted,
            );
            self.unread_counted = len - MAX_PERF_MAP_BYTES;
        }
        let limit = len
            .min(MAX_PERF_MAP_BYTES)
            .min(self.consumed + self.allowance.available());
        while self.consumed < limit && Instant::now() < until {
            let chunk = read_span(file, self.consumed, (limit - self.consumed).min(READ_CHUNK))?;
            self.allowance.spend(chunk.len() as u64);
            let used = self.take_lines(&chunk);
            if used == 0 {
                break; // one incomplete line: wait for its end
            }
            self.consumed += used as u64;
        }
        Ok(())
    }

    /// Parses the complete lines at the start of `chunk` (and the start of
    /// an over-long one); returns how many bytes were used.
    fn take_lines(&mut self, chunk: &[u8]) -> usize {
        let mut pos = 0;
        if self.skipping {
            match memchr(chunk) {
                Some(i) => {
                    pos = i + 1;
                    self.skipping = false;
                }
                None => return chunk.len(),
            }
        }
        loop {
            let rest = &chunk[pos..];
            match memchr(rest) {
                Some(i) => {
                    self.add_line(&rest[..i]);
                    pos += i + 1;
                }
                None if rest.len() > MAX_LINE_BYTES => {
                    self.add_line(&rest[..MAX_LINE_BYTES]);
                    self.skipping = true;
                    return chunk.len();
                }
                None => return pos,
            }
        }
    }

    fn add_line(&mut self, line: &[u8]) {
        if let Some((start, size, name)) = parse_line(line) {
            self.ranges.insert(start, start.saturating_add(size), name);
        }
    }

    /// The name of the code holding `address`.
    pub fn name_of(&self, address: u64) -> Option<&str> {
        self.ranges.name_of(address)
    }

    /// Bytes of the file consumed so far (complete lines, and what was
    /// skipped of an over-long one).
    pub fn consumed(&self) -> u64 {
        self.consumed
    }
}

/// The index of the first newline in `bytes`.
fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

/// `START SIZE name` (hex numbers, optional `0x`) -> its parts; `None` for
/// a malformed line. A line cut inside a UTF-8 character keeps what is
/// before it.
fn parse_line(line: &[u8]) -> Option<(u64, u64, &str)> {
    let line = match std::str::from_utf8(line) {
        Ok(line) => line,
        Err(err) if err.error_len().is_none() => {
            std::str::from_utf8(&line[..err.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    let line = line.trim_end_matches('\r');
    let mut parts = line.splitn(3, ' ');
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    (!name.is_empty()).then_some((start, size, name))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn parses_lines_and_rejects_malformed_ones() {
        assert_eq!(
            parse_line(b"7f00a000 1c0 LazyCompile:*work /a.js:1"),
            Some((0x7f00_a000, 0x1c0, "LazyCompile:*work /a.js:1"))
        );
        assert_eq!(
            parse_line(b"0x10 0x20 py::f:/x.py"),
            Some((0x10, 0x20, "py::f:/x.py"))
        );
        for bad in [&b"123"[..], b"xyz 10 f", b"10 zz f", b"10 20 ", b"\xff 1 f"] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn later_ranges_replace_the_ones_they_overlap() {
        let mut map = CodeRanges::default();
        map.insert(0x100, 0x200, "a");
        map.insert(0x200, 0x300, "b");
        map.insert(0x400, 0x500, "c");
        assert_eq!(map.name_of(0x1ff), Some("a"));
        assert_eq!(map.name_of(0x300), None);
        map.insert(0x180, 0x280, "d");
        assert_eq!(map.name_of(0x100), None, "a was replaced");
        assert_eq!(map.name_of(0x250), Some("d"));
        assert_eq!(map.name_of(0x2ff), None, "b was replaced");
        assert_eq!(map.name_of(0x450), Some("c"));
        map.relocate(0x400, 0x1000, 0x10);
        assert_eq!(map.name_of(0x450), None);
        assert_eq!(map.name_of(0x100f), Some("c"));
        let held = map.held.bytes();
        assert_eq!(held, 2 + 2 * ENTRY_OVERHEAD, "d and c");
        map.clear();
        assert_eq!(map.held.bytes(), 0);
    }

    /// Reads `map` on from `path` now (no deadline of its own).
    fn read(map: &mut PerfMap, path: &std::path::Path) {
        let file = File::open(path).expect("open");
        map.read_more(&file, Instant::now() + Duration::from_secs(60))
            .expect("read");
    }

    #[test]
    fn reads_a_map_and_what_is_appended_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("perf-1.map");
        let mut file = File::create(&path).expect("create perf map");
        writeln!(file, "1000 100 first").unwrap();
        write!(file, "2000 100 second").unwrap(); // no newline yet
        let mut map = PerfMap::default();
        read(&mut map, &path);
        assert_eq!(map.name_of(0x1080), Some("first"));
        assert_eq!(map.name_of(0x2000), None, "incomplete line");
        writeln!(file, "\n3000 10 third").unwrap();
        read(&mut map, &path);
        assert_eq!(map.name_of(0x20ff), Some("second"));
        assert_eq!(map.name_of(0x3000), Some("third"));
        assert_eq!(map.name_of(0x1080), Some("first"));
        // Replaced by a shorter file: read again from the start.
        std::fs::write(&path, "4000 10 fourth\n").unwrap();
        read(&mut map, &path);
        assert_eq!(map.name_of(0x1080), None);
        assert_eq!(map.name_of(0x4000), Some("fourth"));
    }

    #[test]
    fn an_over_long_name_is_cut_and_the_rest_of_its_line_skipped_chunk_by_chunk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("perf-2.map");
        let mut file = File::create(&path).expect("create perf map");
        // A name of 2.5 chunks, then a good line.
        write!(file, "1000 100 ").unwrap();
        let long = vec![b'A'; (READ_CHUNK * 5 / 2) as usize];
        file.write_all(&long).unwrap();
        writeln!(file, "\n5000 10 after").unwrap();
        let cut = untrusted::counters().names_cut;
        let mut map = PerfMap::default();
        read(&mut map, &path);
        let name = map.name_of(0x1000).expect("named");
        assert!(
            name.ends_with(untrusted::CUT_MARKER),
            "{}",
            &name[name.len() - 20..]
        );
        assert!(name.len() <= MAX_NAME_BYTES + untrusted::CUT_MARKER.len());
        assert_eq!(map.name_of(0x5000), Some("after"));
        assert!(untrusted::counters().names_cut > cut);
        assert_eq!(map.consumed, std::fs::metadata(&path).unwrap().len());
    }

    #[test]
    fn a_map_of_tiny_lines_stops_at_the_files_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("perf-3.map");
        let mut text = String::new();
        // More entries than one file's budget holds.
        let entries = untrusted::MAX_HELD_PER_FILE / ENTRY_OVERHEAD + 1000;
        for i in 0..entries {
            text.push_str(&format!("{:x} 1 f\n", i * 2));
        }
        std::fs::write(&path, &text).unwrap();
        let dropped = untrusted::counters().entries_dropped;
        let mut map = PerfMap::default();
        read(&mut map, &path);
        assert!(map.ranges.held.bytes() <= untrusted::MAX_HELD_PER_FILE);
        assert!(untrusted::counters().entries_dropped >= dropped + 1000);
        assert_eq!(map.name_of(0), Some("f"));
    }
}
