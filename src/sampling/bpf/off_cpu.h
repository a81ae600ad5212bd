/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Off-CPU: where wanted threads wait. Included last by profiler.bpf.c:
 * it shares the walker, scratch space and rings of the files above; user
 * space loads and attaches these programs only with --off-cpu.
 *
 * Only tracepoints: kprobes and fentry/fexit are missing on some kernels
 * (no CONFIG_KPROBES; trampolines refused), and no tracefs is needed
 * (tp_btf attaches by BTF id).
 *
 * off_cpu_switch (tp_btf/sched_switch) sees both sides of a switch:
 * - prev, a wanted thread leaving its CPU: when, and whether it blocked or
 *   was still runnable (preempted, or yielding), into its task storage
 *   (off_cpu_starts);
 * - next, a thread getting its CPU back: how long it waited. A wait
 *   shorter than off_cpu_min_ns is counted and dropped. For a longer one
 *   its kernel stack is taken at once (bpf_get_task_stack: next has not
 *   run since it left, so this is where it waited). Its user stack cannot
 *   be read here (this is prev's address space), so the wait goes into
 *   off_cpu_pending with the user pc and sp it waited at.
 * off_cpu_resume (tp_btf/sys_exit) runs in the thread itself when the
 * system call it waited in returns: with the same user pc and sp as at the
 * wait, its user stack is walked by the same walker as cpu-clock samples
 * (tail calls through off_cpu_walkers) and one record goes out, with
 * SAMPLE_FLAG_OFF_CPU, the wait's length in off_cpu_ns and its end as the
 * timestamp; a process running a CPython the walker knows has its Python
 * frames walked first (walk_python_off_cpu, as walk_python does for
 * cpu-clock samples). A wait that does not end in a system call's return (a
 * preemption, a page fault) is sent from off_cpu_switch with its kernel
 * stack and user pc only (UNWIND_NOT_WALKED).
 *
 * Helpers: bpf_task_storage_get (5.11), bpf_get_task_stack (5.9),
 * bpf_task_pt_regs (5.15; only the bpf_loop variant has these programs),
 * bpf_get_current_task_btf, the walker's bpf_loop and bpf_find_vma,
 * bpf_ringbuf_*; program type tp_btf (5.5); map type task storage (5.11).
 */

/* Waits shorter than this are counted, not recorded (ns). */
const volatile __u64 off_cpu_min_ns = 0;

/* Waits in off_cpu_pending: while none is, off_cpu_resume costs one read. */
__u64 off_cpu_pending_count = 0;

/* Wanted threads off their CPU: when and how each left, in the task's
 * own storage (5.11): no lock and no hash per switch, where a hash map
 * keyed by tid cost about 300 ns a switch on `perf bench sched pipe`. A
 * thread not waiting has time_ns 0. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct off_cpu_start);
} off_cpu_starts SEC(".maps");

/* A wait that ended, waiting for its thread's system call to return so
 * that its user stack can be walked. */
struct off_cpu_pending {
	__u64 end_ns;               /* when the thread got its CPU back */
	__u64 waited_ns;
	__u64 ip;                   /* the thread's user pc and sp at the wait */
	__u64 sp;
	__u32 runnable;
	__u32 kernel_frames;
	__u64 kernel[MAX_KERNEL_FRAMES];
};

/* tid -> its pending wait (user space sizes it: PENDING_WAITS; allocated
 * only for waits of at least off_cpu_min_ns). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct off_cpu_pending);
} off_cpu_pending SEC(".maps");

/* Per-CPU space where off_cpu_switch assembles a pending wait. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct off_cpu_pending);
} off_cpu_scratch SEC(".maps");

/* The off-CPU walker (tp_btf/sys_exit, like off_cpu_resume: the kernel
 * only tail-calls between tracing programs of one hook), slot 0; its
 * Python walker, slot PYTHON_PROGRAM_SLOT (python.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} off_cpu_walkers SEC(".maps");

#define TASK_RUNNING 0
#define TASK_DEAD 0x80

/* Kernels before 5.14 name the task's state `state` (a long). */
struct task_struct___pre_5_14 {
	long state;
} __attribute__((preserve_access_index));

