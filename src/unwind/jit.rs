//! Unwind tables of JIT code, from the unwinding information jitdump files
//! carry (CPython 3.13 `-X perf_jit`, V8 `--perf-prof-unwinding-info`).
//!
//! perf's jitdump format has a `JIT_CODE_UNWINDING_INFO` record (id 4):
//! `unwinding_size`, `eh_frame_hdr_size`, `mapped_size` (u64 each), then
//! `unwinding_size` bytes: an `.eh_frame` followed by its
//! `.eh_frame_hdr` (`eh_frame_hdr_size` bytes). It describes the code of the
//! next `JIT_CODE_LOAD` record; its pointers are relative to where perf
//! places that `.eh_frame` when it turns the record into an ELF image: right
//! after the code, at the code's address plus its size rounded up to 8
//! bytes (`ALIGN_8` in perf's `genelf.c`). `JIT_CODE_MOVE` moves the code
//! and its unwinding information with it.
//!
//! Each anonymous executable mapping of a process that holds such code gets
//! a table of its own under a synthetic object id (from [`JIT_OBJECT_ID_BASE`]),
//! with rows at mapping-relative addresses (the walker's bias is the
//! mapping's start). The FDEs are evaluated by the builder's own
//! ([`super::cfi::fde_spans`], gimli) and assembled like an object's.
//! Tables never change under their id (the BPF walker caches rows by id and
//! address): when code is added to a mapping, its table is built again
//! under a new id, the process is described again with it, and the old id is
//! retired.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindContext, UnwindSection};
use rustc_hash::FxHashMap;
use tracing::debug;

use super::assemble::{Assembly, Span};
use super::cfi::{fde_spans, Slice};
use super::rule::{Rule, UnsupportedKind};
use super::table::{CfiSource, UnwindTable};
use crate::process::jit::{
    ne_u64, JitdumpCursor, JitdumpRecord, JIT_CODE_LOAD, JIT_CODE_MOVE, JIT_CODE_UNWINDING_INFO,
};
use crate::process::untrusted::{self, Held, Pending, Poll, ENTRY_OVERHEAD, READ_DEADLINE};
use crate::process::walker::VDSO_OBJECT_ID;

/// First object id of JIT tables; they count up to [`VDSO_OBJECT_ID`]
/// (exclusive) and wrap. Tracker object ids count up from 0.
pub const JIT_OBJECT_ID_BASE: u32 = 0x8000_0000;
/// Most pieces of code with unwinding information kept per process.
const MAX_CODES: usize = 1 << 18;
/// Most JIT tables per process (the walker knows 256 mappings).
const MAX_TABLES: usize = 256;
/// Longest the sampling thread waits for a process's first jitdump read
/// (once per process; later reads are only polled).
const FIRST_READ_WAIT: Duration = Duration::from_millis(5);
/// Shortest time between two looks at whether a process's jitdump grew.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Shortest time between two sweeps of the processes no longer in `/proc`
/// ([`JitTables::forget_gone`]).
const GONE_SWEEP: Duration = Duration::from_secs(5);

/// A piece of JIT code with its unwinding information.
#[derive(Debug)]
struct Code {
    /// Bytes of code.
    size: u64,
    /// Its `.eh_frame` (identical ones are shared).
    eh_frame: Arc<[u8]>,
    /// Bytes taken from the process's [`Held`] budget for it.
    cost: usize,
}

/// The table of one mapping, as last built.
#[derive(Debug)]
struct MappingTable {
    object_id: u32,
    /// [`digest`] of the code it was built from.
    digest: (usize, u64),
}

/// A record the unwind tables use, as a reader thread hands it over: only
/// the bytes [`apply`] reads (a code load without its name and code).
#[derive(Debug)]
enum Owned {
    Restart,
    Record(u32, Vec<u8>),
}

/// What one read of a jitdump on a reader thread gives back: the cursor,
/// and the records it found.
type ReadDone = (JitdumpCursor, Vec<Owned>);

/// What is known of one process's jitdump.
#[derive(Debug, Default)]
struct ProcessJit {
    /// The cursor (a default one while a read is out with it).
    cursor: JitdumpCursor,
    /// A read on a reader thread ([`untrusted::spawn`]), not yet collected.
    reading: Option<Pending<ReadDone>>,
    /// A read passed [`READ_DEADLINE`]: the file is read no more.
    stalled: bool,
    /// The `.eh_frame` of the latest unwinding-info record, for the next
    /// code load.
    pending: Option<Arc<[u8]>>,
    /// Code with unwinding information, by address.
    codes: BTreeMap<u64, Code>,
    /// What `codes` holds, within the budgets of files processes control.
    held: Held,
    /// Tables by mapping start.
    tables: FxHashMap<u64, MappingTable>,
    /// When a read was last started.
    last_read: Option<Instant>,
    /// When [`JitTables::grew`] last looked for evicted tables.
    last_checked: Option<Instant>,
}

