//! Which program a pprof profile presents as the one profiled: pprof readers
//! take the first mapping for the main binary (`File:` in `go tool pprof`'s
//! reports). Under `record` it is the command's own executable, even when a
//! child it starts (another program) takes most samples; for the whole
//! machine it is the kernel, not whichever process was sampled most.
//! Checked by decoding the profile with the crate's own prost types, and by
//! running `go tool pprof -top` on it.
//!
//! Needs root (BPF), gcc and Go (`scripts/setup.sh` installs it).

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use lightswitch::profile::format::pprof::proto;
use prost::Message;

use common::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The leader (built with `-DLEADER`) starts the worker (`argv[1]`), spins
/// for 0.3 s and waits for it; the worker spins for `SPIN_NS` ns (1.5 s).
const SPINNER: &str = r#"
#ifndef SPIN_NS
#define SPIN_NS 1500000000L
#endif
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
volatile unsigned long sink;
__attribute__((noinline)) void spin_for(long ns) {
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (volatile int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - t0.tv_sec) * 1000000000L + now.tv_nsec - t0.tv_nsec < ns);
}
int main(int argc, char **argv) {
#ifdef LEADER
    pid_t child = fork();
    if (child == 0) {
        execv(argv[1], argv + 1);
        _exit(127);
    }
    spin_for(300000000L);
    waitpid(child, 0, 0);
#else
    spin_for(SPIN_NS);
#endif
    return 0;
}
"#;

/// Run lightswitch with `args` writing a pprof profile into `dir`, and
/// decode it; `go tool pprof -top` must read it.
fn profile(dir: &Path, args: &[&str]) -> (proto::Profile, String) {
    let mut all = vec![
        "--sample-freq",
        "499",
        "--profile-format",
        "pprof",
        "--profile-path",
        s(dir),
        "--unwind-cache-dir",
        "none",
    ];
    if args.first() == Some(&"record") {
        all.insert(0, "record");
        all.extend(&args[1..]);
    } else {
        all.extend(args);
    }
    run(&all, TIMEOUT).assert_success();
    let path = dir.join("profile.pb");
    let mut raw = Vec::new();
    let bytes = fs::read(&path).unwrap();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(bytes.as_slice())
            .read_to_end(&mut raw)
            .unwrap();
    } else {
        raw = bytes;
    }
    let top = go_pprof(&["-top", s(&path)]);
    assert!(top.contains("flat%"), "{top}");
    (proto::Profile::decode(raw.as_slice()).unwrap(), top)
}

fn filenames(p: &proto::Profile) -> Vec<&str> {
    p.mapping
        .iter()
        .map(|m| p.string_table[m.filename as usize].as_str())
        .collect()
}

/// Samples whose `pid` label is `pid`.
fn samples_of(p: &proto::Profile, pid: i64) -> i64 {
    let pid_key = p.string_table.iter().position(|s| s == "pid").unwrap() as i64;
    p.sample
        .iter()
        .filter(|s| s.label.iter().any(|l| l.key == pid_key && l.num == pid))
        .map(|s| s.value[0])
        .sum()
}

#[test]
fn record_presents_the_commands_executable() {
    let _serial = serial();
    let leader = compile("lsw_fm_leader", SPINNER, &["-O2", "-g", "-DLEADER"]);
    let worker = compile("lsw_fm_worker", SPINNER, &["-O2", "-g"]);
    let dir = tempdir();
    let (p, top) = profile(
        dir.path(),
        &["record", "--", s(&leader.path), s(&worker.path)],
    );
    let names = filenames(&p);
    let leader_path = fs::canonicalize(&leader.path).unwrap();
    assert_eq!(names[0], s(&leader_path), "mappings: {names:?}");
    assert!(
        top.contains("File: lsw_fm_leader"),
        "go tool pprof names another program:\n{top}"
    );
    // The worker took most samples: the choice is the command's, not the
    // busiest program's.
    let worker_path = fs::canonicalize(&worker.path).unwrap();
    let started_in = |path: &Path| {
        let id = p.mapping[names.iter().position(|n| *n == s(path)).unwrap()].id;
        p.sample
            .iter()
            .filter(|s| {
                s.location_id
                    .iter()
                    .any(|&l| p.location[l as usize - 1].mapping_id == id)
            })
            .map(|s| s.value[0])
            .sum::<i64>()
    };
    assert!(
        started_in(&worker_path) > 2 * started_in(&leader_path),
        "the worker must take most samples: {names:?}\n{top}"
    );
}

#[test]
fn the_whole_machine_presents_the_kernel() {
    let _serial = serial();
    let worker = compile(
        "lsw_fm_busy",
        SPINNER,
        &["-O2", "-g", "-DSPIN_NS=30000000000L"],
    );
    let busy = Workload::spawn(&worker);
    let dir = tempdir();
    let (p, top) = profile(dir.path(), &["--duration", "1"]);
    let names = filenames(&p);
    assert_eq!(names[0], "[kernel.kallsyms]", "mappings: {names:?}\n{top}");
    assert!(
        samples_of(&p, busy.pid().into()) > 0,
        "the busy program was not sampled:\n{top}"
    );
}
