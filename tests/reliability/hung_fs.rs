//! A program run from a FUSE file system whose reads never answer, beside
//! a root bystander: the whole-machine run must sample on, write its
//! profile on time with the bystander's samples, name the program's frames
//! `[read timed out: ...]` and count the object as given up
//! (process/opener.rs, docs/reliability.md).
//!
//! The file system is a small libfuse 3 server compiled here (`fuse3` and
//! `libfuse3-dev`, scripts/setup.sh). It is mounted by root with
//! `allow_other`, as a user's mount would be with `user_allow_other`, and
//! the program runs as nobody. It answers everything until the test
//! switches it: from then on every request of a process whose command line
//! holds a marker (the profile directory of this test's run) is never
//! answered, so that only the profiler under test meets the hang, not
//! other profilers or programs of the machine.
//!
//! A thread of the profiler stays in the kernel's wait for the server's
//! answer, which no signal ends (not even SIGKILL: the kernel waits for a
//! request the server has taken), so the process can only exit once the
//! server answers or goes: the test ends the server after the profile is
//! written, and then the run exits 0.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::{self, Lightswitch, Workload, CHAIN};

/// The FUSE server (see the module docs).
const FUSE_SERVER: &str = r#"
/* A FUSE file system of one file, `/NAME`, with the bytes of FILE. Every
 * request is answered normally until the file TRIGGER exists; from then on
 * a request from a process whose command line holds TRIGGER's contents is
 * never answered (its handler waits for good), as a hung server's. Others'
 * are still answered, so that only the profiler under test meets the hang,
 * not other programs of the machine. Usage: fusehang FILE NAME TRIGGER
 * MOUNTPOINT (in the foreground, one thread per request, allow_other). */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *data;
static off_t size;
static char name[256];
static const char *trigger;

static void hang_once_triggered(void) {
    char marker[256] = {0}, cmdline[8192] = {0}, path[64];
    FILE *t = fopen(trigger, "r");
    if (!t) return;
    size_t m = fread(marker, 1, sizeof marker - 1, t);
    fclose(t);
    if (m == 0) return;
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)fuse_get_context()->pid);
    FILE *c = fopen(path, "r");
    if (!c) return;
    size_t n = fread(cmdline, 1, sizeof cmdline - 1, c);
    fclose(c);
    for (size_t i = 0; i < n; i++) if (!cmdline[i]) cmdline[i] = ' ';
    if (strstr(cmdline, marker))
        for (;;) pause();
}

static int fs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    hang_once_triggered();
    memset(st, 0, sizeof *st);
    if (!strcmp(path, "/")) { st->st_mode = S_IFDIR | 0755; st->st_nlink = 2; return 0; }
    if (!strcmp(path, name)) { st->st_mode = S_IFREG | 0755; st->st_nlink = 1; st->st_size = size; return 0; }
    return -ENOENT;
}

static int fs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    hang_once_triggered();
    if (strcmp(path, "/")) return -ENOENT;
    fill(buf, ".", NULL, 0, 0);
    fill(buf, "..", NULL, 0, 0);
    fill(buf, name + 1, NULL, 0, 0);
    return 0;
}

static int fs_open(const char *path, struct fuse_file_info *fi) {
    hang_once_triggered();
    if (strcmp(path, name)) return -ENOENT;
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EACCES;
    return 0;
}

static int fs_read(const char *path, char *buf, size_t n, off_t off, struct fuse_file_info *fi) {
    (void)path; (void)fi;
    hang_once_triggered();
    if (off >= size) return 0;
    if ((off_t)n > size - off) n = size - off;
    memcpy(buf, data + off, n);
    return n;
}

static const struct fuse_operations ops = {
    .getattr = fs_getattr, .readdir = fs_readdir, .open = fs_open, .read = fs_read,
};

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: fusehang FILE NAME TRIGGER MOUNTPOINT\n"); return 2; }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 1; }
    fseeko(f, 0, SEEK_END); size = ftello(f); rewind(f);
    data = malloc(size);
    if (!data || fread(data, 1, size, f) != (size_t)size) { perror("read"); return 1; }
    fclose(f);
    snprintf(name, sizeof name, "/%s", argv[2]);
    trigger = argv[3];
    char *fargv[] = {argv[0], "-f", "-o", "allow_other,ro,fsname=fusehang", argv[4], NULL};
    return fuse_main(5, fargv, &ops, NULL);
}
"#;

/// The program served from the FUSE mount: prints `ready`, then spins.
const SPIN: &str = r#"
#include <stdio.h>
#include <signal.h>
#include <sys/prctl.h>
__attribute__((noinline)) void spin_on_fuse(void) { for (volatile unsigned long i = 0;; i++) {} }
int main(void) { prctl(PR_SET_PDEATHSIG, SIGKILL); printf("ready\n"); fflush(stdout); spin_on_fuse(); }
"#;

/// The mounted server and the program run from it; both killed and the
/// mount detached on drop.
struct HungMount {
    server: Child,
    spinner: Option<Child>,
    mountpoint: PathBuf,
}

impl Drop for HungMount {
    fn drop(&mut self) {
        if let Some(spinner) = &mut self.spinner {
            let _ = spinner.kill();
            let _ = spinner.wait();
        }
        self.end_server();
    }
}

