#!/usr/bin/env bash
# Boots another kernel under qemu (virtme-ng over this machine's root file
# system) and checks that lightswitch works there:
#
#   bash tests/kernels/run.sh 5.10    # Debian 11's kernel (no bpf_loop: the compat programs)
#   bash tests/kernels/run.sh 6.1     # Debian 12's own kernel
#   bash tests/kernels/run.sh 6.12    # Debian 12's backport kernel
#
# KERNEL is a Debian release series ("5.10", "6.1", "6.12") or a full package
# name ("linux-image-6.1.0-50-amd64"). The newest installed package of the
# series is used, else the newest one apt offers is installed; 5.10 (Debian
# 11's, not in Debian 12's sources) comes from the bullseye-security suite of
# the Debian mirror apt uses, installed with apt-get (which brings its
# dependencies). Installs what it needs (the kernel package, qemu-system-x86,
# busybox-static, virtme-ng from PyPI) and builds the release binary if it is
# missing (LS=... points at another).
#
# Checks, one line each, then PASS or FAIL (exit status 0 only on PASS):
#   load        the BPF program loads (load time and verified instructions
#               per program are printed for docs/kernels.md)
#   chain       --pids of a running no-frame-pointer program, 10 s at 99 Hz
#               in 2 s windows: after the first window (the start-up, whose
#               share is printed too) >= 90% of its samples carry its whole
#               call chain (main;alpha;beta;gamma_;delta;burn). A 3 s cold
#               run first fills the unwind-table cache the checks use
#               (emulated CPUs build tables 5-15x slower: the checks are about
#               the kernel; the info line gives cold and warm start-up times)
#   pprof       the last window's pprof profile decodes (go tool pprof)
#   exec-exit   whole-machine run: once the profiler has described the
#               processes running at its start, a shell execs a second copy
#               of the program; after its 1.5 s warm-up phase
#               (main;warm_up;warm_burn, whose share is printed too) >= 90%
#               of its samples carry the whole chain; after it exits, Ctrl-C
#               ends the run, which must exit 0
#   record      `record -- chain 3` (the program from its first instruction):
#               exits 0, and >= 90% of the samples in burn carry the whole
#               chain
# The load line also names the variant of the BPF programs the kernel got
# (bpf_loop, or compat before 5.17: docs/kernels.md).
#
# Under TCG (the default: KVM hangs at boot in nested VMs) one kernel takes
# 1-2 minutes here (5.10: 2-4), far more on a loaded machine; the guest is
# stopped after VM_TIMEOUT seconds (default 600). KVM=1 uses KVM where it
# works; KEEP=1 keeps the run's files (under target/kernel-check.*, or
# /var/lib/lightswitch-kernel-check/ for a checkout under /tmp) for a look.
# `--install-only` after KERNEL installs the kernel package, qemu and
# virtme-ng and stops (scripts/setup.sh does this for 5.10 and 6.1).
set -uo pipefail

KERNEL=${1:?usage: tests/kernels/run.sh KERNEL [--install-only] (e.g. 6.1, 6.12, or linux-image-...)}
INSTALL_ONLY=${2:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
LS=${LS:-$ROOT/target/release/lightswitch}
export DEBIAN_FRONTEND=noninteractive

say() { printf '%-10s %s\n' "$1" "$2"; }
die() { say setup "$1"; echo FAIL; exit 1; }

# --- The kernel package ------------------------------------------------------
case "$KERNEL" in
linux-image-*) pattern="^${KERNEL//./\\.}\$" ;;
5.10) pattern='^linux-image-5\.10\.0-[0-9]+-amd64$' ;;
6.1) pattern='^linux-image-6\.1\.0-[0-9]+-amd64$' ;;
*) pattern="^linux-image-${KERNEL//./\\.}\\.[0-9]+\\+deb[0-9]+-amd64\$" ;;
esac
newest() { grep -E "$pattern" | sort -V | tail -1; }
pkg=$(dpkg-query -W -f='${Package} ${Status}\n' 'linux-image-*' 2>/dev/null |
    awk '$4 == "installed" {print $1}' | newest)
