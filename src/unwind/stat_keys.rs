//! The content keys of objects without a build ID, remembered by file
//! identity: such an object is keyed by the XXH3 hash of its whole file
//! ([`ObjectKey::ContentHash`]), and hashing rustc's librustc_driver and
//! libLLVM (153 and 200 MB, no build ID) took hundreds of milliseconds on
//! a loaded machine before their tables could be read from the cache, or
//! built. So the hash is remembered in `CACHE_DIR/by-stat/NAME`, a file
//! holding the key's name (`xxh3-` and 32 hex digits), NAME being the
//! file's device, inode, size, modification and status-change times (a
//! file rewritten in place changes at least its status-change time). A
//! file with no such entry is built without a cache lookup, and its hash
//! remembered after the build.

use std::fs::Metadata;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ObjectKey;

/// Subdirectory of the cache directory holding the entries.
const DIR: &str = "by-stat";

/// The entry for the file whose metadata is `meta`.
fn entry(cache_dir: &Path, meta: &Metadata) -> PathBuf {
    cache_dir.join(DIR).join(format!(
        "{:x}-{:x}-{:x}-{}.{:09}-{}.{:09}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    ))
}

/// The content key remembered for the file whose metadata is `meta`;
/// `None` when there is none (or it is unreadable or malformed).
pub(super) fn find(cache_dir: &Path, meta: &Metadata) -> Option<ObjectKey> {
    let text = std::fs::read_to_string(entry(cache_dir, meta)).ok()?;
    let hex = text.trim().strip_prefix("xxh3-")?;
    if hex.len() != 32 {
        return None;
    }
    u128::from_str_radix(hex, 16)
        .ok()
        .map(ObjectKey::ContentHash)
}

/// Remember `key` for the file whose metadata is `meta` (written to a
/// temporary file, then renamed; a lost entry only costs a hash). Build-ID
/// keys are not remembered: reading a build ID costs nothing.
pub(super) fn remember(cache_dir: &Path, meta: &Metadata, key: &ObjectKey) -> std::io::Result<()> {
    if !matches!(key, ObjectKey::ContentHash(_)) {
        return Ok(());
    }
    let dir = cache_dir.join(DIR);
    std::fs::create_dir_all(&dir)?;
    let mut file = tempfile::NamedTempFile::new_in(&dir)?;
    file.write_all(key.to_string().as_bytes())?;
    file.persist(entry(cache_dir, meta))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_key_is_found_until_the_file_changes() {
        let cache = tempfile::tempdir().expect("tempdir");
        let objects = tempfile::tempdir().expect("tempdir");
        let path = objects.path().join("object");
        std::fs::write(&path, b"first contents").expect("write");
        let meta = std::fs::metadata(&path).expect("metadata");
        assert_eq!(find(cache.path(), &meta), None);
        let key = ObjectKey::ContentHash(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        remember(cache.path(), &meta, &key).expect("remembered");
        assert_eq!(find(cache.path(), &meta), Some(key));
        // Rewritten in place: another identity.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"other contents!").expect("rewrite");
        let changed = std::fs::metadata(&path).expect("metadata");
        assert_eq!(find(cache.path(), &changed), None);
        // Build IDs are not remembered; malformed entries are not keys.
        remember(cache.path(), &changed, &ObjectKey::BuildId(vec![1, 2])).expect("no-op");
        assert_eq!(find(cache.path(), &changed), None);
        std::fs::write(entry(cache.path(), &changed), "xxh3-zz").expect("write");
        assert_eq!(find(cache.path(), &changed), None);
    }
}
