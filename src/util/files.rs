//! Files the profiler writes: profiles (one-shot runs, window files) and the
//! collector's stored profiles. Each is written atomically (a temporary file
//! in the same directory, synced, renamed over the target, the directory
//! synced), so a reader never sees a half-written file and a crash leaves
//! the old one or the new one, and with a private mode by default.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Default mode of the profiles lightswitch writes (and the collector
/// stores), before the caller's umask (`--profile-mode` changes it):
/// readable by the owner only, as perf writes `perf.data`. A profile names
/// every sampled process and command and holds raw kernel addresses, which
/// would defeat KASLR where `kernel.kptr_restrict` hides them from other
/// users.
pub const PROFILE_MODE: u32 = 0o600;

/// Parse `--profile-mode`: octal permission bits (`600`, `0640`), at most
/// `0666` (profiles are not executable).
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .map_err(|_| format!("{text:?} is not an octal file mode such as 600 or 640"))?;
    if mode & !0o666 != 0 {
        return Err(format!(
            "{text:?}: a profile's mode may only have read and write bits (at most 666)"
        ));
    }
    Ok(mode)
}

/// Name prefix of the temporary files [`write_atomic`] renames into place;
/// readers of a directory skip such names.
pub const TMP_PREFIX: &str = ".tmp-";

/// Write `bytes` to `path` atomically, as a new file of `mode` less the
/// umask (replacing a file keeps no old mode); a device, FIFO or symlink at
/// `path` is written into instead ([`writes_through`]). Errors name the path.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    write_atomic_with(path, mode, |file| Ok(file.write_all(bytes)?))
}

/// Like [`write_atomic`], with the content written by `fill` into the
/// temporary file (buffer small writes yourself), so that it need not be in
/// memory whole. Nothing appears at `path` when `fill` fails. Errors:
/// `fill`'s (as `writing <path>: ...`), and the file system's, naming the
/// path.
pub fn write_atomic_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // The directory may have gone since the run started: make it again
    // rather than lose the profile.
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if path.is_dir() {
        bail!("{} is a directory: name a file", path.display());
    }
    let writing = || format!("writing {}", path.display());
    if is_stdout(path) {
        // This process's own standard output (`-`, `/dev/stdout`, or its
        // target named directly): written through the descriptor it has,
        // so that a shell's `>>` (O_APPEND) and whatever was written to it
        // before stay; opening the path again would truncate the file.
        check_stdout_open()?;
        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating standard output")?;
        let mut target = File::from(fd);
        fill(&mut target).context("writing standard output")?;
        return target.flush().context("writing standard output");
    }
    if writes_through(path) {
        // A device or FIFO (`-o /dev/null`, a named pipe) or a symlink
        // (`/dev/stdout`, a link to elsewhere) is written into, as perf
        // and pprof do; renaming over it would replace the device node or
        // the link with a file.
        let mut target = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        fill(&mut target).with_context(writing)?;
        return target.flush().with_context(writing);
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(TMP_PREFIX)
        .permissions(fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    fill(tmp.as_file_mut()).with_context(writing)?;
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    // PersistError's message is its io::Error's: keep one of them.
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming into {}", path.display()))?;
    sync_dir(dir)
}

/// Whether [`write_atomic`] writes into what is at `path` rather than
/// renaming a new file over it: a symlink (followed: `/dev/stdout`, a link
/// to a file elsewhere), a character or block device, a FIFO or a socket.
/// `false` for a regular file, a directory or nothing.
pub fn writes_through(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| {
        let kind = m.file_type();
        !kind.is_file() && !kind.is_dir()
    })
}

/// Whether `path` is (or leads to) the file, pipe or terminal this
/// process's standard output writes to (same device and inode).
pub fn is_stdout(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(out), Ok(target)) = (fs::metadata("/proc/self/fd/1"), fs::metadata(path)) else {
        return false;
    };
    (out.dev(), out.ino()) == (target.dev(), target.ino())
}

/// Errors when this process was started with its standard output closed
/// (`>&-`): the Rust runtime then gives it `/dev/null` opened read-write
/// (which a shell's `>/dev/null` never does), and a profile written there
/// would be lost without a word. (A daemon's standard output set up the
/// same way, `/dev/null` opened read-write, is taken for closed too: a
/// profile written there would be lost just the same.)
pub fn check_stdout_open() -> Result<()> {
    if stdout_is_runtime_null() {
        bail!("cannot write the profile to standard output: it is closed (--profile-name -)");
    }
    Ok(())
}

