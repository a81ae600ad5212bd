//! Programs run from a FUSE file system beside a root bystander
//! (process/opener/, docs/reliability.md):
//! - whose reads never answer, or answer the first ones (an object's ELF
//!   headers) and never the later ones (its text and CFI): the
//!   whole-machine run must sample on, write its profile on time with the
//!   bystander's samples, name the program's frames `[read timed out: ...]`,
//!   count the object as given up, and exit while the server still holds
//!   the request it never answers;
//! - whose reads answer: the object is copied into memory and its frames
//!   named from the copy.
//!
//! The file system is a small libfuse 3 server compiled here (`fuse3` and
//! `libfuse3-dev`, scripts/setup.sh). It is mounted by root with
//! `allow_other`, as a user's mount would be with `user_allow_other`, and
//! the program runs as nobody. It answers everything until the test
//! switches it: from then on the requests of a process whose command line,
//! or whose parent's, holds a marker (the profile directory of this test's
//! run: the profiler and its opener helper) are never answered (or only
//! reads of a given byte range, which the opener's copy reads), so that
//! only the profiler under test meets the hang, not other profilers or
//! programs of the machine.
//!
//! The helper that waits for the server's answer stays in the kernel's
//! wait, which no signal ends (not even SIGKILL: the kernel waits for a
//! request the server has taken); the profiler must exit regardless.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::bystander::{self, Bystander};
use crate::common::{self, Lightswitch};

/// The FUSE server (see the module docs).
const FUSE_SERVER: &str = r#"
/* A FUSE file system of one file, `/NAME`, with the bytes of FILE. Every
 * request is answered normally until the file TRIGGER exists; from then on
 * a request from a process whose command line, or whose parent's, holds
 * TRIGGER's contents is never answered (its handler waits for good), as a
 * hung server's (its pid is added to TRIGGER.held). With FROM and TO, only such reads of bytes in [FROM, TO)
 * hang; such processes then read the file with direct I/O (not from the
 * page cache), so that each of their reads comes here as asked. Others'
 * requests are still answered, so that only the profiler under test meets
 * the hang. Usage: fusehang FILE NAME TRIGGER MOUNTPOINT [FROM TO] (in the
 * foreground, one thread per request, allow_other). */
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
static long long hang_from = -1, hang_to = -1;

static int cmdline_holds(int pid, const char *marker) {
    char cmdline[8192] = {0}, path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *c = fopen(path, "r");
    if (!c) return 0;
    size_t n = fread(cmdline, 1, sizeof cmdline - 1, c);
    fclose(c);
    for (size_t i = 0; i < n; i++) if (!cmdline[i]) cmdline[i] = ' ';
    return strstr(cmdline, marker) != NULL;
}

static int parent_of(int pid) {
    char line[256], path[64];
    int ppid = 0;
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *s = fopen(path, "r");
    if (!s) return 0;
    while (fgets(line, sizeof line, s))
        if (sscanf(line, "PPid: %d", &ppid) == 1) break;
    fclose(s);
    return ppid;
}

/* Whether the trigger is set and the requester is marked. */
static int marked(void) {
    char marker[256] = {0};
    FILE *t = fopen(trigger, "r");
    if (!t) return 0;
    size_t m = fread(marker, 1, sizeof marker - 1, t);
    fclose(t);
    if (m == 0) return 0;
    int pid = (int)fuse_get_context()->pid;
    return cmdline_holds(pid, marker) || cmdline_holds(parent_of(pid), marker);
}

/* Hang for good, noting the requester's pid in TRIGGER.held first. */
static void hang(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s.held", trigger);
    FILE *h = fopen(path, "a");
    if (h) { fprintf(h, "%d\n", (int)fuse_get_context()->pid); fclose(h); }
    for (;;) pause();
}

static void hang_if_all_hang(void) { if (hang_from < 0 && marked()) hang(); }

static int fs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    hang_if_all_hang();
    memset(st, 0, sizeof *st);
    if (!strcmp(path, "/")) { st->st_mode = S_IFDIR | 0755; st->st_nlink = 2; return 0; }
    if (!strcmp(path, name)) { st->st_mode = S_IFREG | 0755; st->st_nlink = 1; st->st_size = size; return 0; }
    return -ENOENT;
}

static int fs_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    hang_if_all_hang();
    if (strcmp(path, "/")) return -ENOENT;
    fill(buf, ".", NULL, 0, 0);
    fill(buf, "..", NULL, 0, 0);
    fill(buf, name + 1, NULL, 0, 0);
    return 0;
}

