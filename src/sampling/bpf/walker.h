/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The DWARF walker: one step of a user-stack walk.
 *
 * User stacks are walked from DWARF CFI compiled by user space into compact
 * unwind rows (docs/unwind-tables.md): for each frame the walker finds the
 * mapping of the pc in the process's sorted mapping list (the previous
 * frame's mapping is tried first), then the row: from this CPU's caches of
 * rows (by stack position, then by object and address), or by a binary
 * search in the object's page. It computes the CFA, reads the return
 * address at CFA - 8 and recovers rbp; both reads come from a copy of
 * STACK_CHUNK_SIZE bytes of the stack, refilled when a read falls outside
 * it. Mappings without CFI, and objects whose table is not loaded yet, fall
 * back to frame pointers. Every walk records how it ended (finish).
 *
 * walk_step is the one step body of both variants (walker_variants.h runs
 * it FRAMES_PER_PROGRAM times per program run); continue_walk (record.h)
 * goes on through tail calls up to MAX_USER_FRAMES.
 */
#ifndef LIGHTSWITCH_WALKER_H
#define LIGHTSWITCH_WALKER_H

/* The mapping containing pc, by binary search over the sorted list. */
static __always_inline struct exec_mapping *find_mapping(struct walk_state *st, struct process_info *proc,
							 __u64 pc)
{
	st->search_lo = 0;
	st->search_hi = proc->mapping_count;
	/* Invariant: the answer, if any, is in [lo, hi). 9 halvings cover 256. */
	for (int i = 0; i < 10; i++) {
		__u32 lo = st->search_lo, hi = st->search_hi;
		if (hi > MAX_PROCESS_MAPPINGS)
			hi = MAX_PROCESS_MAPPINGS;
		if (hi <= lo + 1)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		if (proc->mappings[mid & (MAX_PROCESS_MAPPINGS - 1)].start <= pc)
			st->search_lo = mid;
		else
			st->search_hi = mid;
	}
	__u32 lo = st->search_lo;
	if (lo >= proc->mapping_count)
		return NULL;
	struct exec_mapping *m = &proc->mappings[lo & (MAX_PROCESS_MAPPINGS - 1)];
	if (pc < m->start || pc >= m->end)
		return NULL;
	st->last_mapping = lo;
	return m;
}

/* The mapping containing pc: the previous frame's if it still fits (callers
 * are often in the same object), else by binary search. */
static __always_inline struct exec_mapping *mapping_of(struct walk_state *st, struct process_info *proc,
						       __u64 pc)
{
	__u32 hint = st->last_mapping & (MAX_PROCESS_MAPPINGS - 1);
	struct exec_mapping *m = &proc->mappings[hint];
	if (hint < proc->mapping_count && m->start <= pc && pc < m->end)
		return m;
	return find_mapping(st, proc, pc);
}

/* Slot of (object_id, vaddr) in the row cache (multiplicative hashing). */
static __always_inline __u32 row_cache_slot(__u32 object_id, __u64 vaddr)
{
	__u64 h = (vaddr ^ ((__u64)object_id << 40)) * 0x9E3779B97F4A7C15ULL;
	return (h >> 54) & (ROW_CACHE_ENTRIES - 1);
}

/* Read the 8 bytes of user memory at addr, from the stack copy when it holds
 * them; otherwise refill the copy from addr. Near the end of the stack's
 * mapping a full copy would fault, so the copy then stops at the end of
 * addr's page. Returns 0, or a negative error when addr is unreadable. */
static __always_inline long read_stack_word(struct scratch_space *sc, __u64 addr, __u64 *out)
{
	struct walk_state *st = &sc->state;
	__u64 offset = addr - st->chunk_start;
	if (addr >= st->chunk_start && offset + 8 <= st->chunk_len && (offset & 7) == 0) {
		*out = sc->stack_chunk[(offset / 8) & (STACK_CHUNK_SIZE / 8 - 1)];
		return 0;
	}
	/* Frames keep their saved words 8-byte aligned; anything else is read
	 * on its own. */
	if (addr & 7)
		return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
	st->chunk_len = 0;
	__u32 len = STACK_CHUNK_SIZE;
	if (bpf_probe_read_user(sc->stack_chunk, STACK_CHUNK_SIZE, (void *)addr) != 0) {
		len = 4096 - (addr & 4095);
		/* A copy within one page failed: addr itself is unreadable. */
		if (len >= STACK_CHUNK_SIZE)
			return -1;
		if (len < 8)
			return bpf_probe_read_user(out, sizeof(*out), (void *)addr);
		if (bpf_probe_read_user(sc->stack_chunk, len & (STACK_CHUNK_SIZE - 1), (void *)addr) != 0)
			return -1;
	}
	st->chunk_start = addr;
	st->chunk_len = len;
	*out = sc->stack_chunk[0];
	return 0;
}

