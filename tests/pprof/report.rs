//! What `go tool pprof` reports from a profile: `-top`, `-traces`,
//! `-tags`/`-tagfocus`, `-lines`.

use super::*;

/// How far apart sums of `go tool pprof -top`'s columns may be, ns (0.1 ms;
/// [`parse_top`] gives ns): each figure is rounded for display to 0.01 ms (a
/// caller's 2028.06ms cum against its callee's 2026.05ms plus its own flat
/// shown as 2ms).
const TOP_ROUNDING_NS: f64 = 100_000.0;

/// `go tool pprof -top` and `-traces` on the chain `main -> chain_a ->
/// chain_b -> chain_hot` (no frame pointers): `chain_hot` has the highest
/// flat and nearly all of it, its callers' cum covers it and grows towards
/// the leaf, and the heaviest trace is the whole chain leaf first, down to
/// `_start`, labelled with the target's pid.
#[test]
fn go_tool_pprof_top_and_traces() {
    let _serial = serial();
    let program = compile("lsw_pp_chain", &chain_source(), NO_FP);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);
    let file = s(&r.path);

    let top = common::go_pprof(&["-top", file]);
    let rows = parse_top(&top);
    let total = header_total(&top);
    let hot = row(&rows, "chain_hot", &top);
    let max_flat = rows.iter().map(|r| r.flat).fold(0.0, f64::max);
    assert!(
        hot.flat == max_flat && hot.flat >= 0.8 * total,
        "chain_hot must have the highest flat, and most of the {total} total:\n{top}"
    );
    let mut below = hot.cum;
    for caller in ["chain_b", "chain_a", "main"] {
        let r = row(&rows, caller, &top);
        assert!(
            r.flat <= 0.05 * hot.flat,
            "{caller} only calls: its flat must be tiny next to chain_hot's:\n{top}"
        );
        assert!(
            r.cum <= below + r.flat + TOP_ROUNDING_NS && r.cum >= 0.9 * hot.flat,
            "{caller}'s cum must cover chain_hot's flat (all but samples still waiting for \
             an unwind table) and not exceed its callee's cum (plus its own flat):\n{top}"
        );
        below = r.cum;
    }

    let traces_text = common::go_pprof(&["-traces", file]);
    let traces = parse_traces(&traces_text);
    let dominant = traces
        .iter()
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .unwrap();
    let frames: Vec<&str> = dominant.frames.iter().map(String::as_str).collect();
    let chain = ["chain_hot", "chain_b", "chain_a", "main"];
    assert!(
        frames.len() > chain.len()
            && frames[..chain.len()] == chain
            && frames.last() == Some(&"_start")
            && frames[chain.len()..]
                .iter()
                .all(|f| LIBC_START_FRAMES.contains(f)),
        "the heaviest trace must be chain_hot, chain_b, chain_a, main, then libc start-up \
         down to _start:\n{dominant:?}\n{traces_text}"
    );
    assert_eq!(
        dominant.labels.get("pid"),
        Some(&target.pid_arg()),
        "{dominant:?}"
    );
    assert_eq!(
        dominant.labels.get("comm").map(String::as_str),
        Some("lsw_pp_chain"),
        "{dominant:?}"
    );
    let with_chain: f64 = traces
        .iter()
        .filter(|t| t.frames.windows(chain.len()).any(|w| w == chain))
        .map(|t| t.value)
        .sum();
    let all: f64 = traces.iter().map(|t| t.value).sum();
    assert!(
        with_chain >= 0.85 * all,
        "only {with_chain} of {all} in traces through chain_hot <- chain_b <- chain_a <- main:\n\
         {traces_text}"
    );
}

