//! Builds an [`UnwindTable`] from an x86-64 ELF object's CFI: `.eh_frame`
//! (for an object without section headers, the one `PT_GNU_EH_FRAME`
//! points at), else `.debug_frame` (of the object, else of its separate
//! debug file).
//!
//! gimli parses and evaluates every FDE; each row of gimli's unwind table is
//! translated into a [`Rule`] by the architecture's file
//! ([`super::x86_64`]; unrepresentable rules become
//! [`Rule::Unsupported`] and are counted by kind). The FDEs' rows are
//! assembled in address order by [`super::assemble`] (an FDE with a later
//! start wins where ranges overlap; on equal starts the later one in the
//! section; gaps get [`Rule::EndOfFunction`]; identical consecutive rules
//! merge), and the stream is split into pages.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use gimli::{
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, LittleEndian, UnwindContext, UnwindSection,
};
use object::elf;
use object::read::elf::{ElfFile64, FileHeader};
use object::{CompressionFormat, Endianness, Object, ObjectSection};

use super::assemble::{Assembly, Span};
use super::context_start::{add_context_start_marks, Code, OUTERMOST_MARK};
use super::early::{Ahead, EarlySink, FdeAt, CHECK_EVERY_FDES};
use super::eh_frame_hdr;
use super::identity::find_debug_file;
use super::rule::{Rule, UnsupportedKind};
use super::table::{CfiSource, InvalidTable, RuleAt, UnwindTable, MAX_ADDRESS};
use super::x86_64;

/// Largest decompressed `.debug_frame` accepted, bytes.
const MAX_SECTION_SIZE: u64 = 1 << 32;

