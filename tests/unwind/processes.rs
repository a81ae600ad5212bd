//! Complete stacks through what processes do: dlopen, signal handlers,
//! vfork, deleted binaries, pid namespaces, Go, `show-unwind`, and the
//! frame limit.

use super::*;

/// A library `dlopen`ed 2 s after profiling started: its new mapping is
/// found while running and its table loaded, so the spin inside it gets
/// complete stacks from `_start` through `main`.
#[test]
pub(super) fn dlopen_after_start() {
    let _serial = serial();
    let lib_source = format!(
        "{STOP_FLAG}
__attribute__((noinline)) void lib_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void lib_entry(void) {{ lib_hot(); sink++; }}
"
    );
    let mut lib_flags = vec!["-shared", "-fPIC"];
    lib_flags.extend_from_slice(NO_FP);
    let lib = compile("liblswuw.so", &lib_source, &lib_flags);
    let main_source = format!(
        r#"{DIE_WITH_PARENT}
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
__attribute__((noinline)) void spin(double seconds) {{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {{
        for (int i = 0; i < 100000; i++) sink++;
        clock_gettime(CLOCK_MONOTONIC, &now);
    }} while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}}
int main(void) {{
    char go;
    if (read(0, &go, 1) != 1) return 1;
    spin(2.0);
    void *lib = dlopen("{}", RTLD_NOW);
    if (!lib) {{ fprintf(stderr, "%s\n", dlerror()); return 1; }}
    void (*entry)(void) = (void (*)(void))dlsym(lib, "lib_entry");
    if (!entry) return 1;
    entry();
    sink++;
    return 0;
}}
"#,
        lib.path.display()
    );
    let program = compile("lsw_uw_dlopen", &main_source, NO_FP);
    let mut target = Target::run(&program.path);

    let dir = tempdir();
    let mut profiler = Lightswitch::spawn(&profile_args(target.pid, "5", dir.path()));
    profiler.expect_sampling();
    // Sampling has started: the library is loaded 2 s from now.
    target.release();
    let p = finish(profiler.wait(TIMEOUT), dir.path());

    let in_lib = |u: &[&str]| u.last() == Some(&"lib_hot");
    let lib_samples = tally(&p.stacks, &program.name, in_lib);
    let chain = ["main", "lib_entry", "lib_hot"];
    let complete = tally(&p.stacks, &program.name, |u| complete_chain(u, &chain));
    let mine = of_process(&p.stacks, &program.name);
    assert!(
        lib_samples.matching >= MIN_SAMPLES,
        "only {} samples in lib_hot (the library was loaded 2 s into a 5 s run):\n{}\n{}",
        lib_samples.matching,
        show(&mine),
        p.out
    );
    assert!(
        complete.matching as f64 >= 0.9 * lib_samples.matching as f64,
        "only {} of {} samples in lib_hot are complete ({}):\n{}\n{}",
        complete.matching,
        lib_samples.matching,
        describe(&chain),
        show(&mine),
        p.out
    );
    // Before the dlopen the program spins in `spin` (and the vDSO's
    // clock_gettime, and ld.so while loading): those stacks are complete
    // from `_start` through `main` too.
    let t = tally(&p.stacks, &program.name, |u| {
        u.iter()
            .position(|&f| f == "main")
            .is_some_and(|m| m + 1 < u.len() && complete_chain(&u[..=m], &["main"]))
    });
    assert_share(
        &p,
        &program.name,
        "complete from _start through main",
        0.95,
        t,
    );
}

/// A SIGALRM handler that never returns: the walk goes through the
/// signal frame (`__restore_rt`) into the interrupted function and `main`.
#[test]
pub(super) fn signal_handler_frame() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
#include <signal.h>
#include <unistd.h>
__attribute__((noinline)) void handler_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void handler(int sig) {{ handler_hot(); sink += sig; }}
__attribute__((noinline)) void interrupted(void) {{ while (!stop) sink++; }}
int main(void) {{
    signal(SIGALRM, handler);
    alarm(1);
    interrupted();
    sink++;
    return 0;
}}
"
    );
    let program = compile("lsw_uw_signal", &source, NO_FP);
    let target = Target::run(&program.path);
    // The alarm fires 1 s after start; from then on the handler spins.
    thread::sleep(Duration::from_millis(1300));
    let p = profile(&target, "2");
    assert_chain(
        &p,
        &program.name,
        "_start;[libc start;]main;interrupted;<signal trampoline>;handler;handler_hot",
        |u| {
            let n = u.len();
            n >= 6
                && complete_chain(&u[..n - 3], &["main", "interrupted"])
                && (u[n - 3] == "__restore_rt" || u[n - 3].starts_with("libc"))
                && u[n - 2..] == ["handler", "handler_hot"]
        },
    );
}

