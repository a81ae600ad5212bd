//! Frames in code generated at run time, named from the perf map the
//! generating program writes (`/tmp/perf-PID.map`), profiled end to end as
//! root with real BPF sampling:
//! - a small C program that copies two functions' machine code into
//!   anonymous executable memory, writes their names to its perf map and
//!   runs them: directly, and inside its own PID and mount namespaces with
//!   a private `/tmp` (the map is then only under `/proc/PID/root/tmp`,
//!   named by the process's namespace pid);
//! - the same program naming them in a jitdump file (`jit-PID.dump`) that
//!   it maps executable, the way writers of that format mark it;
//! - `node --perf-basic-prof` running a chain of named JavaScript
//!   functions (skipped, with the reason printed, where node is absent);
//! - CPython 3.12+ `-X perf` (skipped, with the reason printed, where no
//!   such Python is found): named, but its trampolines have no unwind
//!   information, so stacks end at the innermost Python function;
//! - CPython 3.13+ `-X perf_jit` (skipped likewise): its jitdump carries
//!   the trampolines' unwinding information, and stacks go through every
//!   Python function down to the interpreter's `main`.
//!
//! Needs root (BPF, namespaces), gcc, util-linux's `unshare`; node from
//! scripts/setup.sh.

#[path = "../common/mod.rs"]
mod common;
mod runtimes;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;

/// Longest any single profiler run may take before the test gives up.
const TIMEOUT: Duration = Duration::from_secs(60);

/// A program that generates `jit_outer` (frame, call `jit_inner`) and
/// `jit_inner` (frame, count `n` down) into an anonymous mapping, names
/// them in `/tmp/perf-PID.map` and calls `jit_outer` forever from `main`.
fn jit_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static const unsigned char inner[] = {{
    0x55,                   /* push rbp */
    0x48, 0x89, 0xe5,       /* mov rbp, rsp */
    0x48, 0x89, 0xf8,       /* mov rax, rdi */
    0x48, 0xff, 0xc8,       /* 1: dec rax */
    0x75, 0xfb,             /* jnz 1b */
    0x5d,                   /* pop rbp */
    0xc3,                   /* ret */
}};
#define OUTER 64
static const unsigned char outer[] = {{
    0x55,                         /* push rbp */
    0x48, 0x89, 0xe5,             /* mov rbp, rsp */
    0xe8, 0xb7, 0xff, 0xff, 0xff, /* call jit_inner (0 - (OUTER + 9)) */
    0x5d,                         /* pop rbp */
    0xc3,                         /* ret */
}};
int main(void) {{
    unsigned char *code = mmap(0, 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) return 1;
    memcpy(code, inner, sizeof inner);
    memcpy(code + OUTER, outer, sizeof outer);
    if (mprotect(code, 4096, PROT_READ | PROT_EXEC)) return 1;
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (!map) return 1;
    fprintf(map, "%lx %zx jit_inner\n", (unsigned long)code, sizeof inner);
    fprintf(map, "%lx %zx jit_outer\n", (unsigned long)(code + OUTER), sizeof outer);
    fclose(map);
    void (*run)(unsigned long) = (void (*)(unsigned long))(code + OUTER);
    for (;;) run(100000000);
}}
"#
    )
}

