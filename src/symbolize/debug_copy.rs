//! Uncompressed copies of debug information stored compressed.
//!
//! Debian's and Fedora's debug packages store DWARF sections compressed
//! (`SHF_COMPRESSED`, zlib or zstd): libc6-dbg's libc debug file holds
//! 2.9 MB of compressed sections that inflate to about 14 MB. blazesym
//! inflates such sections into the heap every time it parses the file, and a
//! continuous symbolizer parses libc again in every window that brings new
//! addresses in it (it costs too much to keep, [`super::KEPT_OBJECT_MAX_BYTES`]):
//! under process churn those 14 MB were the largest single item of the
//! agent's heap (jemalloc heap profiles, docs/decisions/0009-debug-copies-inflated-and-streamed.md).
//!
//! This module writes, once per build ID, a copy of such a file whose debug
//! sections are stored uncompressed, inflated as streams (so the heap never
//! holds the file), under `DIR/BUILD_ID.debug` ([`DebugCopies`]: the unwind cache directory's
//! [`SUBDIRECTORY`]). blazesym maps the copy, so the DWARF is read
//! through the page cache instead of being inflated into the heap. A file
//! that cannot be copied (no build ID, larger than [`MAX_COPY_BYTES`] once
//! inflated, a corrupt section, a write error) is symbolized from the
//! original as before, and not tried again by the run.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use object::elf;
use object::read::elf::{CompressionHeader, ElfFile64, SectionHeader};
use object::{CompressionFormat, Endianness, Object, ObjectSection, ReadRef};
use tracing::debug;

/// The subdirectory of the unwind cache directory (`--unwind-cache-dir`)
/// that holds the copies.
pub const SUBDIRECTORY: &str = "decompressed-debug";

/// Largest inflated size (bytes, all sections) of a file this module copies.
pub const MAX_COPY_BYTES: u64 = 1 << 30;

/// Total size (bytes) of the copies kept in the directory; writing a copy
/// removes the least recently used ones (by modification time, refreshed
/// on use) beyond it.
pub const DIR_BUDGET_BYTES: u64 = 4 << 30;

/// Files whose answer [`DebugCopies::uncompressed_copy`] remembers (past
/// it, it forgets them all and looks again).
const REMEMBERED_FILES: usize = 4096;

/// A file's identity (`stat`): the symbolizer reads objects through
/// `/proc/self/fd/N` paths, whose numbers are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i64,
}

/// The copies of one directory (a run's unwind cache directory's
/// [`SUBDIRECTORY`]), shared by the run's symbolizers, with what was
/// answered for each file: its copy, or `None` (nothing compressed, or it
/// could not be copied: not tried again).
#[derive(Debug)]
pub struct DebugCopies {
    dir: PathBuf,
    known: Mutex<HashMap<FileId, Option<PathBuf>>>,
}

impl DebugCopies {
    /// Copies written to `dir` (created when the first is written).
    pub fn new(dir: PathBuf) -> Self {
        DebugCopies {
            dir,
            known: Mutex::default(),
        }
    }