/// Why no table could be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Reading the object failed.
    #[error("cannot read {}", path.display())]
    Io {
        /// The object's path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The bytes are not a well-formed ELF file.
    #[error("malformed ELF file")]
    Elf(#[from] object::Error),
    /// A valid object this builder does not handle (not 64-bit little-endian
    /// x86-64, or relocatable).
    #[error("unsupported object: {0}")]
    Unsupported(String),
    /// Neither `.eh_frame` nor `.debug_frame` exists (the caller should fall
    /// back to frame pointers).
    #[error("no call frame information (.eh_frame or .debug_frame)")]
    NoCfi,
    /// The `PT_GNU_EH_FRAME` segment (`.eh_frame_hdr`) of an object without
    /// section headers is malformed or points outside the object.
    #[error("malformed PT_GNU_EH_FRAME: {0}")]
    EhFrameHdr(String),
    /// The CFI section is malformed.
    #[error("malformed {section}: {error}")]
    Cfi {
        /// `.eh_frame` or `.debug_frame`.
        section: CfiSource,
        /// gimli's error.
        error: gimli::Error,
    },
    /// A compressed (zlib or zstd) `.debug_frame` that could not be
    /// decompressed.
    #[error("cannot decompress {section}: {reason}")]
    Compression {
        /// The section name.
        section: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The rows do not form a valid table (too many rows or pages).
    #[error(transparent)]
    Table(#[from] InvalidTable),
}

/// Builds the table of an x86-64 ELF object from its own CFI.
pub fn build_table(elf_bytes: &[u8]) -> Result<UnwindTable, BuildError> {
    build_table_with_debug_file(elf_bytes, None)
}

/// Builds the table as [`build_table_at`] does (as [`build_table`] without
/// a `path`), sending the rows of the pages `early` asks for ahead of the
/// full table ([`super::early`]).
pub fn build_table_early(
    path: Option<&Path>,
    elf_bytes: &[u8],
    early: &dyn EarlySink,
    debug_dirs: &[PathBuf],
) -> Result<UnwindTable, BuildError> {
    build_at(path, elf_bytes, Some(early), debug_dirs)
}

/// Reads the object at `path` and builds its table with
/// [`build_table_at`].
pub fn build_table_from_path(
    path: &Path,
    debug_dirs: &[PathBuf],
) -> Result<UnwindTable, BuildError> {
    build_table_at(path, &read(path)?, debug_dirs)
}

/// Builds the table of the object whose bytes are `elf_bytes`, read from
/// `path`: when the object has no CFI, its separate debug file (found by
/// [`find_debug_file`] under `debug_dirs` (`--debug-dirs`) from `path`
/// and the object's build ID or `.gnu_debuglink`) supplies `.debug_frame`.
pub fn build_table_at(
    path: &Path,
    elf_bytes: &[u8],
    debug_dirs: &[PathBuf],
) -> Result<UnwindTable, BuildError> {
    build_at(Some(path), elf_bytes, None, debug_dirs)
}

fn build_at(
    path: Option<&Path>,
    elf_bytes: &[u8],
    early: Option<&dyn EarlySink>,
    debug_dirs: &[PathBuf],
) -> Result<UnwindTable, BuildError> {
    match build_with(elf_bytes, None, early) {
        Err(BuildError::NoCfi) => {
            match path.and_then(|p| find_debug_file(p, elf_bytes, debug_dirs)) {
                Some(debug_path) => build_with(elf_bytes, Some(&read(&debug_path)?), early),
                None => Err(BuildError::NoCfi),
            }
        }
        result => result,
    }
}

fn read(path: &Path) -> Result<Vec<u8>, BuildError> {
    std::fs::read(path).map_err(|source| BuildError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Builds the table of an x86-64 ELF object: its `.eh_frame`, else its
/// `.debug_frame`, else the `.debug_frame` of `debug_file` (the bytes of its
/// separate debug file, whose section addresses are the object's). A section
/// without any FDE counts as absent; [`BuildError::NoCfi`] when all are.
pub fn build_table_with_debug_file(
    elf_bytes: &[u8],
    debug_file: Option<&[u8]>,
) -> Result<UnwindTable, BuildError> {
    build_with(elf_bytes, debug_file, None)
}

fn build_with(
    elf_bytes: &[u8],
    debug_file: Option<&[u8]>,
    early: Option<&dyn EarlySink>,
) -> Result<UnwindTable, BuildError> {
    let file = parse_x86_64(elf_bytes)?;
    let entry = Some(file.entry()).filter(|&e| e != 0);
    let code = Code::of(&file);
    if let Some((data, bases)) = eh_frame_of(&file)? {
        let mut eh_frame = EhFrame::new(&data, LittleEndian);
        eh_frame.set_address_size(8);
        let table =
            build_from_section(&eh_frame, &bases, CfiSource::EhFrame, (entry, &code), early)?;
        if table.stats().fdes > 0 {
            return Ok(table);
        }
    }
    let debug = debug_file.map(parse_x86_64).transpose()?;
    for f in std::iter::once(&file).chain(debug.as_ref()) {
        if let Some(section) = f.section_by_name(".debug_frame") {
            if let Some(data) = section_data(&section, ".debug_frame")? {
                let mut debug_frame = DebugFrame::new(&data, LittleEndian);
                debug_frame.set_address_size(8);
                let bases = BaseAddresses::default();
                let table = build_from_section(
                    &debug_frame,
                    &bases,
                    CfiSource::DebugFrame,
                    (entry, &code),
                    early,
                )?;
                if table.stats().fdes > 0 {
                    return Ok(table);
                }
            }
        }
    }
    Err(BuildError::NoCfi)
}

/// `.eh_frame`'s bytes and the base addresses its pointers are relative to.
type EhFrameData<'d> = (Cow<'d, [u8]>, BaseAddresses);

/// The `.eh_frame` of `file` with the base addresses its pointers are
/// relative to: its `.eh_frame` section, or for an object without section
/// headers the one `PT_GNU_EH_FRAME` points at ([`eh_frame_hdr`]).
fn eh_frame_of<'d>(
    file: &ElfFile64<'d, Endianness>,
) -> Result<Option<EhFrameData<'d>>, BuildError> {
    if file.elf_section_table().is_empty() {
        return Ok(eh_frame_hdr::eh_frame_from_segments(file)
            .map_err(BuildError::EhFrameHdr)?
            .map(|found| (Cow::Borrowed(found.data), found.bases())));
    }
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Ok(None);
    };
    let address_of = |name| file.section_by_name(name).map_or(0, |s| s.address());
    let bases = BaseAddresses::default()
        .set_eh_frame(section.address())
        .set_eh_frame_hdr(address_of(".eh_frame_hdr"))
        .set_text(address_of(".text"))
        .set_got(address_of(".got"));
    Ok(section_data(&section, ".eh_frame")?.map(|data| (data, bases)))
}

/// Parses a 64-bit little-endian x86-64 ELF executable or shared object.
fn parse_x86_64(bytes: &[u8]) -> Result<ElfFile64<'_, Endianness>, BuildError> {
    match object::FileKind::parse(bytes)? {
        object::FileKind::Elf64 => {}
        object::FileKind::Elf32 => return Err(BuildError::Unsupported("32-bit ELF".into())),
        other => return Err(BuildError::Unsupported(format!("not ELF ({other:?})"))),
    }
    let file = ElfFile64::<Endianness>::parse(bytes)?;
    let header = file.elf_header();
    let endian = file.endian();
    let machine = header.e_machine(endian);
    if machine != x86_64::ELF_MACHINE {
        return Err(BuildError::Unsupported(format!(
            "ELF machine {machine} is not x86-64 ({})",
            x86_64::ELF_MACHINE
        )));
    }
    if endian != Endianness::Little {
        return Err(BuildError::Unsupported("big-endian ELF".into()));
    }
    if header.e_type(endian) == elf::ET_REL {
        return Err(BuildError::Unsupported(
            "relocatable object (not linked)".into(),
        ));
    }
    Ok(file)
}

