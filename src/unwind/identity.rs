//! Object identity (the key tables are shared and cached by) and separate
//! debug-file lookup.

use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use object::read::elf::ElfFile64;
use object::{Endianness, Object};

/// Where distributions install separate debug files: the default of
/// [`debug_dirs`].
pub const DEFAULT_DEBUG_ROOT: &str = "/usr/lib/debug";

/// Longest build ID used as a key, bytes (real ones are 8 to 20 bytes).
pub const MAX_BUILD_ID_LEN: usize = 64;

/// The identity of an object file: every process mapping the same object
/// shares one table, and the disk cache is keyed by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKey {
    /// The GNU build ID (`.note.gnu.build-id`), raw bytes.
    BuildId(Vec<u8>),
    /// XXH3-128 of the whole file, for objects without a build ID. Stable
    /// across runs, machines and versions of this program (the algorithm is
    /// fixed), but not collision-resistant against crafted files.
    ContentHash(u128),
}

impl ObjectKey {
    /// The key of an object file's bytes: its build ID when it is an ELF file
    /// with one (of 1 to [`MAX_BUILD_ID_LEN`] bytes), else the hash of the
    /// bytes. Never fails: unparsable files are keyed by content too.
    pub fn for_object(bytes: &[u8]) -> ObjectKey {
        Self::for_object_or(bytes, || xxhash_rust::xxh3::xxh3_128(bytes))
    }

    /// [`Self::for_object`], with the content hash of an object without a
    /// build ID computed by `content_hash` instead of from `bytes`: when
    /// `bytes` is a mapping of the file, hashing it would make every page of
    /// the file resident in this process (200 MB for rustc's libLLVM, the
    /// start-up peak, docs/decisions/0011), where [`content_hash`] reads it a chunk
    /// at a time. Only the ELF headers and notes of `bytes` are read.
    pub fn for_object_or(bytes: &[u8], content_hash: impl FnOnce() -> u128) -> ObjectKey {
        Self::by_build_id(bytes).unwrap_or_else(|| ObjectKey::ContentHash(content_hash()))
    }

    /// The key of an object file's bytes when it is an ELF file with a
    /// build ID (of 1 to [`MAX_BUILD_ID_LEN`] bytes); `None` otherwise.
    pub fn by_build_id(bytes: &[u8]) -> Option<ObjectKey> {
        match build_id(bytes) {
            Ok(Some(id)) if (1..=MAX_BUILD_ID_LEN).contains(&id.len()) => {
                Some(ObjectKey::BuildId(id))
            }
            _ => None,
        }
    }
}

/// Bytes [`content_hash`] reads at a time.
pub const HASH_CHUNK_BYTES: usize = 1 << 20;

/// XXH3-128 of the whole content of `file` (the value
/// [`ObjectKey::ContentHash`] holds for those bytes), read
/// [`HASH_CHUNK_BYTES`] at a time from offset 0 (the file's position is
/// not used).
pub fn content_hash(file: &File) -> std::io::Result<u128> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; HASH_CHUNK_BYTES];
    let mut offset = 0u64;
    loop {
        let n = file.read_at(&mut buf, offset)?;
        if n == 0 {
            return Ok(hasher.digest128());
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
}

/// `buildid-<hex>` or `xxh3-<32 hex digits>`: usable as a file name.
impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectKey::BuildId(id) => write!(f, "buildid-{}", hex(id)),
            ObjectKey::ContentHash(h) => write!(f, "xxh3-{h:032x}"),
        }
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The GNU build ID of a 64-bit ELF file (`Ok(None)` when it has none).
pub fn build_id(elf: &[u8]) -> Result<Option<Vec<u8>>, object::Error> {
    let file = ElfFile64::<Endianness>::parse(elf)?;
    Ok(file.build_id()?.map(<[u8]>::to_vec))
}

/// Finds the separate debug file of the object at `path`, the way gdb does:
/// by build ID ([`find_debug_file_by_build_id`]), then the `.gnu_debuglink`
/// name in the object's directory, its `.debug/` subdirectory and
/// `ROOT/<object's directory>` for each `ROOT` of `debug_dirs` (its CRC32
/// must match the link's).
pub fn find_debug_file(path: &Path, elf: &[u8], debug_dirs: &[PathBuf]) -> Option<PathBuf> {
    let file = ElfFile64::<Endianness>::parse(elf).ok()?;
    if let Some(found) = file
        .build_id()
        .ok()
        .flatten()
        .and_then(|id| find_debug_file_by_build_id(id, debug_dirs))
    {
        return Some(found);
    }
    let (name, crc) = file.gnu_debuglink().ok().flatten()?;
    let name = Path::new(std::str::from_utf8(name).ok()?);
    let dir = path.parent()?;
    let relative_dir = dir.strip_prefix("/").unwrap_or(dir);
    [dir.join(name), dir.join(".debug").join(name)]
        .into_iter()
        .chain(
            debug_dirs
                .iter()
                .map(|root| root.join(relative_dir).join(name)),
        )
        .find(|candidate| {
            candidate != path && map(candidate).is_some_and(|bytes| crc32fast::hash(&bytes) == crc)
        })
}

