#!/usr/bin/env bash
# Off-CPU overhead (decision 0014), as root:
#
#   sudo bash bench/overhead/offcpu.sh [ROUNDS] [LOOPS]
#
# A context-switch-heavy workload, `perf bench sched pipe -T -l LOOPS` (two
# threads passing a token through pipes: every op is two blocking reads),
# run alone and under each off-CPU profiler, ROUNDS times (default 3,
# 200000 loops), each profiler running the workload as its command, pinned
# to CPU 0 (`taskset -c 0`): unpinned, its two threads ran either on one
# CPU (about 5 us/op here) or on two (about 40 us/op, every wakeup an
# interrupt to the other CPU), and a round's mode was chance, so runs of
# one round were not comparable (9 rounds once: the run alone took
# 4.5 to 42.3 us/op). The profilers themselves are not pinned.
#   - lightswitch record --off-cpu (its default --off-cpu-min), folded output;
#   - bpftrace: sched_switch, the leaving thread's kstack/ustack kept, the
#     blocked time summed per (kstack, ustack) when it runs again, as bcc's
#     offcputime does;
#   - perf record -e sched:sched_switch -g.
# Per run: the workload's own usecs/op (slowdown against the run alone of
# the same round) and the CPU time of everything the run did (profiler plus
# workload, /usr/bin/time), less the run alone's: the profiler's cost, its
# BPF programs included (they run on the workload's time).
# lightswitch runs without tracefs; the script mounts tracefs for bpftrace
# and perf only, and unmounts what it mounted.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" -ne 0 ]; then
    echo "error: run as root: sudo bash bench/overhead/offcpu.sh $*" >&2
    exit 1
fi
rounds="${1:-3}"
loops="${2:-200000}"
target="${CARGO_TARGET_DIR:-target}"
lightswitch="$target/release/lightswitch"
[ -x "$lightswitch" ] || cargo build --release --quiet --bin lightswitch
for tool in perf bpftrace taskset /usr/bin/time; do
    command -v "$tool" >/dev/null || { echo "error: $tool is missing (scripts/setup.sh)" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tracefs=/sys/kernel/tracing
mounted=0

cat > "$work/offcpu.bt" <<'EOF'
tracepoint:sched:sched_switch
{
    if (pid == cpid) {
        @start[tid] = nsecs;
        @kst[tid] = kstack;
        @ust[tid] = ustack;
    }
    $next = args->next_pid;
    $s = @start[$next];
    if ($s != 0) {
        @off[@kst[$next], @ust[$next]] = sum(nsecs - $s);
        delete(@start[$next]);
    }
}
EOF

workload=(taskset -c 0 perf bench sched pipe -T -l "$loops")

# run NAME CMD...: the workload's usecs/op and the run's CPU seconds (user + system).
run() {
    local name="$1"
    shift
    /usr/bin/time -f "cpu %U %S" -o "$work/time" "$@" > "$work/out" 2> "$work/err" || {
        echo "error: $name failed:" >&2
        cat "$work/err" >&2
        exit 1
    }
    local usecs cpu
    usecs=$(awk '/usecs\/op/ {print $1}' "$work/out" "$work/err" | head -1)
    cpu=$(awk '/^cpu/ {print $2 + $3}' "$work/time")
    echo "$name $usecs $cpu"
}

mount_tracefs() {
    if ! mountpoint -q "$tracefs"; then
        mount -t tracefs nodev "$tracefs"
        mounted=1
    fi
}
unmount_tracefs() {
    if [ "$mounted" = 1 ]; then
        umount "$tracefs"
        mounted=0
    fi
}

results="$work/results"
: > "$results"
for round in $(seq "$rounds"); do
    unmount_tracefs
    base=$(run none "${workload[@]}")
    echo "round $round $base" >> "$results"
    echo "round $round $(run lightswitch "$lightswitch" record --off-cpu --profile-format folded \
        --profile-path "$work/ls" -- "${workload[@]}")" >> "$results"
    mount_tracefs
    echo "round $round $(run bpftrace bpftrace -c "$(command -v taskset) ${workload[*]:1}" "$work/offcpu.bt")" >> "$results"
    echo "round $round $(run perf perf record -q -o "$work/perf.data" -e sched:sched_switch -g \
        -- "${workload[@]}")" >> "$results"
    unmount_tracefs
done

# Per profiler: median usecs/op, slowdown against the same round's run
# alone, CPU seconds more than that run.
echo "perf bench sched pipe -T -l $loops, $rounds rounds (medians):"
printf "%-12s %10s %10s %14s\n" profiler usecs/op slowdown "extra CPU s"
awk '
    { name = $3; usecs = $4; cpu = $5; r = $2
      if (name == "none") { base_u[r] = usecs; base_c[r] = cpu }
      else { slow[name] = slow[name] " " (usecs / base_u[r] - 1) * 100
             extra[name] = extra[name] " " cpu - base_c[r] }
      all[name] = all[name] " " usecs }
    function median(list,   n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    END {
        printf "%-12s %10.3f %10s %14s\n", "none", median(all["none"]), "-", "-"
        n = split("lightswitch bpftrace perf", names, " ")
        for (i = 1; i <= n; i++) { p = names[i]
            printf "%-12s %10.3f %9.1f%% %14.2f\n", p, median(all[p]), median(slow[p]), median(extra[p]) }
    }' "$results"
echo "raw runs (round, profiler, usecs/op, CPU s):"
cat "$results"
