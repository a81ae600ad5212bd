//! Independent facts about files and processes (readelf, /proc), to check
//! the profile against.

use super::*;

/// The GNU build ID of `path` as `readelf -n` prints it ("" if none).
pub(crate) fn readelf_build_id(path: &str) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("running readelf (binutils)");
    assert!(
        out.status.success(),
        "readelf -n {path} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Build ID: ")
                .map(|id| id.trim().to_string())
        })
        .unwrap_or_default()
}

/// The running kernel's GNU build ID, parsed from the ELF notes in
/// /sys/kernel/notes (namesz, descsz, type, name and desc padded to 4).
pub(crate) fn kernel_build_id() -> String {
    let notes = fs::read("/sys/kernel/notes").expect("reading /sys/kernel/notes");
    let word = |at: usize| u32::from_le_bytes(notes[at..at + 4].try_into().unwrap()) as usize;
    let pad = |n: usize| n.div_ceil(4) * 4;
    let mut at = 0;
    while at + 12 <= notes.len() {
        let (namesz, descsz, kind) = (word(at), word(at + 4), word(at + 8));
        let name = &notes[at + 12..at + 12 + namesz];
        let desc_at = at + 12 + pad(namesz);
        if name == b"GNU\0" && kind == 3 {
            return notes[desc_at..desc_at + descsz]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
        }
        at = desc_at + pad(descsz);
    }
    panic!("no GNU build-ID note in /sys/kernel/notes");
}

/// One line of /proc/PID/maps.
#[derive(Debug)]
pub(crate) struct MapsLine {
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) offset: u64,
    pub(crate) path: String,
}

pub(crate) fn proc_maps(pid: u32) -> Vec<MapsLine> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).expect("reading /proc/PID/maps");
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, _perms, offset) = (f.next()?, f.next()?, f.next()?);
            let (_dev, _inode) = (f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            let (start, end) = range.split_once('-')?;
            Some(MapsLine {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                path,
            })
        })
        .collect()
}

/// The tid of the thread of `pid` named `name`, waiting up to 10 s for it.
pub(crate) fn thread_named(pid: u32, name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                if comm.trim_end() == name {
                    return task.file_name().to_string_lossy().parse().unwrap();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no thread {name} in {pid} within 10 s"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

pub(crate) fn nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}
