//! Programs walked whole from their first milliseconds under `record`:
//! tables loaded before the command starts, and walks finished in user
//! space from stack copies for a program a script starts.

use std::path::Path;

use super::*;

/// The command's executable and ld.so have their unwind tables loaded
/// before it execs, and the libraries ld.so maps (libc) had theirs from
/// the scan of the held process (lightswitch's own): a program without
/// frame pointers that lives 100 ms has complete stacks (no unwind
/// marker) from its first samples. Before the tables were loaded ahead, 6-11% of
/// such a program's samples were `no_table` (decision 0011; 41-90 samples a
/// run while a churn soak loaded the machine), most in its first
/// milliseconds.
#[test]
pub(super) fn record_walks_a_short_program_without_frame_pointers_from_its_start() {
    let _serial = serial();
    let program = compile("rec_nofp", &phases_source(), NO_FP_FLAGS);
    let mut share = CompleteShare::default();
    // Three runs, so that about 200 samples decide.
    for _ in 0..3 {
        let dir = tempdir();
        let command = [s(&program.path), "20", "80"];
        let out = run(&record_args(dir.path(), "997", &command), TIMEOUT);
        assert_eq!(out.status.code(), Some(0), "{out}");
        share.add(&dir.path().join("folded.txt"), &program.name, &out);
    }
    share.check(97);
}

/// A `#!/bin/sh` script that runs a program nobody ran before: the shell's
/// child execs a binary whose table is not loaded (not even cached), so the
/// BPF walker cannot walk its first milliseconds; those samples come with
/// a copy of the stack, and user space walks them on once the table is in
/// (`unwind::deferred`). Before, about 6% of the program's samples
/// (128 of 1996 at 4999 Hz, 4 runs) were `no_table`, all in its first
/// milliseconds.
#[test]
pub(super) fn record_walks_a_new_program_a_shell_script_starts_from_its_start() {
    let _serial = serial();
    let mut share = CompleteShare::default();
    let mut walked_on = 0;
    for run_index in 0..3 {
        // A new build ID each run: no table of it is cached.
        let source = format!(
            "{}\nconst char *lsw_run_tag = \"{run_index}-{}\";\n",
            phases_source(),
            std::process::id()
        );
        let program = compile(&format!("rec_sh{run_index}"), &source, NO_FP_FLAGS);
        let dir = tempdir();
        let script = dir.path().join("wrapper.sh");
        std::fs::write(&script, format!("#!/bin/sh\n{} 20 80\n", s(&program.path))).unwrap();
        chmod(&script, 0o755);
        let out = run(&record_args(dir.path(), "4999", &[s(&script)]), TIMEOUT);
        assert_eq!(out.status.code(), Some(0), "{out}");
        // record prints its summary on stderr (stdout is the command's).
        walked_on += out
            .stderr
            .split("stack copies: walked_on=")
            .nth(1)
            .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        share.add(&dir.path().join("folded.txt"), &program.name, &out);
    }
    share.check(97);
    // The summary says how many walks user space finished.
    assert!(walked_on > 0, "no walk finished from a stack copy");
}

/// A thread whose stack is deeper than any one copy: a 600 KiB frame
/// between its hot leaf and its outermost frames (rustc's compiler thread
/// has a 540 KiB one). Its first samples, before the program's table is
/// loaded, come with a split copy: the 32 KiB from rsp and the 64 KiB below
/// the end of the thread's stack mapping, and the walks user space
/// finishes from them are complete. With one 32 KiB copy, each ended at
/// the large frame as `stack_copy_ended` (0 walked on, 6-13 ended a run);
/// now 9-12 are walked on and 0-1 ends a run.
#[test]
fn record_walks_a_thread_with_a_600_kib_frame_from_its_start() {
    let runs = DeepFrameRuns::record("4999", 0.08, 4000);
    // A copy the ring has no room for at 96 KiB is sent at 32 KiB, in one
    // part, and ends at the large frame: a few a run.
    runs.check(|walked_on, ended| walked_on > 3 * ended);
}

