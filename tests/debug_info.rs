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
//!   function included;
//! - a program and a shared library stripped the Fedora way, with
//!   MiniDebugInfo (`.gnu_debugdata`): static functions named from it, and
//!   the debug files, when found by build ID, read first;
//! - a program whose text was moved to anonymous memory at the same
//!   addresses (`hugectl --text`, hugify): unwound and named as its file.
//!
//! Needs root (BPF), gcc, binutils (`objcopy`, `strip`, `nm`) and xz-utils; the first test
//! needs `llvm-objcopy` (scripts/setup.sh installs llvm).

mod common;

use std::fs;
use std::process::Command;
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
    assert_chain_of(&Workload::spawn(program), program, extra, chain);
}

/// [`assert_profiled_chain`] for `workload`, a running `program`.
fn assert_chain_of(workload: &Workload, program: &Program, extra: &[&str], chain: &[&str]) {
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

/// The shared library of the MiniDebugInfo test: an exported entry, two
/// static functions below it, and an inlined helper only DWARF can name.
const MDI_LIBRARY: &str = r#"
volatile unsigned long lib_sink;
static inline __attribute__((always_inline)) void lib_mix(unsigned long n) {
    for (unsigned long i = 0; i < n; i++) lib_sink += i * 2654435761u;
}
static __attribute__((noipa)) void lib_leaf(unsigned long n) { lib_mix(n); lib_sink++; }
static __attribute__((noipa)) void lib_mid(unsigned long n) { lib_leaf(n); lib_sink++; }
__attribute__((noipa)) void lib_entry(unsigned long n) { lib_mid(n); lib_sink++; }
"#;

/// The program: `main` and a global and two static functions, none
/// exported, above the library's.
fn mdi_program_source() -> String {
    format!(
        "{DIE_WITH_PARENT}
extern void lib_entry(unsigned long n);
volatile unsigned long sink;
static __attribute__((noipa)) void prog_c(unsigned long n) {{ lib_entry(n); sink++; }}
static __attribute__((noipa)) void prog_b(unsigned long n) {{ prog_c(n); sink++; }}
__attribute__((noipa)) void prog_a(unsigned long n) {{ prog_b(n); sink++; }}
int main(void) {{ for (;;) {{ prog_a(200000); sink++; }} }}
"
    )
}

/// What Fedora's find-debuginfo does to each ELF file `$1`: the debug file
/// `$1.debug` split off and linked, the file stripped, and the functions
/// `.dynsym` lacks kept xz-compressed in `.gnu_debugdata` (the script says
/// how; the symbolizer's benchmark builds its library with it too).
const FEDORA_RECIPE: &str = include_str!("../scripts/fedora-minidebuginfo.sh");

/// The MiniDebugInfo program (`lsw_mdi`) and its library (`libmdi.so`),
/// built and stripped the Fedora way ([`FEDORA_RECIPE`]), their debug
/// files moved to `DEBUG_ROOT/.build-id/xx/yyyy.debug` (as when no
/// debuginfo package is installed, unless that root is searched).
struct FedoraBuild {
    program: Program,
    library: std::path::PathBuf,
    /// Holds the library (removed on drop).
    _lib_dir: tempfile::TempDir,
    debug_root: tempfile::TempDir,
}

impl FedoraBuild {
    fn new() -> Self {
        let lib_dir = tempdir();
        let library = lib_dir.path().join("libmdi.so");
        let lib_source = lib_dir.path().join("mdi.c");
        fs::write(&lib_source, MDI_LIBRARY).expect("write");
        let mut lib_args = FLAGS.to_vec();
        lib_args.extend(["-fPIC", "-shared", "-Wl,--build-id=sha1", "-o"]);
        lib_args.extend([s(&library), s(&lib_source)]);
        tool("gcc", &lib_args);
        let mut flags = FLAGS.to_vec();
        let rpath = format!("-Wl,-rpath,{}", s(lib_dir.path()));
        let link = format!("-L{}", s(lib_dir.path()));
        flags.extend([
            "-Wl,--build-id=sha1",
            "-Wl,--no-as-needed",
            &link,
            "-lmdi",
            &rpath,
        ]);
        let program = compile("lsw_mdi", &mdi_program_source(), &flags);
        let debug_root = tempdir();
        let build = FedoraBuild {
            program,
            library,
            _lib_dir: lib_dir,
            debug_root,
        };
        for file in [&build.program.path, &build.library] {
            tool("sh", &["-c", FEDORA_RECIPE, "fedora", s(file)]);
            let debug = file.with_extension(match file.extension() {
                Some(ext) => format!("{}.debug", ext.to_string_lossy()),
                None => "debug".to_string(),
            });
            let moved = build.debug_file(file);
            fs::create_dir_all(moved.parent().expect("parent")).expect("mkdir");
            fs::rename(&debug, moved).expect("move");
            let sections = Command::new("readelf").arg("-S").arg(file).output();
            let sections = String::from_utf8_lossy(&sections.expect("readelf").stdout).into_owned();
            assert!(sections.contains(".gnu_debugdata"), "{sections}");
            assert!(!sections.contains(".symtab"), "{sections}");
        }
        build
    }

    /// Where the debug file of `file` (the program or the library) is.
    fn debug_file(&self, file: &std::path::Path) -> std::path::PathBuf {
        let id = build_id(file);
        let dir = self.debug_root.path().join(".build-id").join(&id[..2]);
        dir.join(format!("{}.debug", &id[2..]))
    }
}

/// A program and a shared library built and stripped the Fedora way, their
/// debug files gone (as when no debuginfo package is installed): every
/// function of the chain is named from `.gnu_debugdata` (the static ones
/// too) or `.dynsym`. With the debug files found by build ID, DWARF comes
/// first (gdb's order) and names the inlined function too.
#[test]
fn minidebuginfo_names_static_functions() {
    let _serial = serial();
    let build = FedoraBuild::new();
    let program = &build.program;
    let chain = [
        "main",
        "prog_a",
        "prog_b",
        "prog_c",
        "lib_entry",
        "lib_mid",
        "lib_leaf",
    ];
    // libc's debug file names its static start-up functions.
    let no_debug_files = "/nonexistent,/usr/lib/debug";
    assert_profiled_chain(program, &["--debug-dirs", no_debug_files], &chain);
    let dirs = format!("{},/usr/lib/debug", s(build.debug_root.path()));
    let with_inlined = [&chain[..], &["lib_mix"]].concat();
    assert_profiled_chain(program, &["--debug-dirs", &dirs], &with_inlined);
}

/// Windows of a continuous symbolizer (one agent's, for days) that each
/// bring new addresses in the Fedora-built program and library
/// ([`FedoraBuild`], debug files not searched): every window names the
/// static functions from `.gnu_debugdata` and the PLT stub, and each
/// object's tables (its section inflated, its stubs read) are built once,
/// not once a window (`lightswitch_symbol_tables_built_total`).
#[test]
fn minidebuginfo_is_read_once_per_object_across_windows() {
    use lightswitch::process::ProcessTracker;
    use lightswitch::profile::{aggregate::Aggregator, Window};
    use lightswitch::sampling::records::{RawSample, UnwindStatus};
    use lightswitch::symbolize::{minidebuginfo, object_tables, Symbolizer};

    let _serial = serial();
    let build = FedoraBuild::new();
    let workload = Workload::spawn(&build.program);
    let pid = workload.pid();
    // Where each function is in the process: its object's base (the
    // mapping of file offset 0) plus its address in the debug file.
    let base_in = |maps: &[lightswitch::process::maps::MapsEntry], file: &std::path::Path| {
        maps.iter()
            .find(|m| std::path::Path::new(&m.path) == file && m.file_offset == 0)
            .map(|m| m.start)
    };
    // The library is mapped by ld.so after the exec the workload waited for.
    let deadline = std::time::Instant::now() + TIMEOUT;
    let maps = loop {
        let maps = lightswitch::process::maps::read_maps(pid).expect("maps");
        let text = |m: &lightswitch::process::maps::MapsEntry| {
            m.executable && std::path::Path::new(&m.path) == build.library
        };
        if base_in(&maps, &build.library).is_some() && maps.iter().any(text) {
            break maps;
        }
        assert!(std::time::Instant::now() < deadline, "libmdi.so not mapped");
        std::thread::sleep(Duration::from_millis(5));
    };
    let base_of = |file: &std::path::Path| base_in(&maps, file).expect("mapped");
    let address_of = |file: &std::path::Path, name: &str| {
        let debug = build.debug_file(file);
        let nm = Command::new("nm").arg(&debug).output().expect("nm");
        let symbols = String::from_utf8_lossy(&nm.stdout).into_owned();
        let vaddr = symbols
            .lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
            .unwrap_or_else(|| panic!("{name} in {symbols}"));
        base_of(file) + vaddr
    };
    let objdump = Command::new("objdump")
        .arg("-d")
        .arg(&build.program.path)
        .output()
        .expect("objdump");
    let disassembly = String::from_utf8_lossy(&objdump.stdout).into_owned();
    let stub = disassembly
        .lines()
        .find(|l| l.ends_with("<lib_entry@plt>:"))
        .and_then(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .expect("lib_entry@plt");
    let mut functions: Vec<(&str, u64)> = ["main", "prog_a", "prog_b", "prog_c"]
        .into_iter()
        .map(|f| (f, address_of(&build.program.path, f)))
        .chain(["lib_mid", "lib_leaf"].map(|f| (f, address_of(&build.library, f))))
        .collect();
    functions.push(("lib_entry@plt", base_of(&build.program.path) + stub));

    let symbolizer = Symbolizer::new();
    let mut tracker = ProcessTracker::new();
    let (read_before, built_before) = (minidebuginfo::stats().read, object_tables::builds());
    for window in 0..5u64 {
        let mut aggregator = Aggregator::new();
        for &(_, address) in &functions {
            let sample = RawSample {
                timestamp_ns: 0,
                pid,
                tid: pid,
                cpu: 0,
                process_comm: build.program.name.as_str().into(),
                thread_comm: build.program.name.as_str().into(),
                kernel_thread: false,
                kernel_stack: Vec::new(),
                // A new address each window, inside the function.
                user_stack: vec![address + window],
                user_status: UnwindStatus::Complete,
                python: Vec::new(),
                python_walked: false,
                stack_copy: None,
                wait: None,
            };
            aggregator.add(&sample, &mut tracker);
        }
        let span = Window {
            start_unix_ns: window * 1_000_000_000,
            duration_ns: 1_000_000_000,
            sample_freq_hz: 99,
            off_cpu: false,
        };
        let profile = symbolizer.build_profile(&aggregator, &tracker, span);
        let mut names: Vec<&str> = profile
            .frames
            .iter()
            .map(|f| &*f.lines.last().expect("a line").function)
            .collect();
        let mut wanted: Vec<&str> = functions.iter().map(|&(f, _)| f).collect();
        names.sort();
        wanted.sort();
        assert_eq!(names, wanted, "window {window}");
    }
    let read = minidebuginfo::stats().read - read_before;
    assert_eq!(read, 2, "sections inflated in 5 windows (2 objects)");
    let built = object_tables::builds();
    assert_eq!(built.minidebuginfo - built_before.minidebuginfo, 2);
    assert_eq!(built.plt - built_before.plt, 1, "the program's stubs");
}

/// A library that moves the caller's text to anonymous memory at the same
/// addresses, as `hugectl --text` and hugify do: in place (anonymous memory
/// mapped over it with `MAP_FIXED`, huge pages asked for, the text copied
/// back and made executable), or built elsewhere and `mremap`ped into
/// place. Its own code stays where it is while the program's is away.
const MOVE_TEXT_LIBRARY: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
static void text_of(unsigned long pc, unsigned long *start, unsigned long *end) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512], perms[8];
    unsigned long s, e;
    while (maps && fgets(line, sizeof line, maps)) {
        if (sscanf(line, "%lx-%lx %7s", &s, &e, perms) == 3 && perms[2] == 'x' && s <= pc && pc < e) {
            *start = s;
            *end = e;
            fclose(maps);
            return;
        }
    }
    abort();
}
void move_text(void *pc, int by_mremap) {
    unsigned long start, end;
    text_of((unsigned long)pc, &start, &end);
    size_t len = end - start;
    char *copy = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED) abort();
    memcpy(copy, (void *)start, len);
    if (by_mremap) {
        if (mprotect(copy, len, PROT_READ | PROT_EXEC) != 0) abort();
        if (mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)start) != (void *)start)
            abort();
        return;
    }
    void *at = mmap((void *)start, len, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (at != (void *)start) abort();
    madvise(at, len, MADV_HUGEPAGE);
    memcpy(at, copy, len);
    if (mprotect(at, len, PROT_READ | PROT_EXEC) != 0) abort();
    munmap(copy, len);
}
"#;