/* The last row of the page whose pc_low <= pc_low; st->search_end is set
 * to where its rule ends (the next row's pc_low, or UNWIND_PAGE_SIZE). */
static __always_inline struct unwind_row *find_row(struct walk_state *st, __u32 first, __u32 row_count,
						   __u16 pc_low)
{
	st->search_lo = 0;
	st->search_hi = row_count;
	/* A page holds at most 65536 rows: 16 halvings. */
	for (int i = 0; i < 17; i++) {
		__u32 lo = st->search_lo, hi = st->search_hi;
		if (hi <= lo + 1)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		__u32 index = first + mid;
		struct unwind_row *row = bpf_map_lookup_elem(&unwind_rows, &index);
		if (!row)
			return NULL;
		if (row->pc_low <= pc_low)
			st->search_lo = mid;
		else
			st->search_hi = mid;
	}
	__u32 index = first + st->search_lo + 1;
	struct unwind_row *next = bpf_map_lookup_elem(&unwind_rows, &index);
	/* Kept in map memory: the verifier tracks no value there, so the
	 * two outcomes do not double its states. */
	st->search_end = UNWIND_PAGE_SIZE;
	if (next && st->search_lo + 1 < row_count)
		st->search_end = next->pc_low;
	index--;
	return bpf_map_lookup_elem(&unwind_rows, &index);
}


/* Remember the registers of the walk's current frame, user frame number
 * `frame`, as where user space should walk on from, if it is the first
 * frame the walk could not go past for want of a table or a mapping. */
static __always_inline void note_copy_start(struct walk_state *st, __u32 frame)
{
	if (st->copy_wanted)
		return;
	st->copy_wanted = 1;
	st->copy_exact_ip = st->exact_ip;
	st->copy_frame = frame;
	st->copy_ip = st->ip;
	st->copy_sp = st->sp;
	st->copy_bp = st->bp;
	st->copy_bx = st->bx;
	st->copy_bx_addr = st->bx_addr;
	st->copy_bx_unknown = st->bx_unknown;
}

/* One frame-pointer step: the caller's rbp is at [bp], its return address at [bp + 8]. */
static __always_inline void frame_pointer_step(struct walk_state *st)
{
	__u64 saved[2];

	st->used_fp = 1;
	if (st->bp == 0) {
		finish(st, UNWIND_FRAME_POINTER);
		return;
	}
	if (bpf_probe_read_user(saved, sizeof(saved), (void *)st->bp) != 0 || saved[1] < USER_MIN_ADDRESS ||
	    saved[1] >= USER_ADDRESS_LIMIT || (saved[0] != 0 && saved[0] <= st->bp)) {
		/* The chain stops here: unreadable, a return address no code can
		 * have, or not moving up the stack. */
		finish(st, UNWIND_FRAME_POINTER);
		return;
	}
	st->last_step_fp = 1;
	/* Whether the callee saved rbx, and where, is unknown without CFI. */
	st->bx_unknown = 1;
	st->sp = st->bp + 16;
	st->bp = saved[0];
	st->ip = saved[1];
	st->exact_ip = 0;
}

/* Where lookup_row found the frame's row. */
struct found_row {
	struct unwind_row row;
	__u32 row_end;      /* page offset where the row's rule ends */
};

/* The unwind row for vaddr of object_id (the frame's lookup address): from
 * the CPU's rows by stack position, its row cache, or a binary search in
 * the object's page (the previous frame's page costs no hash lookup); the
 * caches learn what was searched. False when there is none: the object's
 * table is still being built (the frame is then noted as where a stack copy
 * starts) or no CFI covers the pc; the caller steps by frame pointers. */