/// Two processes in one run, one of them with a named second thread, each
/// thread spinning in its own function: `-tagfocus pid=` and `-tagfocus
/// tid=` select exactly those samples (the totals equal the decoded
/// profile's per-label counts) and no other process's or thread's function;
/// `-tags` lists the `pid`, `tid`, `comm` and `thread_name` values.
#[test]
fn tagfocus_pid_and_tid() {
    let _serial = serial();
    let source_a = format!(
        "#define _GNU_SOURCE
{DIE_WITH_PARENT}
#include <pthread.h>
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void a_main_hot(void) {{ while (!stop) sink++; }}
__attribute__((noinline)) void *a_worker_hot(void *arg) {{ while (!stop) sink++; return arg; }}
int main(void) {{
    pthread_t t;
    if (pthread_create(&t, 0, a_worker_hot, 0)) return 1;
    pthread_setname_np(t, \"lsw_pp_worker\");
    a_main_hot();
    sink++;
    return 0;
}}
"
    );
    let source_b = format!(
        "{DIE_WITH_PARENT}
volatile int stop;
volatile unsigned long sink;
__attribute__((noinline)) void b_hot(void) {{ while (!stop) sink++; }}
int main(void) {{ b_hot(); sink++; return 0; }}
"
    );
    let mut flags_a = NO_FP.to_vec();
    flags_a.push("-pthread");
    let prog_a = compile("lsw_pp_tag_a", &source_a, &flags_a);
    let prog_b = compile("lsw_pp_tag_b", &source_b, NO_FP);
    let a = Workload::spawn(&prog_a);
    let b = Workload::spawn(&prog_b);
    let worker = thread_named(a.pid(), "lsw_pp_worker");
    let r = profile(&[a.pid(), b.pid()], "pprof", &[]);
    assert_eq!(r.summary.processes, 2, "{}", r.out);
    let ix = r.index();

    // Labels in the decoded profile: exactly pid, tid, comm, thread_name,
    // with the values /proc has.
    for sample in &r.profile.sample {
        let keys: Vec<&str> = sample.label.iter().map(|l| ix.str(l.key)).collect();
        assert_eq!(keys, ["pid", "tid", "comm", "thread_name"], "{sample:?}");
        let pid = ix.num_label(sample, "pid").unwrap();
        let tid = ix.num_label(sample, "tid").unwrap();
        let comm = ix.str_label(sample, "comm").unwrap();
        let thread_name = ix.str_label(sample, "thread_name").unwrap();
        let (want_comm, want_thread) = if pid == i64::from(a.pid()) {
            let thread = if tid == i64::from(worker) {
                "lsw_pp_worker"
            } else {
                assert_eq!(tid, i64::from(a.pid()), "{sample:?}");
                "lsw_pp_tag_a"
            };
            ("lsw_pp_tag_a", thread)
        } else {
            assert_eq!(pid, i64::from(b.pid()), "{sample:?}");
            assert_eq!(tid, pid, "{sample:?}");
            ("lsw_pp_tag_b", "lsw_pp_tag_b")
        };
        assert_eq!((comm, thread_name), (want_comm, want_thread), "{sample:?}");
    }
    let count_a = ix.count_pid(a.pid());
    let count_b = ix.count_pid(b.pid());
    let count_worker = ix.count(|s| ix.num_label(s, "tid") == Some(worker.into()));
    for (what, n) in [("A", count_a), ("B", count_b), ("A's worker", count_worker)] {
        assert!(
            n >= MIN_SAMPLES,
            "only {n} samples of {what}:\n{}\n{}",
            ix.show(),
            r.out
        );
    }

    let file = s(&r.path);
    // Counts (-sample_index=samples) and every node (-nodefraction=0), so
    // the rows' flats add up exactly to the selected samples.
    let focus = |filter: String| {
        let text = common::go_pprof(&[
            "-tagfocus",
            &filter,
            "-sample_index=samples",
            "-nodefraction=0",
            "-top",
            file,
        ]);
        let rows = parse_top(&text);
        (rows, text)
    };
    let cases = [
        (
            format!("pid={}", a.pid()),
            count_a,
            vec!["a_main_hot", "a_worker_hot"],
            vec!["b_hot"],
        ),
        (
            format!("pid={}", b.pid()),
            count_b,
            vec!["b_hot"],
            vec!["a_main_hot", "a_worker_hot"],
        ),
        (
            format!("tid={worker}"),
            count_worker,
            vec!["a_worker_hot"],
            vec!["a_main_hot", "b_hot"],
        ),
    ];
    for (filter, count, shown, hidden) in cases {
        let (rows, text) = focus(filter.clone());
        let flat: f64 = rows.iter().map(|r| r.flat).sum();
        assert_eq!(
            flat as u64, count,
            "-tagfocus {filter} must select exactly the {count} samples with that label:\n{text}"
        );
        let hot: f64 = shown.iter().map(|f| row(&rows, f, &text).flat).sum();
        assert!(
            hot >= 0.8 * flat,
            "-tagfocus {filter}: {shown:?} must have most of the samples:\n{text}"
        );
        for f in hidden {
            assert!(
                rows.iter().all(|r| r.name != f),
                "-tagfocus {filter} must not show {f}:\n{text}"
            );
        }
    }

    let tags_text = common::go_pprof(&["-tags", file]);
    let tags = parse_tags(&tags_text);
    let set =
        |values: &[&str]| -> BTreeSet<String> { values.iter().map(|v| v.to_string()).collect() };
    let (pid_a, pid_b, tid_w) = (a.pid_arg(), b.pid_arg(), worker.to_string());
    let expected: BTreeMap<String, BTreeSet<String>> = [
        ("comm", set(&["lsw_pp_tag_a", "lsw_pp_tag_b"])),
        (
            "thread_name",
            set(&["lsw_pp_tag_a", "lsw_pp_worker", "lsw_pp_tag_b"]),
        ),
        ("pid", set(&[&pid_a, &pid_b])),
        ("tid", set(&[&pid_a, &tid_w, &pid_b])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(tags, expected, "`go tool pprof -tags`:\n{tags_text}");
}

/// A `-g` build: `go tool pprof -lines -top` names `chain_hot` at the line
/// of its loop in the C file written here, and each caller at the line of
/// its call (return addresses are mapped to their call sites). The decoded
/// functions carry the source file.
#[test]
fn lines_with_debug_info() {
    let _serial = serial();
    let source = chain_source();
    let program = compile("lsw_pp_lines", &source, NO_FP);
    let src = source_path(&program);
    let src = s(&src);
    let target = Workload::spawn(&program);
    let r = profile(&[target.pid()], "pprof", &[]);

    let text = common::go_pprof(&["-lines", "-sample_index=samples", "-top", s(&r.path)]);
    let rows = parse_top(&text);
    let total = r.summary.samples as f64;
    let loop_line = line_of(&source, "sink += i;");
    let hot = row(&rows, &format!("chain_hot {src}:{loop_line}"), &text);
    assert!(
        hot.flat >= 0.8 * total,
        "the loop line of chain_hot must hold most of the {total} samples:\n{text}"
    );
    for (caller, call) in [
        ("chain_b", "chain_hot();"),
        ("chain_a", "chain_b();"),
        ("main", "chain_a();"),
    ] {
        let name = format!("{caller} {src}:{}", line_of(&source, call));
        let r = row(&rows, &name, &text);
        assert!(
            r.cum >= 0.8 * total,
            "{name} (the call site) must be on most stacks:\n{text}"
        );
    }

    let ix = r.index();
    for name in ["chain_hot", "chain_b", "chain_a", "main"] {
        let f = r
            .profile
            .function
            .iter()
            .find(|f| ix.str(f.name) == name)
            .unwrap_or_else(|| panic!("no function {name}"));
        assert_eq!(ix.str(f.filename), src, "{name}: {f:?}");
        assert_eq!(ix.str(f.system_name), name, "{name}: {f:?}");
    }
}