/// The same generated functions, named in a jitdump file (`jit-PID.dump`
/// beside the program) that the program maps executable, as writers of the
/// format do for profilers to find it, instead of a perf map.
fn jitdump_source() -> String {
    let source = jit_source();
    let start = source.find("    char path[64];").expect("perf map part");
    let end = source.find("    void (*run)").expect("run part");
    let jitdump = r#"    char exe[4096], path[4200];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 1;
    exe[n] = 0;
    *strrchr(exe, '/') = 0;
    snprintf(path, sizeof path, "%s/jit-%d.dump", exe, (int)getpid());
    FILE *dump = fopen(path, "w+");
    if (!dump) return 1;
    unsigned int header[6] = {0x4A695444, 1, 40, 62, 0, (unsigned int)getpid()};
    unsigned long long stamp_flags[2] = {0, 0};
    fwrite(header, sizeof header, 1, dump);
    fwrite(stamp_flags, sizeof stamp_flags, 1, dump);
    fflush(dump);
    if (mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fileno(dump), 0) == MAP_FAILED) return 1;
    const char *names[2] = {"jd_inner", "jd_outer"};
    unsigned char *addrs[2] = {code, code + OUTER};
    unsigned long long sizes[2] = {sizeof inner, sizeof outer};
    for (int i = 0; i < 2; i++) {
        unsigned int rec[2] = {0, (unsigned int)(16 + 40 + strlen(names[i]) + 1 + sizes[i])};
        unsigned long long stamp = 0;
        unsigned int ids[2] = {(unsigned int)getpid(), (unsigned int)getpid()};
        unsigned long long load[4] = {(unsigned long long)addrs[i], (unsigned long long)addrs[i], sizes[i], (unsigned long long)i};
        fwrite(rec, sizeof rec, 1, dump);
        fwrite(&stamp, sizeof stamp, 1, dump);
        fwrite(ids, sizeof ids, 1, dump);
        fwrite(load, sizeof load, 1, dump);
        fwrite(names[i], strlen(names[i]) + 1, 1, dump);
        fwrite(addrs[i], sizes[i], 1, dump);
    }
    fflush(dump);
"#;
    format!("{}{jitdump}{}", &source[..start], &source[end..])
}

/// Profile process `pid` for 2 s and return its folded stacks (process
/// name `name`) with the run's output text.
fn profile(pid: u32, name: &str) -> (Vec<Stack>, String) {
    let dir = tempdir();
    let pid = pid.to_string();
    let out = run(
        &[
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
        ],
        TIMEOUT,
    );
    out.assert_success();
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let mine: Vec<Stack> = of_process(&stacks, name).into_iter().cloned().collect();
    (mine, out.to_string())
}

/// Samples of `stacks` whose user frames hold `chain` (root to leaf,
/// contiguous).
fn with_chain(stacks: &[Stack], chain: &[&str]) -> u64 {
    stacks
        .iter()
        .filter(|(frames, _)| user_frames(frames).windows(chain.len()).any(|w| w == chain))
        .map(|(_, n)| n)
        .sum()
}

/// Require `chain` in at least 90% of `stacks`' (at least 100) samples.
fn assert_chain(stacks: &[Stack], chain: &[&str], out: &str) {
    let all = total(stacks);
    let hit = with_chain(stacks, chain);
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 100, "only {all} samples:\n{}\n{out}", show(&refs));
    assert!(
        hit as f64 >= 0.9 * all as f64,
        "{hit} of {all} samples have {}:\n{}\n{out}",
        chain.join(";"),
        show(&refs)
    );
}

/// Wait until process `pid`'s perf map (as it sees it) names `jit_outer`.
fn wait_for_map(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ns_pid = fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))?
                    .split_whitespace()
                    .last()?
                    .parse::<u32>()
                    .ok()
            });
        let map = ns_pid
            .and_then(|n| fs::read_to_string(format!("/proc/{pid}/root/tmp/perf-{n}.map")).ok());
        if map.is_some_and(|m| m.contains("jit_outer")) {
            return;
        }
        assert!(Instant::now() < deadline, "no perf map for {pid} in 10 s");
        thread::sleep(Duration::from_millis(20));
    }
}

