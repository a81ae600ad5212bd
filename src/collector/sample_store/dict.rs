//! The stack table: every string, mapping, frame, stack and thread the
//! store has seen, each held once and named by a dense `u32` id, shared by
//! every block (so a stack sampled in a thousand windows is stored once).
//!
//! On disk it is a sequence of segments, `stacks/SEQ.seg` (SEQ a decimal
//! sequence number, zero-padded to 10 digits): each holds the entries added
//! since the previous one ([`Segment`], prost, then zstd, then a CRC-32 of
//! the compressed bytes), written atomically before the first block that
//! refers to them. Loading applies the segments in order; a segment that
//! does not start where the previous ended, or fails its check, stops the
//! load there (blocks referring to later ids are then skipped as corrupt,
//! not misread). A segment starting at zero everywhere is a whole snapshot
//! ([`Dictionary::compact`] writes one at start-up when segments pile up),
//! and replaces what came before it.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use prost::Message;
use tracing::warn;

use crate::profile::{Frame, FrameKind, Line, Profile, ProfileMapping};
use crate::sampling::records::UnwindStatus;
use crate::util::files::TMP_PREFIX;

pub use super::records::{FrameRec, LineRec, MappingRec, Segment, StackRec, ThreadRec};

/// A table whose entries are held once: id -> value, value -> id.
#[derive(Debug)]
struct Table<T: Eq + std::hash::Hash + Clone> {
    items: Vec<T>,
    ids: HashMap<T, u32>,
}

impl<T: Eq + std::hash::Hash + Clone> Default for Table<T> {
    fn default() -> Self {
        Table {
            items: Vec::new(),
            ids: HashMap::new(),
        }
    }
}

impl<T: Eq + std::hash::Hash + Clone> Table<T> {
    fn intern(&mut self, value: T) -> u32 {
        if let Some(&id) = self.ids.get(&value) {
            return id;
        }
        let id = self.items.len() as u32;
        self.ids.insert(value.clone(), id);
        self.items.push(value);
        id
    }

    fn len(&self) -> u32 {
        self.items.len() as u32
    }

    /// Forget every entry from id `len` on.
    fn truncate(&mut self, len: u32) {
        if len < self.len() {
            self.items.truncate(len as usize);
            self.ids.retain(|_, id| *id < len);
        }
    }
}

/// Where the table stood before an ingest ([`Dictionary::mark`]), to go
/// back to if the ingest fails ([`Dictionary::undo`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    persisted: Counts,
    next_seq: u64,
    segments: usize,
}

/// How many entries of each table: the ids below are taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    strings: u32,
    mappings: u32,
    frames: u32,
    stacks: u32,
    threads: u32,
}

/// The stack table in memory (see the module docs).
#[derive(Debug)]
pub struct Dictionary {
    dir: PathBuf,
    file_mode: u32,
    strings: Table<Arc<str>>,
    mappings: Table<MappingRec>,
    frames: Table<FrameRec>,
    stacks: Table<StackRec>,
    threads: Table<ThreadRec>,
    /// What the segments on disk hold.
    persisted: Counts,
    /// Sequence number of the next segment.
    next_seq: u64,
    /// Segment files on disk.
    segments: usize,
}

fn kind_code(kind: FrameKind) -> u32 {
    match kind {
        FrameKind::Kernel => 0,
        FrameKind::User => 1,
        FrameKind::UnwindMarker => 2,
    }
}

fn segment_name(seq: u64) -> String {
    format!("{seq:010}.seg")
}

