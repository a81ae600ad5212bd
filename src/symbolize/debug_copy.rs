//! Uncompressed copies of debug information stored compressed.
//!
//! Debian's and Fedora's debug packages store DWARF sections compressed
//! (`SHF_COMPRESSED`, zlib or zstd): libc6-dbg's libc debug file holds
//! 2.9 MB of compressed sections that inflate to about 14 MB. blazesym
//! inflates such sections into the heap every time it parses the file, and a
//! continuous symbolizer parses libc again in every window that brings new
//! addresses in it (it costs too much to keep, [`super::KEPT_OBJECT_MAX_BYTES`]):
//! under process churn those 14 MB were the largest single item of the
//! agent's heap (issue 18, jemalloc heap profiles).
//!
//! This module writes, once per build ID, a copy of such a file whose debug
//! sections are stored uncompressed (object's ELF builder rewrites the file),
//! under `DIR/BUILD_ID.debug` ([`configure`]: the unwind cache directory's
//! [`SUBDIRECTORY`]). blazesym maps the copy, so the DWARF is read
//! through the page cache instead of being inflated into the heap. A file
//! that cannot be copied (no build ID, larger than [`MAX_COPY_BYTES`] once
//! inflated, a corrupt section, a write error) is symbolized from the
//! original as before, and not tried again by this process.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use object::read::elf::ElfFile64;
use object::{CompressionFormat, Endianness, Object, ObjectSection};
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

/// Files whose answer [`uncompressed_copy`] remembers (past it, it forgets
/// them all and looks again).
const REMEMBERED_FILES: usize = 4096;

static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();

/// A file's identity (`stat`): the symbolizer reads objects through
/// `/proc/self/fd/N` paths, whose numbers are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i64,
}

/// What [`uncompressed_copy`] answered for each file: its copy, or `None`
/// (nothing compressed, or it could not be copied: not tried again).
static KNOWN: Mutex<Option<HashMap<FileId, Option<PathBuf>>>> = Mutex::new(None);

/// Sets the directory copies are written to (`None`: make no copies).
/// Only the first call counts. Without a call, no copies are made.
pub fn configure(dir: Option<PathBuf>) {
    let _ = DIR.set(dir);
}

/// The file to read `file`'s debug information from: an uncompressed copy
/// when `file` is an ELF file with compressed debug sections and a copy is
/// (or can now be) in the directory [`configure`] set; `None` otherwise
/// (read `file` itself). After the first call for a file, costs a `stat`.
pub fn uncompressed_copy(file: &Path) -> Option<PathBuf> {
    let dir = DIR.get()?.as_deref()?;
    let meta = fs::metadata(file).ok()?;
    let id = FileId {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    };
    let known = |map: &mut Option<HashMap<FileId, Option<PathBuf>>>| {
        map.get_or_insert_default().get(&id).cloned()
    };
    match known(&mut KNOWN.lock().unwrap_or_else(|p| p.into_inner())) {
        Some(Some(copy)) if fs::metadata(&copy).is_ok() => return Some(copy),
        Some(None) => return None,
        _ => {}
    }
    let copy = copy_into(file, dir).unwrap_or_else(|err| {
        debug!("debug copy: {}: {err:#}", file.display());
        None
    });
    let mut map = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_default();
    if map.len() >= REMEMBERED_FILES {
        map.clear();
    }
    map.insert(id, copy.clone());
    copy
}

