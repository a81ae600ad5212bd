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

mod common;

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

/// `node --perf-basic-prof` names its JavaScript functions in its perf
/// map: `outerJsWork` (into which the optimizing compiler inlines
/// `innerJsWork`) or `innerJsWork` is named on nearly every sample.
#[test]
fn node_perf_basic_prof() {
    let _serial = serial();
    if Command::new("node").arg("--version").output().is_err() {
        eprintln!("skipped: node is not installed (scripts/setup.sh installs nodejs)");
        return;
    }
    let dir = tempdir();
    let script = dir.path().join("jit.js");
    fs::write(
        &script,
        "function innerJsWork(n) { let s = 0; for (let i = 0; i < n; i++) s = (s + i * 31) | 0; return s; }\n\
         function outerJsWork() { let t = 0; for (let k = 0; k < 50; k++) t ^= innerJsWork(100000); return t; }\n\
         const end = Date.now() + 20000; let x = 0;\n\
         while (Date.now() < end) x ^= outerJsWork();\n\
         console.log(x);\n",
    )
    .expect("write script");
    let mut node = Command::new("node")
        .arg("--perf-basic-prof")
        .arg(&script)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("node");
    let pid = node.id();
    let map = format!("/tmp/perf-{pid}.map");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !fs::read_to_string(&map).is_ok_and(|m| m.contains("innerJsWork")) {
        assert!(
            Instant::now() < deadline,
            "node wrote no map naming innerJsWork"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    let (stacks, out) = profile(pid, comm.trim_end());
    let _ = node.kill();
    let _ = node.wait();
    let _ = fs::remove_file(&map);
    let all = total(&stacks);
    let named: u64 = stacks
        .iter()
        .filter(|(frames, _)| frames.iter().any(|f| f.contains("JsWork")))
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 100, "only {all} samples:\n{out}");
    assert!(
        named as f64 >= 0.9 * all as f64,
        "{named} of {all} samples name a JsWork function:\n{}\n{out}",
        show(&refs)
    );
}

/// A CPython of at least 3.`minor`: `python3.13`, `python3.12` or
/// `python3` on the PATH, else one of pyenv's versions. 3.12 writes a
/// perf map naming each Python function's trampoline (`-X perf`); 3.13
/// also a jitdump with their unwinding information (`-X perf_jit`).
fn python_at_least(minor: u32) -> Option<String> {
    let pyenv = std::env::var("PYENV_ROOT")
        .unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap_or_default()));
    let mut candidates: Vec<String> = ["python3.13", "python3.12", "python3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Ok(versions) = fs::read_dir(format!("{pyenv}/versions")) {
        let mut found: Vec<String> = versions
            .flatten()
            .map(|v| format!("{}/bin/python3", v.path().display()))
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev());
    }
    candidates.into_iter().find(|python| {
        Command::new(python)
            .arg("-c")
            .arg(format!(
                "import sys; sys.exit(sys.version_info < (3, {minor}))"
            ))
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// CPython 3.12+ `-X perf` names the trampolines of Python functions in
/// its perf map; most samples carry `inner_py_work`/`outer_py_work`. Its
/// perf map carries no unwind information (`-X perf_jit`'s jitdump does:
/// [`python_x_perf_jit`]), so the documented limit below stays.
#[test]
fn python_x_perf() {
    let _serial = serial();
    let Some(python) = python_at_least(12) else {
        eprintln!("skipped: no CPython 3.12 or later found (python3.12, python3.13, pyenv)");
        return;
    };
    let dir = tempdir();
    let script = dir.path().join("work.py");
    fs::write(
        &script,
        "import time\n\
         def inner_py_work(n):\n    s = 0\n    for i in range(n):\n        s = (s + i * 31) & 0xffffffff\n    return s\n\
         def outer_py_work():\n    t = 0\n    for _ in range(5):\n        t ^= inner_py_work(20000)\n    return t\n\
         end = time.time() + 20\nx = 0\nwhile time.time() < end:\n    x ^= outer_py_work()\nprint(x)\n",
    )
    .expect("write script");
    let (stacks, out) = profile_python(&python, "perf", &script, "inner_py_work");
    let all = total(&stacks);
    let named: u64 = stacks
        .iter()
        .filter(|(frames, _)| {
            frames
                .iter()
                .any(|f| f.starts_with("py::inner_py_work:") || f.starts_with("py::outer_py_work:"))
        })
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    assert!(all >= 50, "only {all} samples:\n{out}");
    // CPython 3.12 and 3.13's trampolines (`sub $8,%rsp; call *%rcx`) keep
    // no frame pointer and have no CFI: the walk ends at the innermost
    // Python function's trampoline (perf's DWARF walk does the same), so a
    // sample counts when it names either function; outer Python frames are
    // not asked for. Samples in the interpreter's own start-up name neither.
    assert!(
        named as f64 >= 0.6 * all as f64,
        "{named} of {all} samples name a py_work function:\n{}\n{out}",
        show(&refs)
    );
}

/// CPython 3.13+ `-X perf_jit`: a chain of Python functions (outer ->
/// middle -> inner) whose trampolines the jitdump names and describes
/// with unwinding information. At least 90% of the samples carry the
/// three names in order, below the interpreter's `Py_RunMain` (the walk
/// goes through each trampoline by its CFI and on into the interpreter).
/// CPython writes the jitdump through a 4 KiB stdio buffer, so the script
/// compiles 64 more functions after the chain's: their records push the
/// chain's into the file (as any program that goes on compiling does).
#[test]
fn python_x_perf_jit() {
    let _serial = serial();
    let Some(python) = python_at_least(13) else {
        eprintln!("skipped: no CPython 3.13 or later found (python3.13, pyenv)");
        return;
    };
    let dir = tempdir();
    let script = dir.path().join("chain.py");
    fs::write(
        &script,
        "import time\n\
         def inner_py_jit(n):\n    s = 0\n    for i in range(n):\n        s = (s + i * 31) & 0xffffffff\n    return s\n\
         def middle_py_jit(n):\n    return inner_py_jit(n)\n\
         def outer_py_jit():\n    t = 0\n    for _ in range(5):\n        t ^= middle_py_jit(20000)\n    return t\n\
         outer_py_jit()\n\
         for i in range(64):\n    exec(f'def flush_{i}(): return {i}\\nflush_{i}()')\n\
         end = time.time() + 20\nx = 0\nwhile time.time() < end:\n    x ^= outer_py_jit()\nprint(x)\n",
    )
    .expect("write script");
    let (stacks, out) = profile_python(&python, "perf_jit", &script, "inner_py_jit");
    let chain = [
        "Py_RunMain",
        "py::outer_py_jit:",
        "py::middle_py_jit:",
        "py::inner_py_jit:",
    ];
    let in_order = |frames: &[String]| {
        let mut want = chain.iter().peekable();
        for frame in user_frames(frames) {
            if want.peek().is_some_and(|w| frame.starts_with(**w)) {
                want.next();
            }
        }
        want.peek().is_none()
    };
    let all = total(&stacks);
    let hit: u64 = stacks
        .iter()
        .filter(|(frames, _)| in_order(frames))
        .map(|(_, n)| n)
        .sum();
    let refs: Vec<&Stack> = stacks.iter().collect();
    eprintln!("{python} -X perf_jit: {hit} of {all} samples have the chain in order");
    assert!(all >= 100, "only {all} samples:\n{}\n{out}", show(&refs));
    assert!(
        hit as f64 >= 0.9 * all as f64,
        "{hit} of {all} samples have {} in order:\n{}\n{out}",
        chain.join(" .. "),
        show(&refs)
    );
}

/// Runs `python -X option script` and profiles it (with [`profile`]) once
/// the file its option writes (`perf`: `/tmp/perf-PID.map`; `perf_jit`:
/// `/tmp/jit-PID.dump`) names `function`, waiting up to 15 s; removes that
/// file after.
fn profile_python(
    python: &str,
    option: &str,
    script: &Path,
    function: &str,
) -> (Vec<Stack>, String) {
    let mut child = Command::new(python)
        .args(["-X", option])
        .arg(script)
        .stdout(Stdio::null())
        .spawn()
        .expect("python");
    let pid = child.id();
    let _kill = KillOnDrop(&mut child);
    let file = match option {
        "perf" => format!("/tmp/perf-{pid}.map"),
        _ => format!("/tmp/jit-{pid}.dump"),
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let names = |data: Vec<u8>| {
        data.windows(function.len())
            .any(|w| w == function.as_bytes())
    };
    while !fs::read(&file).is_ok_and(names) {
        assert!(
            Instant::now() < deadline,
            "{python} -X {option} wrote no {file} naming {function}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    let profiled = profile(pid, comm.trim_end());
    let _ = fs::remove_file(&file);
    profiled
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