/// glibc's x86-64 `vfork` pops its return address into rdi around the
/// system call (CFI `DW_CFA_register 16, 5`): samples taken while the
/// parent is in that call (the kernel copying it into the child) walk
/// through rdi, as the interrupted registers hold it, on to `main`.
#[test]
pub(super) fn vfork_return_address_in_a_register() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
#include <sys/wait.h>
#include <unistd.h>
__attribute__((noinline)) void spawn_one(void) {{
    pid_t child = vfork();
    if (child == 0)
        _exit(0);
    if (child > 0)
        waitpid(child, 0, 0);
    sink++;
}}
__attribute__((noinline)) void spawner(void) {{ while (!stop) spawn_one(); sink++; }}
int main(void) {{
    spawner();
    return 0;
}}
"
    );
    let program = compile("lsw_uw_vfork", &source, NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    let in_vfork = |u: &[&str]| u.last().is_some_and(|leaf| leaf.contains("vfork"));
    let chain = ["main", "spawner", "spawn_one"];
    let samples = tally(&p.stacks, &program.name, in_vfork);
    let complete = tally(&p.stacks, &program.name, |u| {
        in_vfork(u) && complete_chain(&u[..u.len() - 1], &chain)
    });
    let mine = of_process(&p.stacks, &program.name);
    assert!(
        samples.matching >= 20,
        "only {} samples in vfork:\n{}\n{}",
        samples.matching,
        show(&mine),
        p.out
    );
    assert!(
        complete.matching * 100 >= samples.matching * 95,
        "only {} of {} samples in vfork are {}; vfork:\n{}\n{}",
        complete.matching,
        samples.matching,
        describe(&chain),
        show(&mine),
        p.out
    );
}

/// A coroutine on a heap-allocated `makecontext` stack: the walk ends at
/// glibc's trampoline (`__start_context`, whose first byte `makecontext`
/// put on the stack as the return address), as complete, not as
/// `frame_pointer` or `stack_copy_ended` after frame pointers the
/// coroutine never set up.
#[test]
fn makecontext_stack_ends_at_the_trampoline() {
    let _serial = serial();
    let source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
#include <stdlib.h>
#include <ucontext.h>
static ucontext_t main_context, coroutine;
__attribute__((noinline)) void co_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void co_b(void) {{ co_hot(); sink++; }}
__attribute__((noinline)) void co_a(void) {{ co_b(); sink++; }}
__attribute__((noinline)) void co_entry(void) {{ co_a(); sink++; }}
int main(void) {{
    size_t size = 256 * 1024;
    getcontext(&coroutine);
    coroutine.uc_stack.ss_sp = malloc(size);
    coroutine.uc_stack.ss_size = size;
    coroutine.uc_link = &main_context;
    makecontext(&coroutine, co_entry, 0);
    swapcontext(&main_context, &coroutine);
    return 0;
}}
"
    );
    let program = compile("lsw_uw_mkctx", &source, NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    assert_chain(
        &p,
        &program.name,
        "<makecontext trampoline in libc>;co_entry;co_a;co_b;co_hot (complete)",
        |u| {
            u.len() == 5
                && (u[0].starts_with("libc") || u[0] == "__start_context")
                && u[1..] == ["co_entry", "co_a", "co_b", "co_hot"]
        },
    );
    let complete = p.unwind.get("complete").copied().unwrap_or(0);
    let all: u64 = p.unwind.values().sum();
    let waited = p.unwind.get("no_table").copied().unwrap_or(0);
    assert!(
        complete * 100 >= (all - waited) * 95,
        "only {complete} of {all} walks complete:\n{}",
        p.out
    );
}