apt_updated=0
# Debian 11's kernel: the newest package of bullseye-security, from the mirror
# apt uses (the first URIs line of the Debian sources, or sources.list's first
# deb line), installed with its dependencies.
if [ -z "$pkg" ] && [ "$KERNEL" = 5.10 ]; then
    mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
    [ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null)
    [ -n "$mirror" ] || die "no Debian mirror in apt's sources"
    security=${mirror%/debian}/debian-security
    file=$(curl -fsS -m 120 "$security/dists/bullseye-security/main/binary-amd64/Packages.xz" | xz -d |
        awk '/^Package: linux-image-5\.10\.0-[0-9]+-amd64$/{p=1} p&&/^Filename:/{print $2; p=0}' | sort -V | tail -1)
    [ -n "$file" ] || die "no linux-image-5.10.0-*-amd64 in $security bullseye-security"
    deb_dir=$(mktemp -d)
    curl -fsS -m 600 -o "$deb_dir/${file##*/}" "$security/$file" || die "downloading $security/$file failed"
    apt-get update -qq && apt_updated=1
    apt-get install -y -qq --no-install-recommends "$deb_dir/${file##*/}" >/dev/null ||
        die "apt-get install ${file##*/} failed"
    rm -rf "$deb_dir"
    pkg=$(dpkg-query -W -f='${Package} ${Status}\n' 'linux-image-*' 2>/dev/null |
        awk '$4 == "installed" {print $1}' | newest)
    [ -n "$pkg" ] || die "installing ${file##*/} gave no $KERNEL kernel"
fi
if [ -z "$pkg" ]; then
    apt-get update -qq && apt_updated=1
    pkg=$(apt-cache search --names-only "${pattern%\$}" | awk '{print $1}' | newest)
    [ -n "$pkg" ] || die "no Debian package matches kernel $KERNEL"
fi
need=()
for p in "$pkg" qemu-system-x86 busybox-static curl xz-utils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    [ $apt_updated = 1 ] || apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || die "apt-get install ${need[*]} failed"
fi
# virtme-ng's `vng`: on PATH, in the scripts directory of the python3 it
# was installed for, or in the virtualenv scripts/setup.sh makes (where it is
# installed if missing: Debian 12's own Python refuses a system-wide pip).
vng_venv=${CARGO_TARGET_DIR:-$ROOT/target}/vng-venv
find_vng() {
    command -v vng && return
    [ -x "$vng_venv/bin/vng" ] && echo "$vng_venv/bin/vng" && return
    local dir
    dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null) &&
        [ -x "$dir/vng" ] && echo "$dir/vng"
}
VNG=$(find_vng)
if [ -z "$VNG" ]; then
    { /usr/bin/python3 -m venv "$vng_venv" && "$vng_venv/bin/pip" install -q virtme-ng; } >/dev/null 2>&1 ||
        die "installing virtme-ng into $vng_venv failed (python3-venv missing? bash scripts/setup.sh)"
    VNG=$(find_vng) || die "virtme-ng installed, but no vng command found"