/// A section's contents (decompressed), or `None` when it has none in the
/// file (`SHT_NOBITS` in debug files, or empty).
fn section_data<'d>(
    section: &object::read::elf::ElfSection64<'d, '_, Endianness>,
    name: &'static str,
) -> Result<Option<Cow<'d, [u8]>>, BuildError> {
    let compressed = section.compressed_data()?;
    let err = |reason: String| BuildError::Compression {
        section: name,
        reason,
    };
    let size = compressed.uncompressed_size;
    let data = match compressed.format {
        CompressionFormat::None => Cow::Borrowed(compressed.data),
        CompressionFormat::Zlib => Cow::Owned(decompress(
            flate2::read::ZlibDecoder::new(compressed.data),
            size,
            err,
        )?),
        CompressionFormat::Zstandard => {
            let decoder = zstd::stream::read::Decoder::with_buffer(compressed.data)
                .map_err(|e| err(e.to_string()))?;
            Cow::Owned(decompress(decoder, size, err)?)
        }
        other => return Err(err(format!("{other:?} compression is not supported"))),
    };
    Ok((!data.is_empty()).then_some(data))
}

/// Reads exactly `size` bytes (at most [`MAX_SECTION_SIZE`]) from
/// `decoder`.
fn decompress(
    decoder: impl Read,
    size: u64,
    err: impl Fn(String) -> BuildError,
) -> Result<Vec<u8>, BuildError> {
    if size > MAX_SECTION_SIZE {
        return Err(err(format!("{size} bytes uncompressed")));
    }
    let mut out = Vec::with_capacity(size as usize);
    decoder
        .take(size)
        .read_to_end(&mut out)
        .map_err(|e| err(e.to_string()))?;
    if out.len() as u64 != size {
        return Err(err(format!("{} of {size} bytes", out.len())));
    }
    Ok(out)
}

pub(super) type Slice<'d> = gimli::EndianSlice<'d, LittleEndian>;

/// CIEs parsed so far, by section offset.
type Cies<'d> = HashMap<usize, gimli::CommonInformationEntry<Slice<'d>>>;

/// The CIE at `offset` of `section`, parsed once.
fn cie_at<'d, S: UnwindSection<Slice<'d>>>(
    cies: &mut Cies<'d>,
    section: &S,
    bases: &BaseAddresses,
    offset: S::Offset,
) -> gimli::Result<gimli::CommonInformationEntry<Slice<'d>>> {
    let key: usize = gimli::UnwindOffset::into(offset);
    if let Some(cie) = cies.get(&key) {
        return Ok(cie.clone());
    }
    let cie = section.cie_from_offset(bases, offset)?;
    cies.insert(key, cie.clone());
    Ok(cie)
}