static __always_inline bool lookup_row(struct walk_context *wc, struct walk_state *st, __u32 object_id,
				       __u64 vaddr, struct found_row *out)
{
	struct scratch_space *sc = wc->sc;
	struct row_cache_entry *by_sp = &sc->stack_slots[(st->sp / STACK_SLOT_BYTES) & (STACK_SLOT_ENTRIES - 1)];
	if (by_sp->object_tag == object_id + 1 && by_sp->vaddr == vaddr) {
		out->row = by_sp->row;
		out->row_end = by_sp->row_end;
		return true;
	}
	struct row_cache_entry *cached = &wc->cache->entries[row_cache_slot(object_id, vaddr)];
	if (cached->object_tag == object_id + 1 && cached->vaddr == vaddr) {
		out->row = cached->row;
		out->row_end = cached->row_end;
	} else {
		__u32 page_number = vaddr >> UNWIND_PAGE_BITS;
		if (!(st->cached_page_valid && st->cached_key.object_id == object_id &&
		      st->cached_key.page == page_number)) {
			struct page_key key = { .object_id = object_id, .page = page_number };
			struct page_value *page = bpf_map_lookup_elem(&unwind_pages, &key);
			st->cached_page_valid = 0;
			if (!page && !bpf_map_lookup_elem(&loaded_objects, &object_id)) {
				/* The table is still being built: frame pointers meanwhile. */
				st->missing_table = 1;
				note_copy_start(st, st->user_frames - 1);
				return false;
			}
			if (page) {
				st->cached_key = key;
				st->cached_page = *page;
				st->cached_page_valid = 1;
			}
		}
		struct unwind_row *found = NULL;
		if (st->cached_page_valid)
			found = find_row(st, st->cached_page.first_row, st->cached_page.row_count,
					 vaddr & (UNWIND_PAGE_SIZE - 1));
		if (!found)
			return false;
		out->row = *found;
		out->row_end = st->search_end;
		cached->vaddr = vaddr;
		cached->object_tag = object_id + 1;
		cached->row_end = out->row_end;
		cached->row = out->row;
	}
	by_sp->vaddr = vaddr;
	by_sp->object_tag = object_id + 1;
	by_sp->row_end = out->row_end;
	by_sp->row = out->row;
	return true;
}

/* What walk_step does once the CFA is known (cfa_of). */
#define STEP_HAVE_CFA (-1)

/* The CFA of the frame by row's rule (cfa_type, its offset cfa_offset in
 * bytes) into *cfa: STEP_HAVE_CFA. Or what the step returns when the rule
 * ends the walk (1: the outermost frame, an unsupported rule, a register
 * that cannot be read) or sets the caller's registers itself (0: a signal
 * frame). */
static __always_inline long cfa_of(struct scratch_space *sc, struct walk_state *st, struct unwind_row *row,
				   __u8 cfa_type, bool cfa_from_rbx, __u64 cfa_offset, __u64 *cfa)
{
	switch (cfa_type) {
	case CFA_RSP_OFFSET:
	case CFA_RETURN_IN_REGISTER:
		*cfa = st->sp + cfa_offset;
		return STEP_HAVE_CFA;
	case CFA_RBP_OFFSET:
		if (cfa_from_rbx) {
			__u64 bx = st->bx;
			if (st->bx_unknown || (st->bx_addr != 0 && read_stack_word(sc, st->bx_addr, &bx) != 0)) {
				count(STAT_UNSUPPORTED_BASE + UNSUPPORTED_KIND_CFA_REGISTER);
				finish(st, UNWIND_UNSUPPORTED_RULE);
				return 1;
			}
			/* rbx was read from outside the words a remembered walk checks. */
			st->unrepeatable = 1;
			*cfa = bx + cfa_offset;
		} else {
			*cfa = st->bp + cfa_offset;
		}
		return STEP_HAVE_CFA;
	case CFA_PLT:
		*cfa = st->sp + 8 + (((st->ip & 15) >= row->cfa_offset) ? 8 : 0);
		return STEP_HAVE_CFA;
	case CFA_OUTERMOST:
		finish(st, st->used_fp ? UNWIND_FRAME_POINTER : UNWIND_COMPLETE);
		return 1;
	case CFA_SIGNAL_FRAME: {
		/* rsp points at the ucontext the kernel saved for the handler. */
		__u64 regs[3];
		st->bx_addr = st->sp + UCONTEXT_RBX;
		st->bx_unknown = 0;
		if (bpf_probe_read_user(&regs[0], 8, (void *)(st->sp + UCONTEXT_RBP)) ||
		    bpf_probe_read_user(&regs[1], 8, (void *)(st->sp + UCONTEXT_RSP)) ||
		    bpf_probe_read_user(&regs[2], 8, (void *)(st->sp + UCONTEXT_RIP))) {
			finish(st, UNWIND_READ_FAULT);
			return 1;
		}
		st->bp = regs[0];
		st->sp = regs[1];
		st->ip = regs[2];
		st->exact_ip = 1;
		st->last_step_fp = 0;
		st->unrepeatable = 1;
		return 0;
	}
	case CFA_UNSUPPORTED:
	default: {
		__u32 kind = (__u16)row->fp_offset;
		if (kind >= MAX_UNSUPPORTED_KINDS)
			kind = MAX_UNSUPPORTED_KINDS - 1;
		count(STAT_UNSUPPORTED_BASE + kind);
		finish(st, UNWIND_UNSUPPORTED_RULE);
		return 1;
	}
	}
}