impl HungMount {
    /// Ends the server: the kernel fails its requests, and the mount is
    /// detached.
    fn end_server(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mountpoint)
            .status();
    }
}

/// Mounts `served` as `/hungspin` under `dir/mnt` and runs it from there as
/// nobody; its requests hang for processes with `marker` in their command
/// line once `dir/hang` holds it.
fn mount_and_run(dir: &Path, server: &Path, served: &Path) -> HungMount {
    let mountpoint = dir.join("mnt");
    fs::create_dir(&mountpoint).unwrap();
    let trigger = dir.join("hang");
    let server = Command::new(server)
        .arg(served)
        .arg("hungspin")
        .arg(&trigger)
        .arg(&mountpoint)
        .stdout(Stdio::null())
        .spawn()
        .expect("the FUSE server");
    let mut mount = HungMount {
        server,
        spinner: None,
        mountpoint: mountpoint.clone(),
    };
    let exe = mountpoint.join("hungspin");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !exe.exists() {
        assert!(
            Instant::now() < deadline,
            "the FUSE file system never came up"
        );
        thread::sleep(Duration::from_millis(20));
    }
    let mut spinner = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .stdout(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(spinner.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready", "{:?}", spinner.try_wait());
    mount.spinner = Some(spinner);
    mount
}

/// Whether a process with `marker` in its command line cannot read `file`
/// within 1 s (`cp FILE MARKER`): the hang is real.
fn read_hangs(file: &Path, marker: &Path) -> bool {
    let mut cp = Command::new("cp").arg(file).arg(marker).spawn().unwrap();
    thread::sleep(Duration::from_secs(1));
    let hung = cp.try_wait().unwrap().is_none();
    // Killed, it stays in the kernel until the server goes; not waited for.
    let _ = cp.kill();
    hung
}

#[test]
fn a_program_on_a_hung_fuse_mount_never_stalls_the_whole_machine_run() {
    let _serial = common::serial();
    let dir = common::tempdir();
    common::chmod(dir.path(), 0o755);
    let server = common::compile(
        "lsw_fusehang",
        FUSE_SERVER,
        &[
            "-O1",
            "-I/usr/include/fuse3",
            "-Wl,--no-as-needed",
            "-lfuse3",
        ],
    );
    let spin = common::compile("hungspin", SPIN, &["-O1"]);
    let bystander_program = common::compile(
        "bystander",
        &common::chain_forever_source(),
        common::FP_FLAGS,
    );
    let mut mount = mount_and_run(dir.path(), &server.path, &spin.path);
    let out_dir = dir.path().join("out-hung-fs-victim");
    fs::write(dir.path().join("hang"), common::s(&out_dir)).unwrap();
    assert!(
        read_hangs(&mount.mountpoint.join("hungspin"), &out_dir.join("x")),
        "the FUSE server answers: the test would prove nothing"
    );
    let bystander = Workload::spawn(&bystander_program);
    let started = Instant::now();
    let mut profiler = Lightswitch::spawn(&[
        "--duration",
        "3",
        "-F",
        "999",
        "--profile-format",
        "folded",
        "--unwind-cache-dir",
        "none",
        "--profile-path",
        common::s(&out_dir),
    ]);
    profiler.expect_sampling();
    // The bystander's CPU time while sampled (about the 3 s of the run).
    let cpu_before = bystander.cpu_time();
    thread::sleep(Duration::from_secs(3));
    let bystander_cpu = bystander.cpu_time() - cpu_before;
    let folded = out_dir.join("folded.txt");
    while !folded.exists() && started.elapsed() < Duration::from_secs(60) && profiler.is_running() {
        thread::sleep(Duration::from_millis(20));
    }
    let written = started.elapsed();
    drop(bystander);
    // Its exit waits for the stuck request (module docs).
    thread::sleep(Duration::from_millis(500));
    mount.end_server();
    let out = profiler.wait(Duration::from_secs(20));
    out.assert_success();
    // A 3 s run: loading the BPF programs and symbolizing take seconds more
    // (up to 20 s measured on a 2-core machine under a load of 20). A
    // stalled run never writes it.
    assert!(
        written < Duration::from_secs(50),
        "a 3 s run wrote its profile after {written:?}:\n{out}"
    );
    let text = fs::read_to_string(&folded).unwrap();
    let stacks = common::parse_folded(&text);
    let bystander: u64 = common::of_process(&stacks, "bystander")
        .iter()
        .filter(|(frames, _)| common::ends_with_chain(&common::user_frames(frames), CHAIN))
        .map(|(_, n)| n)
        .sum();
    let expected = bystander_cpu.as_secs_f64() * 999.0;
    assert!(
        bystander as f64 >= 0.4 * expected,
        "bystander: {bystander} samples for {bystander_cpu:?} of CPU\n{out}"
    );
    let hung: u64 = common::of_process(&stacks, "hungspin")
        .iter()
        .filter(|(frames, _)| {
            frames
                .iter()
                .any(|f| f.starts_with("[read timed out: hungspin]+0x"))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        hung >= 100,
        "{hung} samples of hungspin named as timed out:\n{out}"
    );
    let given_up = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("objects given up: timed_out="))
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok());
    assert!(given_up.is_some_and(|n| n >= 1), "{out}");
}
