//! Unwind tables: each object's DWARF CFI (`.eh_frame`, else `.debug_frame`)
//! compiled into compact rows the BPF program can search (format:
//! `docs/unwind-tables.md`, C layout in `src/sampling/bpf/profiler.h`).
//!
//! [`loader`] keeps the BPF walker supplied with process descriptions and tables.
//! [`cfi`] evaluates the CFI with gimli into [`rule::Rule`]s (for
//! objects without section headers, [`eh_frame_hdr`] finds `.eh_frame`
//! through `PT_GNU_EH_FRAME`), which
//! [`table`] splits into pages ([`UnwindTable`]; [`early`] builds the pages
//! samples wait on ahead of the rest); [`jit`] builds tables of
//! JIT code from the unwinding information in jitdump files; [`identity`] keys objects
//! (build ID, else content hash) and finds separate debug files; [`cache`]
//! keeps built tables on disk; [`show`] renders a table for
//! `lightswitch show-unwind`; [`deferred`] finishes in user space, from a
//! copy of the stack, the walks the BPF walker stopped for want of a table.

use std::path::{Path, PathBuf};

use tracing::debug;

mod assemble;
mod build_queue;
pub mod cache;
pub mod cfi;
mod context_start;
pub mod deferred;
pub mod early;
pub mod eh_frame_hdr;
pub mod identity;
pub mod interp;
pub mod jit;
pub mod loader;
#[cfg(test)]
mod reference_tests;
mod row_ranges;
pub mod rule;
pub mod show;
mod stat_keys;
pub mod table;
mod x86_64;

pub use cfi::{
    build_table, build_table_at, build_table_early, build_table_from_path,
    build_table_with_debug_file, BuildError,
};
pub use identity::ObjectKey;
pub use rule::{unsupported_kind_name, Rule, UnsupportedKind};
pub use table::{CfiSource, TableRow, TableStats, UnwindTable};

/// The table of the object whose bytes are `elf_bytes`: read from the disk
/// cache in `cache_dir` (keyed by [`ObjectKey::for_object`]) when it holds a
/// valid entry, else built with [`build_table`] and stored there. Without a
/// cache directory the table is just built.
pub fn cached_table(cache_dir: Option<&Path>, elf_bytes: &[u8]) -> anyhow::Result<UnwindTable> {
    cached(
        cache_dir,
        || ObjectKey::for_object(elf_bytes),
        || build_table(elf_bytes),
    )
}

/// Like [`cached_table`] for the object file `file` mapped as `elf_bytes`,
/// building with [`build_table_at`]: an object without CFI gets its
/// `.debug_frame` from its separate debug file (found by build ID, or by
/// `.gnu_debuglink` next to `path`). An object without a build ID is keyed
/// by the hash of `file` read in chunks, so that its mapping does not become
/// resident ([`ObjectKey::for_object_or`]).
pub fn cached_table_at(
    cache_dir: Option<&Path>,
    path: &Path,
    file: &std::fs::File,
    elf_bytes: &[u8],
    debug_dirs: &[PathBuf],
) -> anyhow::Result<UnwindTable> {
    cached(
        cache_dir,
        || object_key_at(file, elf_bytes),
        || build_table_at(path, elf_bytes, debug_dirs),
    )
}

/// The cache key of the object file `file` mapped as `elf_bytes`: its build
/// ID, else the hash of `file` read in chunks, so that its mapping does not
/// become resident ([`ObjectKey::for_object_or`]).
pub fn object_key_at(file: &std::fs::File, elf_bytes: &[u8]) -> ObjectKey {
    ObjectKey::for_object_or(elf_bytes, || {
        identity::content_hash(file).unwrap_or_else(|_| xxhash_rust::xxh3::xxh3_128(elf_bytes))
    })
}

fn cached(
    cache_dir: Option<&Path>,
    key: impl FnOnce() -> ObjectKey,
    build: impl FnOnce() -> Result<UnwindTable, BuildError>,
) -> anyhow::Result<UnwindTable> {
    let Some(dir) = cache_dir else {
        return Ok(build()?);
    };
    let key = key();
    let (table, outcome) = cache::get_or_build(dir, &key, build)?;
    debug!("unwind table {key}: {outcome:?}");
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_table_builds_once_then_reads_the_cache() {
        let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let (Ok(bytes), Ok(file)) = (std::fs::read(path), std::fs::File::open(path)) else {
            eprintln!("skipped: {} is absent", path.display());
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let built = cached_table_at(Some(dir.path()), path, &file, &bytes, &[]).expect("built");
        let entry = cache::entry_path(dir.path(), &ObjectKey::for_object(&bytes));
        assert!(entry.exists());
        assert_eq!(
            cache::load(dir.path(), &ObjectKey::for_object(&bytes)).ok(),
            Some(built.clone())
        );
        assert_eq!(cached_table(Some(dir.path()), &bytes).expect("hit"), built);
        assert_eq!(cached_table(None, &bytes).expect("uncached"), built);
    }
}