static int fs_open(const char *path, struct fuse_file_info *fi) {
    hang_if_all_hang();
    if (strcmp(path, name)) return -ENOENT;
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EACCES;
    if (hang_from >= 0 && marked()) fi->direct_io = 1;
    return 0;
}

static int fs_read(const char *path, char *buf, size_t n, off_t off, struct fuse_file_info *fi) {
    (void)path; (void)fi;
    hang_if_all_hang();
    if (hang_from >= 0 && off < hang_to && off + (off_t)n > hang_from && marked()) hang();
    if (off >= size) return 0;
    if ((off_t)n > size - off) n = size - off;
    memcpy(buf, data + off, n);
    return n;
}

static const struct fuse_operations ops = {
    .getattr = fs_getattr, .readdir = fs_readdir, .open = fs_open, .read = fs_read,
};

int main(int argc, char **argv) {
    if (argc != 5 && argc != 7) {
        fprintf(stderr, "usage: fusehang FILE NAME TRIGGER MOUNTPOINT [FROM TO]\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 1; }
    fseeko(f, 0, SEEK_END); size = ftello(f); rewind(f);
    data = malloc(size);
    if (!data || fread(data, 1, size, f) != (size_t)size) { perror("read"); return 1; }
    fclose(f);
    snprintf(name, sizeof name, "/%s", argv[2]);
    trigger = argv[3];
    if (argc == 7) { hang_from = atoll(argv[5]); hang_to = atoll(argv[6]); }
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
/// nobody; the marked processes' requests (those whose command line, or
/// whose parent's, holds what `dir/hang` holds, once it does) hang: all of
/// them, or only reads of `later`'s byte range.
fn mount_and_run(dir: &Path, server: &Path, served: &Path, later: Option<(u64, u64)>) -> HungMount {
    let mountpoint = dir.join("mnt");
    fs::create_dir(&mountpoint).unwrap();
    let trigger = dir.join("hang");
    let mut command = Command::new(server);
    command
        .arg(served)
        .arg("hungspin")
        .arg(&trigger)
        .arg(&mountpoint);
    if let Some((from, to)) = later {
        command.args([from.to_string(), to.to_string()]);
    }
    let server = command
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

/// Whether a process whose parent has `marker` in its command line cannot
/// read `bytes` bytes (all: `None`) of `file` within 1 s.
fn read_hangs(file: &Path, bytes: Option<u64>, marker: &Path) -> bool {
    let read = bytes.map_or("cat".to_string(), |n| format!("head -c {n}"));
    let mut reader = Command::new("sh")
        .arg("-c")
        .arg(format!("{read} \"$1\" > /dev/null; : \"$0\""))
        .arg(marker)
        .arg(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        if reader.try_wait().unwrap().is_some() {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
    // The shell ends at once; its reader stays in the kernel until the
    // server goes (not waited for).
    let _ = reader.kill();
    let _ = reader.wait();
    true
}

/// The byte range from the start of `.text` to the end of `.eh_frame` of
/// the ELF file at `path`: what an object's identity (ELF headers, notes,
/// section headers) does not need, and its tables and its copy do.
fn text_to_eh_frame(path: &Path) -> (u64, u64) {
    use object::{Object, ObjectSection};
    let data = fs::read(path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let range = |name| {
        file.section_by_name(name)
            .and_then(|s| s.file_range())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let (text, eh_frame) = (range(".text"), range(".eh_frame"));
    (text.0, eh_frame.0 + eh_frame.1)
}

/// The pids whose requests the server holds, from `held` (one a line).
fn held_pids(held: &Path) -> Vec<u32> {
    fs::read_to_string(held)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A whole-machine run beside a program on a FUSE mount whose marked
/// requests hang (all, or `later`'s reads only) and a root bystander: the
/// checks of the module docs.
fn run_beside_hung_mount(later: bool) {
    let _serial = common::serial();
    let dir = common::tempdir();
    common::chmod(dir.path(), 0o755);
    let server = fuse_server();
    let spin = common::compile("hungspin", SPIN, &["-O1"]);
    let range = later.then(|| text_to_eh_frame(&spin.path));
    let mut mount = mount_and_run(dir.path(), &server.path, &spin.path, range);
    let out_dir = dir.path().join("out-hung-fs-victim");
    fs::write(dir.path().join("hang"), common::s(&out_dir)).unwrap();
    let served = mount.mountpoint.join("hungspin");
    assert!(
        read_hangs(&served, None, &out_dir),
        "the FUSE server answers: the test would prove nothing"
    );
    if let Some((from, _)) = range {
        assert!(
            !read_hangs(&served, Some(from), &out_dir),
            "the FUSE server does not answer the ELF headers"
        );
    }
    let held = dir.path().join("hang.held");
    let held_before = held_pids(&held);
    let mut bystander = Bystander::start();
    let started = Instant::now();
    let mut profiler = Lightswitch::spawn(&common::folded_run_args("3", &out_dir));
    profiler.expect_sampling();
    // The bystander's CPU time while sampled (about the 3 s of the run).
    bystander.restart_clock();
    thread::sleep(Duration::from_secs(3));
    let bystander_cpu = bystander.cpu_so_far();
    let profiler_pid = profiler.pid();
    // The profiler exits on its own (reaped here), while the server still
    // holds the request it never answers. A 3 s run: loading the BPF
    // programs and symbolizing take seconds more (up to 20 s measured on a
    // 2-core machine under a load of 20). A stalled run never exits.
    while profiler.is_running() && started.elapsed() < Duration::from_secs(60) {
        thread::sleep(Duration::from_millis(20));
    }
    if profiler.is_running() {
        // Stuck in the server's wait: released first, or it could not be
        // killed.
        mount.end_server();
        let out = profiler.wait(Duration::from_secs(20));
        panic!("the profiler did not exit while the server held its request:\n{out}");
    }
    let out = profiler.wait(Duration::from_secs(1));
    let ended = started.elapsed();
    let held_now: Vec<u32> = held_pids(&held)
        .into_iter()
        .filter(|pid| !held_before.contains(pid))
        .collect();
    bystander.stop();
    mount.end_server();
    out.assert_success();
    assert!(
        !held_now.is_empty() && !held_now.contains(&profiler_pid),
        "requests held by the server: {held_now:?}, the profiler's pid {profiler_pid}: \
         the hang was not met by its helper\n{out}"
    );
    let folded = out_dir.join("folded.txt");
    let stacks = common::read_folded(&folded);
    bystander::assert_kept(bystander::samples(&stacks), bystander_cpu, 999.0, &out);
    // Every sample of the program is named as timed out. How many there
    // are depends on the program: the server may hold its own page faults
    // too once the profiler's open has dropped the file's cached pages.
    let of_hungspin = common::of_process(&stacks, "hungspin");
    let all: u64 = of_hungspin.iter().map(|(_, n)| n).sum();
    let hung: u64 = of_hungspin
        .iter()
        .filter(|(frames, _)| {
            frames
                .iter()
                .any(|f| f.starts_with("[read timed out: hungspin]+0x"))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        hung >= 5 && hung * 10 >= all * 9,
        "{hung} of {all} samples of hungspin named as timed out (run of {ended:?}); its stacks: {:?}\n{out}",
        of_hungspin.iter().take(6).collect::<Vec<_>>()
    );
    let given_up = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("objects given up: timed_out="))
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok());
    assert!(given_up.is_some_and(|n| n >= 1), "{out}");
}

/// The FUSE server, compiled.
fn fuse_server() -> common::Program {
    common::compile(
        "lsw_fusehang",
        FUSE_SERVER,
        &[
            "-O1",
            "-I/usr/include/fuse3",
            "-Wl,--no-as-needed",
            "-lfuse3",
        ],
    )
}

#[test]
fn a_program_on_a_hung_fuse_mount_never_stalls_the_whole_machine_run() {
    run_beside_hung_mount(false);
}

#[test]
fn a_fuse_mount_that_hangs_after_the_elf_headers_never_stalls_the_run() {
    run_beside_hung_mount(true);
}

#[test]
fn a_program_on_a_fuse_mount_is_named_from_its_copy_in_memory() {
    let _serial = common::serial();
    let dir = common::tempdir();
    common::chmod(dir.path(), 0o755);
    let server = fuse_server();
    let spin = common::compile("hungspin", SPIN, &["-O1", "-g"]);
    // No trigger: every request is answered.
    let _mount = mount_and_run(dir.path(), &server.path, &spin.path, None);
    let out_dir = dir.path().join("out");
    let out = common::run(
        &common::folded_run_args("2", &out_dir),
        Duration::from_secs(60),
    );
    out.assert_success();
    let stacks = common::read_folded(&out_dir.join("folded.txt"));
    let named: u64 = common::of_process(&stacks, "hungspin")
        .iter()
        .filter(|(frames, _)| common::user_frames(frames).contains(&"spin_on_fuse"))
        .map(|(_, n)| n)
        .sum();
    assert!(named >= 100, "{named} samples in spin_on_fuse:\n{out}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("objects copied from file systems that can hang: ")),
        "{out}"
    );
}
