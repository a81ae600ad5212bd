#!/usr/bin/env bash
# Large objects from a process's first milliseconds (decision 0011): a
# whole-machine lightswitch, then `rustc -O` on a generated medium program
# started 50 ms after sampling starts, run with a cold unwind cache (an empty
# --unwind-cache-dir) and then a warm one (the same directory, filled by the
# cold run). Prints, per run, the share of rustc's samples (folded output,
# process name `rustc-probe`: a link to the toolchain's rustc, so that other
# rustc processes on the machine are not counted) that end in
# `[unwind: no_table]` or `[unwind: stack_copy_ended]` (a table was missing
# and the walk from the sample's stack copy ended with the copy), and when
# rustc's large objects' tables were loaded
# (from the --logging debug lines), milliseconds after rustc's exec.
#
# Usage (root, from the project root, after `cargo build --release`):
#   bench/large_objects/run.sh [--runs N] [--modules N] [--freq HZ]
#                              [--budget-mb MB] [--keep DIR] [--lightswitch BIN]
# --keep DIR leaves the logs, profiles and caches in DIR; --lightswitch
# measures another build (e.g. an older commit's) instead of target/release's.
set -euo pipefail

runs=3 modules=8 freq=997 budget=64 keep="" bin=""
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) runs=$2; shift 2 ;;
    --modules) modules=$2; shift 2 ;;
    --freq) freq=$2; shift 2 ;;
    --budget-mb) budget=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --lightswitch) bin=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${bin:-$root/target/release/lightswitch}
[ -x "$bin" ] || { echo "no $bin: build first (cargo build --release)" >&2; exit 2; }
sysroot=$(rustc --print sysroot)
real_rustc="$sysroot/bin/rustc"
[ -x "$real_rustc" ] || { echo "no rustc at $real_rustc" >&2; exit 2; }

work=${keep:-$(mktemp -d /tmp/large-objects.XXXXXX)}
mkdir -p "$work"
[ -n "$keep" ] || trap 'rm -rf "$work"' EXIT
ln -sf "$real_rustc" "$work/rustc-probe"
"$here/gen_source.sh" "$modules" >"$work/medium.rs"

# ms since the epoch of an RFC 3339 log timestamp
log_ms() { date -d "$1" +%s%3N; }

# One run: $1 label, $2 cache directory.
run_once() {
    local label=$1 cache=$2 out="$work/out-$1" log="$work/log-$1"
    rm -rf "$out"
    : >"$log"
    "$bin" -F "$freq" --unwind-cache-dir "$cache" --max-unwind-info-mb "$budget" \
        --profile-format folded --profile-path "$out" --logging debug \
        >"$log" 2>&1 &
    local ls_pid=$!
    local waited=0
    until grep -q "lightswitch::run::agent: sampling" "$log"; do
        sleep 0.005
        waited=$((waited + 1))
        if [ $waited -gt 12000 ] || ! kill -0 $ls_pid 2>/dev/null; then
            echo "lightswitch did not start:" >&2; tail -5 "$log" >&2; exit 1
        fi
    done
    sleep 0.05
    local started
    started=$(date +%s%3N)
    "$work/rustc-probe" -O "$work/medium.rs" -o "$work/medium-$label" 2>&1
    local ended
    ended=$(date +%s%3N)
    sleep 0.3
    kill -INT $ls_pid
    wait $ls_pid || { echo "lightswitch failed:" >&2; tail -5 "$log" >&2; exit 1; }
    local folded="$out/folded.txt"
    local total no_table
    total=$(awk -F';' '$1 == "rustc-probe" { n += $NF + 0 } END { print n + 0 }' \
        <(sed 's/ \([0-9]*\)$/;\1/' "$folded"))
    # (grep finding nothing is 0 such samples, not a failure)
    no_table=$({ grep '^rustc-probe;' "$folded" || true; } |
        { grep -E '\[unwind: (no_table|stack_copy_ended)\]' || true; } |
        awk '{ n += $NF } END { print n + 0 }')
    local loads=""
    for object in librustc_driver libLLVM; do
        local line
        line=$(grep -m1 "lightswitch::unwind::loader: .*$object.*: loaded" "$log" || true)
        if [ -n "$line" ]; then
            loads+=" $object=$(( $(log_ms "${line%% *}") - started ))ms"
        else
            loads+=" $object=never"
        fi
    done
    local load1
    load1=$(cut -d' ' -f1 /proc/loadavg)
    awk -v l="$label" -v t="$total" -v n="$no_table" -v d="$((ended - started))" \
        -v loads="$loads" -v load="$load1" 'BEGIN {
        printf "%-6s rustc samples %5d  no_table %5d  share %5.1f%%  compile %5d ms  load1 %s  table loaded after exec:%s\n",
            l, t, n, t ? 100 * n / t : 0, d, load, loads }'
}

for ((r = 1; r <= runs; r++)); do
    cache="$work/cache-$r"
    rm -rf "$cache"
    mkdir -p "$cache"
    run_once "cold$r" "$cache"
    run_once "warm$r" "$cache"
done
