/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Sending a finished record to user space through its CPU's ring in
 * `samples` (send_sample), with a stack copy when the walk stopped for want
 * of a table or mapping (stack_copy.h); and the program array the walk goes
 * on through (walker_programs), used by the native walk (record.h) and the
 * Python walk (python.h), which both end here.
 */
#ifndef LIGHTSWITCH_SEND_H
#define LIGHTSWITCH_SEND_H

/* The walker itself, for tail calls (slot 0), and the Python walker (slot 1, python.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} walker_programs SEC(".maps");


/* Copy the finished record out to user space. */
static __always_inline void send_sample(struct scratch_space *sc, bool compat)
{
	struct stack_sample *s = &sc->sample;
	__u32 kframes = sc->state.kernel_frames;
	__u32 uframes = sc->state.user_frames;

	if (kframes > MAX_KERNEL_FRAMES)
		kframes = MAX_KERNEL_FRAMES;
	if (uframes > MAX_USER_FRAMES)
		uframes = MAX_USER_FRAMES;
	s->header.kernel_frames = kframes;
	s->header.user_frames = uframes;
	s->header.user_status = sc->state.status;
	__u32 pyslots = 2 * sc->state.python_frames;
	if (pyslots > MAX_KERNEL_FRAMES + MAX_USER_FRAMES)
		pyslots = MAX_KERNEL_FRAMES + MAX_USER_FRAMES;
	s->header.python_frames = pyslots / 2;
	__u64 size = sizeof(struct sample_header) + (kframes + uframes + pyslots) * sizeof(__u64);
	if (size > sizeof(struct stack_sample))
		size = sizeof(struct stack_sample);
	__u32 cpu = s->header.cpu;
	void *ring = bpf_map_lookup_elem(&samples, &cpu);
	if (!ring) {
		/* User space attaches only to CPUs it made a ring for; were
		 * this one missing, its samples count as lost. */
		count(STAT_LOST_RINGBUF);
		return;
	}
	__u64 waiting = bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA);
	__u8 status = sc->state.status;
	/* A walk that stopped for want of a table or mapping takes its stack
	 * along, while the ring would stay less than half full. */
	if ((status == UNWIND_NO_TABLE || status == UNWIND_NO_MAPPING || status == UNWIND_MAPPINGS_UNKNOWN) &&
	    sc->state.copy_wanted) {
		if (send_with_copy(sc, ring, size, waiting, compat))
			return;
		count(STAT_STACK_COPY_SKIPPED);
	}
	__u64 wakeup = waiting > samples_wakeup_bytes ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
	if (bpf_ringbuf_output(ring, s, size, wakeup) != 0)
		count(STAT_LOST_RINGBUF);
}

#endif
