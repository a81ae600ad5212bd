//! The compat variant of the BPF programs (kernels 5.10 to 5.16: no
//! `bpf_loop`, `bpf_find_vma`, `bpf_task_pt_regs` or
//! `bpf_get_current_task_btf`), forced on this machine's kernel: the same
//! programs as the tests above, with the same expected stacks (the
//! bounded-loop walker must give the same frames, depth and results as
//! `bpf_loop`'s). Each profiler run must say it loaded the compat programs
//! ([`with_bpf_variant`]).

use super::*;

#[test]
fn compat_c_no_frame_pointers_chain() {
    with_bpf_variant("compat", languages::c_no_frame_pointers_chain);
}

/// 300 frames: three program runs of the walker (128 frames each).
#[test]
fn compat_c_recursion_300() {
    with_bpf_variant("compat", languages::c_recursion_300);
}

/// Reused walks: the step records what the next walk may join.
#[test]
fn compat_reused_walks_check_every_caller() {
    with_bpf_variant("compat", languages::reused_walks_check_every_caller);
}

/// 1024 frames, the limit: eight program runs, seven tail calls.
#[test]
fn compat_truncated_beyond_limit() {
    with_bpf_variant("compat", processes::truncated_beyond_limit);
}

#[test]
fn compat_signal_handler_frame() {
    with_bpf_variant("compat", processes::signal_handler_frame);
}

/// The interrupted frame's return address in a register: the saved user
/// registers read from the top of the kernel stack, not `bpf_task_pt_regs`.
#[test]
fn compat_vfork_return_address_in_a_register() {
    with_bpf_variant("compat", processes::vfork_return_address_in_a_register);
}

/// A library mapped after the walk started: found by user space (no
/// `bpf_find_vma`), walked on from the stack copy.
#[test]
fn compat_dlopen_after_start() {
    with_bpf_variant("compat", processes::dlopen_after_start);
}

/// The trampoline's rbx-based CFA: rbx from the kernel-entry registers
/// (no `bpf_task_pt_regs`) or from `_dl_fixup`'s save slot.
#[test]
fn compat_lazy_binding_trampoline_cfa_in_rbx() {
    with_bpf_variant("compat", processes::lazy_binding_trampoline_cfa_in_rbx);
}

#[test]
fn compat_go_frame_pointers() {
    with_bpf_variant("compat", processes::go_frame_pointers);
}
