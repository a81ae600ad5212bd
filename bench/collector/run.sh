#!/usr/bin/env bash
# The collector's sample store on a real workload (decision 0015): records a
# whole-machine run at 10 kHz as OTLP (as root: real BPF), then runs
# `cargo bench --bench collector_store` on it, which prints the bytes on
# disk per sample for one hour of that workload and measures ingest.
#   sudo bash bench/collector/run.sh [SECONDS]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-30}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo build --release --bin lightswitch
./target/release/lightswitch -F 10000 --duration "$seconds" --profile-format otlp \
    --profile-path "$out" --unwind-cache-dir "$out/cache"
LIGHTSWITCH_BENCH_OTLP="$out/profile.otlp.pb" cargo bench --bench collector_store