/// The same at the default 99 Hz, where the rings were 128 KiB and a
/// 96 KiB copy never fitted under the half-full rule: every copy was
/// 32 KiB and ended at the large frame (1-2 a run, 0 walked on, 93-96% of
/// samples complete). With the 256 KiB floor every one is walked on. The
/// 100 000 filler FDEs make the table take long enough to build that each
/// run has about two samples before it is in.
#[test]
fn record_walks_a_thread_with_a_600_kib_frame_at_99_hz() {
    let runs = DeepFrameRuns::record("99", 0.3, 100_000);
    runs.check(|walked_on, ended| walked_on >= 2 && ended == 0);
}

/// Three `record` runs of a script that starts a new program (a new build
/// ID each run, so no table is cached) whose thread spins under a 600 KiB
/// frame, with the copies user space walked on and the ones that ended.
struct DeepFrameRuns {
    share: CompleteShare,
    walked_on: u64,
    ended: u64,
}

impl DeepFrameRuns {
    /// Run at `freq` Hz; the thread spins `seconds`; the program has
    /// `filler_fdes` one-instruction functions, each with an FDE, so that
    /// its table takes longer to build and more of its first samples need
    /// the copy.
    fn record(freq: &str, seconds: f64, filler_fdes: u32) -> Self {
        let _serial = serial();
        let mut runs = DeepFrameRuns {
            share: CompleteShare::default(),
            walked_on: 0,
            ended: 0,
        };
        for run_index in 0..3 {
            let source = format!(
                r#"#include <pthread.h>
#include <time.h>
volatile unsigned long sink;
const char *lsw_run_tag = "{run_index}-{pid}-{freq}";
__asm__(".text\n.rept {filler_fdes}\n.cfi_startproc\nnop\nret\n.cfi_endproc\n.endr\n");
static double now(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}}
__attribute__((noinline)) void deep_hot(double until) {{ while (now() < until) sink++; }}
__attribute__((noinline)) void deep_b(double until) {{ deep_hot(until); sink++; }}
__attribute__((noinline)) void deep_a(double until) {{ deep_b(until); sink++; }}
__attribute__((noinline)) void huge_frame(double until) {{
    volatile char big[600 * 1024];
    big[0] = 1;
    big[sizeof big - 1] = 2;
    deep_a(until);
    sink += big[0] + big[sizeof big - 1];
}}
void *thread_main(void *arg) {{ huge_frame(now() + {seconds}); return arg; }}
int main(void) {{
    pthread_t t;
    if (pthread_create(&t, 0, thread_main, 0) != 0) return 1;
    return pthread_join(t, 0);
}}
"#,
                pid = std::process::id()
            );
            let program = compile(&format!("rec_deep{run_index}"), &source, NO_FP_FLAGS);
            let dir = tempdir();
            let script = dir.path().join("wrapper.sh");
            std::fs::write(&script, format!("#!/bin/sh\n{}\n", s(&program.path))).unwrap();
            chmod(&script, 0o755);
            let out = run(&record_args(dir.path(), freq, &[s(&script)]), TIMEOUT);
            assert_eq!(out.status.code(), Some(0), "{out}");
            let copies = |name: &str| {
                out.stderr
                    .split(&format!("{name}="))
                    .nth(1)
                    .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            runs.walked_on += copies("walked_on");
            runs.ended += copies("deeper_than_copy");
            runs.share
                .add(&dir.path().join("folded.txt"), &program.name, &out);
        }
        runs
    }

    /// 97% of the samples complete, and `copies_ok(walked_on, ended)`.
    fn check(&self, copies_ok: impl Fn(u64, u64) -> bool) {
        self.share.check(97);
        assert!(
            copies_ok(self.walked_on, self.ended),
            "{} walks finished from stack copies, {} ended with their copy:\n{}",
            self.walked_on,
            self.ended,
            self.share.report.join("\n")
        );
    }
}

