#!/usr/bin/env bash
# Overhead harness (docs/performance.md), one command as root:
#
#   sudo bash bench/overhead/run.sh [matrix|soak|rss|churn|timeline|startup|python|all] [--quick] [OPTIONS]
#
# Builds the workload (workload.c: no frame pointers, hot loop 30 frames
# deep) and lightswitch in release mode, then runs the harness
# (bench/overhead/main.rs, `cargo run --example overhead`), which rewrites its
# blocks of docs/performance.md. `--help` lists the options.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "$(id -u)" -ne 0 ]; then
    echo "error: run as root: sudo bash bench/overhead/run.sh $*" >&2
    exit 1
fi
bash scripts/setup.sh
target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target/overhead"
gcc -O2 -g -fomit-frame-pointer -fno-optimize-sibling-calls -fasynchronous-unwind-tables \
    -o "$target/overhead/workload" bench/overhead/workload.c
# The hostile neighbours and the bystander of `churn --hostile N` (decision 0013).
gcc -O1 -fno-omit-frame-pointer -o "$target/overhead/hostile" bench/overhead/hostile.c
cargo build --release --quiet --bin lightswitch --example overhead
exec "$target/release/examples/overhead" --workload "$target/overhead/workload" \
    --lightswitch "$target/release/lightswitch" \
    --hostile-program "$target/overhead/hostile" "$@"