/// A program that moves its text (`BY_MREMAP` chooses how) and then runs a
/// chain of static functions.
fn moved_text_source() -> String {
    format!(
        "{DIE_WITH_PARENT}
extern void move_text(void *pc, int by_mremap);
volatile unsigned long sink;
static __attribute__((noipa)) void text_hot(unsigned long n) {{
    for (unsigned long i = 0; i < n; i++) sink += i * 2654435761u;
}}
static __attribute__((noipa)) void text_d(unsigned long n) {{ text_hot(n); sink++; }}
static __attribute__((noipa)) void text_c(unsigned long n) {{ text_d(n); sink++; }}
static __attribute__((noipa)) void text_b(unsigned long n) {{ text_c(n); sink++; }}
static __attribute__((noipa)) void text_a(unsigned long n) {{ text_b(n); sink++; }}
int main(void) {{ move_text((void *)main, BY_MREMAP); for (;;) {{ text_a(200000); sink++; }} }}
"
    )
}

/// Whether process `pid`'s maps show `path` executable (its text still
/// file-backed).
fn text_file_backed(pid: u32, path: &std::path::Path) -> bool {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    maps.lines()
        .any(|l| l.ends_with(s(path)) && l.split(' ').nth(1).is_some_and(|p| p.contains('x')))
}

