//! One opening, as the helper does it: open the first path that opens,
//! `fstat` and `fstatfs` it, copy it into a memfd when its file system can
//! hang, read its ELF identity. Runs in the helper (a process of its own,
//! or a thread for library users: `super::helper`), never on the thread
//! that waits for the answer.

use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::super::LoadSegments;

/// Largest object copied from a file system that can hang, bytes; a larger
/// one is given up ([`Reply::TooLarge`]).
pub const MAX_COPY_BYTES: u64 = 256 << 20;

/// `f_type` (`fstatfs`, `linux/magic.h`) of the file systems whose reads
/// may never answer: user-space servers and network file systems. Objects
/// on them are copied into a memfd under the opener's deadline, so that no
/// later read (unwind tables, symbols) goes to them. Local file systems
/// (ext4, xfs, btrfs, tmpfs, overlay, squashfs, ...) are read in place.
const CAN_HANG: &[(u32, &str)] = &[
    (0x6573_5546, "fuse"),
    (0x0000_6969, "nfs"),
    (0xff53_4d42, "cifs"),
    (0xfe53_4d42, "smb2"),
    (0x0000_517b, "smb"),
    (0x0102_1997, "9p"),
    (0x00c3_6400, "ceph"),
    (0x6b41_4653, "afs"),
    (0x5346_414f, "afs"),
    (0x7375_7245, "coda"),
    (0x1366_1366, "orangefs"),
    (0x0116_1970, "gfs2"),
];

/// The name of the file system type `f_type` if its reads may hang
/// ([`CAN_HANG`]).
pub fn can_hang(f_type: u64) -> Option<&'static str> {
    let magic = (f_type & 0xffff_ffff) as u32;
    CAN_HANG
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name)
}

/// What the opener asks the helper: open the first of `paths` that opens.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// Paths to try in order, as bytes (a path need not be UTF-8).
    pub paths: Vec<Vec<u8>>,
}

/// What the helper answers; an opened file's descriptor comes with it.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    /// Opened; its descriptor (the file, or its memfd copy) comes with the
    /// reply.
    Opened {
        /// The file's size, bytes (`fstat`).
        bytes: u64,
        /// `st_dev` of the file.
        dev: u64,
        /// `st_ino` of the file.
        ino: u64,
        /// Executable `PT_LOAD` segments.
        load_segments: LoadSegments,
        /// GNU build ID.
        build_id: Option<Vec<u8>>,
        /// The file system type it was copied from into a memfd, when its
        /// file system can hang.
        copied_from: Option<String>,
    },
    /// No path opened: the last error.
    Failed {
        /// Its `errno`, if it had one.
        errno: Option<i32>,
        /// Its text.
        message: String,
    },
    /// On a file system that can hang and larger than [`MAX_COPY_BYTES`].
    TooLarge {
        /// Its size, bytes.
        bytes: u64,
        /// The file system type.
        fs: String,
    },
}

impl Reply {
    fn failed(err: &std::io::Error) -> Reply {
        Reply::Failed {
            errno: err.raw_os_error(),
            message: err.to_string(),
        }
    }
}

/// Open the first of `request.paths` that opens, `fstat` it, copy it into a
/// memfd if its file system can hang ([`can_hang`]; up to `copy_cap`
/// bytes), and read its ELF identity (an unreadable ELF file is opened with
/// no segments and no build ID). The file to hand on comes with an
/// [`Reply::Opened`].
pub fn open_object(request: &Request, copy_cap: u64) -> (Reply, Option<File>) {
    use std::os::unix::ffi::OsStrExt;
    let mut last = std::io::Error::from(std::io::ErrorKind::NotFound);
    for path in &request.paths {
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(err) => {
                last = err;
                continue;
            }
        };
        let meta = match file.metadata() {
            Ok(meta) => meta,
            Err(err) => return (Reply::failed(&err), None),
        };
        let fs = match rustix::fs::fstatfs(&file) {
            Ok(stat) => can_hang(stat.f_type as u64),
            Err(err) => return (Reply::failed(&err.into()), None),
        };
        let (file, copied_from) = match fs {
            None => (file, None),
            Some(fs) if meta.len() > copy_cap => {
                let reply = Reply::TooLarge {
                    bytes: meta.len(),
                    fs: fs.to_string(),
                };
                return (reply, None);
            }
            Some(fs) => match copy_to_memfd(&file, meta.len()) {
                Ok(copy) => (copy, Some(fs.to_string())),
                Err(err) => return (Reply::failed(&err), None),
            },
        };
        let (load_segments, build_id) = elf_identity(&file).unwrap_or_else(|err| {
            tracing::debug!("{}: not a readable ELF file: {err}", path.display());
            (Vec::new(), None)
        });
        let reply = Reply::Opened {
            bytes: meta.len(),
            dev: meta.dev(),
            ino: meta.ino(),
            load_segments,
            build_id,
            copied_from,
        };
        return (reply, Some(file));
    }
    (Reply::failed(&last), None)
}