impl Dictionary {
    /// Load the segments in `dir` (created if missing). Errors: the
    /// directory cannot be created or listed. Bad segments are logged and
    /// end the load (see the module docs).
    pub fn open(dir: &Path, file_mode: u32) -> Result<Self> {
        super::create_dir(dir, file_mode)?;
        let mut dict = Dictionary {
            dir: dir.to_path_buf(),
            file_mode,
            strings: Table::default(),
            mappings: Table::default(),
            frames: Table::default(),
            stacks: Table::default(),
            threads: Table::default(),
            persisted: Counts::default(),
            next_seq: 0,
            segments: 0,
        };
        dict.strings.intern(Arc::from(""));
        let mut files: Vec<(u64, PathBuf)> = fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(TMP_PREFIX) {
                    return None;
                }
                let seq = name.strip_suffix(".seg")?.parse().ok()?;
                Some((seq, e.path()))
            })
            .collect();
        files.sort();
        dict.segments = files.len();
        dict.next_seq = files.last().map_or(0, |(seq, _)| seq + 1);
        for (_, path) in &files {
            if let Err(e) = read_segment(path).and_then(|s| dict.apply(s)) {
                warn!(
                    "stack table: {} unusable ({e:#}); later segments ignored",
                    path.display()
                );
                break;
            }
        }
        dict.persisted = dict.counts();
        Ok(dict)
    }

    fn counts(&self) -> Counts {
        Counts {
            strings: self.strings.len(),
            mappings: self.mappings.len(),
            frames: self.frames.len(),
            stacks: self.stacks.len(),
            threads: self.threads.len(),
        }
    }

    fn apply(&mut self, s: Segment) -> Result<()> {
        let starts = [
            s.first_string,
            s.first_mapping,
            s.first_frame,
            s.first_stack,
            s.first_thread,
        ];
        if starts == [0; 5] && !s.strings.is_empty() {
            // A snapshot: start again from it.
            self.strings = Table::default();
            self.mappings = Table::default();
            self.frames = Table::default();
            self.stacks = Table::default();
            self.threads = Table::default();
        } else {
            let c = self.counts();
            if starts != [c.strings, c.mappings, c.frames, c.stacks, c.threads] {
                bail!("it starts at {starts:?}, the table ends at {c:?}");
            }
        }
        for string in s.strings {
            self.strings.intern(Arc::from(string));
        }
        let n = self.strings.len();
        let strings_ok = |ids: &[u32]| ids.iter().all(|&i| i < n);
        for m in s.mappings {
            if !strings_ok(&[m.filename, m.build_id]) {
                bail!("a mapping names a string past the table");
            }
            self.mappings.intern(m);
        }
        for f in s.frames {
            let lines_ok = f
                .lines
                .iter()
                .all(|l| strings_ok(&[l.function, l.system_name, l.file]));
            if !lines_ok || f.mapping > self.mappings.len() || f.lines.is_empty() {
                bail!("a frame names an entry past its table");
            }
            self.frames.intern(f);
        }
        for st in s.stacks {
            if !strings_ok(&[st.status]) || st.frames.iter().any(|&f| f >= self.frames.len()) {
                bail!("a stack names an entry past its table");
            }
            self.stacks.intern(st);
        }
        for t in s.threads {
            if !strings_ok(&[t.host, t.comm, t.name]) {
                bail!("a thread names a string past the table");
            }
            self.threads.intern(t);
        }
        Ok(())
    }

    /// Write the entries added since the last segment as a new segment
    /// (nothing when there are none). Errors: the file system's; the
    /// entries stay in memory and go into the next segment.
    pub fn persist(&mut self) -> Result<()> {
        let c = self.counts();
        if c == self.persisted {
            return Ok(());
        }
        let p = self.persisted;
        let segment = self.segment_from(p);
        self.write_segment(&segment)?;
        self.persisted = c;
        Ok(())
    }

    /// Where the table stands: what is on disk (call it with nothing
    /// unpersisted, i.e. before interning a request's entries).
    pub fn mark(&self) -> Mark {
        Mark {
            persisted: self.persisted,
            next_seq: self.next_seq,
            segments: self.segments,
        }
    }

    /// Go back to `mark` after a failed ingest: the segment written since
    /// (if any) is removed and the entries added since are forgotten, so
    /// the table in memory is what is on disk and no entry is left that
    /// nothing refers to. If that segment cannot be removed, its entries
    /// stay (in memory as on disk: still consistent) and only unpersisted
    /// ones are forgotten.
    pub fn undo(&mut self, mark: Mark) {
        if self.next_seq > mark.next_seq {
            let path = self.dir.join(segment_name(mark.next_seq));
            match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    warn!("stack table: cannot remove {}: {e}", path.display());
                }
                _ => {
                    let _ = crate::util::files::sync_dir(&self.dir);
                    self.persisted = mark.persisted;
                    self.next_seq = mark.next_seq;
                    self.segments = mark.segments;
                }
            }
        }
        let p = self.persisted;
        self.strings.truncate(p.strings);
        self.mappings.truncate(p.mappings);
        self.frames.truncate(p.frames);
        self.stacks.truncate(p.stacks);
        self.threads.truncate(p.threads);
    }

    fn segment_from(&self, p: Counts) -> Segment {
        Segment {
            first_string: p.strings,
            first_mapping: p.mappings,
            first_frame: p.frames,
            first_stack: p.stacks,
            first_thread: p.threads,
            strings: self.strings.items[p.strings as usize..]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            mappings: self.mappings.items[p.mappings as usize..].to_vec(),
            frames: self.frames.items[p.frames as usize..].to_vec(),
            stacks: self.stacks.items[p.stacks as usize..].to_vec(),
            threads: self.threads.items[p.threads as usize..].to_vec(),
        }
    }

    fn write_segment(&mut self, segment: &Segment) -> Result<()> {
        let packed = zstd::bulk::compress(&segment.encode_to_vec(), 3)
            .context("compressing a stack-table segment")?;
        let mut bytes = packed;
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let path = self.dir.join(segment_name(self.next_seq));
        if let Err(e) = super::health::write_file(&path, &bytes, self.file_mode) {
            // Renamed but not synced, perhaps: the next segment takes this name.
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        self.next_seq += 1;
        self.segments += 1;
        Ok(())
    }

    /// When more than `max_segments` segment files exist, write the whole
    /// table as one snapshot segment and delete the older files. Errors:
    /// the file system's (the old segments are then kept).
    pub fn compact(&mut self, max_segments: usize) -> Result<()> {
        if self.segments <= max_segments {
            return Ok(());
        }
        let snapshot = self.segment_from(Counts::default());
        let last = self.next_seq;
        self.write_segment(&snapshot)?;
        for seq in 0..last {
            let path = self.dir.join(segment_name(seq));
            if fs::remove_file(&path).is_ok() {
                self.segments -= 1;
            }
        }
        crate::util::files::sync_dir(&self.dir)?;
        self.persisted = self.counts();
        Ok(())
    }

    /// Bytes of the segment files on disk.
    pub fn disk_bytes(&self) -> u64 {
        fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }

    fn string(&mut self, s: &str) -> u32 {
        match self.strings.ids.get(s) {
            Some(&id) => id,
            None => self.strings.intern(Arc::from(s)),
        }
    }

    /// The id of `host`'s thread `tid` of process `pid`, named as given.
    pub fn thread(&mut self, host: &str, pid: u32, tid: u32, comm: &str, name: &str) -> u32 {
        let rec = ThreadRec {
            host: self.string(host),
            pid,
            tid,
            comm: self.string(comm),
            name: self.string(name),
        };
        self.threads.intern(rec)
    }

    /// The ids of `profile`'s frames (index i: frame i), interning them.
    pub fn frames_of(&mut self, profile: &Profile) -> Vec<u32> {
        let mapping_ids: Vec<u32> = profile
            .mappings
            .iter()
            .map(|m| {
                let rec = MappingRec {
                    start: m.start,
                    limit: m.limit,
                    file_offset: m.file_offset,
                    filename: self.string(&m.filename),
                    build_id: m.build_id.as_deref().map_or(0, |b| self.string(b)),
                };
                self.mappings.intern(rec)
            })
            .collect();
        profile
            .frames
            .iter()
            .map(|f| {
                let lines = f
                    .lines
                    .iter()
                    .map(|l| LineRec {
                        function: self.string(&l.function),
                        system_name: self.string(&l.system_name),
                        file: l.file.as_deref().map_or(0, |s| self.string(s)),
                        line: l.line.unwrap_or(0),
                    })
                    .collect();
                let rec = FrameRec {
                    kind: kind_code(f.kind),
                    address: f.address,
                    mapping: f
                        .mapping
                        .and_then(|m| mapping_ids.get(m))
                        .map_or(0, |&id| id + 1),
                    lines,
                    symbolized: f.symbolized,
                };
                self.frames.intern(rec)
            })
            .collect()
    }

    /// The id of the stack of frame ids `frames` (leaf first) that ended `status`.
    pub fn stack(&mut self, frames: Vec<u32>, status: UnwindStatus) -> u32 {
        let status = self.string(&status.name());
        self.stacks.intern(StackRec { frames, status })
    }

    /// Number of stacks and of threads (ids below these exist).
    pub fn sizes(&self) -> (u32, u32) {
        (self.stacks.len(), self.threads.len())
    }

    /// Thread `id`.
    pub fn thread_rec(&self, id: u32) -> &ThreadRec {
        &self.threads.items[id as usize]
    }

    /// String `id`.
    pub fn str(&self, id: u32) -> &Arc<str> {
        &self.strings.items[id as usize]
    }

    /// Stack `id`.
    pub fn stack_rec(&self, id: u32) -> &StackRec {
        &self.stacks.items[id as usize]
    }

    /// Frame `id` as a profile frame, its mapping (if any) by global mapping id.
    pub fn frame(&self, id: u32) -> (Frame, Option<u32>) {
        let f = &self.frames.items[id as usize];
        let lines: Vec<Line> = f
            .lines
            .iter()
            .map(|l| Line {
                function: self.str(l.function).clone(),
                system_name: self.str(l.system_name).clone(),
                file: (l.file != 0).then(|| self.str(l.file).clone()),
                line: (l.line != 0).then_some(l.line),
            })
            .collect();
        let kind = match f.kind {
            0 => FrameKind::Kernel,
            2 => FrameKind::UnwindMarker,
            _ => FrameKind::User,
        };
        let frame = Frame {
            kind,
            address: f.address,
            mapping: None,
            lines: lines.into(),
            symbolized: f.symbolized,
        };
        (frame, f.mapping.checked_sub(1))
    }

    /// Mapping `id` as a profile mapping.
    pub fn mapping(&self, id: u32) -> ProfileMapping {
        let m = &self.mappings.items[id as usize];
        ProfileMapping {
            start: m.start,
            limit: m.limit,
            file_offset: m.file_offset,
            filename: self.str(m.filename).to_string(),
            build_id: (m.build_id != 0).then(|| self.str(m.build_id).to_string()),
        }
    }

    /// The unwind result named by string `id`.
    pub fn status(&self, id: u32) -> UnwindStatus {
        UnwindStatus::from_name(self.str(id)).unwrap_or(UnwindStatus::Complete)
    }
}

/// A segment file: zstd'd prost, then its CRC-32.
fn read_segment(path: &Path) -> Result<Segment> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Some((body, crc)) = bytes.split_last_chunk::<4>() else {
        bail!("too short");
    };
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        bail!("its checksum does not match (a torn or damaged file)");
    }
    let raw = zstd::stream::decode_all(body).context("it does not decompress")?;
    Segment::decode(raw.as_slice()).context("it does not decode")
}
