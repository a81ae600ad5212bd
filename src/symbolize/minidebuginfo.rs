//! MiniDebugInfo: the function symbols that Fedora, RHEL and their
//! rebuilds, and Amazon Linux keep in a stripped object's `.gnu_debugdata`
//! section, an xz-compressed ELF file holding only a `.symtab` (the
//! functions that `.dynsym` lacks: every static function, and the global
//! ones a program does not export). gdb, elfutils and systemd-coredump read
//! it; so does [`super::objects`], in gdb's order: DWARF and symbols of a
//! debug file found by build ID, `.gnu_debuglink` or debuginfod first, then
//! this table, then `.dynsym`.
//!
//! The section is untrusted input. Its decompressed size is read from the
//! xz index (liblzma's index decoder) before anything is inflated, and a section whose size exceeds
//! [`MAX_DECOMPRESSED_BYTES`] is skipped; the decoder (liblzma, the xz
//! reference implementation) runs under a memory limit and may not produce
//! more than the index announced. A section that fails any of these checks
//! is counted ([`stats`]) and skipped, and the object keeps its `.dynsym`
//! names.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use liblzma::stream::{Action, Status, Stream, CONCATENATED};
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection};
use tracing::debug;

use super::function_symbols::FunctionSymbols;

/// Largest decompressed `.gnu_debugdata` read, bytes. Fedora's largest
/// (libLLVM, a hundred thousand functions) is a few MiB.
pub const MAX_DECOMPRESSED_BYTES: u64 = 64 << 20;

/// Memory the xz decoder may use, bytes: what `xz -9` (a 64 MiB dictionary,
/// which xz does not shrink for small inputs) needs, 65 MiB. Fedora's `xz`
/// (`-6`) needs 9 MiB. The dictionary is touched only as far as the data
/// written, at most [`MAX_DECOMPRESSED_BYTES`].
const DECODER_MEMORY_LIMIT: u64 = 72 << 20;

static READ: AtomicU64 = AtomicU64::new(0);
static CORRUPT: AtomicU64 = AtomicU64::new(0);
static TOO_LARGE: AtomicU64 = AtomicU64::new(0);

/// What reading MiniDebugInfo sections did since the process started
/// (`/metrics`). A section is read once per object while a continuous
/// symbolizer keeps the object's parsed data ([`super::object_tables`]),
/// and once per batch for objects it does not keep; counted each time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MiniDebugInfoStats {
    /// Sections decompressed and their symbols read.
    pub read: u64,
    /// Sections skipped as corrupt: a bad xz stream, index or checksum, or
    /// not an ELF file once inflated.
    pub corrupt: u64,
    /// Sections skipped because their index announces more than
    /// [`MAX_DECOMPRESSED_BYTES`].
    pub too_large: u64,
}

/// The counts so far.
pub fn stats() -> MiniDebugInfoStats {
    MiniDebugInfoStats {
        read: READ.load(Ordering::Relaxed),
        corrupt: CORRUPT.load(Ordering::Relaxed),
        too_large: TOO_LARGE.load(Ordering::Relaxed),
    }
}

/// Why a section was not read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum Unreadable {
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("{0} bytes decompressed, more than the {MAX_DECOMPRESSED_BYTES} read")]
    TooLarge(u64),
}

fn corrupt(what: impl std::fmt::Display) -> Unreadable {
    Unreadable::Corrupt(what.to_string())
}

/// The function symbols (virtual addresses of the object) of `elf`'s
/// MiniDebugInfo. `None` when it has no `.gnu_debugdata`, or a `.symtab`
/// of its own (whose symbols are read directly), and when the section
/// cannot be read (counted in [`stats`]; `path` names the object in the
/// message).
pub(super) fn function_symbols(
    elf: &ElfFile64<'_, Endianness>,
    path: &Path,
) -> Option<FunctionSymbols> {
    if elf.section_by_name(".symtab").is_some() {
        return None;
    }
    let section = elf.section_by_name(".gnu_debugdata")?;
    let symbols = section.data().map_err(corrupt).and_then(read_symbols);
    match symbols {
        Ok(symbols) => {
            READ.fetch_add(1, Ordering::Relaxed);
            debug!(
                "{}: {} functions in .gnu_debugdata",
                path.display(),
                symbols.len()
            );
            Some(symbols)
        }
        Err(err) => {
            let counter = match err {
                Unreadable::Corrupt(_) => &CORRUPT,
                Unreadable::TooLarge(_) => &TOO_LARGE,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            debug!("{}: .gnu_debugdata skipped: {err}", path.display());
            None
        }
    }
}

/// The function symbols of the compressed ELF file `xz`.
fn read_symbols(xz: &[u8]) -> Result<FunctionSymbols, Unreadable> {
    let size = decompressed_size(xz)?;
    if size > MAX_DECOMPRESSED_BYTES {
        return Err(Unreadable::TooLarge(size));
    }
    let bytes = inflate(xz, size)?;
    let file = ElfFile64::<Endianness>::parse(&*bytes).map_err(corrupt)?;
    Ok(FunctionSymbols::of_symtab(&file))
}

/// The decompressed size of the xz data `xz`, bytes, as its last stream's
/// index records it (read from the end, as gdb reads it, without inflating
/// anything; a section of several streams then inflates to more than this
/// and is refused by [`inflate`]).
fn decompressed_size(xz: &[u8]) -> Result<u64, Unreadable> {
    liblzma::uncompressed_size(std::io::Cursor::new(xz)).map_err(corrupt)
}

/// The decompressed bytes of `xz`, which its index says are `size` bytes:
/// an error if the decoder needs more memory than
/// [`DECODER_MEMORY_LIMIT`], finds the data corrupt (checksums, the index
/// against the blocks), or produces any other number of bytes.
fn inflate(xz: &[u8], size: u64) -> Result<Vec<u8>, Unreadable> {
    let mut stream =
        Stream::new_stream_decoder(DECODER_MEMORY_LIMIT, CONCATENATED).map_err(corrupt)?;
    // One byte more than announced: a stream that fills it lied.
    let capacity = usize::try_from(size + 1).map_err(corrupt)?;
    let mut out = Vec::with_capacity(capacity);
    loop {
        let (read, written) = (stream.total_in(), stream.total_out());
        let input = usize::try_from(read)
            .ok()
            .and_then(|read| xz.get(read..))
            .ok_or_else(|| corrupt("xz decoder read past its input"))?;
        let status = stream
            .process_vec(input, &mut out, Action::Finish)
            .map_err(corrupt)?;
        if out.len() as u64 > size {
            return Err(corrupt("more data than the xz index says"));
        }
        match status {
            Status::StreamEnd => break,
            _ if stream.total_in() == read && stream.total_out() == written => {
                return Err(corrupt("truncated xz data"));
            }
            _ => {}
        }
    }
    if out.len() as u64 != size {
        return Err(corrupt("less data than the xz index says"));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "minidebuginfo_tests.rs"]
mod tests;