/// Text moved to anonymous memory, in place or by `mremap`, is unwound
/// with its file's table and named from its file: every sample has the
/// whole chain.
#[test]
fn text_moved_to_anonymous_memory() {
    let _serial = serial();
    let lib_dir = tempdir();
    let library = lib_dir.path().join("libmovetext.so");
    let lib_source = lib_dir.path().join("movetext.c");
    fs::write(&lib_source, MOVE_TEXT_LIBRARY).expect("write");
    tool(
        "gcc",
        &["-O2", "-fPIC", "-shared", "-o", s(&library), s(&lib_source)],
    );
    let chain = ["main", "text_a", "text_b", "text_c", "text_d", "text_hot"];
    for (name, by_mremap) in [("lsw_anon_fixed", "0"), ("lsw_anon_mremap", "1")] {
        let mut flags = FLAGS.to_vec();
        let define = format!("-DBY_MREMAP={by_mremap}");
        let rpath = format!("-Wl,-rpath,{}", s(lib_dir.path()));
        let link = format!("-L{}", s(lib_dir.path()));
        flags.extend([&define, "-Wl,--no-as-needed", &link, "-lmovetext", &rpath]);
        let program = compile(name, &moved_text_source(), &flags);
        let workload = Workload::spawn(&program);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while text_file_backed(workload.pid(), &program.path) {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: text not moved"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_chain_of(&workload, &program, &[], &chain);
    }
}