/// Evaluates the FDE `at` into `spans` (empty on entry): its rows as rules,
/// clamped to its range; one [`UnsupportedKind::InvalidCfi`] span over the
/// range when it cannot be evaluated. Unsupported rules go to `count`.
fn evaluate_fde<'d, S: UnwindSection<Slice<'d>>>(
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    cies: &mut Cies<'d>,
    at: &FdeAt,
    spans: &mut Vec<Span>,
    count: &mut dyn FnMut(UnsupportedKind),
) {
    let &FdeAt { start, end, offset } = at;
    if offset == OUTERMOST_MARK {
        spans.push(Span {
            start,
            end,
            rule: Rule::Outermost,
        });
        return;
    }
    let evaluated = section
        .fde_from_offset(bases, S::Offset::from(offset), |s, b, o| {
            cie_at(cies, s, b, o)
        })
        .and_then(|fde| fde_spans(&fde, section, bases, ctx, spans, &mut &mut *count));
    if evaluated.is_err() {
        spans.clear();
        spans.push(Span {
            start,
            end,
            rule: Rule::Unsupported(UnsupportedKind::InvalidCfi),
        });
        count(UnsupportedKind::InvalidCfi);
    }
}

/// Evaluates every FDE of `section` and assembles the table, in two passes
/// so that memory stays near the size of the result: the first finds each
/// FDE's range, the second evaluates the FDEs in address order, each
/// straight into the [`Assembly`]. With `early`, the second pass stops
/// every [`CHECK_EVERY_FDES`] FDEs to build and send the pages it asks for,
/// and to send the pages it has finished; the last pages are sent as soon
/// as the table is assembled. The object's `entry` point, where no FDE
/// covers it, is the outermost frame ([`entry_point_rules`]), and so is
/// the byte before a `makecontext` trampoline ([`add_context_start_marks`]).
fn build_from_section<'d, S: UnwindSection<Slice<'d>>>(
    section: &S,
    bases: &BaseAddresses,
    source: CfiSource,
    (entry, code): (Option<u64>, &Code<'_>),
    early: Option<&dyn EarlySink>,
) -> Result<UnwindTable, BuildError> {
    let cfi_err = |error| BuildError::Cfi {
        section: source,
        error,
    };
    let mut unsupported = BTreeMap::new();
    let mut count = |kind| *unsupported.entry(kind).or_insert(0u64) += 1;
    let mut cies = Cies::new();
    let mut fdes = Vec::new();
    let mut fde_count = 0u64;
    let mut context_starts = Vec::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next().map_err(cfi_err)? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        fde_count += 1;
        let Ok(fde) = partial.parse(|s, b, o| cie_at(&mut cies, s, b, o)) else {
            count(UnsupportedKind::InvalidCfi);
            continue;
        };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()).filter(|e| *e <= MAX_ADDRESS) else {
            count(UnsupportedKind::AddressRange);
            continue;
        };
        if code.is_context_start(start) {
            context_starts.push(start);
        }
        if start < end {
            fdes.push(FdeAt {
                start,
                end,
                offset: fde.offset(),
            });
        }
    }
    // Stable: equal starts keep section order, so the later FDE is laid last.
    fdes.sort_by_key(|f| f.start);
    add_context_start_marks(&mut fdes, &context_starts);
    let mut ctx = Box::new(UnwindContext::new());
    let mut assembly = Assembly::default();
    let mut spans = Vec::new();
    let mut ahead = early.map(Ahead::new);
    for (i, at) in fdes.iter().enumerate() {
        if let Some(ahead) = ahead.as_mut().filter(|_| i % CHECK_EVERY_FDES == 0) {
            ahead.serve(&fdes, source, |at, spans| {
                evaluate_fde(section, bases, &mut ctx, &mut cies, at, spans, &mut |_| {})
            });
            ahead.progress(assembly.merged(), source);
        }
        spans.clear();
        evaluate_fde(
            section, bases, &mut ctx, &mut cies, at, &mut spans, &mut count,
        );
        assembly.add_fde(&spans, at.start, at.end);
    }
    drop(fdes);
    let mut rules = assembly.finish();
    if let Some(entry) = entry {
        entry_point_rules(&mut rules, entry);
    }
    let table = UnwindTable::from_rules(&rules, fde_count, unsupported, source)?;
    if let Some(ahead) = ahead.as_mut() {
        // The pages not sent yet, at once: the caller may store the table
        // in the cache (and wait for the disk) before the loader gets it.
        ahead.send(&table);
    }
    Ok(table)
}