    /// The file to read `file`'s debug information from: an uncompressed
    /// copy when `file` is an ELF file with compressed debug sections and a
    /// copy is (or can now be) in the directory; `None` otherwise (read
    /// `file` itself). After the first call for a file, costs a `stat`.
    pub fn uncompressed_copy(&self, file: &Path) -> Option<PathBuf> {
        let meta = fs::metadata(file).ok()?;
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        };
        let known = self.lock().get(&id).cloned();
        match known {
            Some(Some(copy)) if fs::metadata(&copy).is_ok() => return Some(copy),
            Some(None) => return None,
            _ => {}
        }
        let copy = copy_into(file, &self.dir).unwrap_or_else(|err| {
            debug!("debug copy: {}: {err:#}", file.display());
            None
        });
        let mut map = self.lock();
        if map.len() >= REMEMBERED_FILES {
            map.clear();
        }
        map.insert(id, copy.clone());
        copy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileId, Option<PathBuf>>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `file`'s copy in `dir`, written now if missing; `Ok(None)` when `file`
/// has no compressed debug section. Only the headers are read unless a
/// copy must be written, and then each section is inflated as a stream
/// ([`write_inflated`]): the heap holds buffers, not the file.
fn copy_into(file: &Path, dir: &Path) -> Result<Option<PathBuf>> {
    let cache = object::ReadCache::new(fs::File::open(file).context("opening")?);
    let elf = ElfFile64::<Endianness, &object::ReadCache<fs::File>>::parse(&cache)
        .context("parsing ELF")?;
    let compressed = compressed_sections(&elf)?;
    if compressed.is_empty() {
        return Ok(None);
    }
    let Some(build_id) = elf.build_id().ok().flatten() else {
        bail!("no build ID to name its copy");
    };
    let copy = dir.join(format!("{}.debug", crate::unwind::identity::hex(build_id)));
    if fs::metadata(&copy).is_ok_and(|m| m.len() > 0) {
        // Used: the least recently used copies are the ones evicted.
        if let Ok(f) = fs::File::options().append(true).open(&copy) {
            let _ = f.set_modified(SystemTime::now());
        }
        return Ok(Some(copy));
    }
    let inflated = compressed
        .iter()
        .try_fold(0u64, |total, c| total.checked_add(c.size))
        .filter(|&total| total <= MAX_COPY_BYTES)
        .with_context(|| format!("more than {MAX_COPY_BYTES} bytes once inflated"))?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let length = fs::metadata(file).context("stat")?.len();
    make_room(dir, length + inflated);
    crate::util::files::write_atomic_with(&copy, 0o644, |out| {
        write_inflated(&elf, file, &compressed, out)
    })?;
    debug!(
        "debug copy: {} -> {} ({} bytes inflated)",
        file.display(),
        copy.display(),
        inflated
    );
    Ok(Some(copy))
}

/// A compressed debug section (`SHF_COMPRESSED`, gABI "Section
/// Compression") of a file to copy.
#[derive(Debug)]
struct Compressed {
    /// Its index in the section header table.
    index: usize,
    format: CompressionFormat,
    /// File offset (bytes) of its compressed stream, after the
    /// compression header, and the stream's length (bytes).
    offset: u64,
    length: u64,
    /// Its size inflated (`ch_size`, bytes) and its alignment inflated
    /// (`ch_addralign`, at least 1).
    size: u64,
    align: u64,
}

/// Largest `ch_addralign` (bytes) of a section this module inflates: the
/// padding before it is written out, so a hostile header must not ask for
/// terabytes of it.
const MAX_SECTION_ALIGN: u64 = 1 << 16;

/// The `.debug_*` sections of `elf` flagged `SHF_COMPRESSED` with zlib or
/// zstd, in section order. A section whose compression header cannot be
/// read, or of another type, is left as it is (compressed, in the copy
/// too). Errors: an alignment that is not a power of two up to
/// [`MAX_SECTION_ALIGN`].
fn compressed_sections<'data, R: ReadRef<'data>>(
    elf: &ElfFile64<'data, Endianness, R>,
) -> Result<Vec<Compressed>> {
    let endian = elf.endian();
    let mut found = Vec::new();
    for section in elf.sections() {
        let Ok(name) = section.name() else { continue };
        if !name.starts_with(".debug_") {
            continue;
        }
        let header = section.elf_section_header();
        let Ok(Some((chdr, offset, length))) = header.compression(endian, elf.data()) else {
            continue;
        };
        let format = match chdr.ch_type(endian) {
            elf::ELFCOMPRESS_ZLIB => CompressionFormat::Zlib,
            elf::ELFCOMPRESS_ZSTD => CompressionFormat::Zstandard,
            _ => continue,
        };
        let align = chdr.ch_addralign(endian).max(1);
        if !align.is_power_of_two() || align > MAX_SECTION_ALIGN {
            bail!("{name}: alignment {align}");
        }
        found.push(Compressed {
            index: section.index().0,
            format,
            offset,
            length,
            size: chdr.ch_size(endian),
            align,
        });
    }
    Ok(found)
}

/// Writes to `out` the ELF file `file` (parsed as `elf`) with its
/// `compressed` sections stored inflated: first `file`'s bytes unchanged,
/// so every segment and every other section keeps its offset; then each
/// section inflated (at its `ch_addralign`); then a section header table
/// that points those sections at their inflated bytes with `SHF_COMPRESSED`
/// cleared. The ELF header's `e_shoff` and `e_shentsize` are the fields
/// changed in place; the compressed bytes stay in the copy, unreferenced
/// (libc's debug copy: 14.2 MB on disk, 10.4 with them dropped). Sections are
/// inflated as streams: the heap holds buffers, not the file (a whole-file
/// rewrite held libc's debug file three times, 23 MiB, decision 0009). Errors:
/// a section that does not inflate to its `ch_size`, I/O.
fn write_inflated<'data, R: ReadRef<'data>>(
    elf: &ElfFile64<'data, Endianness, R>,
    file: &Path,
    compressed: &[Compressed],
    out: &mut fs::File,
) -> Result<()> {
    let endian = elf.endian();
    let mut source = fs::File::open(file).context("opening")?;
    let mut end = io::copy(&mut source, out).context("copying")?;
    let mut headers: Vec<elf::SectionHeader64<Endianness>> =
        elf.elf_section_table().iter().copied().collect();
    let mut appended = io::BufWriter::with_capacity(1 << 16, &mut *out);
    for c in compressed {
        let start = end.next_multiple_of(c.align);
        write_zeros(&mut appended, start - end)?;
        source.seek(SeekFrom::Start(c.offset))?;
        let stream = io::BufReader::new((&source).take(c.length));
        inflate_into(c.format, stream, c.size, &mut appended)
            .with_context(|| format!("section {}", c.index))?;
        let header = headers.get_mut(c.index).context("section index")?;
        header.sh_offset.set(endian, start);
        header.sh_size.set(endian, c.size);
        header.sh_addralign.set(endian, c.align);
        let flags = header.sh_flags.get(endian).0 & !elf::SHF_COMPRESSED.0;
        header.sh_flags.set(endian, elf::SectionFlags(flags));
        end = start + c.size;
    }
    let table = end.next_multiple_of(8);
    write_zeros(&mut appended, table - end)?;
    for header in &headers {
        appended.write_all(object::pod::bytes_of(header))?;
    }
    appended.flush()?;
    drop(appended);
    let mut file_header = *elf.elf_header();
    file_header.e_shoff.set(endian, table);
    file_header
        .e_shentsize
        .set(endian, size_of::<elf::SectionHeader64<Endianness>>() as u16);
    out.seek(SeekFrom::Start(0))?;
    out.write_all(object::pod::bytes_of(&file_header))?;
    Ok(())
}

fn write_zeros(out: &mut impl Write, count: u64) -> io::Result<()> {
    io::copy(&mut io::repeat(0).take(count), out).map(drop)
}

/// Inflates the compressed stream `compressed` (zlib or zstd) into `out`;
/// errors unless it gives exactly `size` bytes.
fn inflate_into(
    format: CompressionFormat,
    compressed: impl io::BufRead,
    size: u64,
    out: &mut impl Write,
) -> Result<()> {
    let written = match format {
        CompressionFormat::Zlib => io::copy(
            &mut flate2::bufread::ZlibDecoder::new(compressed).take(size + 1),
            out,
        )?,
        CompressionFormat::Zstandard => io::copy(
            &mut zstd::stream::read::Decoder::with_buffer(compressed)?.take(size + 1),
            out,
        )?,
        other => bail!("unsupported compression {other:?}"),
    };
    if written != size {
        bail!("inflated to {written} bytes, header says {size}");
    }
    Ok(())
}

/// Remove the least recently used copies in `dir` until `incoming` more
/// bytes fit in [`DIR_BUDGET_BYTES`].
fn make_room(dir: &Path, incoming: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut copies: Vec<(SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "debug"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    copies.sort();
    let mut total: u64 = copies.iter().map(|(_, len, _)| len).sum::<u64>() + incoming;
    for (_, len, path) in copies {
        if total <= DIR_BUDGET_BYTES {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::ObjectSymbol;
    use std::process::Command;

    /// A small program with DWARF (`gcc -g`), and copies of it whose debug
    /// sections binutils compressed with zlib and with zstd.
    fn programs(dir: &Path) -> Option<(PathBuf, Vec<PathBuf>)> {
        let source = dir.join("p.c");
        fs::write(
            &source,
            "static int __attribute__((noinline)) triple(int x) { return x * 3; }\n\
             int main(int argc, char **argv) { return triple(argc); }\n",
        )
        .expect("write source");
        let plain = dir.join("p");
        let built = Command::new("gcc")
            .args(["-g", "-O1", "-Wl,--build-id", "-o"])
            .arg(&plain)
            .arg(&source)
            .status()
            .is_ok_and(|s| s.success());
        if !built {
            eprintln!("skipped: gcc failed");
            return None;
        }
        let mut compressed = Vec::new();
        for format in ["zlib", "zstd"] {
            let out = dir.join(format!("p.{format}"));
            let ok = Command::new("objcopy")
                .arg(format!("--compress-debug-sections={format}"))
                .arg(&plain)
                .arg(&out)
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                compressed.push(out);
            } else {
                eprintln!("objcopy cannot compress with {format}: not tested");
            }
        }
        Some((plain, compressed))
    }

    fn debug_sections(data: &[u8]) -> Vec<(String, bool, Vec<u8>)> {
        let elf = ElfFile64::<Endianness>::parse(data).expect("ELF");
        elf.sections()
            .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
            .map(|s| {
                let c = s.compressed_file_range().expect("range");
                let bytes = s.data().expect("data").to_vec();
                let name = s.name().expect("name").to_string();
                (name, c.format != CompressionFormat::None, bytes)
            })
            .collect()
    }

    /// `path`'s copy as [`copy_into`] writes it, read back.
    fn inflated_copy(path: &Path, out: &Path) -> Vec<u8> {
        let cache = object::ReadCache::new(fs::File::open(path).expect("open"));
        let elf =
            ElfFile64::<Endianness, &object::ReadCache<fs::File>>::parse(&cache).expect("ELF");
        let compressed = compressed_sections(&elf).expect("compression headers");
        assert!(!compressed.is_empty(), "{}", path.display());
        let mut file = fs::File::create(out).expect("create");
        write_inflated(&elf, path, &compressed, &mut file).expect("inflates");
        fs::read(out).expect("read back")
    }

    type Layout = (Vec<(String, Option<(u64, u64)>)>, Vec<u8>);

    /// Where each section and segment of `data` lies: (name, offset, size)
    /// of the sections that are not debug sections, and the program
    /// headers' bytes.
    fn layout(data: &[u8]) -> Layout {
        let elf = ElfFile64::<Endianness>::parse(data).expect("ELF");
        let sections = elf
            .sections()
            .filter(|s| !s.name().is_ok_and(|n| n.starts_with(".debug_")))
            .map(|s| (s.name().expect("name").to_string(), s.file_range()))
            .collect();
        let segments = object::pod::bytes_of_slice(elf.elf_program_headers()).to_vec();
        (sections, segments)
    }

    /// The copy holds the very bytes of the uncompressed original's debug
    /// sections, none flagged compressed; every other section and every
    /// segment is where it was, and the symbols are unchanged.
    #[test]
    fn inflated_copy_has_the_original_debug_sections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((plain, compressed)) = programs(dir.path()) else {
            return;
        };
        let original = debug_sections(&fs::read(&plain).expect("read"));
        assert!(original.iter().any(|(n, ..)| n == ".debug_info"));
        assert!(compressed.iter().any(|p| p.extension().unwrap() == "zlib"));
        for path in &compressed {
            let data = fs::read(path).expect("read");
            assert!(
                debug_sections(&data).iter().any(|(_, c, _)| *c),
                "{} has no compressed section",
                path.display()
            );
            let copy = inflated_copy(path, &dir.path().join("copy"));
            let sections = debug_sections(&copy);
            assert_eq!(sections, original, "{}", path.display());
            assert_eq!(layout(&copy), layout(&data), "{}", path.display());
            let symbols = |bytes: &[u8]| {
                let elf = ElfFile64::<Endianness>::parse(bytes).expect("ELF");
                let named = elf
                    .symbols()
                    .map(|s| (s.name().map(str::to_string), s.address()));
                named.collect::<Vec<_>>()
            };
            assert!(symbols(&copy)
                .iter()
                .any(|(n, _)| n.as_deref() == Ok("triple")));
            assert_eq!(symbols(&copy), symbols(&data));
        }
    }

    /// A copy is written once under the build ID, found again by the next
    /// call; a file with nothing compressed gets none.
    #[test]
    fn copies_are_named_by_build_id_and_made_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let Some((plain, compressed)) = programs(dir.path()) else {
            return;
        };
        let copies = dir.path().join("copies");
        assert_eq!(copy_into(&plain, &copies).expect("checks"), None);
        let copy = copy_into(&compressed[0], &copies)
            .expect("copies")
            .expect("a copy");
        let data = fs::read(&plain).expect("read");
        let elf = ElfFile64::<Endianness>::parse(&*data).expect("ELF");
        let id = elf.build_id().expect("note").expect("build ID");
        assert_eq!(
            copy,
            copies.join(format!("{}.debug", crate::unwind::identity::hex(id)))
        );
        let written = fs::metadata(&copy)
            .expect("copy")
            .modified()
            .expect("mtime");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            copy_into(&compressed[0], &copies).expect("again"),
            Some(copy.clone())
        );
        let reused = fs::metadata(&copy).expect("copy");
        assert!(
            reused.modified().expect("mtime") > written,
            "use refreshes it"
        );
        assert_eq!(reused.len(), fs::read(&copy).expect("read").len() as u64);
    }

    /// A section that does not inflate to its header's size is an error.
    #[test]
    fn a_truncated_section_is_an_error() {
        // zlib's stream of no bytes: header, an empty final block, Adler-32.
        let stream = &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01][..];
        assert!(inflate_into(CompressionFormat::Zlib, stream, 16, &mut Vec::new()).is_err());
        assert!(inflate_into(CompressionFormat::Zlib, stream, 0, &mut Vec::new()).is_ok());
    }
}
