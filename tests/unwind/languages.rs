//! Complete stacks by language and shape: C without frame pointers, the
//! vDSO, deep recursion, walks reused across samples, C++ templates, Rust
//! release builds, very large stack frames.

use super::*;

/// C at -O2 without frame pointers: the whole chain from `_start`, which
/// only the CFI walk can produce.
#[test]
pub(super) fn c_no_frame_pointers_chain() {
    let _serial = serial();
    let program = compile("lsw_uw_chain", &c_chain_source(), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let t = tally(&p.stacks, &program.name, |u| complete_chain(u, C_CHAIN));
    assert_share(&p, &program.name, &describe(C_CHAIN), 0.95, t);
    // Frame pointers cannot have produced these stacks: the summary counts
    // them as complete CFI walks.
    let complete = p.unwind.get("complete").copied().unwrap_or(0);
    assert!(
        complete as f64 >= 0.95 * (t.total - t.no_table) as f64,
        "only {complete} of {} walks are counted complete:\n{}",
        t.total - t.no_table,
        p.out
    );
}

/// `main -> clocks`, which spends its time in `clock_gettime`, answered by
/// the kernel's vDSO without a system call.
fn vdso_source() -> String {
    format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}#include <time.h>
__attribute__((noinline)) void clocks(void) {{
    struct timespec ts;
    while (!stop) {{ clock_gettime(CLOCK_MONOTONIC, &ts); sink += ts.tv_nsec; }}
}}
int main(void) {{ clocks(); sink++; return 0; }}
"
    )
}

/// Frames in the vDSO are named (from the profiler's own vDSO, the same
/// image), never left as `[vdso]+0x...`, and walks through them complete.
#[test]
fn vdso_frames_named() {
    let _serial = serial();
    let program = compile("lsw_uw_vdso", &vdso_source(), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let mine = of_process(&p.stacks, &program.name);
    let unnamed: Vec<&Stack> = mine
        .iter()
        .copied()
        .filter(|(f, _)| f.iter().any(|x| x.starts_with("[vdso]")))
        .collect();
    assert!(
        unnamed.is_empty(),
        "vDSO frames left unsymbolized:\n{}\n{}",
        show(&unnamed),
        p.out
    );
    // glibc calls the vDSO's entry point (`__vdso_clock_gettime`, also
    // exported as `clock_gettime`) from its own `clock_gettime`.
    let in_vdso = |u: &[&str]| {
        u.len() >= 2
            && u[u.len() - 1].contains("clock_gettime")
            && u[u.len() - 2].contains("clock_gettime")
            && complete_chain(&u[..u.len() - 2], &["main", "clocks"])
    };
    let t = tally(&p.stacks, &program.name, in_vdso);
    assert_share(
        &p,
        &program.name,
        "main;clocks;clock_gettime (libc);clock_gettime (vDSO)",
        0.3,
        t,
    );
}

/// Recursion 300 deep: every one of the 300 frames, in order, between
/// `main` and the leaf.
#[test]
pub(super) fn c_recursion_300() {
    let _serial = serial();
    let program = compile("lsw_uw_rec300", &recursion_source(300), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let chain = recursion_chain(300);
    assert_chain(
        &p,
        &program.name,
        "main, exactly 300 `recurse` frames and hot, from _start",
        |u| complete_chain(u, &chain),
    );
}

/// `main` calling `left` and `right` in turn, both calling `mid -> spin`.
/// `left` and `right` have the same frame size, so `mid` and `spin` run at
/// the same stack addresses with the same registers on either path: only
/// the return address into `left` or `right` tells them apart.
fn two_paths_source() -> String {
    format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
__attribute__((noinline)) void spin(void) {{ for (int i = 0; i < 20000; i++) sink++; }}
__attribute__((noinline)) void mid(void) {{ spin(); sink++; }}
__attribute__((noinline)) void left(void) {{ mid(); sink += 1; }}
__attribute__((noinline)) void right(void) {{ mid(); sink += 2; }}
int main(void) {{ while (!stop) {{ left(); right(); }} return 0; }}
"
    )
}

/// Each CPU reuses its previous walk when a new one reaches the same
/// registers, after checking every stack word that walk read. Here the
/// two paths alternate every few tens of microseconds with identical
/// registers below `left`/`right`: both must keep about half of the
/// samples, with exact chains. A walk is reused when the previous sample
/// on its CPU took the same path, about half of the time: at least a
/// quarter must be (the debug log's `walks_reused`).
#[test]
pub(super) fn reused_walks_check_every_caller() {
    let _serial = serial();
    let program = compile("lsw_uw_paths", &two_paths_source(), NO_FP);
    let target = Target::run(&program.path);
    let dir = tempdir();
    let mut args = profile_args(target.pid, "2", dir.path());
    args.extend(["--logging".to_string(), "debug".to_string()]);
    let p = finish(run(&args, TIMEOUT), dir.path());
    let via = |caller: &'static str| {
        move |u: &[&str]| complete_chain(u, &["main", caller, "mid", "spin"])
    };
    let left = tally(&p.stacks, &program.name, via("left"));
    let right = tally(&p.stacks, &program.name, via("right"));
    let both = Tally {
        matching: left.matching + right.matching,
        ..left
    };
    assert_share(&p, &program.name, "main;left|right;mid;spin", 0.95, both);
    for (name, t) in [("left", left), ("right", right)] {
        assert!(
            t.matching * 10 >= both.matching * 3,
            "{name} has {} of the {} samples in spin (expected about half):\n{}",
            t.matching,
            both.matching,
            p.out
        );
    }
    let reused: u64 = p
        .out
        .stderr
        .split("walks_reused: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no walks_reused in the debug log:\n{}", p.out));
    assert!(
        reused * 4 >= both.matching,
        "only {reused} of {} walks were reused:\n{}",
        both.matching,
        p.out
    );
}