/// Lazy binding on every call (`LD_BIND_NOT=1`: the resolved address is
/// never written back): the samples land in glibc's trampoline
/// `_dl_runtime_resolve_xsave*`, whose CFA is rbx + 56 while it realigns
/// rsp, and in `_dl_fixup` and the symbol lookup it calls, which save that
/// rbx. Every stack goes through the trampoline to `main;a;b`, complete.
#[test]
pub(super) fn lazy_binding_trampoline_cfa_in_rbx() {
    let _serial = serial();
    let lib_source = "volatile unsigned long lib_sink;
__attribute__((noinline)) void lib_noop(void) { lib_sink++; }
";
    let mut lib_flags = vec!["-shared", "-fPIC"];
    lib_flags.extend_from_slice(NO_FP);
    let lib = compile("liblswbind.so", lib_source, &lib_flags);
    let main_source = format!(
        "{DIE_WITH_PARENT}{STOP_FLAG}
void lib_noop(void);
__attribute__((noinline)) void b(void) {{ while (!stop) {{ lib_noop(); sink++; }} }}
__attribute__((noinline)) void a(void) {{ b(); sink++; }}
int main(void) {{ a(); return 0; }}
"
    );
    // The library goes before the source on gcc's command line: keep it
    // even where the linker defaults to --as-needed.
    let mut flags = NO_FP.to_vec();
    let link = lib.path.display().to_string();
    flags.extend(["-Wl,--no-as-needed", &link]);
    let program = compile("lsw_uw_bind", &main_source, &flags);
    let mut cmd = Command::new(&program.path);
    cmd.env("LD_BIND_NOT", "1");
    let target = Target::spawn(cmd, &program.name, false);
    let p = profile(&target, "2");
    let through_resolver = |u: &[&str]| {
        let Some(main) = u.iter().position(|f| *f == "main") else {
            return false;
        };
        u.first() == Some(&"_start")
            && u[main..].starts_with(&["main", "a", "b"])
            && u.get(main + 3)
                .is_some_and(|f| f.starts_with("_dl_runtime_resolve"))
    };
    let t = tally(&p.stacks, &program.name, through_resolver);
    // Most of the time goes to the trampoline's xsave/xrstor and the lookup.
    assert_share(
        &p,
        &program.name,
        "_start;[libc start;]main;a;b;_dl_runtime_resolve_xsave*[;...]",
        0.9,
        t,
    );
    let unsupported = p.unwind.get("unsupported_rule").copied().unwrap_or(0);
    assert_eq!(unsupported, 0, "walks stopped by a rule:\n{}", p.out);
}

/// A binary deleted after it started: its table is built from the file
/// the process still maps, and its frames are symbolized.
#[test]
fn deleted_binary() {
    let _serial = serial();
    let program = compile("lsw_uw_chain", &c_chain_source(), NO_FP);
    let dir = tempdir();
    let copy = dir.path().join("lsw_uw_deleted");
    fs::copy(&program.path, &copy).unwrap();
    let target = Target::run(&copy);
    fs::remove_file(&copy).unwrap();
    let p = profile(&target, "2");
    assert_chain(&p, "lsw_uw_deleted", &describe(C_CHAIN), |u| {
        complete_chain(u, C_CHAIN)
    });
}

/// A process in its own pid namespace (and /proc), profiled by its host
/// pid: symbolized and complete.
#[test]
fn pid_namespace() {
    let _serial = serial();
    let program = compile("lsw_uw_pidns", &c_chain_source(), NO_FP);
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(&program.path);
    let target = Target::spawn(cmd, &program.name, true);
    assert_ne!(target.pid, target.child.id());
    let ns_pid = fs::read_to_string(format!("/proc/{}/status", target.pid))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:").map(str::to_string))
        .unwrap_or_default();
    assert!(
        ns_pid.split_whitespace().last() == Some("1"),
        "{} should be pid 1 in its namespace (NSpid: {ns_pid})",
        program.name
    );
    let p = profile(&target, "2");
    assert_chain(&p, &program.name, &describe(C_CHAIN), |u| {
        complete_chain(u, C_CHAIN)
    });
}

const GO_SOURCE: &str = r#"package main

var sink uint64
var stop bool

//go:noinline
func hot() {
	for !stop {
		sink++
	}
}

//go:noinline
func b() {
	hot()
	sink++
}

//go:noinline
func a() {
	b()
	sink++
}

