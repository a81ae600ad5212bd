/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Stack copies: a walk that stopped for want of a table or a mapping sends
 * the registers of the frame it could not go past (note_copy_start,
 * walker.h) and the user stack above it, for user space to walk on from
 * once it knows the table or mapping (deferred unwinding,
 * src/unwind/deferred.rs). The record is assembled in the ring itself (the
 * copy does not fit in per-CPU scratch), in the smallest of three sizes the
 * stack fits; send_sample (record.h) calls send_with_copy.
 */
#ifndef LIGHTSWITCH_STACK_COPY_H
#define LIGHTSWITCH_STACK_COPY_H

/* A record with a stack copy, as it is laid out in the ring. */
struct copy_record {
	struct stack_sample sample;
	struct stack_copy copy;
	__u8 stack[STACK_COPY_BYTES];
};

/* The same with room for STACK_COPY_LARGE_BYTES of stack: for stacks
 * deeper than STACK_COPY_BYTES (a compiler's). */
struct copy_record_large {
	struct stack_sample sample;
	struct stack_copy copy;
	__u8 stack[STACK_COPY_LARGE_BYTES];
};

/* The same with room for STACK_COPY_SMALL_BYTES of stack: for a main
 * thread whose whole stack is that shallow (a young process, a shell). */
struct copy_record_small {
	struct stack_sample sample;
	struct stack_copy copy;
	__u8 stack[STACK_COPY_SMALL_BYTES];
};

/* Copy the user stack from `sp` into `dst` (`bytes`, a constant, at most):
 * to the end of its page, then whole pages. A page that cannot be read (a
 * stack page never touched is not present, and BPF cannot fault it in: a
 * large frame's untouched array, the end of the stack) is a hole: bit i of
 * *missing for the i-th page from the one holding sp. The number of bytes
 * copied, holes included; 0 if the first part could not be read and
 * `need_first` (it holds the frame's own return address). */
static __always_inline __u32 copy_user_stack(__u8 *dst, __u64 sp, __u32 bytes, bool need_first,
					     __u32 *missing)
{
	__u32 first = 4096 - (sp & 4095);
	barrier_var(first);
	if (first > 4096)
		return 0;
	__u32 holes = 0;
	if (bpf_probe_read_user(dst, first, (void *)sp) != 0) {
		if (need_first)
			return 0;
		holes = 1;
	}
	__u32 len = first;
	for (int i = 0; i < bytes / 4096 - 1; i++) {
		__u32 off = len;
		barrier_var(off);
		if (off > bytes - 4096)
			break;
		/* Branch-free (errors are negative): a branch here would double
		 * the states the verifier walks at every page. */
		__u64 failed = (__u64)bpf_probe_read_user(&dst[off], 4096, (void *)(sp + off)) >> 63;
		holes |= (__u32)failed << ((i + 1) & 31);
		len = off + 4096;
	}
	*missing = holes;
	return len;
}

/* Fill a reserved record's sample (`size` bytes of sc's) and copy head
 * (one part of `len` bytes; send_with_copy sets a split copy's upper part). */
static __always_inline void fill_copy_record(struct scratch_space *sc, __u64 size,
					     struct stack_sample *sample, struct stack_copy *copy,
					     __u32 len)
{
	struct walk_state *st = &sc->state;
	sc->sample.header.flags |= SAMPLE_FLAG_STACK_COPY;
	bpf_probe_read_kernel(sample, size, &sc->sample);
	copy->ip = st->copy_ip;
	copy->sp = st->copy_sp;
	copy->bp = st->copy_bp;
	/* The word a save slot holds is read here, once per copy. */
	copy->bx = st->copy_bx;
	copy->bx_known = !st->copy_bx_unknown;
	if (copy->bx_known && st->copy_bx_addr != 0 &&
	    bpf_probe_read_user(&copy->bx, sizeof(copy->bx), (void *)st->copy_bx_addr) != 0)
		copy->bx_known = 0;
	copy->frame = st->copy_frame;
	copy->len = len;
	copy->upper_start = 0;
	copy->upper_len = 0;
	copy->upper_missing = 0;
	copy->exact_ip = st->copy_exact_ip;
}

/* bpf_find_vma callback: the end of the mapping (into data, a __u64). */
static long mapping_end(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	*(__u64 *)data = vma->vm_end;
	return 0;
}

/* The end of the current thread's stack above `sp`, page aligned (0:
 * unknown): for the main thread, STACK_TOP_SLACK bytes above
 * mm->start_stack (where argc lies at exec; the environment is above it;
 * _start reads a little above it); for another, the end of the mapping
 * that holds sp (its thread stack, whose top holds the thread's TLS),
 * where bpf_find_vma exists and is free in this interrupt (the walk may
 * have used it), else as its TLS pointer tells (stack_end_from_tls). */
