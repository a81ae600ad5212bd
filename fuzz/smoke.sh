#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ from its seeds (fuzz/seeds/TARGET)
# and fails on the first crash, panic, leak or time-out (an input taking
# over 30 s). 20 s per target by default; CI runs `--seconds 10`. For the long runs of
# docs/reliability.md: `bash fuzz/smoke.sh --runs 1000000` (each target
# until it has executed that many inputs; its corpus grows in
# fuzz/corpus/TARGET, kept between runs and ignored by git; with
# `--seconds N` too, each stops at whichever comes first).
#
# Needs the nightly toolchain (`rustup toolchain install nightly`) and
# cargo-fuzz, which is installed here if missing (`cargo install
# cargo-fuzz --locked`: about a minute, three on a loaded 2-CPU machine).
# A crash leaves its input in fuzz/artifacts/TARGET/; replay it with
# `cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=""
runs=""
targets=(pprof_body unwind_builder unwind_cache perf_map jitdump)
targets+=(compare_folded compare_timeline eh_frame_hdr)
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --runs) runs="$2"; shift 2 ;;
        --target) targets=("$2"); shift 2 ;;
        *) echo "usage: $0 [--seconds N | --runs N] [--target NAME]" >&2; exit 2 ;;
    esac
done

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: installing the nightly toolchain" >&2
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cargo +nightly fuzz build -O
for target in "${targets[@]}"; do
    limit=()
    if [ -n "$runs" ]; then
        corpus="fuzz/corpus/$target"
        limit+=(-runs="$runs")
    else
        corpus=$(mktemp -d)
        seconds=${seconds:-20}
    fi
    if [ -n "$seconds" ]; then
        limit+=(-max_total_time="$seconds")
    fi
    mkdir -p "$corpus"
    echo "fuzz: $target (${limit[*]})" >&2
    start=$(date +%s)
    log="$(mktemp)"
    status=0
    cargo +nightly fuzz run -O "$target" "$corpus" "fuzz/seeds/$target" -- \
        "${limit[@]}" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E "^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)" "$log" || true
    echo "fuzz: $target: exit $status after $(( $(date +%s) - start )) s (log: $log)" >&2
    if [ "$status" -ne 0 ]; then
        tail -n 60 "$log" >&2
        exit "$status"
    fi
done
