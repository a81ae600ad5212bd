//! Objects whose unwind information or names are not where a plain reader
//! looks, profiled end to end as root (small C programs compiled here,
//! without frame pointers, profiled by pid; their exact call chains checked
//! in the folded output):
//! - an executable stripped of its section headers (`llvm-objcopy
//!   --strip-sections`): CFI through `PT_GNU_EH_FRAME`, names from the
//!   dynamic symbol table through `PT_DYNAMIC`, and `show-unwind` on it;
//! - a stripped executable (no `.gnu_debuglink`) whose debug file sits at
//!   `DIR/.build-id/xx/yyyy.debug` under `--debug-dirs`, its debug sections
//!   uncompressed, zlib- or zstd-compressed: every frame named, the inlined
//!   function included.
//!
//! Needs root (BPF), gcc and binutils (`objcopy`, `strip`); the first test
//! needs `llvm-objcopy` (scripts/setup.sh installs llvm).

mod common;

use std::fs;
use std::time::Duration;

use common::*;

/// Longest any single profiler run may take before the test gives up.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Optimized, no frame pointers (only CFI to unwind with), no sibling calls.
const FLAGS: &[&str] = NO_FP_FLAGS;

/// Share of the samples that must carry the whole chain.
const SHARE: f64 = 0.9;

/// Profile the running `program` for 2 s (extra profiler arguments
/// `extra`) and require `chain` (root to leaf, after libc's start-up
/// frames) on at least [`SHARE`] of its samples.
fn assert_profiled_chain(program: &Program, extra: &[&str], chain: &[&str]) {
    let workload = Workload::spawn(program);
    let dir = tempdir();
    let pid = workload.pid_arg();
    let mut args = vec![
        "--pids",
        &pid,
        "--duration",
        "2",
        "--sample-freq",
        "499",
        "--profile-format",
        "folded",
        "--profile-path",
        s(dir.path()),
    ];
    if !extra.contains(&"--unwind-cache-dir") {
        args.extend(["--unwind-cache-dir", "none"]);
    }
    args.extend_from_slice(extra);
    let out = run(&args, TIMEOUT);
    out.assert_success();
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let mine = of_process(&stacks, &program.name);
    let all = total(&stacks);
    let matching: u64 = mine
        .iter()
        .filter(|(frames, _)| ends_with_chain(&user_frames(frames), chain))
        .map(|(_, n)| n)
        .sum();
    assert!(all >= 100, "only {all} samples:\n{out}");
    assert!(
        matching as f64 >= SHARE * all as f64,
        "{matching} of {all} samples have {}:\n{}\n{out}",
        chain.join(";"),
        show(&mine)
    );
}

/// An executable without section headers unwinds through its
/// `PT_GNU_EH_FRAME` table and is named from its dynamic symbols.
#[test]
fn object_without_section_headers() {
    let _serial = serial();
    let mut flags = FLAGS.to_vec();
    flags.push("-rdynamic");
    let program = compile("lsw_nosec", &chain_source(), &flags);
    tool("llvm-objcopy", &["--strip-sections", s(&program.path)]);
    let header = fs::read(&program.path).expect("read");
    assert_eq!(&header[0x3c..0x3e], [0, 0], "section headers left");

    let shown = run(&["show-unwind", s(&program.path)], TIMEOUT);
    shown.assert_success();
    assert!(shown.stdout.contains("\nsource: .eh_frame\n"), "{shown}");
    let fdes: u64 = shown
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("fdes: ")?.parse().ok())
        .unwrap_or_else(|| panic!("no fdes line:\n{shown}"));
    // main, alpha, beta, burn, _start and the C runtime's own functions.
    assert!(fdes >= 5, "{shown}");

    assert_profiled_chain(&program, &[], &["main", "alpha", "beta", "burn"]);
}

/// A stripped executable's debug file is found by build ID under
/// `--debug-dirs`, with plain, zlib- and zstd-compressed debug sections
/// (those read from an inflated copy in the unwind cache directory).
#[test]
fn debug_file_by_build_id() {
    let _serial = serial();
    for compression in ["none", "zlib", "zstd"] {
        let mut flags = FLAGS.to_vec();
        flags.push("-Wl,--build-id=sha1");
        let program = compile(&format!("lsw_bid_{compression}"), &chain_source(), &flags);
        let path = s(&program.path);
        let root = tempdir();
        let debug = program.dir().join("debug");
        tool("objcopy", &["--only-keep-debug", path, s(&debug)]);
        if compression != "none" {
            let format = format!("--compress-debug-sections={compression}");
            tool("objcopy", &[&format, s(&debug)]);
        }
        tool("strip", &["-s", path]);
        let id = build_id(&program.path);
        let dir = root.path().join(".build-id").join(&id[..2]);
        fs::create_dir_all(&dir).expect("mkdir");
        fs::copy(&debug, dir.join(format!("{}.debug", &id[2..]))).expect("copy");

        // libc's own debug file (for its static start-up functions) stays
        // reachable through the default directory.
        let dirs = format!("/nonexistent,{},/usr/lib/debug", s(root.path()));
        let chain = ["main", "alpha", "beta", "burn", "mix"];
        // Compressed debug sections are read from an inflated copy in the
        // unwind cache directory, named by build ID.
        let cache = tempdir();
        let args = ["--debug-dirs", &dirs, "--unwind-cache-dir", s(cache.path())];
        assert_profiled_chain(&program, &args, &chain);
        let copy = cache
            .path()
            .join("decompressed-debug")
            .join(format!("{id}.debug"));
        assert_eq!(copy.exists(), compression != "none", "{}", copy.display());
    }
}
