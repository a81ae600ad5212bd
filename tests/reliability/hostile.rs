//! Hostile neighbours (decision 0013): unprivileged processes (user nobody) whose
//! perf maps and jitdump files try to stall, starve or inflate the root
//! whole-machine profiler, beside a root bystander with a known chain. Each
//! run must end on time, exit 0, keep the bystander's samples, name nothing
//! from a file it must not read, stay within its memory, and count what it
//! refused or cut (the `jit files:` line of the summary).

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::bystander::{self, Bystander};
use crate::common::{self, Lightswitch};

/// A JIT-like program: it maps an anonymous executable page and spins in it.
/// `argv[1]`: a file to map read+exec first (a jitdump's marker), or "".
/// `argv[2]`: its perf map: `none`, `fifo` (a FIFO with no writer),
/// `link:TARGET` (a symlink), or `name:N` (one line naming the page with an
/// N-byte name). It prints the page's address, then spins.
const SPIN: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>
int main(int argc, char **argv) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (argv[1][0]) { int fd = open(argv[1], O_RDONLY); if (fd < 0 || mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 3; }
    unsigned char *page = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    page[0] = 0xeb; page[1] = 0xfe; /* jmp . */
    char path[64]; snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    const char *mode = argv[2];
    if (!strcmp(mode, "fifo")) { if (mkfifo(path, 0644)) return 4; }
    else if (!strncmp(mode, "link:", 5)) { if (symlink(mode + 5, path)) return 5; }
    else if (!strncmp(mode, "name:", 5)) {
        FILE *f = fopen(path, "w"); if (!f) return 6;
        fprintf(f, "%lx 1000 ", (unsigned long)page);
        for (long i = atol(mode + 5); i > 0; i--) fputc('N', f);
        fputc('\n', f); fclose(f);
    }
    printf("%lx\n", (unsigned long)page); fflush(stdout);
    ((void (*)(void))page)();
    return 0;
}
"#;

/// One hostile process, run as nobody; killed (and its perf map removed)
/// on drop.
struct Hostile {
    child: Child,
    page: u64,
}

impl Hostile {
    fn start(spin: &Path, mapped: &str, perf_map: &str) -> Hostile {
        let mut child = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(spin)
            .args([mapped, perf_map])
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux)");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .expect("the page's address");
        let page = u64::from_str_radix(line.trim(), 16).unwrap_or_else(|_| {
            panic!("{perf_map}: no address ({line:?}), {:?}", child.try_wait())
        });
        Hostile { child, page }
    }

    fn perf_map(&self) -> String {
        format!("/tmp/perf-{}.map", self.child.id())
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(self.perf_map());
    }
}

/// What a whole-machine run beside hostile processes gave.
struct Verdict {
    out: common::Output,
    wall: Duration,
    peak_rss_mib: u64,
    folded: String,
    bystander: u64,
    /// The bystander's CPU time over the run.
    bystander_cpu: Duration,
}

/// Profiles the whole machine for 3 s at 999 Hz (folded) while a root
/// bystander runs the chain; samples the profiler's peak RSS (VmHWM)
/// every 20 ms.
fn whole_machine_run(dir: &Path) -> Verdict {
    let bystander = Bystander::start();
    let out_dir = dir.join("out");
    let started = Instant::now();
    let mut profiler = Lightswitch::spawn(&common::folded_run_args("3", &out_dir));
    let status = format!("/proc/{}/status", profiler.pid());
    let mut peak_kib = 0;
    while profiler.is_running() && started.elapsed() < Duration::from_secs(40) {
        if let Some(kib) = fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        }) {
            peak_kib = peak_kib.max(kib);
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = profiler.wait(Duration::from_secs(5));
    let wall = started.elapsed();
    let bystander_cpu = bystander.stop();
    let folded = fs::read_to_string(out_dir.join("folded.txt")).unwrap_or_default();
    let bystander = bystander::samples(&common::parse_folded(&folded));
    Verdict {
        out,
        wall,
        peak_rss_mib: peak_kib / 1024,
        folded,
        bystander,
        bystander_cpu,
    }
}

