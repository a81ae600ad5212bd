/* SPDX-License-Identifier: MIT */
/*
 * Types shared by the BPF program (profiler.bpf.c) and user space (src/sampler.rs).
 * Keep both sides in agreement: user space reads these records byte for byte.
 */
#ifndef LIGHTSWITCH_PROFILER_H
#define LIGHTSWITCH_PROFILER_H

/* Most kernel frames bpf_get_stack returns; the kernel caps it at
 * kernel.perf_event_max_stack (default 127). */
#define MAX_KERNEL_FRAMES 127
/* Most user frames one sample carries. */
#define MAX_USER_FRAMES 127
#define TASK_COMM_LEN 16

/* How the user-stack walk of one sample ended. Stored in sample_header.user_status. */
enum unwind_status {
	UNWIND_COMPLETE = 0,        /* reached the outermost frame */
	UNWIND_TRUNCATED = 1,       /* stopped at MAX_USER_FRAMES */
	UNWIND_READ_FAULT = 2,      /* reading the user stack failed */
	UNWIND_NO_USER_STACK = 3,   /* kernel thread: no user stack exists */
	UNWIND_FRAME_POINTER = 4,   /* walked with frame pointers (no CFI table used) */
	UNWIND_NO_MAPPING = 5,      /* a PC fell outside every known mapping */
	UNWIND_NO_TABLE = 6,        /* the object's unwind table is not loaded yet */
	UNWIND_UNSUPPORTED_RULE = 7,/* the CFI rule cannot be evaluated in BPF */
};

/* Indices into the per-CPU `stats` array map. */
enum stat_index {
	STAT_SAMPLES = 0,           /* perf events that reached the program for a wanted task */
	STAT_LOST_RINGBUF = 1,      /* records the ring buffer had no room for */
	STAT_KERNEL_STACK_ERROR = 2,/* bpf_get_stack failed for the kernel stack */
	STAT_MAX = 3,
};

/* Flags in sample_header.flags */
#define SAMPLE_FLAG_KERNEL_THREAD 1

/*
 * The fixed-size head of one sample record in the `samples` ring buffer. It is
 * followed by kernel_frames kernel addresses (leaf first), then user_frames user
 * addresses (leaf first, each a u64). Records are variable length: only the
 * frames that exist are sent.
 */
struct sample_header {
	__u64 timestamp_ns;         /* bpf_ktime_get_ns(): CLOCK_MONOTONIC, ns */
	__u32 pid;                  /* thread group id (process), init pid namespace */
	__u32 tid;                  /* thread id, init pid namespace */
	__u32 cpu;
	__u16 kernel_frames;
	__u16 user_frames;
	__u8 user_status;           /* enum unwind_status */
	__u8 flags;                 /* SAMPLE_FLAG_* */
	__u16 padding;
	__u32 padding2;
	char process_comm[TASK_COMM_LEN]; /* group leader's comm */
	char thread_comm[TASK_COMM_LEN];  /* this thread's comm */
};

struct stack_sample {
	struct sample_header header;
	__u64 frames[MAX_KERNEL_FRAMES + MAX_USER_FRAMES];
};

#endif
