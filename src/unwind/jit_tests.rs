//! Tests of the JIT tables: rows from unwinding-info records, moves,
//! growth read on a reader thread, eviction, a real CPython 3.13 jitdump.

use std::io::Write;
use std::process::Command;

use super::*;
use crate::unwind::rule::{Bx, CfaOffset, Fp};

/// The body of a `JIT_CODE_UNWINDING_INFO` record CPython 3.13.0
/// `-X perf_jit` wrote for its 11-byte trampoline (`sub $8,%rsp;
/// call *%rcx; add $8,%rsp; ret`): sizes 68, 20, 80, then a CIE and an
/// FDE (CFA rsp+16 from byte 4, rsp+8 again from byte 10) and the
/// `.eh_frame_hdr`, padded to 8 bytes.
const CPYTHON_313_UNWINDING_INFO: &str = "4400000000000000140000000000000050000000000000001400000000000000017a5200017810011b0c070890010000140000001c000000d0ffffff0b00000000440e10460e0800011b033bccffffff01000000c0ffffffe8ffffff00000000";
const TRAMPOLINE: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

use crate::process::jit::test_dumps::{header, record};

fn load(addr: u64, name: &str) -> Vec<u8> {
    crate::process::jit::test_dumps::load(addr, name, &TRAMPOLINE)
}

fn moved(old: u64, new: u64) -> Vec<u8> {
    crate::process::jit::test_dumps::moved(old, new, TRAMPOLINE.len() as u64)
}

fn rsp(bytes: i64) -> Rule {
    Rule::RspOffset {
        cfa: CfaOffset::new(bytes).expect("offset"),
        fp: Fp::Unchanged,
        bx: Bx::Unchanged,
    }
}

/// The rules a trampoline's FDE gives, byte by byte, and none after it.
fn assert_trampoline(table: &UnwindTable, at: u64) {
    for (offset, want) in [
        (0, rsp(8)),
        (3, rsp(8)),
        (4, rsp(16)),
        (9, rsp(16)),
        (10, rsp(8)),
    ] {
        assert_eq!(table.lookup(at + offset), want, "at {at:#x} + {offset}");
    }
    assert_eq!(table.lookup(at + 11), Rule::EndOfFunction, "after {at:#x}");
}

const BASE: u64 = 0x7f00_1234_0000;