/// Whether descriptor 1 is `/dev/null` opened read-write: what the Rust
/// runtime puts in place of a closed standard output before `main`.
fn stdout_is_runtime_null() -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(null) = fs::metadata("/dev/null") else {
        return false;
    };
    // SAFETY: F_GETFL on a descriptor number only reads its flags.
    let flags = unsafe { libc::fcntl(libc::STDOUT_FILENO, libc::F_GETFL) };
    fs::metadata("/proc/self/fd/1").is_ok_and(|m| {
        m.file_type().is_char_device()
            && m.rdev() == null.rdev()
            && flags >= 0
            && flags & libc::O_ACCMODE == libc::O_RDWR
    })
}

/// Whether `path` is a regular file (not following a symlink): what this
/// module's writers create, and what may be removed again when a run
/// takes back the files it wrote (never a device written into).
pub fn is_regular_file(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// Make `dir`'s entries durable (after a rename or a new entry in it).
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

/// Held by tests that change the process's umask or check the modes of
/// files they create: the umask is process-wide and tests run on threads.
#[cfg(test)]
pub(crate) static UMASK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.txt");
        write_atomic(&path, b"one", PROFILE_MODE).unwrap();
        write_atomic(&path, b"two", PROFILE_MODE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_fifo_is_written_into_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || fs::read(fifo).unwrap())
        };
        write_atomic(&fifo, b"folded 1\n", PROFILE_MODE).unwrap();
        assert_eq!(reader.join().unwrap(), b"folded 1\n");
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(!is_regular_file(&fifo));
        let null = Path::new("/dev/null");
        write_atomic(null, b"x", PROFILE_MODE).unwrap();
        assert!(fs::metadata(null).unwrap().file_type().is_char_device());
    }

    /// A symlink (`/dev/stdout`, a link to a file elsewhere) is written
    /// through: the link stays, its target gets the profile.
    #[test]
    fn a_symlink_is_written_through_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.txt");
        let link = dir.path().join("link.txt");
        fs::write(&target, b"old and longer").unwrap();
        std::os::unix::fs::symlink("target.txt", &link).unwrap();
        assert!(writes_through(&link));
        write_atomic(&link, b"new", PROFILE_MODE).unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&target).unwrap(), b"new");
        // A link to nothing yet creates its target.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink("made.txt", &dangling).unwrap();
        write_atomic(&dangling, b"x", PROFILE_MODE).unwrap();
        assert_eq!(fs::read(dir.path().join("made.txt")).unwrap(), b"x");
        assert!(!writes_through(&target));
        assert!(!is_stdout(&target));
    }

    /// A write that fails names the file it was writing, once.
    #[test]
    fn write_errors_name_the_file() {
        let err = format!(
            "{:#}",
            write_atomic(Path::new("/dev/full"), b"x", PROFILE_MODE).unwrap_err()
        );
        assert!(
            err.starts_with("writing /dev/full: No space left on device"),
            "{err}"
        );
        assert_eq!(err.matches("/dev/full").count(), 1, "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pb");
        let err = write_atomic_with(&path, PROFILE_MODE, |_| anyhow::bail!("encoding failed"));
        let err = format!("{:#}", err.unwrap_err());
        assert_eq!(err, format!("writing {}: encoding failed", path.display()));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_directory_in_the_way_is_named_once_and_nothing_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        fs::create_dir(&target).unwrap();
        let err = format!(
            "{:#}",
            write_atomic(&target, b"x", PROFILE_MODE).unwrap_err()
        );
        assert_eq!(err.matches("is a directory").count(), 1, "{err}");
        let entries: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(entries.len(), 1, "{entries:?}");
    }

    #[test]
    fn profiles_are_private_whatever_the_umask_allows() {
        let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pb");
        // SAFETY: umask only swaps the process's file-mode mask.
        let old = unsafe { libc::umask(0o022) };
        let written = write_atomic(&path, b"x", PROFILE_MODE);
        let mode = fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        // A stricter umask makes it stricter still.
        unsafe { libc::umask(0o277) };
        let strict = write_atomic(&path, b"y", PROFILE_MODE);
        let strict_mode = fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        // Loosened on purpose (--profile-mode 644), the umask still applies.
        unsafe { libc::umask(0o022) };
        let loose = write_atomic(&path, b"z", parse_mode("666").unwrap());
        let loose_mode = fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        unsafe { libc::umask(old) };
        written.unwrap();
        strict.unwrap();
        loose.unwrap();
        assert_eq!(mode.unwrap(), 0o600);
        assert_eq!(strict_mode.unwrap(), 0o400);
        assert_eq!(loose_mode.unwrap(), 0o644);
        assert_eq!(parse_mode("0640"), Ok(0o640));
        assert!(parse_mode("755").is_err() && parse_mode("rw").is_err());
    }
}