/* Step to the caller of the frame whose CFA is cfa, by row's rules: its
 * return address (from the stack at CFA - 8, or, in the interrupted frame,
 * from a register), where its rbx is saved, its rbp; the words read from
 * the stack are recorded in rec, the walk being remembered. Returns 1 to
 * stop (a read failed, or the return address is 0: the outermost frame). */
static __always_inline long step_to_caller(struct scratch_space *sc, struct walk_state *st,
					   struct walk_memo *rec, struct unwind_row *row, __u8 cfa_type,
					   __u64 cfa, bool compat)
{
	__u64 ra;
	if (cfa_type == CFA_RETURN_IN_REGISTER) {
		/* Only the interrupted frame's registers are known (st->user_frames
		 * already counts this frame). */
		if (st->user_frames != 1 ||
		    read_interrupted_user_register(&sc->user_regs, (__u16)row->fp_offset, &ra, compat) != 0) {
			count(STAT_UNSUPPORTED_BASE + UNSUPPORTED_KIND_RETURN_ADDRESS);
			finish(st, UNWIND_UNSUPPORTED_RULE);
			return 1;
		}
		st->unrepeatable = 1;
	} else {
		if (read_stack_word(sc, cfa - 8, &ra) != 0) {
			finish(st, UNWIND_READ_FAULT);
			return 1;
		}
		memo_record_read(rec, st, cfa - 8, ra);
	}
	/* The caller's rbx: only its address is kept (a word read only if an
	 * rbx-based CFA needs it). */
	__u8 bx_rule = row->fp_type >> RBX_RULE_SHIFT;
	if (bx_rule == RBX_UNKNOWN) {
		st->bx_unknown = 1;
	} else if (bx_rule != 0) {
		st->bx_addr = cfa - (__u64)bx_rule * 8;
		st->bx_unknown = 0;
	}
	if ((row->fp_type & FP_TYPE_MASK) == FP_AT_CFA_OFFSET) {
		__u64 bp;
		__u64 bp_addr = cfa + (__s64)row->fp_offset * 8;
		if (read_stack_word(sc, bp_addr, &bp) != 0) {
			finish(st, UNWIND_READ_FAULT);
			return 1;
		}
		st->bp = bp;
		memo_record_read(rec, st, bp_addr, bp);
	}
	/* FP_UNSUPPORTED: rbp is unknown from here on; it only matters if a
	 * caller's CFA is rbp-based, which then reads from a wrong address and
	 * ends as a read fault rather than a wrong stack in most cases. */
	if (ra == 0) {
		finish(st, st->used_fp ? UNWIND_FRAME_POINTER : UNWIND_COMPLETE);
		return 1;
	}
	st->sp = cfa;
	st->ip = ra;
	st->exact_ip = 0;
	st->last_step_fp = 0;
	return 0;
}

/* Walk one frame: record st->ip, then compute the caller's registers.
 * Returns 1 to stop. The one step body of both walkers: the bpf_loop
 * callback (unwind_step) and the compat variant's global function
 * (unwind_step_compat), both in walker_variants.h. */