/// The debug file of the object whose GNU build ID is `id` (at least 2
/// bytes): the first `ROOT/.build-id/xx/yyyy.debug` (`xx` the first byte in
/// hex, `yyyy` the rest) among the `ROOT`s of `debug_dirs` that is an ELF
/// file with the same build ID.
pub fn find_debug_file_by_build_id(id: &[u8], debug_dirs: &[PathBuf]) -> Option<PathBuf> {
    if id.len() < 2 {
        return None;
    }
    let relative = Path::new(".build-id")
        .join(hex(&id[..1]))
        .join(format!("{}.debug", hex(&id[1..])));
    debug_dirs
        .iter()
        .map(|root| root.join(&relative))
        .find(|candidate| {
            map(candidate)
                .and_then(|bytes| build_id(&bytes).ok().flatten())
                .is_some_and(|other| other == id)
        })
}

/// The file at `path`, mapped read-only (debug files can be hundreds of MB).
fn map(path: &Path) -> Option<memmap2::Mmap> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: read-only private mapping; a file truncated under us can fault,
    // the same risk every ELF reader of mapped files (blazesym's too) takes.
    unsafe { memmap2::Mmap::map(&file) }.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_is_keyed_by_build_id_and_garbage_by_content() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let Ok(bytes) = std::fs::read(libc) else {
            eprintln!("skipped: {} is absent", libc.display());
            return;
        };
        let key = ObjectKey::for_object(&bytes);
        let ObjectKey::BuildId(id) = &key else {
            panic!("libc has a build ID, got {key}");
        };
        assert!(key.to_string().starts_with("buildid-"));
        assert_eq!(key.to_string().len(), "buildid-".len() + 2 * id.len());
        let garbage = ObjectKey::for_object(b"not an ELF file");
        assert_eq!(garbage, ObjectKey::for_object(b"not an ELF file"));
        assert_ne!(garbage, ObjectKey::for_object(b"not an ELF file!"));
        assert_eq!(garbage.to_string().len(), "xxh3-".len() + 32);
    }

    #[test]
    fn content_hash_of_a_file_read_in_chunks_is_the_hash_of_its_bytes() {
        let mut file = tempfile::tempfile().expect("tempfile");
        let bytes: Vec<u8> = (0..HASH_CHUNK_BYTES * 2 + 12345)
            .map(|i| (i % 251) as u8)
            .collect();
        std::io::Write::write_all(&mut file, &bytes).expect("write");
        let hashed = content_hash(&file).expect("read");
        assert_eq!(
            ObjectKey::for_object_or(&bytes, || hashed),
            ObjectKey::for_object(&bytes)
        );
    }

    #[test]
    fn debug_file_by_build_id_is_the_first_matching_one_among_the_debug_dirs() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let Ok(bytes) = std::fs::read(libc) else {
            eprintln!("skipped: {} is absent", libc.display());
            return;
        };
        let id = build_id(&bytes).expect("parses").expect("build ID");
        let dir = tempfile::tempdir().expect("tempdir");
        let roots: Vec<PathBuf> = ["missing", "wrong", "right", "also-right"]
            .iter()
            .map(|name| dir.path().join(name))
            .collect();
        let at = |root: &Path| {
            root.join(".build-id")
                .join(hex(&id[..1]))
                .join(format!("{}.debug", hex(&id[1..])))
        };
        for (root, contents) in roots[1..].iter().zip([&b"not ELF"[..], &bytes, &bytes]) {
            std::fs::create_dir_all(at(root).parent().expect("parent")).expect("mkdir");
            std::fs::write(at(root), contents).expect("write");
        }
        assert_eq!(
            find_debug_file_by_build_id(&id, &roots),
            Some(at(&roots[2]))
        );
        assert_eq!(
            find_debug_file(Path::new("/elsewhere/libc.so.6"), &bytes, &roots),
            Some(at(&roots[2]))
        );
        assert_eq!(find_debug_file_by_build_id(&id, &roots[..2]), None);
        assert_eq!(find_debug_file_by_build_id(&id[..1], &roots), None);
    }
}