/// The generated functions are named from the perf map, and the walk goes
/// on through their frames into `main`.
#[test]
fn perf_map_names_generated_code() {
    let _serial = serial();
    let program = compile("lsw_jit", &jit_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    wait_for_map(workload.pid());
    let (stacks, out) = profile(workload.pid(), &program.name);
    let _ = fs::remove_file(format!("/tmp/perf-{}.map", workload.pid()));
    assert_chain(&stacks, &["main", "jit_outer", "jit_inner"], &out);
}

/// Generated functions named only in a jitdump file the process mapped.
#[test]
fn jitdump_names_generated_code() {
    let _serial = serial();
    let program = compile("lsw_jitdump", &jitdump_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    let dump = program.dir().join(format!("jit-{}.dump", workload.pid()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs::read(&dump).is_ok_and(|d| d.windows(8).any(|w| w == b"jd_outer")) {
        assert!(
            Instant::now() < deadline,
            "no jitdump at {}",
            dump.display()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let (stacks, out) = profile(workload.pid(), &program.name);
    assert_chain(&stacks, &["main", "jd_outer", "jd_inner"], &out);
}

/// A process in its own PID and mount namespaces writes its perf map to
/// its private `/tmp` under its namespace pid; it is found there.
#[test]
fn perf_map_inside_pid_and_mount_namespaces() {
    let _serial = serial();
    let program = compile("lsw_jitns", &jit_source(), FP_FLAGS);
    // Outside /tmp, which the namespace's own tmpfs hides.
    let outside = tempfile::Builder::new()
        .prefix("lsw-test-")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp");
    let binary = outside.path().join(&program.name);
    fs::copy(&program.path, &binary).expect("copy the program");
    let script = format!("mount -t tmpfs tmpfs /tmp && exec {}", s(&binary));
    let mut unshare = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--mount",
            "--mount-proc",
            "sh",
            "-c",
            &script,
        ])
        .stdin(Stdio::null())
        .spawn()
        .expect("running unshare (util-linux)");
    let _kill = KillOnDrop(&mut unshare);
    let pid = find_process(&program.name);
    wait_for_map(pid);
    assert!(
        !std::path::Path::new(&format!("/tmp/perf-{pid}.map")).exists(),
        "the map must be visible only inside the namespace"
    );
    let (stacks, out) = profile(pid, &program.name);
    assert_chain(&stacks, &["main", "jit_outer", "jit_inner"], &out);
}

/// The pid (as this test sees it) of the process whose `comm` is `name`,
/// waiting up to 10 s for it to appear.
fn find_process(name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = fs::read_dir("/proc").ok().and_then(|entries| {
            entries.flatten().find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let comm = fs::read_to_string(e.path().join("comm")).ok()?;
                (comm.trim_end() == name).then_some(pid)
            })
        });
        if let Some(pid) = found {
            return pid;
        }
        assert!(Instant::now() < deadline, "{name} did not start in 10 s");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills (and reaps) a child when dropped.
struct KillOnDrop<'a>(&'a mut Child);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// In the flame graph, generated code is green and the program's own
/// functions yellow (colours by frame kind, read back from the SVG with a
/// real parser), and the title names the pid and its process.
#[test]
fn flame_graph_colours_generated_code_green() {
    let _serial = serial();
    let program = compile("lsw_jit_svg", &jit_source(), FP_FLAGS);
    let workload = Workload::spawn(&program);
    wait_for_map(workload.pid());
    let dir = tempdir();
    let out = run(
        &[
            "-p",
            &workload.pid_arg(),
            "-d",
            "1500ms",
            "-F",
            "499",
            "--profile-path",
            s(dir.path()),
        ],
        TIMEOUT,
    );
    let _ = fs::remove_file(format!("/tmp/perf-{}.map", workload.pid()));
    out.assert_success();
    let svg = fs::read_to_string(dir.path().join("flamegraph.svg")).unwrap();
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(&svg, options).expect("the SVG parses");
    let title = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("title"))
        .and_then(|n| n.text())
        .unwrap();
    assert_eq!(
        title,
        format!("CPU profile of pid {} (lsw_jit_svg)", workload.pid())
    );
    // The fill of the box named `name` as (r, g, b).
    let fill = |name: &str| -> (u8, u8, u8) {
        let group = doc
            .descendants()
            .filter(|n| n.has_tag_name("g"))
            .find(|g| {
                g.children()
                    .find(|n| n.has_tag_name("title"))
                    .and_then(|t| t.text())
                    .is_some_and(|t| t.starts_with(&format!("{name} (")))
            })
            .unwrap_or_else(|| panic!("no box for {name}"));
        let rect = group.children().find(|n| n.has_tag_name("rect")).unwrap();
        let rgb: Vec<u8> = rect
            .attribute("fill")
            .unwrap()
            .trim_start_matches("rgb(")
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.parse().unwrap())
            .collect();
        (rgb[0], rgb[1], rgb[2])
    };
    for jit in ["jit_outer", "jit_inner"] {
        let (r, g, b) = fill(jit);
        assert!(
            (60..=120).contains(&r) && (170..=220).contains(&g) && (60..=120).contains(&b),
            "{jit}: rgb({r},{g},{b}) is not the JIT green"
        );
    }
    let (r, g, b) = fill("main");
    assert!(
        r >= 230 && (180..=230).contains(&g) && (40..=90).contains(&b),
        "main: rgb({r},{g},{b}) is not the native yellow"
    );
}