/// Applies one record to what is known of a process's code: `pending`,
/// the latest unwinding information not yet used by a code load, and
/// `codes` (within `held`). Returns whether `codes` changed.
fn apply(
    pending: &mut Option<Arc<[u8]>>,
    codes: &mut BTreeMap<u64, Code>,
    held: &mut Held,
    id: u32,
    body: &[u8],
) -> bool {
    match id {
        JIT_CODE_UNWINDING_INFO if body.len() >= 24 => {
            let (size, hdr_size) = (ne_u64(body, 0), ne_u64(body, 8));
            let eh_frame = usize::try_from(size.saturating_sub(hdr_size))
                .ok()
                .and_then(|len| body.get(24..24usize.checked_add(len)?))
                // V8 on x86-64 writes headers without CFI: no information.
                .filter(|bytes| !bytes.is_empty());
            *pending = eh_frame.map(|bytes| match &*pending {
                Some(last) if **last == *bytes => last.clone(),
                _ => match codes.values().next_back() {
                    Some(code) if *code.eh_frame == *bytes => code.eh_frame.clone(),
                    _ => Arc::from(bytes),
                },
            });
            false
        }
        JIT_CODE_LOAD if body.len() >= 40 => {
            let (addr, size) = (ne_u64(body, 16), ne_u64(body, 24));
            let mut changed = codes
                .remove(&addr)
                .inspect(|old| held.give_back(old.cost))
                .is_some();
            if let Some(eh_frame) = pending.take() {
                // Shared bytes are paid for once.
                let own = if Arc::strong_count(&eh_frame) == 1 {
                    eh_frame.len()
                } else {
                    0
                };
                let cost = ENTRY_OVERHEAD + own;
                if codes.len() < MAX_CODES && held.take(cost) {
                    codes.insert(
                        addr,
                        Code {
                            size,
                            eh_frame,
                            cost,
                        },
                    );
                    changed = true;
                }
            }
            changed
        }
        JIT_CODE_MOVE if body.len() >= 48 => {
            let (old, new) = (ne_u64(body, 16), ne_u64(body, 24));
            let moved = codes.remove(&old);
            moved
                .map(|code| {
                    if let Some(replaced) = codes.insert(new, code) {
                        held.give_back(replaced.cost);
                    }
                })
                .is_some()
        }
        _ => false,
    }
}

/// The part of a record [`apply`] reads, copied for the trip back from the
/// reader thread: unwinding information whole, loads and moves by their
/// fixed fields; `None` for records the tables do not use.
fn owned(id: u32, body: &[u8]) -> Option<Owned> {
    let keep = match id {
        JIT_CODE_UNWINDING_INFO => body.len(),
        JIT_CODE_LOAD => body.len().min(40),
        JIT_CODE_MOVE => body.len().min(48),
        _ => return None,
    };
    Some(Owned::Record(id, body[..keep].to_vec()))
}

/// Reads what was added to `file` with `cursor` (one chunk at most), on a
/// reader thread.
fn read_on(mut cursor: JitdumpCursor, file: &File) -> ReadDone {
    let mut records = Vec::new();
    let read = cursor.read_new(file, |record| match record {
        JitdumpRecord::Restart => records.push(Owned::Restart),
        JitdumpRecord::Record { id, body } => records.extend(owned(id, body)),
    });
    if let Err(err) = read {
        debug!("jitdump: {err}");
    }
    (cursor, records)
}

impl ProcessJit {
    /// Collects a finished read (applying its records) and, when none is
    /// out and the last started `interval` ago or more, starts the next on
    /// a reader thread, with its own descriptor of `file`. Never waits.
    /// Returns whether the code with unwinding information changed.
    fn poll(&mut self, file: &File, interval: Duration) -> bool {
        let mut changed = self.collect(Duration::ZERO);
        let due = self.last_read.is_none_or(|t| t.elapsed() >= interval);
        if self.stalled || self.reading.is_some() || !due {
            return changed;
        }
        let Ok(file) = file.try_clone() else {
            return changed;
        };
        let first = self.last_read.is_none();
        self.last_read = Some(Instant::now());
        let cursor = std::mem::take(&mut self.cursor);
        self.reading = untrusted::spawn(move || read_on(cursor, &file));
        if self.reading.is_none() && !self.codes.is_empty() {
            // No reader free, and the cursor went with the job: the file is
            // read again from its start next time.
            self.forget_codes();
            changed = true;
        }
        if first {
            // A process's first read is waited for a little, so that its
            // first description has its tables (one drain of the rings
            // later would leave its first samples without them).
            changed |= self.collect(FIRST_READ_WAIT);
        }
        changed
    }

