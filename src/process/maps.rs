//! Parsing of `/proc/PID/maps` (see proc(5)).

use anyhow::{anyhow, Context, Result};

/// One line of `/proc/PID/maps`: a range of the address space and what backs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    /// First address of the range (inclusive).
    pub start: u64,
    /// End of the range (exclusive).
    pub end: u64,
    /// Whether the range is mapped executable (`x` in the permissions).
    pub executable: bool,
    /// Offset into the backing file of `start`, bytes.
    pub file_offset: u64,
    /// Device of the backing file, `(major << 32) | minor`.
    pub dev: u64,
    /// Inode of the backing file; 0 for anonymous and special mappings.
    pub inode: u64,
    /// Path as the process sees it (` (deleted)` suffix removed), a special
    /// name such as `[vdso]`, or empty for anonymous memory.
    pub path: String,
    /// Whether the kernel marked the backing file ` (deleted)`.
    pub deleted: bool,
}

impl MapsEntry {
    /// Whether this range is backed by a file (not anonymous or special).
    pub fn is_file_backed(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }
}

fn hex(field: &str) -> Result<u64> {
    u64::from_str_radix(field, 16).with_context(|| format!("bad hex field {field:?}"))
}

/// Parse one line of `/proc/PID/maps`.
pub fn parse_line(line: &str) -> Result<MapsEntry> {
    let mut fields = line.splitn(6, ' ');
    let mut next = |what: &str| {
        fields
            .next()
            .ok_or_else(|| anyhow!("missing {what} in {line:?}"))
    };
    let range = next("range")?;
    let perms = next("permissions")?;
    let offset = next("offset")?;
    let dev = next("device")?;
    let inode = next("inode")?;
    let path = fields.next().unwrap_or("").trim_start();
    let (start, end) = range
        .split_once('-')
        .ok_or_else(|| anyhow!("bad range in {line:?}"))?;
    let (major, minor) = dev
        .split_once(':')
        .ok_or_else(|| anyhow!("bad device in {line:?}"))?;
    let (path, deleted) = match path.strip_suffix(" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Ok(MapsEntry {
        start: hex(start)?,
        end: hex(end)?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        file_offset: hex(offset)?,
        dev: (hex(major)? << 32) | hex(minor)?,
        inode: inode
            .parse()
            .with_context(|| format!("bad inode in {line:?}"))?,
        path: path.to_string(),
        deleted,
    })
}

/// Read and parse `/proc/PID/maps`. Errors if the process is gone or a line is malformed.
pub fn read_maps(pid: u32) -> Result<Vec<MapsEntry>> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .filter(|l| !l.is_empty())
        .map(parse_line)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_backed_executable_line() {
        let e = parse_line(
            "7f2c4e628000-7f2c4e7bd000 r-xp 00028000 fd:01 1835347                    /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(e.start, 0x7f2c4e628000);
        assert_eq!(e.end, 0x7f2c4e7bd000);
        assert!(e.executable);
        assert_eq!(e.file_offset, 0x28000);
        assert_eq!(e.dev, (0xfd << 32) | 1);
        assert_eq!(e.inode, 1835347);
        assert_eq!(e.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(e.is_file_backed());
    }

    #[test]
    fn parses_anonymous_special_and_deleted() {
        let anon = parse_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, "");
        assert!(!anon.executable && !anon.is_file_backed());
        let vdso =
            parse_line("7ffd1000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]")
                .unwrap();
        assert_eq!(vdso.path, "[vdso]");
        assert!(vdso.executable && !vdso.is_file_backed());
        let del =
            parse_line("400000-401000 r-xp 00001000 08:02 77 /tmp/my prog (deleted)").unwrap();
        assert_eq!(del.path, "/tmp/my prog");
        assert!(del.deleted);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_line("not a maps line").is_err());
    }
}