/// A sealed memfd holding the first `len` bytes of `file` (fewer if it is
/// shorter), positioned at its start. Every later read of the object goes
/// to it, never to `file`'s file system.
pub fn copy_to_memfd(file: &File, len: u64) -> std::io::Result<File> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(
        "lightswitch-object",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut copy = File::from(fd);
    let mut source = file;
    source.rewind()?;
    std::io::copy(&mut source.take(len), &mut copy)?;
    rustix::fs::fcntl_add_seals(
        &copy,
        SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL,
    )?;
    copy.rewind()?;
    Ok(copy)
}

/// The executable `PT_LOAD` program headers of an ELF file and its GNU
/// build ID (a `.note.gnu.build-id`-style note: owner `GNU`, type 3; other
/// owners' type-3 notes, such as SystemTap's, are not build IDs). Reads
/// only the headers and notes, not the whole file.
fn elf_identity(file: &File) -> object::read::Result<(LoadSegments, Option<Vec<u8>>)> {
    use object::read::elf::{ElfFile64, ProgramHeader};
    use object::read::{Object, ReadCache};
    let cache = ReadCache::new(file);
    let elf = ElfFile64::<object::Endianness, _>::parse(&cache)?;
    let endian = elf.endian();
    let segments = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| {
            ph.p_type(endian) == object::elf::PT_LOAD
                && ph.p_flags(endian).0 & object::elf::PF_X.0 != 0
        })
        .map(|ph| (ph.p_offset(endian), ph.p_vaddr(endian), ph.p_filesz(endian)))
        .collect();
    let build_id = elf.build_id()?.map(<[u8]>::to_vec);
    Ok((segments, build_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_copy_holds_the_same_bytes_and_cannot_be_changed() {
        let exe = File::open(std::env::current_exe().unwrap()).unwrap();
        let len = exe.metadata().unwrap().len();
        let mut copy = copy_to_memfd(&exe, len).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        (&exe).rewind().unwrap();
        (&exe).read_to_end(&mut a).unwrap();
        copy.read_to_end(&mut b).unwrap();
        assert!(a == b, "{} bytes copied of {}", b.len(), a.len());
        assert!(copy.write_all(b"x").is_err(), "sealed against writes");
        assert_eq!(
            elf_identity(&copy).unwrap(),
            elf_identity(&exe).unwrap(),
            "the identity read from the copy is the file's"
        );
        // A shorter copy holds the start.
        let mut head = Vec::new();
        copy_to_memfd(&exe, 100)
            .unwrap()
            .read_to_end(&mut head)
            .unwrap();
        assert_eq!(head, a[..100]);
    }

    #[test]
    fn network_and_user_space_file_systems_can_hang_local_ones_cannot() {
        assert_eq!(can_hang(0x6573_5546), Some("fuse"));
        assert_eq!(can_hang(0x6969), Some("nfs"));
        assert_eq!(can_hang(0xff53_4d42), Some("cifs"));
        assert_eq!(can_hang(0x0102_1997), Some("9p"));
        // ext4, xfs, btrfs, tmpfs, overlayfs
        for local in [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994, 0x794c_7630] {
            assert_eq!(can_hang(local), None, "{local:#x}");
        }
        let here = File::open(std::env::current_exe().unwrap()).unwrap();
        let f_type = rustix::fs::fstatfs(&here).unwrap().f_type as u64;
        assert_eq!(can_hang(f_type), None, "the build directory is local");
    }
}