const CPP_SOURCE: &str = r#"
#include <functional>
#include <signal.h>
#include <sys/prctl.h>
__attribute__((constructor)) static void die_with_parent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void hot_loop() { while (!stop) sink++; }
template <typename T> __attribute__((noinline)) void run(T &f) { f(); sink++; }
int main() {
    // Work after the call keeps the handler from tail-calling hot_loop.
    std::function<void()> f = [] { hot_loop(); sink++; };
    run(f);
    sink++;
    return 0;
}
"#;

/// C++ without frame pointers: a template calling through `std::function`;
/// every name demangled, the chain complete.
#[test]
fn cpp_std_function_template() {
    let _serial = serial();
    let dir = tempdir();
    let src = dir.path().join("fn.cpp");
    fs::write(&src, CPP_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_cpp");
    let mut cmd = Command::new("g++");
    cmd.args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src);
    build(cmd, "g++");
    let target = Target::run(&bin);
    let p = profile(&target, "2");
    let chain = [
        "main",
        "void run<std::function<void ()> >(std::function<void ()>&)",
        "std::_Function_handler<void (), main::{lambda()#1}>::_M_invoke(std::_Any_data const&)",
        "hot_loop()",
    ];
    assert_chain(&p, "lsw_uw_cpp", &describe(&chain), |u| {
        complete_chain(u, &chain)
    });
}

const RUST_SOURCE: &str = r#"
use std::hint::black_box;

#[inline(never)]
fn hot() -> u64 {
    let mut x = 0u64;
    loop {
        x = black_box(x.wrapping_add(1));
        if black_box(false) {
            return x;
        }
    }
}

#[inline(never)]
fn b() -> u64 {
    black_box(hot()) + 1
}

#[inline(never)]
fn a() -> u64 {
    black_box(b()) + 1
}

fn main() {
    println!("{}", a());
}
"#;

