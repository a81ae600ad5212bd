//! The off-CPU workload shared by tests/off_cpu, tests/remote and
//! tests/http: a program that waits a known time under a known function,
//! and how to read its time back from `go tool pprof`.

use super::DIE_WITH_PARENT;

/// Sleeps 10 × 100 ms in `waiter`, then computes for 0.5 s of wall time in
/// `burner`; writes its wall time from start to end (ms) to `argv[1]`.
pub fn waiter_burner_source() -> String {
    format!(
        r#"{DIE_WITH_PARENT}
#include <stdio.h>
#include <time.h>
static double now_ms(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}}
static double started;
__attribute__((constructor)) static void start(void) {{ started = now_ms(); }}
__attribute__((noinline)) void waiter(void) {{
    for (int i = 0; i < 10; i++) {{
        struct timespec t = {{0, 100 * 1000 * 1000}};
        nanosleep(&t, 0);
    }}
}}
volatile unsigned long spin;
__attribute__((noinline)) void burner(void) {{
    double until = now_ms() + 500;
    while (now_ms() < until) spin++;
}}
int main(int argc, char **argv) {{
    waiter();
    burner();
    FILE *f = fopen(argv[1], "w");
    fprintf(f, "%.3f\n", now_ms() - started);
    fclose(f);
    return 0;
}}
"#
    )
}

/// The cumulative ms of `function` in `go tool pprof -top -unit=ms` output.
pub fn pprof_cumulative_ms(top: &str, function: &str) -> f64 {
    let line = top
        .lines()
        .find(|l| l.trim_end().ends_with(&format!(" {function}")))
        .unwrap_or_else(|| panic!("no {function} in pprof's top:\n{top}"));
    line.split_whitespace()
        .nth(3)
        .and_then(|c| c.trim_end_matches("ms").parse().ok())
        .unwrap_or_else(|| panic!("no cumulative ms in {line:?}:\n{top}"))
}

/// The off-CPU ns of process `comm` under `waiter` in `clock_nanosleep`,
/// from `folded` off-CPU stacks (ns weights, as `folded-off-cpu` writes).
pub fn folded_ns_under_waiter(folded: &str, comm: &str) -> u64 {
    let stacks = super::parse_folded(folded);
    super::of_process(&stacks, comm)
        .into_iter()
        .filter(|(f, _)| {
            ["waiter", "clock_nanosleep"]
                .iter()
                .all(|w| f.iter().any(|g| g.contains(w)))
        })
        .map(|(_, n)| n)
        .sum()
}