static __always_inline __u64 stack_end(struct scratch_space *sc, __u64 sp, bool compat)
{
	struct task_struct *task = current_task(compat);
	if (sc->sample.header.pid == sc->sample.header.tid) {
		__u64 top = BPF_CORE_READ(task, mm, start_stack);
		return sp < top ? (top + STACK_TOP_SLACK + 4095) & ~4095ULL : 0;
	}
	__u64 end = 0;
	if (!compat && bpf_find_vma(bpf_get_current_task_btf(), sp, mapping_end, &end, 0) == 0 && end > sp)
		return end;
	return stack_end_from_tls(task, sp);
}

/* Whether a copy of `bytes` from `sp` (the first part of its page on)
 * reaches `end` (stack_end). */
static __always_inline bool stack_fits_copy(__u64 sp, __u64 end, __u64 bytes)
{
	return end != 0 && end <= (sp & ~4095ULL) + bytes;
}

/* The body of send_with_copy for one record type (C has no generics):
 * reserve a RECORD while the ring stays less than half full with it, copy
 * up to BYTES of stack into it (SPLIT: BYTES from sp, then the
 * STACK_COPY_UPPER_BYTES below `end`), fill it and submit it, waking user
 * space at once (such records fill a ring fast); evaluates to false when
 * it could not. */
#define SEND_COPY_RECORD(RECORD, BYTES, SPLIT)                                         \
	({                                                                             \
		bool sent = false;                                                     \
		struct RECORD *rec = NULL;                                             \
		if (waiting + sizeof(struct RECORD) < half)                            \
			rec = bpf_ringbuf_reserve(ring, sizeof(struct RECORD), 0);     \
		if (rec) {                                                             \
			__u32 missing = 0;                                             \
			__u32 len = copy_user_stack(rec->stack, sp, BYTES, true,       \
						    &missing);                         \
			if (len == 0) {                                                \
				bpf_ringbuf_discard(rec, 0);                           \
			} else {                                                       \
				fill_copy_record(sc, size, &rec->sample, &rec->copy,   \
						 len);                                 \
				rec->copy.missing = missing;                           \
				if (SPLIT)                                             \
					copy_upper_part(rec->stack, &rec->copy, end);  \
				bpf_ringbuf_submit(rec, BPF_RB_FORCE_WAKEUP);          \
				sent = true;                                           \
			}                                                              \
		}                                                                      \
		sent;                                                                  \
	})

/* The upper part of a split copy (copy_record_large): the
 * STACK_COPY_UPPER_BYTES below `end`, in `stack` right after the part from
 * sp (copy->len bytes, at most STACK_COPY_BYTES); left out if no page of
 * it can be read. */
static __always_inline void copy_upper_part(__u8 *stack, struct stack_copy *copy, __u64 end)
{
	__u64 start = end - STACK_COPY_UPPER_BYTES;
	__u32 at = copy->len;
	__u32 missing = 0;
	barrier_var(at);
	if (at > STACK_COPY_BYTES ||
	    copy_user_stack(&stack[at], start, STACK_COPY_UPPER_BYTES, false, &missing) !=
		    STACK_COPY_UPPER_BYTES ||
	    missing == (1U << (STACK_COPY_UPPER_BYTES / 4096)) - 1)
		return;
	copy->upper_start = start;
	copy->upper_len = STACK_COPY_UPPER_BYTES;
	copy->upper_missing = missing;
	copy->len = at + STACK_COPY_UPPER_BYTES;
}

/* Send the finished record of `size` bytes (header and frames) with the
 * registers note_copy_start kept and the user stack from their rsp, in the
 * smallest record the whole stack fits (stack_fits_copy), else in one of
 * STACK_COPY_LARGE_BYTES (split where the stack's end is known and
 * further), else (the ring has no room for that) in one of
 * STACK_COPY_BYTES, while the ring stays less than half full with it.
 * The record is assembled in the ring itself (the copy does
 * not fit in per-CPU scratch). False if there is no room or not even the
 * first part of the stack can be read: the caller sends the record alone. */
static __always_inline bool send_with_copy(struct scratch_space *sc, void *ring, __u64 size,
					   __u64 waiting, bool compat)
{
	__u64 sp = sc->state.copy_sp;
	__u64 half = bpf_ringbuf_query(ring, BPF_RB_RING_SIZE) / 2;
	if (size > sizeof(struct stack_sample))
		return false;
	__u64 end = stack_end(sc, sp, compat);
	if (stack_fits_copy(sp, end, STACK_COPY_SMALL_BYTES))
		return SEND_COPY_RECORD(copy_record_small, STACK_COPY_SMALL_BYTES, false);
	if (!stack_fits_copy(sp, end, STACK_COPY_BYTES)) {
		if (end == 0 || stack_fits_copy(sp, end, STACK_COPY_LARGE_BYTES)) {
			if (SEND_COPY_RECORD(copy_record_large, STACK_COPY_LARGE_BYTES, false))
				return true;
		} else if (SEND_COPY_RECORD(copy_record_large, STACK_COPY_BYTES, true)) {
			return true;
		}
	}
	return SEND_COPY_RECORD(copy_record, STACK_COPY_BYTES, false);
}

#endif
