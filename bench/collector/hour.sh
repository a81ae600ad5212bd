#!/usr/bin/env bash
# The users' case of docs/collector.md: one hour at 10 kHz in a real collector
# process, with a 200 µs critical section every 5 s in a busy process.
# Records SECONDS (default 30) of the whole machine at 10 kHz as OTLP while
# bench/collector/burst.c runs, starts `lightswitch collector`, and runs
# `cargo bench --bench collector_store` against it, which replays the
# recording over HTTP (10 s gzip'd OTLP windows, shifted copies) until one
# hour is stored, then times two queries. Prints the storage size too.
#   sudo bash bench/collector/hour.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-30}
out=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$out"; }
trap cleanup EXIT
cargo build --release --bin lightswitch
gcc -O2 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls -o "$out/burst" bench/collector/burst.c
"$out/burst" $((seconds + 5)) & pids+=($!)
./target/release/lightswitch -F 10000 --duration "$seconds" --profile-format otlp \
    --profile-path "$out" --unwind-cache-dir "$out/cache"
port=$((40000 + RANDOM % 20000))
./target/release/lightswitch collector --listen "127.0.0.1:$port" --storage "$out/store" \
    > "$out/collector.log" 2>&1 & pids+=($!)
collector=$!
for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$port/v1/hosts" >/dev/null && break
    sleep 0.2
done
LIGHTSWITCH_BENCH_OTLP="$out/profile.otlp.pb" \
    LIGHTSWITCH_BENCH_COLLECTOR_URL="http://127.0.0.1:$port" \
    LIGHTSWITCH_BENCH_COLLECTOR_PID=$collector \
    cargo bench --bench collector_store
echo "storage: $(du -sb "$out/store" | cut -f1) bytes ($(du -sb "$out/store/.samples" | cut -f1) in .samples)"