func main() {
	a()
}
"#;

/// A Go program: `main.main -> main.a -> main.b -> main.hot`, rooted at
/// the goroutine's `runtime.goexit -> runtime.main`.
#[test]
pub(super) fn go_frame_pointers() {
    let _serial = serial();
    if Command::new("go").arg("version").output().is_err() {
        eprintln!(
            "SKIPPED go_frame_pointers: `go` is not on PATH (the setup script installs golang-go)"
        );
        return;
    }
    let dir = tempdir();
    let module = dir.path().join("src");
    fs::create_dir(&module).unwrap();
    fs::write(module.join("go.mod"), "module t\n\ngo 1.19\n").unwrap();
    fs::write(module.join("main.go"), GO_SOURCE).unwrap();
    let bin = dir.path().join("lsw_uw_go");
    let mut cmd = Command::new("go");
    cmd.current_dir(&module)
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .env("GOCACHE", dir.path().join("cache"))
        .env("GOPATH", dir.path().join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0");
    build(cmd, "go build");
    let target = Target::run(&bin);
    let p = profile(&target, "2");
    let chain = [
        "runtime.goexit",
        "runtime.main",
        "main.main",
        "main.a",
        "main.b",
        "main.hot",
    ];
    assert_chain(&p, "lsw_uw_go", &chain.join(";"), |u| u == chain);
}

/// The path of the libc this test process runs with.
fn libc_path() -> PathBuf {
    let maps = fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"))
        })
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

/// `show-unwind` prints libc's table (sorted rows, then rows, pages and
/// bytes that agree with them) and rejects a file that is not ELF.
#[test]
fn show_unwind_subcommand() {
    let libc = libc_path();
    let out = run(&["show-unwind", s(&libc)], TIMEOUT);
    out.assert_success();
    let addresses: Vec<u64> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("0x"))
        .map(|l| {
            let hex = l.split_whitespace().next().unwrap();
            u64::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad row address in {l:?}"))
        })
        .collect();
    let field = |name: &str| -> u64 {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` line in the summary:\n{}", out.stdout))
    };
    let rows = field("rows: ");
    let pages = field("pages: ");
    let bytes = field("bytes: ");
    let head: String = out.stdout.lines().take(5).collect::<Vec<_>>().join("\n");
    assert!(
        rows > 1000,
        "libc has thousands of FDEs, got {rows} rows:\n{head}"
    );
    assert_eq!(
        addresses.len() as u64,
        rows,
        "one printed row per counted row:\n{head}"
    );
    assert!(
        addresses.windows(2).all(|w| w[0] < w[1]),
        "rows must be sorted by address:\n{head}"
    );
    assert!(pages >= 1 && pages <= rows, "{pages} pages for {rows} rows");
    assert!(
        bytes >= rows * 8,
        "{bytes} bytes cannot hold {rows} rows of 8 bytes"
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("unsupported rules:")),
        "no `unsupported rules:` line:\n{}",
        out.stdout
    );

    let bad = run(&["show-unwind", "/etc/hostname"], TIMEOUT);
    assert_eq!(bad.status.code(), Some(1), "{bad}");
    bad.assert_error(&["error:"]);
}

/// Recursion 2000 deep: the walk stops at 1024 user frames and the sample
/// is marked `[unwind: truncated]`, yet counted with the frames it has.
#[test]
pub(super) fn truncated_beyond_limit() {
    let _serial = serial();
    let program = compile("lsw_uw_rec2000", &recursion_source(2000), NO_FP);
    let target = Target::run(&program.path);
    let p = profile(&target, "2");
    const LIMIT: usize = 1024;
    let t = tally(&p.stacks, &program.name, |u| {
        u.len() == LIMIT + 1
            && u[0] == "[unwind: truncated]"
            && u[LIMIT] == "hot"
            && u[1..LIMIT].iter().all(|&f| f == "recurse")
    });
    assert_share(
        &p,
        &program.name,
        "[unwind: truncated] followed by the 1024 innermost frames (1023 recurse, hot)",
        0.95,
        t,
    );
    let truncated = p.unwind.get("truncated").copied().unwrap_or(0);
    assert!(
        truncated >= t.matching,
        "the summary counts {truncated} truncated walks, the profile has {}:\n{}",
        t.matching,
        p.out
    );
}
