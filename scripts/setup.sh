#!/usr/bin/env bash
# Installs what building and testing lightswitch needs on Debian/Ubuntu, beyond
# the Rust toolchain and gcc: clang (compiles the BPF program), libelf, zlib and
# pkg-config (libbpf), make (builds jemalloc, the allocator), protoc (pprof
# message types), Go (`go tool pprof` in the tests), util-linux
# (setpriv/unshare in the tests), linux-perf (the overhead harness compares
# against `perf record`; bpftrace and rt-tests's hackbench are the off-CPU cost
# harness's anchors, bench/overhead/offcpu.sh; bpftool switches the Python
# walk off and on in its `python` mode), nodejs (JIT perf-map tests: `node --perf-basic-prof`),
# debuginfod (a real debuginfod server for the debug-file fetching test),
# fuse3 and libfuse3-dev (tests/reliability/hung_fs.rs compiles a FUSE
# server whose reads never answer),
# man-db (tests/cli.rs renders the generated man page with `man -l`),
# pypy3 (tests/python checks that PyPy is reported as unsupported, never named),
# python3-venv (tests/otlp decodes OTLP files with the `opentelemetry-proto`
# Python package, installed by pip into a virtualenv: Debian 12's Python is
# "externally managed", so neither a system-wide nor a `--user` pip install
# is allowed; the virtualenv is `otlp-venv` in the cargo target directory,
# $CARGO_TARGET_DIR or ./target, where the test looks for it; tests/perfetto
# likewise decodes Perfetto traces with the `perfetto` package in
# `perfetto-venv`); for
# tests/kernels/run.sh (other kernels booted under qemu): qemu-system-x86,
# busybox-static, curl and xz-utils (Debian 11's 5.10 kernel is fetched from
# bullseye-security), and virtme-ng from PyPI in the virtualenv `vng-venv`
# of the target directory; chromium (tests/web drives the web view in it,
# headless, with npm's playwright-core, installed by `npm ci` into
# web/node_modules from web/package-lock.json; npm comes with some builds of
# nodejs, and is Debian's npm package otherwise).
# Idempotent: installs only what is missing.
set -euo pipefail

packages=(clang llvm libelf-dev zlib1g-dev pkg-config make protobuf-compiler golang-go util-linux linux-perf nodejs debuginfod man-db pypy3 python3-venv qemu-system-x86 busybox-static curl xz-utils chromium bpftrace rt-tests fuse3 libfuse3-dev bpftool)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
if [ ${#missing[@]} -ne 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
venv=$target/otlp-venv
check='import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2'
if ! "$venv/bin/python3" -c "$check" 2>/dev/null; then
    echo "setup: installing opentelemetry-proto into $venv" >&2
    mkdir -p "$target"
    /usr/bin/python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'opentelemetry-proto>=1.43'
fi
# The `perfetto` package's generated protobuf classes decode Perfetto traces
# in tests/perfetto (its trace processor, which fetches a binary, is not used).
perfetto_venv=$target/perfetto-venv
if ! "$perfetto_venv/bin/python3" -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2' 2>/dev/null; then
    echo "setup: installing perfetto into $perfetto_venv" >&2
    mkdir -p "$target"
    /usr/bin/python3 -m venv "$perfetto_venv"
    "$perfetto_venv/bin/pip" install -q 'perfetto>=0.59'
fi
vng_venv=$target/vng-venv
if ! command -v vng >/dev/null && [ ! -x "$vng_venv/bin/vng" ]; then
    echo "setup: installing virtme-ng into $vng_venv" >&2
    mkdir -p "$target"
    /usr/bin/python3 -m venv "$vng_venv"
    "$vng_venv/bin/pip" install -q virtme-ng
fi

# py-spy, the reference tests/python compares Python stacks with.
spy_venv=$target/py-spy-venv
if ! command -v py-spy >/dev/null && [ ! -x "$spy_venv/bin/py-spy" ]; then
    echo "setup: installing py-spy into $spy_venv" >&2
    mkdir -p "$target"
    /usr/bin/python3 -m venv "$spy_venv"
    "$spy_venv/bin/pip" install -q py-spy
fi

# playwright-core for tests/web, at the version web/package-lock.json pins.
if ! command -v npm >/dev/null; then
    echo "setup: installing npm" >&2
    $SUDO apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
if ! [ -f "$repo/web/node_modules/playwright-core/package.json" ]; then
    echo "setup: installing playwright-core into $repo/web/node_modules" >&2
    (cd "$repo/web" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The Debian kernels tests/kernels/run.sh boots under qemu: Debian 11's 5.10
# (bullseye-security) and Debian 12's 6.1, with qemu and virtme-ng.
for kernel in 5.10 6.1; do
    $SUDO bash "$repo/tests/kernels/run.sh" "$kernel" --install-only >/dev/null ||
        { echo "setup: installing the $kernel kernel for tests/kernels/run.sh failed" >&2; exit 1; }
done
