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
//! ([`crate::process::jit`]), which keeps it readable after the
//! process and its mount namespace are gone. Maps are re-read from where the last read stopped when they grew,
//! from the start when they were replaced or shrank; a process's map is
//! kept while the windows name frames of it (after its exit too, since its
//! last map is still right for its samples).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use tracing::debug;

use super::lines::{line_of, Lines};
use super::sources::{Batch, FrameRef, Site, SymbolSource};
use super::vdso::VDSO_MAPPING_NAME;
use super::MappingSource;
use crate::process::jit::perf_map_path;

/// Most bytes of one perf map read (a long-running node process writes a
/// few MB; this bounds what a runaway map costs).
const MAX_PERF_MAP_BYTES: u64 = 256 << 20;

/// Names frames in memory no object file backs (anonymous executable
/// mappings) from the process's perf map; sites are `(pid, address)`.
#[derive(Default)]
pub(super) struct PerfMaps {
    maps: RefCell<HashMap<u32, PerfMap>>,
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
        maps.retain(|&pid, _| batch.contains_key(&u64::from(pid)));
        let mut lines = HashMap::new();
        for (&group, addresses) in batch {
            let Ok(pid) = u32::try_from(group) else {
                continue;
            };
            let path = tracker.perf_map(pid).map(Path::to_path_buf);
            let path = path.or_else(|| perf_map_path(pid));
            let map = match (maps.remove(&pid), path) {
                (Some(map), Some(path)) => map.refreshed(&path),
                (Some(map), None) => Some(map),
                (None, Some(path)) => PerfMap::open(&path),
                (None, None) => None,
            };
            let Some(map) = map else {
                continue;
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
/// code was).
#[derive(Debug, Default)]
pub(super) struct CodeRanges {
    /// By start: `(end, name)`.
    entries: BTreeMap<u64, (u64, Arc<str>)>,
}

impl CodeRanges {
    /// Adds `[start, end)`, dropping the earlier ranges it overlaps.
    pub(super) fn insert(&mut self, start: u64, end: u64, name: Arc<str>) {
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
            self.entries.remove(&s);
        }
        self.entries.insert(start, (end, name));
    }

    /// The range starting at `start`, removed: `(end, name)`.
    pub(super) fn take(&mut self, start: u64) -> Option<(u64, Arc<str>)> {
        self.entries.remove(&start)
    }

    /// The name of the code holding `address`.
    pub(super) fn name_of(&self, address: u64) -> Option<&str> {
        let (_, (end, name)) = self.entries.range(..=address).next_back()?;
        (address < *end).then_some(name.as_ref())
    }

    /// Forget every range.
    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }
}

/// One process's perf map as read so far.
#[derive(Debug)]
struct PerfMap {
    /// `(device, inode)` of the file read.
    identity: (u64, u64),
    /// Bytes consumed: up to the end of the last complete line.
    consumed: u64,
    ranges: CodeRanges,
}

impl PerfMap {
    /// Reads the perf map at `path`; `None` when there is none.
    fn open(path: &Path) -> Option<PerfMap> {
        let mut map = PerfMap {
            identity: (0, 0),
            consumed: 0,
            ranges: CodeRanges::default(),
        };
        map.read_from(path).ok()?;
        Some(map)
    }

    /// This map brought up to date with the file: the lines added since
    /// the last read, or the whole file again if it was replaced or
    /// shrank (`path`: where it is read now). `None` when it cannot be
    /// read any more.
    fn refreshed(mut self, path: &Path) -> Option<PerfMap> {
        match self.read_from(path) {
            Ok(()) => Some(self),
            Err(err) => {
                debug!("{}: {err}", path.display());
                None
            }
        }
    }

    fn read_from(&mut self, path: &Path) -> std::io::Result<()> {
        let mut file = File::open(path)?;
        let meta = file.metadata()?;
        let identity = (meta.dev(), meta.ino());
        if identity != self.identity || meta.len() < self.consumed {
            self.identity = identity;
            self.consumed = 0;
            self.ranges.clear();
        }
        let limit = meta.len().min(MAX_PERF_MAP_BYTES);
        if limit <= self.consumed {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.consumed))?;
        let mut text = Vec::new();
        file.take(limit - self.consumed).read_to_end(&mut text)?;
        // Only complete lines: the writer may be in the middle of one.
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for line in text[..complete].split(|&b| b == b'\n') {
            if let Some((start, size, name)) = parse_line(line) {
                self.ranges
                    .insert(start, start.saturating_add(size), Arc::from(name));
            }
        }
        self.consumed += complete as u64;
        Ok(())
    }

    /// The name of the code holding `address`.
    fn name_of(&self, address: u64) -> Option<&str> {
        self.ranges.name_of(address)
    }
}

/// `START SIZE name` (hex numbers, optional `0x`) -> its parts; `None` for
/// a malformed line.
fn parse_line(line: &[u8]) -> Option<(u64, u64, &str)> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
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
    use std::path::PathBuf;

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
        map.insert(0x100, 0x200, Arc::from("a"));
        map.insert(0x200, 0x300, Arc::from("b"));
        map.insert(0x400, 0x500, Arc::from("c"));
        assert_eq!(map.name_of(0x1ff), Some("a"));
        assert_eq!(map.name_of(0x300), None);
        map.insert(0x180, 0x280, Arc::from("d"));
        assert_eq!(map.name_of(0x100), None, "a was replaced");
        assert_eq!(map.name_of(0x250), Some("d"));
        assert_eq!(map.name_of(0x2ff), None, "b was replaced");
        assert_eq!(map.name_of(0x450), Some("c"));
    }

    #[test]
    fn reads_this_processs_map_and_what_is_appended_to_it() {
        // A map for this test process, where `perf_map_path` looks.
        let pid = std::process::id();
        let path = perf_map_path(pid).expect("own path");
        let mut file = File::create(&path).expect("create perf map");
        let _remove = RemoveOnDrop(path.clone());
        writeln!(file, "1000 100 first").unwrap();
        write!(file, "2000 100 second").unwrap(); // no newline yet
        let map = PerfMap::open(&path).expect("read");
        assert_eq!(map.name_of(0x1080), Some("first"));
        assert_eq!(map.name_of(0x2000), None, "incomplete line");
        writeln!(file, "\n3000 10 third").unwrap();
        let map = map.refreshed(&path).expect("still there");
        assert_eq!(map.name_of(0x20ff), Some("second"));
        assert_eq!(map.name_of(0x3000), Some("third"));
        assert_eq!(map.name_of(0x1080), Some("first"));
        // Replaced by a shorter file: read again from the start.
        std::fs::write(&path, "4000 10 fourth\n").unwrap();
        let map = map.refreshed(&path).expect("replaced");
        assert_eq!(map.name_of(0x1080), None);
        assert_eq!(map.name_of(0x4000), Some("fourth"));
        std::fs::remove_file(&path).unwrap();
        assert!(map.refreshed(&path).is_none(), "gone from a live process");
    }

    struct RemoveOnDrop(PathBuf);

    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
