// SPDX-License-Identifier: GPL-2.0
/*
 * lightswitch's sampling program. Attached to one cpu-clock perf event per
 * online CPU; on each sample it records who was running, the kernel stack and
 * the user stack, and sends one variable-length record to user space through
 * the `samples` ring buffer. Record layout: profiler.h.
 *
 * The user-stack walk lives in walk_user_stack(); today it follows frame
 * pointers. The DWARF (CFI table) walk replaces that function and keeps the
 * record and the unwind_status contract.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "profiler.h"

#define PF_KTHREAD 0x00200000

/* Set by user space before load (read-only data section). */
const volatile bool filter_pids = false; /* only sample pids in target_pids */
const volatile __u32 exclude_pid = 0;    /* never sample this pid (--exclude-self) */

/* Processes to sample when filter_pids is set: tgid -> unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} target_pids SEC(".maps");

/* One record per sample; 16 MiB holds ~8k full-depth records. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 16 * 1024 * 1024);
} samples SEC(".maps");

/* Per-CPU counters, indexed by enum stat_index. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Per-CPU scratch space where a record is assembled before it is copied out. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_sample);
} scratch SEC(".maps");

static __always_inline void count(__u32 index)
{
	__u64 *value = bpf_map_lookup_elem(&stats, &index);
	if (value)
		*value += 1;
}

/* The registers a user-stack walk starts from. */
struct user_regs {
	__u64 ip;
	__u64 sp;
	__u64 bp;
};

/*
 * Walk the user stack by frame pointers: frame i's saved frame pointer is at
 * [bp] and its return address at [bp + 8]. Writes up to MAX_USER_FRAMES
 * addresses (leaf first) at frames[0..] and returns how the walk ended:
 * UNWIND_COMPLETE when the chain ends with a zero frame pointer or return
 * address (the ABI's outermost-frame convention), UNWIND_TRUNCATED at the
 * frame limit, and UNWIND_FRAME_POINTER when the chain simply stops (an
 * unreadable or non-increasing frame pointer, as happens when an outer
 * frame was built without frame pointers): a frame-pointer walk cannot tell
 * that apart from the real end of the stack.
 */
static __always_inline enum unwind_status walk_user_stack(struct user_regs *regs, __u64 *frames,
							   __u16 *frame_count)
{
	__u64 bp = regs->bp;
	__u16 n = 1;

	frames[0] = regs->ip;
	for (int i = 1; i < MAX_USER_FRAMES; i++) {
		__u64 saved[2];

		if (bp == 0) {
			*frame_count = n;
			return UNWIND_COMPLETE;
		}
		if (bpf_probe_read_user(saved, sizeof(saved), (void *)bp) != 0) {
			*frame_count = n;
			return UNWIND_FRAME_POINTER;
		}
		if (saved[1] == 0) {
			*frame_count = n;
			return UNWIND_COMPLETE;
		}
		frames[i] = saved[1];
		n = i + 1;
		/* The stack grows down, so each caller's frame is above its
		 * callee's; anything else is not a frame chain (and could loop). */
		if (saved[0] != 0 && saved[0] <= bp) {
			*frame_count = n;
			return UNWIND_FRAME_POINTER;
		}
		bp = saved[0];
	}
	*frame_count = n;
	return bp == 0 ? UNWIND_COMPLETE : UNWIND_TRUNCATED;
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 tid = (__u32)id;
	__u32 zero = 0;

	/* The idle task (pid 0, one per CPU) is not sampled. */
	if (tid == 0)
		return 0;
	if (exclude_pid != 0 && pid == exclude_pid)
		return 0;
	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;

	count(STAT_SAMPLES);

	struct stack_sample *s = bpf_map_lookup_elem(&scratch, &zero);
	if (!s)
		return 0;

	struct task_struct *task = bpf_get_current_task_btf();
	struct sample_header *h = &s->header;
	h->timestamp_ns = bpf_ktime_get_ns();
	h->pid = pid;
	h->tid = tid;
	h->cpu = bpf_get_smp_processor_id();
	h->flags = 0;
	h->padding = 0;
	h->padding2 = 0;
	bpf_get_current_comm(h->thread_comm, sizeof(h->thread_comm));
	BPF_CORE_READ_STR_INTO(&h->process_comm, task, group_leader, comm);

	/* Kernel stack, leaf first, from the kernel's own unwinder. */
	long kbytes = bpf_get_stack(ctx, s->frames, MAX_KERNEL_FRAMES * sizeof(__u64), 0);
	__u32 kframes = 0;
	if (kbytes < 0)
		count(STAT_KERNEL_STACK_ERROR);
	else
		kframes = kbytes / sizeof(__u64);
	if (kframes > MAX_KERNEL_FRAMES)
		kframes = MAX_KERNEL_FRAMES;
	h->kernel_frames = kframes;

	/* User stack. */
	__u16 uframes = 0;
	if (task->flags & PF_KTHREAD) {
		h->flags |= SAMPLE_FLAG_KERNEL_THREAD;
		h->user_status = UNWIND_NO_USER_STACK;
	} else {
		struct user_regs regs;
		struct pt_regs pregs;

		bpf_probe_read_kernel(&pregs, sizeof(pregs), &ctx->regs);
		if ((pregs.cs & 3) != 3) {
			/* Interrupted in the kernel: the user registers are the
			 * ones saved at kernel entry. */
			struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(task);
			bpf_probe_read_kernel(&pregs, sizeof(pregs), uregs);
		}
		regs.ip = pregs.ip;
		regs.sp = pregs.sp;
		regs.bp = pregs.bp;
		h->user_status = walk_user_stack(&regs, &s->frames[kframes], &uframes);
	}
	if (uframes > MAX_USER_FRAMES)
		uframes = MAX_USER_FRAMES;
	h->user_frames = uframes;

	__u64 size = sizeof(struct sample_header) + (kframes + uframes) * sizeof(__u64);
	if (size > sizeof(struct stack_sample))
		size = sizeof(struct stack_sample);
	if (bpf_ringbuf_output(&samples, s, size, 0) != 0)
		count(STAT_LOST_RINGBUF);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