/// The profiler's own BPF programs follow every exec, fork and exit, so a
/// command that execs thousands of times is sampled inside them. Their
/// kernel frames are named after the programs (`bpf_prog_TAG_on_exec`),
/// although the profile is symbolized after they are unloaded; before, the
/// nearest `/proc/kallsyms` entry then was the kernel image's last data
/// symbol (`__stop_runtime_ptr_USER_PTR_MAX` on x86-64), and each such
/// frame carried that name.
#[test]
fn record_names_samples_inside_the_profilers_own_bpf_programs() {
    let _serial = serial();
    let dir = tempdir();
    let command = [
        "sh",
        "-c",
        "i=0; while [ $i -lt 4000 ]; do /bin/true; i=$((i+1)); done",
    ];
    let out = run(&record_args(dir.path(), "4999", &command), TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{out}");
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let kernel: Vec<&str> = stacks
        .iter()
        .flat_map(|(frames, _)| kernel_frames(frames))
        .collect();
    let ours = ["_on_exec", "_on_fork", "_on_exit", "_add_vma"];
    let in_ours = kernel
        .iter()
        .filter(|f| f.starts_with("bpf_prog_") && ours.iter().any(|name| f.contains(name)))
        .count();
    assert!(
        in_ours > 0,
        "no frame in the profiler's BPF programs:\n{out}"
    );
    // Code past the kernel image is never named after a data symbol of it.
    let misnamed: Vec<_> = kernel.iter().filter(|f| f.starts_with("__stop_")).collect();
    assert!(misnamed.is_empty(), "{misnamed:?}");
}

/// Samples of one program over several runs, and how many have its whole stack.
#[derive(Default)]
struct CompleteShare {
    complete: u64,
    all: u64,
    /// The incomplete stacks and each run's output, for the failure message.
    report: Vec<String>,
}

impl CompleteShare {
    /// Count the samples of process `name` in the folded profile `folded`
    /// of a run whose output was `out`.
    fn add(&mut self, folded: &Path, name: &str, out: &impl std::fmt::Display) {
        let stacks = read_folded(folded);
        for (frames, n) in of_process(&stacks, name) {
            // Samples in the exec itself (the old image being torn down)
            // are from before the command's first instruction.
            if frames.iter().any(|f| f.contains("execve")) {
                continue;
            }
            self.all += n;
            let incomplete = frames
                .iter()
                .any(|f| f.starts_with("[unwind:") || f.contains("[unknown]"));
            if incomplete {
                self.report.push(format!("{n} {}", frames.join(";")));
            } else {
                self.complete += n;
            }
        }
        self.report.push(out.to_string());
    }

    /// At least 50 samples, and `percent`% of them complete.
    fn check(&self, percent: u64) {
        assert!(self.all >= 50, "{} samples of the program", self.all);
        assert!(
            self.complete * 100 >= self.all * percent,
            "{} of {} samples of the program complete:\n{}",
            self.complete,
            self.all,
            self.report.join("\n")
        );
    }
}

/// Every process starts in the dynamic loader, whose entry stub (glibc's
/// `_start`, `_dl_start_user`) has no CFI. A stack rooted there is whole,
/// and the summary counts it `complete`; it used to be reached by frame
/// pointers and counted `frame_pointer` (a shell running 300 `/bin/true`:
/// complete=34 frame_pointer=123, in a new user's trial).
#[test]
fn record_counts_stacks_rooted_in_the_dynamic_loader_complete() {
    let _serial = serial();
    let dir = tempdir();
    let command = ["sh", "-c", "for i in $(seq 300); do /bin/true; done"];
    let out = run(&record_args(dir.path(), "997", &command), TIMEOUT);
    assert_eq!(out.status.code(), Some(0), "{out}");
    let counts = unwind_counts(&out.stderr).unwrap_or_else(|| panic!("no summary:\n{out}"));
    let count = |name: &str| counts.get(name).copied().unwrap_or(0);
    assert!(count("complete") >= 30, "{counts:?}\n{out}");
    assert!(
        count("frame_pointer") * 10 <= count("complete"),
        "{counts:?}\n{out}"
    );
    let stacks = read_folded(&dir.path().join("folded.txt"));
    let in_loader: u64 = stacks
        .iter()
        .filter(|(f, _)| comm(f) == "true" && user_frames(f).first() == Some(&"_start"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        in_loader > 0,
        "no stack of /bin/true rooted at ld.so's _start"
    );
}