    /// Applies the read out, if it finished (waiting at most `wait` for
    /// it); marks the file stalled when it passed [`READ_DEADLINE`].
    /// Returns whether the code with unwinding information changed.
    fn collect(&mut self, wait: Duration) -> bool {
        let Some(reading) = &self.reading else {
            return false;
        };
        match reading.wait(wait, READ_DEADLINE) {
            Poll::Waiting => false,
            Poll::Lost => {
                self.reading = None;
                self.stalled = true;
                debug!("a jitdump read passed {READ_DEADLINE:?}: read no more");
                false
            }
            Poll::Ready((cursor, records)) => {
                self.reading = None;
                self.cursor = cursor;
                self.apply_all(records)
            }
        }
    }

    fn apply_all(&mut self, records: Vec<Owned>) -> bool {
        let mut changed = false;
        for record in records {
            match record {
                Owned::Restart => {
                    self.pending = None;
                    changed |= !self.codes.is_empty();
                    self.forget_codes();
                }
                Owned::Record(id, body) => {
                    let ProcessJit {
                        pending,
                        codes,
                        held,
                        ..
                    } = self;
                    changed |= apply(pending, codes, held, id, &body);
                }
            }
        }
        changed
    }

    fn forget_codes(&mut self) {
        self.codes.clear();
        let held = self.held.bytes();
        self.held.give_back(held);
    }

    /// `(count, sum of addresses)` of the code in `[start, end)`: differs
    /// when code was added, moved or dropped there.
    fn digest(&self, start: u64, end: u64) -> (usize, u64) {
        self.codes
            .range(start..end)
            .fold((0, 0), |(n, sum), (&addr, code)| {
                (n + 1, sum.wrapping_add(addr ^ code.size.rotate_left(32)))
            })
    }
}

/// A JIT table built, to be loaded: its object id, a name for messages,
/// the table.
pub type BuiltTable = (u32, String, UnwindTable);

/// The JIT tables of every process whose jitdump carries unwinding
/// information. Per process at most 2^18 pieces of code and 256 tables;
/// only processes still in `/proc` (swept every 5 s), besides those whose
/// exit was just reported.
#[derive(Debug)]
pub struct JitTables {
    processes: FxHashMap<u32, ProcessJit>,
    next_id: u32,
    /// When [`Self::forget_gone`] last swept.
    last_sweep: Option<Instant>,
}

impl Default for JitTables {
    fn default() -> Self {
        JitTables {
            processes: FxHashMap::default(),
            next_id: JIT_OBJECT_ID_BASE,
            last_sweep: None,
        }
    }
}

impl JitTables {
    /// The object id of the table of process `pid`'s anonymous executable
    /// mapping `[start, end)`, from its jitdump `file` as read so far (a
    /// read of what it added is started on a reader thread, and seen by a
    /// later call or [`Self::grew`]); `None` when no code with unwinding
    /// information lies in it (yet). Never waits for the file. A table built anew is pushed onto `built` (to be loaded), and the
    /// id it replaces onto `retired` (to be unloaded).
    pub fn mapping_table(
        &mut self,
        pid: u32,
        (start, end): (u64, u64),
        file: &File,
        built: &mut Vec<BuiltTable>,
        retired: &mut Vec<u32>,
    ) -> Option<u32> {
        self.forget_gone(retired);
        let process = self.processes.entry(pid).or_default();
        process.poll(file, CHECK_INTERVAL / 2);
        let digest = process.digest(start, end);
        if let Some(table) = process.tables.get(&start) {
            if table.digest == digest {
                return Some(table.object_id);
            }
        }
        if digest.0 == 0
            || (process.tables.len() >= MAX_TABLES && !process.tables.contains_key(&start))
        {
            return None;
        }
        let table = match build(process.codes.range(start..end), start) {
            Ok(table) => table,
            Err(err) => {
                debug!("pid {pid}: JIT code at {start:#x}: {err:#}");
                return None;
            }
        };
        let object_id = self.next_id;
        self.next_id = match self.next_id + 1 {
            VDSO_OBJECT_ID => JIT_OBJECT_ID_BASE,
            next => next,
        };
        let old = process
            .tables
            .insert(start, MappingTable { object_id, digest });
        retired.extend(old.map(|t| t.object_id));
        built.push((
            object_id,
            format!("[jit pid {pid} {start:#x}-{end:#x}]"),
            table,
        ));
        Some(object_id)
    }

