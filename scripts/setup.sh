#!/usr/bin/env bash
# Installs what building and testing lightswitch needs on Debian/Ubuntu, beyond
# the Rust toolchain and gcc: clang (compiles the BPF program), libelf, zlib and
# pkg-config (libbpf), make (builds jemalloc, the allocator), protoc (pprof
# message types), Go (`go tool pprof` in the tests), util-linux
# (setpriv/unshare in the tests), linux-perf (the overhead harness compares
# against `perf record`), nodejs (JIT perf-map tests: `node --perf-basic-prof`),
# debuginfod (a real debuginfod server for the debug-file fetching test),
# man-db (tests/cli.rs renders the generated man page with `man -l`).
# Idempotent: installs only what is missing.
set -euo pipefail

packages=(clang llvm libelf-dev zlib1g-dev pkg-config make protobuf-compiler golang-go util-linux linux-perf nodejs debuginfod man-db)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