/// `file`'s copy in `dir`, written now if missing; `Ok(None)` when `file`
/// has no compressed debug section. Only the headers are read unless a
/// copy must be written.
fn copy_into(file: &Path, dir: &Path) -> Result<Option<PathBuf>> {
    let cache = object::ReadCache::new(fs::File::open(file).context("opening")?);
    let elf = ElfFile64::<Endianness, &object::ReadCache<fs::File>>::parse(&cache)
        .context("parsing ELF")?;
    let compressed = elf.sections().any(|s| {
        s.name().is_ok_and(|n| n.starts_with(".debug_"))
            && s.compressed_file_range()
                .is_ok_and(|r| r.format != CompressionFormat::None)
    });
    if !compressed {
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
    let data = fs::read(file).context("reading")?;
    let out = inflated_elf(&data)?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    make_room(dir, out.len() as u64);
    crate::files::write_atomic(&copy, &out, 0o644)?;
    debug!(
        "debug copy: {} -> {} ({} bytes)",
        file.display(),
        copy.display(),
        out.len()
    );
    Ok(Some(copy))
}

/// The ELF file `data` with its compressed `.debug_*` sections stored
/// inflated (flag `SHF_COMPRESSED` cleared), everything else as it was.
/// Errors: not a 64-bit ELF file, a section that does not inflate to the
/// size its header gives, more than [`MAX_COPY_BYTES`] inflated.
pub fn inflated_elf(data: &[u8]) -> Result<Vec<u8>> {
    let elf = ElfFile64::<Endianness>::parse(data).context("parsing ELF")?;
    let mut inflated: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut total = 0u64;
    for section in elf.sections() {
        let Ok(name) = section.name() else { continue };
        let Ok(c) = section.compressed_data() else {
            continue;
        };
        if !name.starts_with(".debug_") || c.format == CompressionFormat::None {
            continue;
        }
        total += c.uncompressed_size;
        if total > MAX_COPY_BYTES {
            bail!("more than {MAX_COPY_BYTES} bytes once inflated");
        }
        inflated.push((
            name.as_bytes().to_vec(),
            inflate(&c).context(name.to_string())?,
        ));
    }
    let mut builder = object::build::elf::Builder::read64(data).context("reading ELF")?;
    for section in builder.sections.iter_mut() {
        if let Some(i) = inflated
            .iter()
            .position(|(n, _)| section.name.as_slice() == n)
        {
            let (_, bytes) = inflated.swap_remove(i);
            section.data = object::build::elf::SectionData::Data(bytes.into());
            section.sh_flags.0 &= !object::elf::SHF_COMPRESSED.0;
        }
    }
    let mut out = Vec::new();
    builder.write(&mut out).context("writing ELF")?;
    Ok(out)
}

/// The inflated bytes of a compressed section (zlib or zstd), exactly
/// `uncompressed_size` of them.
fn inflate(c: &object::CompressedData<'_>) -> Result<Vec<u8>> {
    let size = c.uncompressed_size;
    let mut out = Vec::with_capacity(usize::try_from(size)?);
    match c.format {
        CompressionFormat::Zlib => {
            flate2::read::ZlibDecoder::new(c.data)
                .take(size + 1)
                .read_to_end(&mut out)?;
        }
        CompressionFormat::Zstandard => {
            zstd::stream::read::Decoder::new(c.data)?
                .take(size + 1)
                .read_to_end(&mut out)?;
        }
        other => bail!("unsupported compression {other:?}"),
    }
    if out.len() as u64 != size {
        bail!("inflated to {} bytes, header says {size}", out.len());
    }
    Ok(out)
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

    /// The copy holds the very bytes of the uncompressed original's debug
    /// sections, none flagged compressed; its code is where it was.
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
            let copy = inflated_elf(&data).expect("inflates");
            let sections = debug_sections(&copy);
            assert_eq!(sections, original, "{}", path.display());
            let address = |bytes: &[u8]| {
                let elf = ElfFile64::<Endianness>::parse(bytes).expect("ELF");
                let sym = elf.symbols().find(|s| s.name() == Ok("triple"));
                sym.map(|s| s.address())
            };
            assert_eq!(address(&copy), address(&data));
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
        let c = object::CompressedData {
            format: CompressionFormat::Zlib,
            data: &[0x78, 0x9c, 0x03, 0x00],
            uncompressed_size: 16,
        };
        assert!(inflate(&c).is_err());
    }
}
