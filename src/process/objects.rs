//! Objects of the tracker: opened through the opener (opener/) from the
//! paths a mapping gives, or from a path before any process maps it, and
//! given up on a file system that hangs.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use tracing::{debug, warn};

use super::maps::MapsEntry;
use super::{opener, GivenUp, ObjectFile, ObjectId, ProcessTracker};

impl ProcessTracker {
    /// The object of `entry`, a file mapping of `pid`, opened through
    /// `/proc/PID/map_files` (else `/proc/PID/root/PATH`) by the opener
    /// (opener/): `None` when it cannot be opened (counted in
    /// [`TrackerStats::objects_unopenable`]) or was given up on a hung file
    /// system ([`TrackerStats::objects_timed_out`]) or as too large to copy
    /// from one that can hang ([`TrackerStats::objects_too_large`]; never
    /// tried again).
    pub(super) fn intern_object(&mut self, pid: u32, entry: &MapsEntry) -> Option<ObjectId> {
        let key = (entry.dev, entry.inode);
        if let Some(&id) = self.object_index.get(&key) {
            return Some(id);
        }
        if self.given_up.contains_key(&key) {
            return None;
        }
        let paths = vec![
            PathBuf::from(format!(
                "/proc/{pid}/map_files/{:x}-{:x}",
                entry.start, entry.end
            )),
            PathBuf::from(format!("/proc/{pid}/root{}", entry.path)),
        ];
        match self.opener.open(paths, entry.dev, opener::OPEN_DEADLINE) {
            opener::Outcome::Opened(opened) => {
                if let Some(fs) = &opened.copied_from {
                    debug!(
                        "pid {pid}: {} read from a copy in memory (on {fs})",
                        entry.path
                    );
                }
                Some(self.insert_object(opened, entry.path.clone(), key))
            }
            opener::Outcome::Failed(err) => {
                debug!("pid {pid}: cannot open {}: {err}", entry.path);
                self.stats.objects_unopenable += 1;
                None
            }
            opener::Outcome::TimedOut => {
                warn!(
                    "pid {pid}: {} given up: opening it and reading its ELF headers took over \
                     {:?} (a hung file system?); its frames are named [read timed out: ...]",
                    entry.path,
                    opener::OPEN_DEADLINE
                );
                self.stats.objects_timed_out += 1;
                self.given_up.insert(key, GivenUp::TimedOut);
                None
            }
            opener::Outcome::TooLarge { bytes, fs } => {
                warn!(
                    "pid {pid}: {} given up: {bytes} bytes on {fs}, a file system that can hang, \
                     over the {} bytes copied into memory; its frames are named \
                     [too large to copy: ...]",
                    entry.path,
                    opener::MAX_COPY_BYTES
                );
                self.stats.objects_too_large += 1;
                self.given_up.insert(key, GivenUp::TooLarge);
                None
            }
            opener::Outcome::NotTried => {
                debug!(
                    "pid {pid}: {} not tried: a read on its file system is stuck",
                    entry.path
                );
                self.stats.objects_timed_out += 1;
                self.given_up.insert(key, GivenUp::TimedOut);
                None
            }
        }
    }

    /// The object of the file at `path` (in this process's mount namespace),
    /// before any process maps it: `lightswitch record` has its command's
    /// executable and interpreter known, with their tables, before the
    /// command execs. Its key is `(dev, inode)` from `fstat`, in the form
    /// `/proc/PID/maps` gives (major << 32 | minor), so that the process
    /// mapping it later finds it; an object no mapping refers to goes after
    /// the usual grace. `None` when the file cannot be opened.
    pub fn intern_file(&mut self, path: &Path) -> Option<ObjectId> {
        // The command's own files, before it runs: a hung file system
        // costs the deadline, and the object is then not known beforehand.
        let opened =
            match self
                .opener
                .open(vec![path.to_path_buf()], u64::MAX, opener::OPEN_DEADLINE)
            {
                opener::Outcome::Opened(opened) => opened,
                outcome => {
                    debug!("cannot open {}: {outcome:?}", path.display());
                    return None;
                }
            };
        if let Some(&id) = self.object_index.get(&opened.file_key) {
            return Some(id);
        }
        let key = opened.file_key;
        Some(self.insert_object(opened, path.to_string_lossy().into_owned(), key))
    }

    /// A new object for `opened`, which processes see at `path`, known by
    /// `file_key` (`(dev, inode)` as in `/proc/PID/maps`).
    fn insert_object(
        &mut self,
        opened: opener::Opened,
        path: String,
        file_key: (u64, u64),
    ) -> ObjectId {
        let open_path = PathBuf::from(format!("/proc/self/fd/{}", opened.file.as_raw_fd()));
        let id = ObjectId(self.next_object);
        self.next_object = self.next_object.wrapping_add(1);
        self.objects.insert(
            id,
            ObjectFile {
                path,
                open_path,
                build_id: opened.build_id,
                load_segments: opened.load_segments,
                file: opened.file,
                bytes: opened.bytes,
                file_key,
            },
        );
        self.object_index.insert(file_key, id);
        id
    }
}