static __always_inline long walk_step(struct walk_context *wc, bool compat)
{
	struct scratch_space *sc = wc->sc;
	struct process_info *proc = wc->proc;
	struct row_cache *cache = wc->cache;
	struct walk_memos *memos = wc->memos;
	if (!sc || !proc || !cache || !memos)
		return 1;
	struct walk_state *st = &sc->state;
	struct stack_sample *s = &sc->sample;

	if (st->done)
		return 1;
	if (st->user_frames < MEMO_JOIN_FRAMES && !st->join_failed && join_remembered_walk(wc, st))
		return 1;
	/* Make the compiler load the walk state afresh: values it kept in
	 * registers would carry the bounds of the checks above into the rest
	 * of the step, and the verifier would check the rest once per bound. */
	barrier();
	__u32 slot = st->kernel_frames + st->user_frames;
	if (st->user_frames >= MAX_USER_FRAMES || slot >= MAX_KERNEL_FRAMES + MAX_USER_FRAMES) {
		finish(st, UNWIND_TRUNCATED);
		return 1;
	}
	s->frames[slot] = st->ip;
	struct walk_memo *rec = &memos->memos[(memos->current ^ 1) & 1];
	struct memo_regs *r = memo_record_step(rec, st);
	st->user_frames++;

	struct exec_mapping *m = mapping_of(st, proc, st->ip);
	if (!m && !st->last_step_fp && !st->vma_looked_up) {
		/* Stop here, have continue_walk ask the kernel for the mapping
		 * (outside this callback, which the verifier then checks with
		 * fewer states), and walk this frame again. */
		st->user_frames--;
		st->vma_wanted = 1;
		return 1;
	}
	if (!m) {
		if (st->last_step_fp) {
			/* A frame pointer led to something that is not code: the
			 * chain ended one frame earlier (rbp held other data). */
			st->user_frames--;
			finish(st, UNWIND_FRAME_POINTER);
			return 1;
		}
		notify_unknown_mapping(s->header.pid, st->ip, proc->generation);
		note_copy_start(st, st->user_frames - 1);
		finish(st, UNWIND_NO_MAPPING);
		return 1;
	}
	if (m->kind == MAPPING_FRAME_POINTERS) {
		frame_pointer_step(st);
		return st->done ? 1 : 0;
	}

	__u32 object_id = m->object_id;
	/* A return address may be one past the end of its function (a call to a
	 * noreturn function): look up the call instruction instead. */
	__u64 bias = m->bias;
	__u64 vaddr = st->ip - bias - (st->exact_ip ? 0 : 1);
	/* Copied so that m is dead from here on: a live pointer into the
	 * mapping list would keep the verifier from pruning states below. */
	__u64 mapping_start = m->start, mapping_end = m->end;
	struct found_row found;
	if (!lookup_row(wc, st, object_id, vaddr, &found)) {
		frame_pointer_step(st);
		return st->done ? 1 : 0;
	}
	struct unwind_row row = found.row;
	__u8 cfa_type = row.cfa_type & CFA_TYPE_MASK;
	if (cfa_type == CFA_END_OF_FUNCTION) {
		/* No CFI covers this pc. */
		frame_pointer_step(st);
		return st->done ? 1 : 0;
	}
	bool cfa_from_rbx = cfa_type == CFA_RBP_OFFSET && (row.fp_type & FP_CFA_FROM_RBX);
	/* A PLT row's CFA depends on the ip itself, a return address in a
	 * register or an rbx-based CFA on that register: no join there. */
	if (cfa_type != CFA_PLT && cfa_type != CFA_RETURN_IN_REGISTER && !cfa_from_rbx)
		memo_row_range(r, &row, found.row_end, vaddr, bias, mapping_start, mapping_end);

	__u64 cfa_offset = row.cfa_offset;
	if (row.cfa_type & CFA_OFFSET_SCALED)
		cfa_offset = (cfa_offset | (__u64)((row.cfa_type >> CFA_OFFSET_HIGH_SHIFT) & CFA_OFFSET_HIGH_MASK)
						   << 16) * 8;
	__u64 cfa;
	long ret = cfa_of(sc, st, &row, cfa_type, cfa_from_rbx, cfa_offset, &cfa);
	if (ret != STEP_HAVE_CFA)
		return ret;
	return step_to_caller(sc, st, rec, &row, cfa_type, cfa, compat);
}

/* One step of the frame-pointer walk of a process user space has not described yet. */
static long frame_pointer_only_step(__u64 index, void *unused)
{
	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 1;
	struct walk_state *st = &sc->state;
	__u32 slot = st->kernel_frames + st->user_frames;
	if (st->user_frames >= MAX_USER_FRAMES || slot >= MAX_KERNEL_FRAMES + MAX_USER_FRAMES) {
		finish(st, UNWIND_TRUNCATED);
		return 1;
	}
	sc->sample.frames[slot] = st->ip;
	st->user_frames++;
	frame_pointer_step(st);
	return st->done ? 1 : 0;
}

#endif
