/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The two variants of the walk's loop. Both run walk_step (walker.h), the
 * one step body they share, FRAMES_PER_PROGRAM times per program run, and
 * the frame-pointer walk of a process not described yet (frame_pointer_only_step)
 * up to MAX_USER_FRAMES times; continue_walk and walk_from (record.h) call
 * them through walk_frames and walk_frame_pointers.
 *
 * - bpf_loop (Linux 5.17 and newer; programs on_cpu_sample, walk_user_stack,
 *   on_exec, and the off-CPU ones): the step is bpf_loop's callback
 *   (unwind_step), verified once.
 * - compat (5.10 to 5.16; programs on_cpu_sample_compat,
 *   walk_user_stack_compat, on_exec_compat): the step is called from a
 *   global function (unwind_step_compat) in a bounded loop. The verifier
 *   checks a global function once, on its own, however many times it is
 *   called (Linux 5.6), so a loop of FRAMES_PER_PROGRAM calls costs it a few
 *   instructions per iteration, not a step's worth: each program run still
 *   walks FRAMES_PER_PROGRAM frames, and the tail calls reach
 *   MAX_USER_FRAMES as with bpf_loop. A global function takes only scalars
 *   on 5.10, so it looks up itself what bpf_loop's callback is handed (the
 *   scratch space, the process's description, the caches): one hash lookup
 *   more per frame. Tail calls from a program with BPF-to-BPF calls need
 *   Linux 5.10 (x86-64 JIT).
 *
 * What else the compat variant does without (a constant `compat` argument
 * through the files): bpf_get_current_task_btf (5.11): bpf_get_current_task
 * and bpf_probe_read_kernel (TASK_FIELD, state.h); bpf_task_pt_regs (5.15):
 * the saved user registers read from the top of the task's kernel stack
 * (arch_x86_64.h); bpf_find_vma (5.17): a pc in no described mapping ends
 * the walk as before user space learns of the mapping (UNWIND_NO_MAPPING,
 * with a stack copy user space walks on from), and an exec deletes the
 * process's description for user space to write anew (process.h).
 */
#ifndef LIGHTSWITCH_WALKER_VARIANTS_H
#define LIGHTSWITCH_WALKER_VARIANTS_H

/* bpf_loop variant: one frame of the walk (continue_walk). */
static long unwind_step(__u64 index, void *data)
{
	return walk_step(data, false);
}

/* compat variant: one frame of the walk, walk_step with what it needs
 * looked up here. Returns 1 to stop. Global (not static): verified once.
 * No arguments: clang may leave the register of an unused one unset, which
 * the verifier refuses. */
__noinline int unwind_step_compat(void)
{
	__u32 zero = 0;
	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 1;
	__u32 pid = sc->sample.header.pid;
	struct walk_context wc = {
		.sc = sc,
		.proc = bpf_map_lookup_elem(&process_mappings, &pid),
		.cache = bpf_map_lookup_elem(&row_cache, &zero),
		.memos = bpf_map_lookup_elem(&walk_memo, &zero),
	};
	return walk_step(&wc, true);
}

/* compat variant: one frame of the frame-pointer walk of a process not
 * described yet. Global: verified once. */
__noinline int frame_pointer_only_step_compat(void)
{
	return frame_pointer_only_step(0, NULL);
}

/* Up to FRAMES_PER_PROGRAM frames of wc's walk (wc is looked up anew per
 * frame by the compat variant). */
static __always_inline void walk_frames(struct walk_context *wc, bool compat)
{
	if (compat) {
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < FRAMES_PER_PROGRAM; i++)
			if (unwind_step_compat())
				break;
	} else {
		bpf_loop(FRAMES_PER_PROGRAM, unwind_step, wc, 0);
	}
}

/* Up to MAX_USER_FRAMES frames by frame pointers. */
static __always_inline void walk_frame_pointers(bool compat)
{
	if (compat) {
#pragma clang loop unroll(disable)
		for (__u32 i = 0; i < MAX_USER_FRAMES; i++)
			if (frame_pointer_only_step_compat())
				break;
	} else {
		bpf_loop(MAX_USER_FRAMES, frame_pointer_only_step, NULL, 0);
	}
}

#endif
