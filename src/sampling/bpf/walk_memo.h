/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Reusing the previous walk (docs/unwind-tables.md, "Reusing the previous
 * walk"). Each CPU remembers its last complete CFI walk: for every step,
 * the rsp and rbp it started from, the range of lookup addresses (pc, less 1
 * for a return address) its unwind row covers, and the stack words it read.
 * When one of a new walk's first MEMO_JOIN_FRAMES frames has the same rsp
 * and rbp as a remembered step and a pc in its range, and every word the
 * remembered walk read from there on still holds the same value, the rest
 * of the walk would repeat it step for step: its frames are copied instead
 * of walked.
 *
 * The walker (walker.h) records its steps here as it goes (memo_record_*),
 * tries to join at its first frames (join_remembered_walk); the program run
 * that found a join replays it (replay_remembered_walk) and keeps a walk
 * that qualifies (memo_keep_walk), both from continue_walk (record.h).
 */
#ifndef LIGHTSWITCH_WALK_MEMO_H
#define LIGHTSWITCH_WALK_MEMO_H

/* Whether the frame about to be walked (st's registers) is a frame of the
 * remembered walk of this process under its current mappings; if so, its
 * index is in st->memo_next. */
static __always_inline bool join_remembered_walk(struct walk_context *wc, struct walk_state *st)
{
	struct walk_memo *memo = &wc->memos->memos[wc->memos->current & 1];
	if (memo->frame_count == 0 || memo->pid != wc->sc->sample.header.pid ||
	    memo->generation != wc->proc->generation)
		return false;
	/* Replay copies the stack from here up to what the walk read. */
	if (memo->end <= st->sp || memo->end - st->sp > REPLAY_STACK_BYTES)
		return false;
	__u32 i = memo->by_sp[(st->sp / STACK_SLOT_BYTES) & (MEMO_INDEX_ENTRIES - 1)];
	if (i >= memo->frame_count)
		return false;
	struct memo_regs *r = &memo->regs[i & (MEMO_FRAMES - 1)];
	__u64 lookup = st->ip - (st->exact_ip ? 0 : 1);
	if (lookup < r->lookup_lo || lookup >= r->lookup_hi || r->sp != st->sp || r->bp != st->bp)
		return false;
	st->memo_next = i;
	st->joining = 1;
	return true;
}

/* Finish the walk with the remembered walk's frames from st->memo_next on,
 * if every word it read from there on still holds the same value: then,
 * step by step, walking would compute the same registers again. Returns
 * false, with st unchanged, if the stack changed or cannot be read. */
static __always_inline bool replay_remembered_walk(struct scratch_space *sc, struct walk_memo *memo)
{
	struct walk_state *st = &sc->state;
	__u32 m = st->memo_next & (MEMO_FRAMES - 1);
	__u64 base = st->sp;
	__u64 span = memo->end - base;
	if (memo->end <= base || span > REPLAY_STACK_BYTES)
		return false;
	/* Keep the bound on the register the read uses: clang may otherwise
	 * spill span before the check and reload the unchecked copy, and the
	 * 6.1 verifier does not carry a bound to a spilled unbounded scalar. */
	barrier_var(span);
	if (bpf_probe_read_user(sc->replay_stack, span, (void *)base) != 0)
		return false;
	__u32 first = memo->regs[m].first_check;
#pragma clang loop unroll(disable)
	for (__u32 i = 0; i < MEMO_CHECKS; i++) {
		__u32 c = first + i;
		if (c >= memo->check_count)
			break;
		struct memo_check *k = &memo->checks[c & (MEMO_CHECKS - 1)];
		__u64 offset = k->addr - base;
		if (k->addr < base || offset + 8 > span || (offset & 7) ||
		    sc->replay_stack[(offset / 8) & (REPLAY_STACK_BYTES / 8 - 1)] != k->value)
			return false;
	}
	/* During a join the walk is at most MEMO_JOIN_FRAMES user frames
	 * deep, so the copy stays within the record. Both are 64-bit so that
	 * the verifier sees the checks on the very registers the copy uses
	 * (not on zero-extended copies of them). */
	__u64 slot = (__u64)st->kernel_frames + st->user_frames;
	__u64 frames = (__u64)memo->frame_count - m;
	if (slot > MAX_KERNEL_FRAMES + MEMO_JOIN_FRAMES || frames == 0 || frames > MEMO_FRAMES)
		return false;
	if (bpf_probe_read_kernel(&sc->sample.frames[slot], frames * sizeof(__u64), &memo->ips[m]) != 0)
		return false;
	/* The joined frame's own ip may differ from the remembered one (same row). */
	sc->sample.frames[slot] = st->ip;
	st->user_frames += frames;
	st->joined = 1;
	count(STAT_WALKS_REUSED);
	finish(st, st->used_fp ? UNWIND_FRAME_POINTER : UNWIND_COMPLETE);
	return true;
}

/* Record the walk's current frame (st's registers, before its step) as
 * step st->user_frames of the walk being remembered, rec. Beyond
 * MEMO_FRAMES the indices wrap and overwrite earlier steps: such a walk is
 * not remembered anyway. Its lookup range is empty until the frame's row
 * sets one (memo_row_range): no frame joins at this step otherwise. */
static __always_inline struct memo_regs *memo_record_step(struct walk_memo *rec, struct walk_state *st)
{
	struct memo_regs *r = &rec->regs[st->user_frames & (MEMO_FRAMES - 1)];
	rec->by_sp[(st->sp / STACK_SLOT_BYTES) & (MEMO_INDEX_ENTRIES - 1)] = st->user_frames;
	r->lookup_lo = 0;
	r->lookup_hi = 0;
	r->sp = st->sp;
	r->bp = st->bp;
	r->first_check = st->rec_checks;
	rec->ips[st->user_frames & (MEMO_FRAMES - 1)] = st->ip;
	return r;
}

/* Every ip of a row (within its mapping) steps the same way: the range of
 * lookup addresses of step r is the row's [pc_low, row_end) in the page of
 * vaddr, moved by the mapping's bias and kept inside [mapping_start,
 * mapping_end - 1), so that the ip of a return address (lookup + 1) is
 * inside the mapping too. */
static __always_inline void memo_row_range(struct memo_regs *r, struct unwind_row *row, __u32 row_end,
					   __u64 vaddr, __u64 bias, __u64 mapping_start, __u64 mapping_end)
{
	__u64 page_start = vaddr & ~((__u64)UNWIND_PAGE_SIZE - 1);
	__u64 lo = page_start + row->pc_low + bias;
	__u64 hi = page_start + row_end + bias;
	r->lookup_lo = lo > mapping_start ? lo : mapping_start;
	r->lookup_hi = hi < mapping_end - 1 ? hi : mapping_end - 1;
}

/* Record that the walk read value at addr (8 bytes). At most two words per
 * frame: within MEMO_FRAMES frames, the index stays below MEMO_CHECKS. */
static __always_inline void memo_record_read(struct walk_memo *rec, struct walk_state *st, __u64 addr,
					     __u64 value)
{
	struct memo_check *k = &rec->checks[st->rec_checks++ & (MEMO_CHECKS - 1)];
	k->addr = addr;
	k->value = value;
	if (addr + 8 > st->rec_end)
		st->rec_end = addr + 8;
}

/* Once a program run's walk is over: keep it as the CPU's remembered walk
 * if it used CFI for every frame, read nothing but the stack words it
 * recorded, and saw one generation of the process's mappings (a later
 * program run looks it up anew). */
static __always_inline void memo_keep_walk(struct scratch_space *sc, struct walk_context *wc)
{
	struct walk_state *st = &sc->state;
	if (st->done && st->status == UNWIND_COMPLETE && !st->joined && !st->unrepeatable &&
	    st->user_frames <= MEMO_FRAMES && st->generation == wc->proc->generation) {
		struct walk_memo *recording = &wc->memos->memos[(wc->memos->current ^ 1) & 1];
		recording->pid = sc->sample.header.pid;
		recording->generation = st->generation;
		recording->frame_count = st->user_frames;
		recording->check_count = st->rec_checks;
		recording->end = st->rec_end;
		wc->memos->current ^= 1;
	}
}

#endif