/// Build `RUST_SOURCE` as a release binary (opt-level 3, no frame
/// pointers, line tables only, the default linker: rust-lld, whose layout
/// maps text from a file offset inside the previous segment), run it and
/// profile it.
fn profile_rust_release() -> Profiled {
    let dir = tempdir();
    let src = dir.path().join("main.rs");
    fs::write(&src, RUST_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_rust");
    let mut cmd = Command::new("rustc");
    cmd.args([
        "--edition",
        "2021",
        "--crate-name",
        "unwind_test",
        "-C",
        "opt-level=3",
        "-C",
        "debuginfo=line-tables-only",
        "-o",
    ])
    .arg(&bin)
    .arg(&src);
    build(cmd, "rustc");
    let target = Target::run(&bin);
    profile(&target, "2")
}

/// Whether `user` is the Rust chain, complete: `_start`, libc start-up,
/// the C `main`, std's `lang_start` frames, then exactly `leaf` (frames
/// named by `name`; inlined `black_box` frames, which may follow any
/// frame, left out).
fn rust_chain(user: &[&str], leaf: &[&str], name: impl Fn(&str) -> String) -> bool {
    let u: Vec<String> = user
        .iter()
        .filter(|f| !f.contains("black_box"))
        .map(|f| name(f))
        .collect();
    let Some(main_at) = u.iter().position(|f| f == "main") else {
        return false;
    };
    u[0] == "_start"
        && u[..main_at]
            .iter()
            .all(|f| LIBC_START_FRAMES.contains(&f.as_str()))
        && u.len() >= main_at + 1 + leaf.len()
        && u[u.len() - leaf.len()..]
            .iter()
            .zip(leaf)
            .all(|(f, l)| *f == name(l))
}

/// The Rust chain, its functions' paths as the binary's symbol table has them.
const RUST_LEAF: &[&str] = &[
    "unwind_test::main",
    "unwind_test::a",
    "unwind_test::b",
    "unwind_test::hot",
];

/// A Rust release binary: `unwind_test::main -> a -> b -> hot`, complete
/// from `_start` through `std::rt::lang_start` and the C `main`. Names are
/// compared without their crate path (see `rust_release_names_qualified`).
#[test]
fn rust_release_chain() {
    let _serial = serial();
    let p = profile_rust_release();
    assert_chain(
        &p,
        "lsw_uw_rust",
        "_start;[libc start;]main;..(std::rt::lang_start)..;[unwind_test::]main;a;b;hot \
         (black_box inline frames aside)",
        |u| {
            rust_chain(u, RUST_LEAF, |f| {
                f.strip_prefix("unwind_test::").unwrap_or(f).to_string()
            })
        },
    );
}

/// The same Rust chain with full paths: `unwind_test::a`, not `a`.
#[test]
fn rust_release_names_qualified() {
    let _serial = serial();
    let p = profile_rust_release();
    assert_chain(
        &p,
        "lsw_uw_rust",
        "_start;[libc start;]main;..(std::rt::lang_start)..;unwind_test::main;unwind_test::a;\
         unwind_test::b;unwind_test::hot (black_box inline frames aside)",
        |u| rust_chain(u, RUST_LEAF, str::to_string),
    );
}

/// Profile `main -> a -> big_frame -> hot` where `big_frame` has a
/// `kib` KiB array on its stack, built with stack-clash protection as
/// hardened distributions do (its probe loop is an unsupported rule, the
/// call site is not). The table must hold the large CFA offset and the
/// chain must be complete.
fn stack_frame_chain(name: &str, kib: u64) {
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
__attribute__((noinline)) void hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void big_frame(void) {{
    volatile char buf[{kib} * 1024];
    buf[0] = 1;
    buf[sizeof buf - 1] = 2;
    hot();
    sink += buf[0] + buf[sizeof buf - 1];
}}
__attribute__((noinline)) void a(void) {{ big_frame(); sink++; }}
int main(void) {{ a(); sink++; return 0; }}
"
    );
    let mut flags = NO_FP.to_vec();
    flags.push("-fstack-clash-protection");
    let program = compile(name, &source, &flags);

    let shown = run(&["show-unwind", s(&program.path)], TIMEOUT);
    shown.assert_success();
    let largest = shown
        .stdout
        .lines()
        .filter(|l| l.starts_with("0x"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(1)?
                .strip_prefix("rsp+")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    assert!(
        largest >= kib * 1024,
        "no row with CFA = rsp + {kib} KiB or more in the table:\n{shown}"
    );

    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let chain = ["main", "a", "big_frame", "hot"];
    assert_chain(&p, &program.name, &describe(&chain), |u| {
        complete_chain(u, &chain)
    });
}

/// A 100 KiB frame (CFA = rsp + 102416, stored scaled) in the chain.
#[test]
fn big_stack_frame() {
    let _serial = serial();
    stack_frame_chain("lsw_uw_big", 100);
}

/// A 600 KiB frame: a scaled CFA offset above 16 bits (the high bits in
/// `cfa_type`), which the row format allows up to 8 MiB.
#[test]
fn huge_stack_frame_600k() {
    let _serial = serial();
    stack_frame_chain("lsw_uw_huge", 600);
}

/// `spin` is inlined into `run` and also kept out of line (called through
/// a function pointer), so the symbol table names it.
const RUST_INLINED_SOURCE: &str = r#"
use std::hint::black_box;

mod outer {
    pub mod inner {
        #[inline]
        pub fn spin(n: u64) -> u64 {
            let mut x = 0u64;
            for i in 0..n {
                x = std::hint::black_box(x.wrapping_add(i));
            }
            x
        }
    }
}

#[inline(never)]
fn run(n: u64) -> u64 {
    let mut t = 0u64;
    loop {
        t = t.wrapping_add(outer::inner::spin(n));
        if black_box(false) {
            return t;
        }
    }
}

fn main() {
    let copy: fn(u64) -> u64 = black_box(outer::inner::spin);
    let n = black_box(1000u64);
    println!("{}", copy(n) + run(n));
}
"#;

/// A Rust release binary with line tables only (cargo's `debug =
/// "line-tables-only"`), whose DWARF names functions without their module
/// (`spin`, `run`): the frame of `spin` inlined into `run` carries the
/// full path the symbol table gives its out-of-line copy, as `run`'s own
/// frame does, below a complete stack.
#[test]
fn rust_inlined_frames_have_full_paths() {
    let _serial = serial();
    let dir = tempdir();
    let src = dir.path().join("main.rs");
    fs::write(&src, RUST_INLINED_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_rsinl");
    let mut cmd = Command::new("rustc");
    cmd.args(["--edition", "2021", "--crate-name", "inline_test"])
        .args(["-C", "opt-level=3", "-C", "debuginfo=line-tables-only"])
        .args(["-C", "codegen-units=1", "-o"])
        .arg(&bin)
        .arg(&src);
    build(cmd, "rustc");
    let target = Target::run(&bin);
    let p = profile(&target, "2");
    let chain = [
        "inline_test::main",
        "inline_test::run",
        "inline_test::outer::inner::spin",
    ];
    assert_chain(
        &p,
        "lsw_uw_rsinl",
        "_start;..;inline_test::main;inline_test::run;inline_test::outer::inner::spin;..",
        |u| {
            let u: Vec<&str> = u
                .iter()
                .copied()
                .filter(|f| !f.contains("black_box"))
                .collect();
            u.first() == Some(&"_start") && u.windows(3).any(|w| w == chain)
        },
    );
}
