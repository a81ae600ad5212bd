/* SPDX-License-Identifier: GPL-2.0 */
/*
 * One record's life: it is begun (begin_record), its user stack is walked
 * FRAMES_PER_PROGRAM frames per program run and on through tail calls to
 * the walker programs (continue_walk, walk_user_stack), and it is sent to
 * user space (send.h), through the Python walker when the process runs a
 * CPython it knows (python.h). The
 * cpu-clock samples (on_cpu.h) and the off-CPU waits (off_cpu.h) both go
 * through walk_from.
 */
#ifndef LIGHTSWITCH_RECORD_H
#define LIGHTSWITCH_RECORD_H

/* Walk up to FRAMES_PER_PROGRAM frames, then either send the record or go
 * on in a fresh run of this program: the walker in slot 0 of `programs`, a
 * program array of ctx's program type (walker_programs holds the walker of
 * the variant user space loaded). `compat`: the variant for kernels without
 * bpf_loop and bpf_find_vma (walker_variants.h); off-CPU walks are never
 * compat (off_cpu.h). */
static __always_inline int continue_walk(void *ctx, struct scratch_space *sc, struct process_info *proc,
					 bool compat, void *programs)
{
	__u32 zero = 0;
	struct walk_state *st = &sc->state;
	struct walk_context wc = {
		.sc = sc,
		.proc = proc,
		.cache = bpf_map_lookup_elem(&row_cache, &zero),
		.memos = bpf_map_lookup_elem(&walk_memo, &zero),
	};
	if (!wc.proc || !wc.cache || !wc.memos) {
		finish(st, UNWIND_NO_TABLE);
	} else {
		walk_frames(&wc, compat);
		/* Never wanted by the compat walk (vma_looked_up is set at its start). */
		if (!compat && st->vma_wanted) {
			/* Which file is mapped at the pc, once per sample
			 * (bpf_find_vma cannot run twice in one interrupt): a
			 * mapping of an object whose table user space knows joins
			 * the description, for this walk and the next ones. The
			 * walk goes on in the next run of this program. */
			st->vma_wanted = 0;
			st->vma_looked_up = 1;
			struct vma_request req = {
				.proc = wc.proc,
				.timestamp_ns = sc->sample.header.timestamp_ns,
				.pid = sc->sample.header.pid,
			};
			bpf_find_vma(bpf_get_current_task_btf(), st->ip, add_vma, &req, 0);
		}
		if (st->joining) {
			st->joining = 0;
			/* If the stack changed since, the walk goes on from the join
			 * in the next run of this program (below): a second bpf_loop
			 * here would have the verifier check unwind_step once more. */
			if (!replay_remembered_walk(sc, &wc.memos->memos[wc.memos->current & 1]))
				st->join_failed = 1;
		}
		memo_keep_walk(sc, &wc);
	}
	if (!sc->state.done) {
		if (sc->state.user_frames >= MAX_USER_FRAMES) {
			finish(&sc->state, UNWIND_TRUNCATED);
		} else {
			sc->state.tail_calls++;
			bpf_tail_call(ctx, programs, 0);
			/* Only reached if the tail call failed. */
			finish(&sc->state, UNWIND_TRUNCATED);
		}
	}
	if (!compat)
		python_hook(ctx, sc, programs);
	send_sample(sc, compat);
	return 0;
}

/* The walk's next FRAMES_PER_PROGRAM frames, through a tail call. */
static __always_inline int walk_more(struct bpf_perf_event_data *ctx, bool compat)
{
	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 0;
	__u32 pid = sc->sample.header.pid;
	return continue_walk(ctx, sc, bpf_map_lookup_elem(&process_mappings, &pid), compat,
			     &walker_programs);
}

/* Start the record of a sample (or wait) of thread tid of process pid,
 * task the current task, at timestamp_ns: its header and a fresh walk state. */
static __always_inline void begin_record(struct scratch_space *sc, struct task_struct *task, __u32 pid,
					 __u32 tid, __u64 timestamp_ns)
{
	struct sample_header *h = &sc->sample.header;
	__builtin_memset(&sc->state, 0, sizeof(sc->state));
	h->timestamp_ns = timestamp_ns;
	h->pid = pid;
	h->tid = tid;
	h->cpu = bpf_get_smp_processor_id();
	h->flags = 0;
	h->python_frames = 0;
	h->python_status = PYTHON_NOT_WALKED;
	h->off_cpu_ns = 0;
	bpf_get_current_comm(h->thread_comm, sizeof(h->thread_comm));
	if (pid == tid)
		__builtin_memcpy(h->process_comm, h->thread_comm, TASK_COMM_LEN);
	else
		BPF_CORE_READ_STR_INTO(&h->process_comm, task, group_leader, comm);
}

/* Walk the user stack from the registers in sc->state (the kernel frames
 * are in place) and send the record: by the process's description, or, for
 * a process not described yet, by frame pointers. `programs`: the walker
 * program array of ctx's program type. */
static __always_inline int walk_from(void *ctx, struct scratch_space *sc, struct task_struct *task,
				     void *programs, bool compat)
{
	struct walk_state *st = &sc->state;
	__u32 pid = sc->sample.header.pid;
	struct process_info *proc = bpf_map_lookup_elem(&process_mappings, &pid);
	/* A description from before the latest exec describes another image. */
	if (proc && proc->exec_id != 0 && proc->exec_id != TASK_FIELD(compat, task, self_exec_id))
		proc = NULL;
	if (!proc) {
		/* Not described yet: user space is told at once (not at its next
		 * poll). Meanwhile, frame pointers give a best-effort stack. */
		notify_unknown_mapping(pid, st->ip, 0);
		/* User space walks the leaf's frame on from a copy of the stack. */
		note_copy_start(st, 0);
		walk_frame_pointers(compat);
		if (!st->done)
			finish(st, UNWIND_TRUNCATED);
		if (st->status != UNWIND_TRUNCATED)
			st->status = UNWIND_MAPPINGS_UNKNOWN;
		send_sample(sc, compat);
		return 0;
	}
	st->generation = proc->generation;
	return continue_walk(ctx, sc, proc, compat, programs);
}

SEC("perf_event")
int walk_user_stack(struct bpf_perf_event_data *ctx)
{
	return walk_more(ctx, false);
}

SEC("perf_event")
int walk_user_stack_compat(struct bpf_perf_event_data *ctx)
{
	return walk_more(ctx, true);
}

#endif
