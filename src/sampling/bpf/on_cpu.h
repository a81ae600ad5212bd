/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The sample entry points: on_cpu_sample (and its compat variant), attached
 * to one cpu-clock perf event per online CPU. On each sample it records who
 * was running, the kernel stack and the user registers, and hands the
 * record to walk_from (record.h), which walks the user stack and sends it.
 */
#ifndef LIGHTSWITCH_ON_CPU_H
#define LIGHTSWITCH_ON_CPU_H

#define PF_KTHREAD 0x00200000

/* A sample: who runs, its kernel stack, its user stack, sent as one record.
 * `compat`: the variant for kernels before 5.17 (walker_variants.h). */
static __always_inline int take_sample(struct bpf_perf_event_data *ctx, bool compat)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 tid = (__u32)id;

	/* The idle task (pid 0, one per CPU) is not sampled. */
	if (tid == 0)
		return 0;
	if (exclude_pid != 0 && pid == exclude_pid)
		return 0;
	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;

	count(STAT_SAMPLES);
	if (scratch_is_busy()) {
		count(STAT_SAMPLES_BUSY);
		return 0;
	}

	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 0;
	struct stack_sample *s = &sc->sample;
	struct walk_state *st = &sc->state;
	struct task_struct *task = current_task(compat);
	begin_record(sc, task, pid, tid, bpf_ktime_get_ns());
	/* The compat walk cannot ask the kernel for a mapping (bpf_find_vma):
	 * as if it had asked already. */
	st->vma_looked_up = compat;
	struct sample_header *h = &s->header;

	/* The registers at the interrupt. */
	const struct sample_regs *regs = sample_regs_of(ctx);
	__u64 ip = regs->ip, sp = regs->sp, bp = regs->bp, bx = regs->bx;
	bool in_user_mode = sample_in_user_mode(regs);

	/* Kernel stack, leaf first, from the kernel's own unwinder. A sample
	 * taken in user mode has none. */
	if (!in_user_mode) {
		long kbytes = bpf_get_stack(ctx, s->frames, MAX_KERNEL_FRAMES * sizeof(__u64), 0);
		if (kbytes < 0)
			count(STAT_KERNEL_STACK_ERROR);
		else
			st->kernel_frames = kbytes / sizeof(__u64);
		if (st->kernel_frames > MAX_KERNEL_FRAMES)
			st->kernel_frames = MAX_KERNEL_FRAMES;
	}

	if (TASK_FIELD(compat, task, flags) & PF_KTHREAD) {
		h->flags |= SAMPLE_FLAG_KERNEL_THREAD;
		finish(st, UNWIND_NO_USER_STACK);
		send_sample(sc, compat);
		return 0;
	}

	if (!in_user_mode && compat) {
		/* Interrupted in the kernel: the user registers are the ones
		 * saved at kernel entry (found without bpf_task_pt_regs). */
		if (read_task_user_regs_compat(task, &sc->user_regs) != 0) {
			finish(st, UNWIND_READ_FAULT);
			send_sample(sc, compat);
			return 0;
		}
		ip = sc->user_regs.ip;
		sp = sc->user_regs.sp;
		bp = sc->user_regs.bp;
		bx = sc->user_regs.bx;
	} else if (!in_user_mode) {
		/* Interrupted in the kernel: the user registers are the ones
		 * saved at kernel entry. */
		struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(task);
		ip = BPF_CORE_READ(uregs, ip);
		sp = BPF_CORE_READ(uregs, sp);
		bp = BPF_CORE_READ(uregs, bp);
		bx = BPF_CORE_READ(uregs, bx);
	}
	st->ip = ip;
	st->sp = sp;
	st->bp = bp;
	st->bx = bx;
	st->exact_ip = 1;

	return walk_from(ctx, sc, task, &walker_programs, compat);
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	return take_sample(ctx, false);
}

SEC("perf_event")
int on_cpu_sample_compat(struct bpf_perf_event_data *ctx)
{
	return take_sample(ctx, true);
}

#endif