/// `name=N` of the summary's `jit files:` line.
fn jit_count(stdout: &str, name: &str) -> u64 {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("jit files: "))
        .unwrap_or_else(|| panic!("no `jit files:` line:\n{stdout}"));
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

fn assert_held(v: &Verdict) {
    assert!(v.out.status.success(), "{}", v.out);
    assert!(
        v.wall < Duration::from_secs(13),
        "a 3 s run took {:?}:\n{}",
        v.wall,
        v.out
    );
    // Its CPU time while profiled: a little more than the 3 s sampled.
    bystander::assert_kept(v.bystander, v.bystander_cpu, 999.0, &v.out);
    assert!(
        v.peak_rss_mib < 256,
        "peak RSS {} MiB\n{}",
        v.peak_rss_mib,
        v.out
    );
}

/// A hostile spin program, compiled where nobody can run it.
fn spin_program() -> common::Program {
    let spin = common::compile("spin", SPIN, &["-O1"]);
    common::chmod(spin.dir(), 0o755);
    spin
}

#[test]
fn a_fifo_or_a_symlink_as_a_perf_map_is_refused_without_stalling_the_run() {
    let _serial = common::serial();
    let dir = common::tempdir();
    let spin = spin_program();
    // A root-only file naming the page of the process that links to it:
    // named in the profile only if the symlink were followed.
    let secret = dir.path().join("secret.map");
    let linked = Hostile::start(&spin.path, "", &format!("link:{}", common::s(&secret)));
    fs::write(
        &secret,
        format!("{:x} 1000 SECRET_ROOT_ONLY\n", linked.page),
    )
    .unwrap();
    common::chmod(&secret, 0o600);
    let fifo = Hostile::start(&spin.path, "", "fifo");
    let v = whole_machine_run(dir.path());
    assert_held(&v);
    assert!(
        !v.folded.contains("SECRET_ROOT_ONLY"),
        "followed a symlink as root"
    );
    assert!(jit_count(&v.out.stdout, "refused") >= 2, "{}", v.out);
    drop((linked, fifo));
}

#[test]
fn an_oversized_jitdump_record_and_a_huge_perf_map_name_cost_bounded_time_and_memory() {
    let _serial = common::serial();
    let dir = common::tempdir();
    common::chmod(dir.path(), 0o755);
    let spin = spin_program();
    // A 1 GiB sparse jitdump whose first record claims 0xfffffff0 bytes.
    let dump = dir.path().join("jit-1.dump");
    let mut bytes = Vec::new();
    for v in [0x4A69_5444u32, 1, 40, 62, 0, 1] {
        bytes.extend_from_slice(&v.to_ne_bytes());
    }
    bytes.extend_from_slice(&[0; 16]);
    bytes.extend_from_slice(&0u32.to_ne_bytes());
    bytes.extend_from_slice(&0xffff_fff0u32.to_ne_bytes());
    bytes.extend_from_slice(&7u64.to_ne_bytes());
    fs::write(&dump, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(&dump)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    common::chmod(&dump, 0o644);
    let jitdump = Hostile::start(&spin.path, common::s(&dump), "none");
    // A perf map line whose name is 100 MB.
    let named = Hostile::start(&spin.path, "", "name:100000000");
    let v = whole_machine_run(dir.path());
    assert_held(&v);
    assert!(
        jit_count(&v.out.stdout, "records_skipped") >= 1,
        "{}",
        v.out
    );
    assert!(jit_count(&v.out.stdout, "names_cut") >= 1, "{}", v.out);
    assert!(
        v.folded.len() < 10 << 20,
        "folded output of {} bytes",
        v.folded.len()
    );
    assert!(v.folded.contains("NNNN…[cut]"), "the cut name, marked");
    drop((jitdump, named));
}
