// SPDX-License-Identifier: GPL-2.0
/*
 * lightswitch's BPF programs, one file per feature (docs/architecture.md,
 * "bpf/"). Each file is included once, here, and uses only what the files
 * above it define: read from the bottom for the order data flows (a sample
 * enters at on_cpu.h, walks in walker.h, leaves in record.h), from the top
 * for what each piece is built on.
 *
 * Two variants of the programs that need newer helpers are built side by
 * side and the loader loads one (src/sampling/sampler/variant.rs): `bpf_loop`
 * (Linux 5.17 and newer) and `compat` (5.10 to 5.16); their walk loops are
 * in walker_variants.h, the other differences are a constant `compat`
 * argument through the files.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

/* Record and table layouts shared with user space. */
#include "profiler.h"
/* The architecture: registers at a sample, signal frames, address limits. */
#include "arch_x86_64.h"
/* Settings, maps, per-CPU scratch space and walk state, counters. */
#include "state.h"
/* Process and exec tracking: descriptions kept current at exec, fork, exit
 * and for a pc the walker does not know (programs on_exec, on_fork, on_exit). */
#include "process.h"
/* Reusing the CPU's previous walk. */
#include "walk_memo.h"
/* The DWARF walker: one step (walk_step). */
#include "walker.h"
/* Its two loops: bpf_loop and compat. */
#include "walker_variants.h"
/* Stack copies for user space to walk on from. */
#include "stack_copy.h"
/* Sending a record, and the program array walks go on through. */
#include "send.h"
/* The CPython walker, run after a native walk (program walk_python). */
#include "python.h"
/* A record's walk across tail calls (programs walk_user_stack*). */
#include "record.h"
/* The sample entry points (programs on_cpu_sample*). */
#include "on_cpu.h"
/* Off-CPU waits (programs off_cpu_switch, off_cpu_resume, walk_user_stack_off_cpu). */
#include "off_cpu.h"

char LICENSE[] SEC("license") = "GPL";