#[test]
fn unwinding_info_becomes_rows_at_mapping_offsets_and_follows_moves() {
    let info = record(JIT_CODE_UNWINDING_INFO, &hex(CPYTHON_313_UNWINDING_INFO));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("jit-1.dump");
    let mut file = std::fs::File::create(&path).expect("create");
    let first = [
        header(),
        info.clone(),
        load(BASE, "py::a"),
        info.clone(),
        load(BASE + 0x110, "py::b"),
        load(BASE + 0x220, "no unwinding info"),
        moved(BASE + 0x110, BASE + 0x330),
    ];
    file.write_all(&first.concat()).unwrap();
    let reader = std::fs::File::open(&path).expect("open");
    let mut jit = JitTables::default();
    let (mut built, mut retired) = (Vec::new(), Vec::new());
    let mapping = (BASE, BASE + 0x1_0000);
    let settled = |jit: &mut JitTables, retired: &mut Vec<u32>| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !jit.grew(1, &reader, |_| false, retired) {
            assert!(Instant::now() < deadline, "the read never came back");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // The first read is waited for a few ms; on a loaded machine it may
    // come back later, through grew().
    let id = match jit.mapping_table(1, mapping, &reader, &mut built, &mut retired) {
        Some(id) => Some(id),
        None => {
            settled(&mut jit, &mut retired);
            jit.mapping_table(1, mapping, &reader, &mut built, &mut retired)
        }
    };
    assert_eq!(id, Some(JIT_OBJECT_ID_BASE));
    assert_eq!(jit.object_of(1, BASE), id);
    let (_, name, table) = &built[0];
    assert!(name.contains("jit pid 1"), "{name}");
    assert_eq!(table.stats().fdes, 2);
    assert_trampoline(table, 0);
    assert_trampoline(table, 0x330);
    assert_eq!(table.lookup(0x114), Rule::EndOfFunction, "moved away");
    assert_eq!(
        table.lookup(0x224),
        Rule::EndOfFunction,
        "no unwinding info"
    );
    // Nothing new: the same table; a mapping without such code: none.
    assert_eq!(
        jit.mapping_table(1, mapping, &reader, &mut built, &mut retired),
        id
    );
    let elsewhere = (BASE + 0x10_0000, BASE + 0x11_0000);
    assert_eq!(
        jit.mapping_table(1, elsewhere, &reader, &mut built, &mut retired),
        None
    );
    assert_eq!((built.len(), retired.len()), (1, 0));

    // The dump grows: seen (after the check interval), and the mapping's
    // table is built again under a new id, the old one retired.
    file.write_all(&[info, load(BASE + 0x440, "py::c")].concat())
        .unwrap();
    std::thread::sleep(CHECK_INTERVAL);
    settled(&mut jit, &mut retired);
    assert!(
        !jit.grew(1, &reader, |_| false, &mut retired),
        "checked just now"
    );
    let new = jit.mapping_table(1, mapping, &reader, &mut built, &mut retired);
    assert_eq!(new, Some(JIT_OBJECT_ID_BASE + 1));
    assert_eq!(retired, vec![JIT_OBJECT_ID_BASE]);
    assert_trampoline(&built[1].2, 0x440);
    assert_trampoline(&built[1].2, 0);
    // An evicted table: described again, built again.
    std::thread::sleep(CHECK_INTERVAL);
    assert!(jit.grew(1, &reader, |id| id == JIT_OBJECT_ID_BASE + 1, &mut retired));
    let again = jit.mapping_table(1, mapping, &reader, &mut built, &mut retired);
    assert_eq!(again, Some(JIT_OBJECT_ID_BASE + 2));
    jit.process_exited(1, &mut retired);
    let ids = |n: &[u32]| n.iter().map(|i| JIT_OBJECT_ID_BASE + i).collect::<Vec<_>>();
    assert_eq!(retired, ids(&[0, 1, 2]));
    assert_eq!(jit.object_of(1, BASE), None, "forgotten");
}

#[test]
fn malformed_unwinding_info_gives_no_rows_and_no_panic() {
    let mut info = hex(CPYTHON_313_UNWINDING_INFO);
    let mut pending = None;
    let mut codes = BTreeMap::new();
    let mut held = Held::default();
    for cut in 0..info.len() {
        apply(
            &mut pending,
            &mut codes,
            &mut held,
            JIT_CODE_UNWINDING_INFO,
            &info[..cut],
        );
    }
    // Only an .eh_frame_hdr (V8 on x86-64): no information.
    let mut hdr_only = vec![0; 24 + 20];
    hdr_only[0] = 20;
    hdr_only[8] = 20;
    apply(
        &mut pending,
        &mut codes,
        &mut held,
        JIT_CODE_UNWINDING_INFO,
        &hdr_only,
    );
    assert!(pending.is_none());
    // Sizes beyond the record: ignored.
    info[0] = 0xff;
    apply(
        &mut pending,
        &mut codes,
        &mut held,
        JIT_CODE_UNWINDING_INFO,
        &info,
    );
    assert!(pending.is_none());
    // Garbage CFI for real code: a table without rows.
    let garbage: Arc<[u8]> = Arc::from(&[0x10, 0, 0, 0, 0xff, 0xff, 0xff, 0xff][..]);
    codes.insert(
        BASE,
        Code {
            size: 11,
            eh_frame: garbage,
            cost: 0,
        },
    );
    let table = build(codes.iter(), BASE).expect("table");
    assert!(table.rows().is_empty());
}

/// A CPython of at least 3.13 (`-X perf_jit`): `python3.13` on the
/// PATH, else one of pyenv's versions.
fn python_313() -> Option<String> {
    let home = std::env::var("HOME").unwrap_or_default();
    let pyenv = std::env::var("PYENV_ROOT").unwrap_or(format!("{home}/.pyenv"));
    let mut found: Vec<String> = std::fs::read_dir(format!("{pyenv}/versions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|v| format!("{}/bin/python3", v.path().display()))
        .collect();
    found.sort();
    std::iter::once("python3.13".to_string())
        .chain(found.into_iter().rev())
        .find(|python| {
            Command::new(python)
                .args(["-c", "import sys; sys.exit(sys.version_info < (3, 13))"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// A jitdump CPython 3.13 `-X perf_jit` really wrote (complete once it
/// exited): every trampoline it names has the trampoline's rows.
#[test]
fn a_real_cpython_313_jitdump() {
    let Some(python) = python_313() else {
        eprintln!("skipped: no CPython 3.13 or later (python3.13, pyenv)");
        return;
    };
    let run = Command::new(&python)
        .args([
            "-X",
            "perf_jit",
            "-c",
            "import os\ndef f(): return 1\nf()\nprint(os.getpid())",
        ])
        .output()
        .expect("python");
    assert!(run.status.success(), "{run:?}");
    let pid = String::from_utf8_lossy(&run.stdout).trim().to_string();
    let path = std::path::PathBuf::from(format!("/tmp/jit-{pid}.dump"));
    let mut process = ProcessJit::default();
    let file = std::fs::File::open(&path).expect("open");
    let (_, records) = read_on(JitdumpCursor::default(), &file);
    process.apply_all(records);
    let _ = std::fs::remove_file(&path);
    assert!(
        process.codes.len() >= 10,
        "{} pieces of code",
        process.codes.len()
    );
    let (&first, _) = process.codes.iter().next().expect("code");
    let table = build(process.codes.iter(), first).expect("table");
    assert_eq!(table.stats().fdes, process.codes.len() as u64);
    assert!(table.stats().unsupported.is_empty());
    for (&addr, code) in &process.codes {
        assert_eq!(code.size, 11);
        assert_trampoline(&table, addr - first);
    }
}

/// Pids above the kernel's highest `pid_max` (2^22): never in `/proc`.
const NO_SUCH_PID: u32 = (1 << 22) + 1;

#[test]
fn exited_processes_asked_about_again_by_late_samples_are_forgotten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("jit-1.dump");
    let info = record(JIT_CODE_UNWINDING_INFO, &hex(CPYTHON_313_UNWINDING_INFO));
    std::fs::write(&path, [header(), info, load(BASE, "py::a")].concat()).expect("write");
    let reader = std::fs::File::open(&path).expect("open");
    let mut jit = JitTables::default();
    let (mut built, mut retired) = (Vec::new(), Vec::new());
    let mapping = (BASE, BASE + 0x1_0000);
    let lifetimes = 300;
    for pid in NO_SUCH_PID..NO_SUCH_PID + lifetimes {
        jit.mapping_table(pid, mapping, &reader, &mut built, &mut retired);
        jit.process_exited(pid, &mut retired);
        // A sample taken before the exit, handled after it.
        jit.grew(pid, &reader, |_| false, &mut retired);
    }
    // A live process (this one) keeps its state through the sweep.
    let me = std::process::id();
    jit.mapping_table(me, mapping, &reader, &mut built, &mut retired);
    std::thread::sleep(GONE_SWEEP + Duration::from_millis(100));
    jit.process_exited(NO_SUCH_PID + lifetimes, &mut retired);
    let kept: Vec<u32> = jit.processes.keys().copied().collect();
    assert_eq!(kept, vec![me], "only live processes are kept");
    let ids: std::collections::HashSet<u32> = built.iter().map(|b| b.0).collect();
    let live = jit.object_of(me, BASE);
    assert!(
        ids.iter()
            .all(|id| retired.contains(id) || Some(*id) == live),
        "every table of a forgotten process is retired"
    );
}
