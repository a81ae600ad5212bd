#!/usr/bin/env bash
# The OTLP sender's cost against the remote sender's (decision 0015): the agent's
# CPU time (user + system, from /usr/bin/time) with 1 s windows at 10 kHz on
# the whole machine, `--sender otlp` (to tests/otlp/receiver.py, which
# decodes every request with opentelemetry-proto and answers 200) against
# `--sender remote` with pprof (to `lightswitch collector`), alternated
# ROUNDS times, each SECONDS long, beside one busy loop per CPU.
#
#   sudo bash bench/otlp_sender.sh [SECONDS] [ROUNDS]     (default 30 2)
#
# Needs a release build and target/otlp-venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
rounds=${2:-2}
target=${CARGO_TARGET_DIR:-target}
bin=$target/release/lightswitch
python=${LIGHTSWITCH_OTLP_PYTHON:-$target/otlp-venv/bin/python3}
scratch=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$scratch"; }
trap cleanup EXIT

for _ in $(seq "$(nproc)"); do (while :; do :; done) & pids+=($!); done
mkdir -p "$scratch/otlp"
"$python" tests/otlp/receiver.py "$scratch/otlp" --accept-all > "$scratch/receiver.out" &
pids+=($!)
"$bin" collector --listen 127.0.0.1:0 --storage "$scratch/store" > "$scratch/collector.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
    grep -q "listening on" "$scratch/receiver.out" 2>/dev/null && grep -qE "127\.0\.0\.1:[0-9]+" "$scratch/collector.out" && break
    sleep 0.1
done
otlp_port=$(sed -n 's/listening on //p' "$scratch/receiver.out")
collector=$(grep -oE "127\.0\.0\.1:[0-9]+" "$scratch/collector.out" | head -1)

run() { # name, args...
    local name=$1; shift
    local status=0
    /usr/bin/time -f "%U %S" -o "$scratch/time" "$bin" --duration "$seconds" --sample-freq 10000 \
        --profile-interval 1 "$@" > "$scratch/$name.out" 2>&1 || status=$?
    read -r user sys < <(tail -1 "$scratch/time")
    if [ "$status" != 0 ]; then
        echo "$name: exit status $status: $(grep -m1 '^error' "$scratch/$name.out")"
    fi
    local delivery
    delivery=$(grep "^delivery:" "$scratch/$name.out" || true)
    printf '%-7s cpu %6.2f s (user %s, sys %s)  %s\n' "$name" "$(echo "$user + $sys" | bc)" "$user" "$sys" "$delivery"
}

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg); $seconds s per run, 1 s windows, 10 kHz"
for _ in $(seq "$rounds"); do
    run remote --sender remote --server-url "http://$collector/v1/profiles"
    run otlp --sender otlp --server-url "http://127.0.0.1:$otlp_port"
done