static __always_inline __u64 task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___pre_5_14 *)t, state);
}

static __always_inline void count_add(__u32 index, __u64 amount)
{
	__u64 *value = bpf_map_lookup_elem(&stats, &index);
	if (value)
		*value += amount;
}

static __always_inline void set_scratch_busy(__u32 busy)
{
	__u32 zero = 0;
	__u32 *flag = bpf_map_lookup_elem(&scratch_busy, &zero);
	if (flag)
		*flag = busy;
}

/* Start the record of wait p of task (not necessarily the current one). */
static __always_inline void begin_wait_record(struct scratch_space *sc, struct task_struct *task,
					      struct off_cpu_pending *p)
{
	struct sample_header *h = &sc->sample.header;
	__builtin_memset(&sc->state, 0, sizeof(sc->state));
	h->timestamp_ns = p->end_ns;
	h->pid = task->tgid;
	h->tid = task->pid;
	h->cpu = bpf_get_smp_processor_id();
	h->flags = SAMPLE_FLAG_OFF_CPU | (p->runnable ? SAMPLE_FLAG_RUNNABLE : 0);
	h->python_frames = 0;
	h->python_status = PYTHON_NOT_WALKED;
	h->off_cpu_ns = p->waited_ns;
	BPF_CORE_READ_STR_INTO(&h->thread_comm, task, comm);
	BPF_CORE_READ_STR_INTO(&h->process_comm, task, group_leader, comm);
	__u32 n = p->kernel_frames;
	if (n > MAX_KERNEL_FRAMES)
		n = MAX_KERNEL_FRAMES;
	if (n > 0 && bpf_probe_read_kernel(sc->sample.frames, n * sizeof(__u64), p->kernel) == 0)
		sc->state.kernel_frames = n;
}

/* Send wait p of task with its kernel stack and user pc only. */
static __always_inline void send_unwalked(struct task_struct *task, struct off_cpu_pending *p)
{
	struct scratch_space *sc = get_scratch();
	if (!sc)
		return;
	begin_wait_record(sc, task, p);
	__u32 slot = sc->state.kernel_frames;
	if (p->ip != 0 && slot < MAX_KERNEL_FRAMES) {
		sc->sample.frames[slot] = p->ip;
		sc->state.user_frames = 1;
	}
	finish(&sc->state, UNWIND_NOT_WALKED);
	send_sample(sc, false);
}