/// Most bytes from an object's entry point that [`entry_point_rules`]
/// marks outermost: the dynamic loader's start-up stub (glibc's x86-64
/// `_start` and `_dl_start_user`, 64 bytes) fits, the rest of a gap without
/// CFI is not assumed to be start-up code.
const ENTRY_STUB_MAX_BYTES: u64 = 128;

/// Marks the object's entry point (ELF `e_entry`) as the outermost frame
/// when no FDE covers it: there the kernel starts the process, and nothing
/// is below it. glibc's dynamic loader has no CFI for its entry stub
/// (`_start`, which calls `_dl_start`, and `_dl_start_user`, which calls
/// `_dl_init`), so every stack of a process still in the loader ended
/// there by frame pointers and was counted `frame_pointer`, not
/// `complete`. Objects whose entry has CFI (an executable's `_start` marks
/// its return address undefined) keep theirs. The rule reaches from the
/// entry to the next FDE, at most [`ENTRY_STUB_MAX_BYTES`].
fn entry_point_rules(rules: &mut Vec<RuleAt>, entry: u64) {
    let at = rules.partition_point(|&(addr, _)| addr <= entry);
    let in_gap = at
        .checked_sub(1)
        .is_none_or(|i| rules[i].1 == Rule::EndOfFunction);
    if !in_gap {
        return;
    }
    let next = rules.get(at).map(|&(addr, _)| addr);
    let end = entry.saturating_add(ENTRY_STUB_MAX_BYTES);
    let end = next.map_or(end, |next| next.min(end));
    let mut added = vec![(entry, Rule::Outermost)];
    if Some(end) != next {
        added.push((end, Rule::EndOfFunction));
    }
    // A gap row starting at the entry itself is replaced.
    let from = if at > 0 && rules[at - 1].0 == entry {
        at - 1
    } else {
        at
    };
    rules.splice(from..at, added);
}

/// Evaluates `fde` (of `section`, whose pointers are relative to `bases`)
/// into `spans`: its rows as rules, clamped to the FDE's range, in address
/// order; unsupported rules are counted by `count`. Errors: gimli's, on
/// malformed CFI (`spans` then holds the rows before it).
pub(super) fn fde_spans<'d, S: UnwindSection<Slice<'d>>>(
    fde: &gimli::FrameDescriptionEntry<Slice<'d>>,
    section: &S,
    bases: &BaseAddresses,
    ctx: &mut UnwindContext<usize>,
    spans: &mut Vec<Span>,
    count: &mut impl FnMut(UnsupportedKind),
) -> gimli::Result<()> {
    let (start, end) = (
        fde.initial_address(),
        fde.initial_address().saturating_add(fde.len()),
    );
    let signal = fde.is_signal_trampoline();
    let mut rows = fde.rows(section, bases, ctx)?;
    while let Some(row) = rows.next_row()? {
        // Clamped to the FDE so that spans stay within the range it claims.
        let (row_start, row_end) = (row.start_address().max(start), row.end_address().min(end));
        if row_start < row_end {
            let rule = if signal {
                Rule::SignalFrame
            } else {
                let (rule, kind) = x86_64::translate(row, section);
                kind.into_iter().for_each(&mut *count);
                rule
            };
            spans.push(Span {
                start: row_start,
                end: row_end,
                rule,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "cfi_tests.rs"]
mod tests;