fi
# vng runs its sibling `virtme-run` by name: its directory goes on PATH.
PATH="$(dirname "$VNG"):$PATH"
vmlinuz=/boot/vmlinuz-${pkg#linux-image-}
[ -f "$vmlinuz" ] || die "$vmlinuz is missing after installing $pkg"
if [ "$INSTALL_ONLY" = --install-only ]; then
    say setup "$pkg, qemu and virtme-ng are installed"
    exit 0
fi
if [ ! -x "$LS" ]; then
    cargo build --release >/dev/null 2>&1 || die "cargo build --release failed"
fi
command -v go >/dev/null || die "go is missing (bash scripts/setup.sh installs it)"

# --- The guest's work ------------------------------------------------------------
# The guest sees this machine's root file system, but virtme-ng mounts empty
# file systems of its own on /tmp, /var/tmp, /run, /dev/shm, /var/log and
# /var/cache. Everything the guest shares with us (the programs, the binary,
# the results) lives under target/, or, when the checkout is under one of
# those, under /var/lib/lightswitch-kernel-check/.
hidden_from_guest() {
    case "$(realpath -m "$1")/" in
    /tmp/* | /var/tmp/* | /run/* | /dev/shm/* | /var/log/* | /var/cache/*) return 0 ;;
    esac
    return 1
}
exchange=$ROOT/target
hidden_from_guest "$exchange" && exchange=/var/lib/lightswitch-kernel-check
mkdir -p "$exchange" || die "cannot create $exchange"
D=$(mktemp -d "$exchange/kernel-check.XXXXXX") || die "cannot create a directory in $exchange"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$D"' EXIT
hidden_from_guest "$D" && die "$D is hidden from the guest"
if hidden_from_guest "$LS"; then
    cp "$LS" "$D/lightswitch" || die "copying $LS to $D failed"
    LS=$D/lightswitch
fi
cat >"$D/chain.c" <<'C'
#include <stdlib.h>
#include <time.h>
#define NOINLINE __attribute__((noinline))
volatile unsigned long sink;
NOINLINE void burn(unsigned long n) { for (unsigned long i = 0; i < n; i++) sink += i * 2654435761u; }
NOINLINE void delta(unsigned long n) { burn(n); sink++; }
NOINLINE void gamma_(unsigned long n) { delta(n); sink++; }
NOINLINE void beta(unsigned long n) { gamma_(n); sink++; }
NOINLINE void alpha(unsigned long n) { beta(n); sink++; }
NOINLINE void warm_burn(unsigned long n) { for (unsigned long i = 0; i < n; i++) sink += i * 40503u; }
NOINLINE void warm_up(unsigned long n) { warm_burn(n); sink++; }
static double since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) + (t.tv_nsec - t0->tv_nsec) / 1e9;
}
/* chain SECONDS [WARM_UP_SECONDS]: main;warm_up;warm_burn first, then main;alpha;...;burn.
 * Long bursts between clock reads: under TCG clock_gettime is a real system call. */
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 10.0, warm = argc > 2 ? atof(argv[2]) : 0.0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (since(&t0) < warm) warm_up(2000000);
    while (since(&t0) < secs) alpha(2000000);
    return 0;
}
C
gcc -O2 -g -fomit-frame-pointer -fno-optimize-sibling-calls -o "$D/chain" "$D/chain.c" || die "gcc failed"
cp "$D/chain" "$D/late"
cat >"$D/guest.sh" <<EOF
uname -r > $D/uname
# 0. Cold start: builds the unwind tables into the cache the checks use, so that
#    they measure the kernel side, not how fast an emulated CPU builds tables.
$D/chain 600 &
chain=\$!
sleep 0.5
$LS --pids \$chain --duration 3 --profile-format folded --profile-path $D/cold \\
    --unwind-cache-dir $D/cache --logging info > $D/cold.log 2>&1
# 1. A program that runs before the profiler starts, profiled by pid: 10 s in
#    2 s windows (the first holds the start-up, the rest the steady state).
$LS --pids \$chain --duration 10 --profile-interval 2 --profile-format folded,pprof \\
    --profile-path $D/pid --unwind-cache-dir $D/cache --logging info > $D/pid.log 2>&1
echo \$? > $D/pid.status
kill \$chain
# 2. Whole machine; once the profiler has described what runs at its start, a
#    shell execs a program that then exits; Ctrl-C ends the run.
$LS --duration 200 --profile-format folded --profile-path $D/all --unwind-cache-dir $D/cache \\
    --logging info > $D/all.log 2>&1 &
lspid=\$!
for i in \$(seq 900); do grep -q "start-up: unwind tables" $D/all.log && break; sleep 0.1; done
sh -c "exec $D/late 4 1.5"
kill -INT \$lspid
wait \$lspid
echo \$? > $D/all.status
# 3. record: a short program from its first instruction.
$LS record --sample-freq 99 --profile-format folded --profile-path $D/rec --unwind-cache-dir $D/cache \\
    --logging info -- $D/chain 3 > $D/rec.log 2>&1
echo \$? > $D/rec.status
EOF
kvm=--disable-kvm
[ "${KVM:-0}" = 1 ] && kvm=
started=$(date +%s)
timeout "${VM_TIMEOUT:-600}" "$VNG" -r "$vmlinuz" --user root $kvm --rw --memory 2G -- "bash $D/guest.sh" >"$D/vng.log" 2>&1
[ -s "$D/uname" ] || { tail -5 "$D/vng.log" >&2; die "the VM did not boot ($pkg)"; }
say kernel "$(cat "$D/uname") ($pkg), guest ran for $(($(date +%s) - started)) s"

# --- Checks ------------------------------------------------------------------
failed=0
check() { # name ok(0/1) detail
    if [ "$2" = 0 ]; then say "$1" "ok: $3"; else say "$1" "FAILED: $3"; failed=1; fi
}
share() { # folded files (glob), process, chain [leaf user frame ["" for any]] [files to skip] -> "samples whole share"
    python3 - "$@" <<'PY'
import glob, sys
pattern, proc, chain = sys.argv[1:4]
leaf = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
skip = int(sys.argv[5]) if len(sys.argv) > 5 else 0
lines = []
for path in sorted(glob.glob(pattern))[skip:]:
    lines += open(path).read().splitlines()
total = whole = 0
for line in lines:
    stack, _, n = line.rpartition(" ")
    frames = stack.split(";")
    user = [f for f in frames if not f.endswith("_[k]")]
    if frames[0] != proc or (leaf and user[-1] != leaf):
        continue
    total += int(n)
    whole += int(n) if chain in stack else 0
print(total, whole, f"{whole / total if total else 0:.3f}")
PY
}
CHAIN="main;alpha;beta;gamma_;delta;burn"
load_line=$(grep -h "BPF program on kernel" "$D/pid.log" 2>/dev/null | sed 's/.*BPF program on kernel [^:]*: //' | head -1)
if [ -n "$load_line" ]; then
    check load 0 "$load_line"
else
    check load 1 "$(grep -hv '^libbpf' "$D/pid.log" 2>/dev/null | tail -1 | cut -c1-300)"
fi
read -r total whole frac <<<"$(share "$D/pid/folded-*.txt" chain "$CHAIN" "" 1)"
read -r s_total s_whole s_frac <<<"$(share "$D/pid/folded-*.txt" chain "$CHAIN")"
ok=1; [ "$total" -gt 0 ] && [ $((whole * 10)) -ge $((total * 9)) ] && [ "$(cat "$D/pid.status" 2>/dev/null)" = 0 ] && ok=0
check chain $ok "after the first 2 s window, $whole of $total samples of chain carry $CHAIN (share $frac, need >= 0.9); whole run $s_whole of $s_total ($s_frac); exit status $(cat "$D/pid.status" 2>/dev/null || echo none)"
last_pprof=$(ls "$D"/pid/profile-*.pb 2>/dev/null | sort | tail -1)
top=$(go tool pprof -top "${last_pprof:-$D/pid/none.pb}" 2>&1)
ok=1; grep -q ' burn$' <<<"$top" && ok=0
check pprof $ok "$(grep -m1 -E '^ *[0-9.]+[a-z]* +[0-9.]+%' <<<"$top" | tr -s ' ' | cut -c1-120) (go tool pprof -top)"
read -r total whole frac <<<"$(share "$D/all/folded.txt" late "$CHAIN" burn)"
read -r w_total w_whole w_frac <<<"$(share "$D/all/folded.txt" late "main;warm_up;warm_burn" warm_burn)"
ok=1; [ "$total" -gt 0 ] && [ $((whole * 10)) -ge $((total * 9)) ] && [ "$(cat "$D/all.status" 2>/dev/null)" = 0 ] && ok=0
check exec-exit $ok "program exec'd once the profiler was running, after its 1.5 s warm-up: $whole of $total samples whole (share $frac, need >= 0.9); in the warm-up $w_whole of $w_total ($w_frac); run exit status $(cat "$D/all.status" 2>/dev/null || echo none)"
read -r total whole frac <<<"$(share "$D/rec/folded.txt" chain "$CHAIN" burn)"
ok=1; [ "$total" -gt 0 ] && [ $((whole * 10)) -ge $((total * 9)) ] && [ "$(cat "$D/rec.status" 2>/dev/null)" = 0 ] && ok=0
check record $ok "record -- chain 3: $whole of $total samples in burn carry the whole chain (share $frac, need >= 0.9); exit status $(cat "$D/rec.status" 2>/dev/null || echo none)"
startup=$(for f in cold pid all rec; do
    echo "$f: $(grep -ho "start-up: unwind tables.*" "$D/$f.log" 2>/dev/null | sed 's/ (.*//; s/start-up: unwind tables of the //')"
done | paste -sd';')
say info "${startup:-no start-up line}"
if [ $failed = 0 ]; then echo PASS; else echo FAIL; fi
exit $failed