    /// Whether process `pid` should be described again: a read of its
    /// jitdump `file` (started every 50 ms at most, on a reader thread)
    /// changed the code with unwinding information, or one of its tables
    /// was `evicted` (looked at every 50 ms at most; that table is then
    /// forgotten, so that it is built again, and its id pushed onto
    /// `retired`). Never waits for the file.
    pub fn grew(
        &mut self,
        pid: u32,
        file: &File,
        evicted: impl Fn(u32) -> bool,
        retired: &mut Vec<u32>,
    ) -> bool {
        self.forget_gone(retired);
        // A process described before its jitdump was open is first seen
        // here: its first read starts now.
        let process = self.processes.entry(pid).or_default();
        let changed = process.poll(file, CHECK_INTERVAL);
        if process
            .last_checked
            .is_some_and(|t| t.elapsed() < CHECK_INTERVAL)
        {
            return changed;
        }
        process.last_checked = Some(Instant::now());
        let before = process.tables.len();
        process.tables.retain(|_, t| {
            let keep = !evicted(t.object_id);
            if !keep {
                retired.push(t.object_id);
            }
            keep
        });
        changed || process.tables.len() != before
    }

    /// Forget process `pid` (it exited); its tables' ids go onto `retired`.
    pub fn process_exited(&mut self, pid: u32, retired: &mut Vec<u32>) {
        if let Some(process) = self.processes.remove(&pid) {
            retired.extend(process.tables.values().map(|t| t.object_id));
        }
        self.forget_gone(retired);
    }

    /// Forget the processes no longer in `/proc`, at most once per
    /// [`GONE_SWEEP`]; their tables' ids go onto `retired`. An exit is not
    /// the last word: a sample the process took before it, handled after
    /// it, describes the process again ([`Self::mapping_table`],
    /// [`Self::grew`]), and nothing else would remove it then (beside a
    /// jitdump writer that restarts every few seconds, each such process
    /// kept its cursor's read buffer, about 1 MiB: the agent's heap grew
    /// without bound). Its samples are named by the symbolizer from the
    /// tracker's open file, not from here.
    fn forget_gone(&mut self, retired: &mut Vec<u32>) {
        if self.last_sweep.is_some_and(|t| t.elapsed() < GONE_SWEEP) {
            return;
        }
        self.last_sweep = Some(Instant::now());
        self.processes.retain(|pid, process| {
            let alive = std::fs::symlink_metadata(format!("/proc/{pid}")).is_ok();
            if !alive {
                retired.extend(process.tables.values().map(|t| t.object_id));
            }
            alive
        });
    }

    /// The id of the current table of `pid`'s mapping starting at `start`.
    pub fn object_of(&self, pid: u32, start: u64) -> Option<u32> {
        Some(self.processes.get(&pid)?.tables.get(&start)?.object_id)
    }
}

/// The table of `codes` (by address), with rows at addresses relative to
/// `base` (the mapping's start). Errors: the rows do not form a table.
fn build<'a>(
    codes: impl Iterator<Item = (&'a u64, &'a Code)>,
    base: u64,
) -> anyhow::Result<UnwindTable> {
    let mut unsupported = BTreeMap::new();
    let mut count = |kind| *unsupported.entry(kind).or_insert(0u64) += 1;
    let mut ctx = Box::new(UnwindContext::new());
    let mut fdes: Vec<(u64, u64, Vec<Span>)> = Vec::new();
    let mut fde_count = 0;
    for (&addr, code) in codes {
        let start = addr - base;
        let end = start.saturating_add(code.size);
        let eh_frame_address = start.saturating_add(code.size.next_multiple_of(8));
        let bases = BaseAddresses::default().set_eh_frame(eh_frame_address);
        let mut section = EhFrame::new(&code.eh_frame, LittleEndian);
        section.set_address_size(8);
        let mut entries = section.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            fde_count += 1;
            let parsed = partial.parse(|s: &EhFrame<Slice<'_>>, b, o| s.cie_from_offset(b, o));
            let Ok(fde) = parsed else {
                count(UnsupportedKind::InvalidCfi);
                continue;
            };
            // Only FDEs within their code (another placement convention
            // would put them elsewhere).
            let (fde_start, fde_end) = (fde.initial_address(), fde.end_address());
            if fde_start < start || fde_end > end || fde_start >= fde_end {
                count(UnsupportedKind::AddressRange);
                continue;
            }
            let mut spans = Vec::new();
            if fde_spans(&fde, &section, &bases, &mut ctx, &mut spans, &mut count).is_err() {
                spans = vec![Span {
                    start: fde_start,
                    end: fde_end,
                    rule: Rule::Unsupported(UnsupportedKind::InvalidCfi),
                }];
                count(UnsupportedKind::InvalidCfi);
            }
            fdes.push((fde_start, fde_end, spans));
        }
    }
    fdes.sort_by_key(|f| f.0);
    let mut assembly = Assembly::default();
    for (start, end, spans) in &fdes {
        assembly.add_fde(spans, *start, *end);
    }
    let rules = assembly.finish();
    Ok(UnwindTable::from_rules(
        &rules,
        fde_count,
        unsupported,
        CfiSource::EhFrame,
    )?)
}

#[cfg(test)]
#[path = "jit_tests.rs"]
mod tests;