/* next got its CPU back after waiting `waited` ns (at least the minimum). */
static __always_inline void end_wait(struct task_struct *next, __u32 tid, __u64 now, __u64 waited,
				     bool runnable)
{
	__u32 zero = 0;
	struct off_cpu_pending *p = bpf_map_lookup_elem(&off_cpu_scratch, &zero);
	if (!p)
		return;
	p->end_ns = now;
	p->waited_ns = waited;
	p->runnable = runnable;
	struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(next);
	p->ip = BPF_CORE_READ(uregs, ip);
	p->sp = BPF_CORE_READ(uregs, sp);
	long kbytes = bpf_get_task_stack(next, p->kernel, sizeof(p->kernel), 0);
	if (kbytes < 0) {
		count(STAT_KERNEL_STACK_ERROR);
		kbytes = 0;
	}
	p->kernel_frames = kbytes / sizeof(__u64);
	/* A runnable thread goes back to user mode without a system call's
	 * return; so does one whose previous wait is still pending (it ran
	 * in between: that wait's user stack is gone). */
	struct off_cpu_pending *old = bpf_map_lookup_elem(&off_cpu_pending, &tid);
	if (scratch_is_busy()) {
		count(STAT_LOST_RINGBUF);
	} else {
		if (old)
			send_unwalked(next, old);
		if (runnable) {
			send_unwalked(next, p);
			if (old && bpf_map_delete_elem(&off_cpu_pending, &tid) == 0)
				__sync_fetch_and_add(&off_cpu_pending_count, -1);
			return;
		}
	}
	if (bpf_map_update_elem(&off_cpu_pending, &tid, p, BPF_ANY) != 0)
		count(STAT_OFF_CPU_UNTRACKED);
	else if (!old)
		__sync_fetch_and_add(&off_cpu_pending_count, 1);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(off_cpu_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = next->pid;
	struct off_cpu_start *start = tid ? bpf_task_storage_get(&off_cpu_starts, next, 0, 0) : NULL;
	if (start && start->time_ns != 0) {
		__u64 waited = now - start->time_ns;
		bool runnable = start->runnable;
		start->time_ns = 0;
		if (waited < off_cpu_min_ns) {
			count(STAT_OFF_CPU_SHORT);
			count_add(STAT_OFF_CPU_SHORT_NS, waited);
		} else {
			count(STAT_OFF_CPU_WAITS);
			end_wait(next, tid, now, waited, runnable);
		}
	}

	__u32 pid = prev->tgid;
	tid = prev->pid;
	if (tid == 0 || (prev->flags & PF_KTHREAD))
		return 0;
	if (exclude_pid != 0 && pid == exclude_pid)
		return 0;
	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;
	__u64 state = task_state(prev);
	/* An exiting thread never runs again. */
	if (state & TASK_DEAD)
		return 0;
	struct off_cpu_start *leaving =
		bpf_task_storage_get(&off_cpu_starts, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!leaving) {
		count(STAT_OFF_CPU_UNTRACKED);
		return 0;
	}
	leaving->time_ns = now;
	leaving->runnable = preempt || state == TASK_RUNNING;
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(off_cpu_resume, struct pt_regs *regs, long ret)
{
	if (*(volatile __u64 *)&off_cpu_pending_count == 0)
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct off_cpu_pending *p = bpf_map_lookup_elem(&off_cpu_pending, &tid);
	if (!p)
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	struct scratch_space *sc = get_scratch();
	if (!sc || scratch_is_busy())
		return 0;
	set_scratch_busy(1);
	struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(task);
	__u64 ip = BPF_CORE_READ(uregs, ip), sp = BPF_CORE_READ(uregs, sp);
	if (ip != p->ip || sp != p->sp) {
		/* It went back to user mode since (a signal handler, a
		 * preemption): the stack it waited with is gone. */
		send_unwalked(task, p);
	} else {
		begin_wait_record(sc, task, p);
		struct walk_state *st = &sc->state;
		st->ip = ip;
		st->sp = sp;
		st->bp = BPF_CORE_READ(uregs, bp);
		st->bx = BPF_CORE_READ(uregs, bx);
		st->exact_ip = 1;
	}
	bool walk = ip == p->ip && sp == p->sp;
	if (bpf_map_delete_elem(&off_cpu_pending, &tid) == 0)
		__sync_fetch_and_add(&off_cpu_pending_count, -1);
	if (walk)
		walk_from(ctx, sc, task, &off_cpu_walkers, false);
	set_scratch_busy(0);
	return 0;
}

/* The user walk of an off-CPU record, continued (tail calls); loaded,
 * never attached. */
SEC("tp_btf/sys_exit")
int BPF_PROG(walk_user_stack_off_cpu, struct pt_regs *regs, long ret)
{
	struct scratch_space *sc = get_scratch();
	if (sc) {
		__u32 pid = sc->sample.header.pid;
		continue_walk(ctx, sc, bpf_map_lookup_elem(&process_mappings, &pid), false,
			      &off_cpu_walkers);
	}
	set_scratch_busy(0);
	return 0;
}

/* The Python walk of an off-CPU record, after its user walk (the tail call
 * in continue_walk's python_hook); loaded, never attached. */
SEC("tp_btf/sys_exit")
int BPF_PROG(walk_python_off_cpu, struct pt_regs *regs, long ret)
{
	struct scratch_space *sc = get_scratch();
	if (sc)
		python_walk_and_send(sc);
	set_scratch_busy(0);
	return 0;
}
