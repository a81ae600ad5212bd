/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The CPython unwinder (docs/python.md): one program, walk_python, tail
 * called by the native walker (slot PYTHON_PROGRAM_SLOT of walker_programs)
 * once the native walk of a sample of a process in python_procs is done.
 * It finds the sampled thread's PyThreadState in the main interpreter's
 * thread list (by its native thread id, as the thread's own pid namespace
 * numbers it; 3.8-3.10: by its pthread_t, the thread pointer), walks its
 * chain of _PyInterpreterFrame (3.8-3.10: of PyFrameObject), appends one
 * python_frame per frame after the sample's user frames and sends the
 * record. User space names the frames and puts each run of them at the
 * native frame of the eval loop that ran it (src/unwind/interp/python/).
 * Loaded with the bpf_loop variant only (it steps with bpf_loop).
 * Included once, by profiler.bpf.c.
 */
#ifndef LIGHTSWITCH_PYTHON_H
#define LIGHTSWITCH_PYTHON_H

/* Slot of walk_python in walker_programs (and of walk_python_off_cpu in off_cpu_walkers). */
#define PYTHON_PROGRAM_SLOT 1
/* Thread states of the main interpreter searched for the sampled thread
 * when it is not in python_threads (one read each, bpf_loop steps). */
#define PYTHON_MAX_THREADS 4096
/* Python frames one sample carries at most (each takes two frame slots). */
#define PYTHON_MAX_FRAMES 256
/* An offset the version does not have. */
#define PYTHON_NO_OFFSET 0xffff
/* Bytes of a frame the walk uses: a _PyInterpreterFrame's fields lie in
 * its first 80; a PyFrameObject's (3.8-3.10) in its first 112 (f_lasti at
 * 104 on 3.8 and 3.9, 96 on 3.10). Read no further: a generator's frame
 * ends its object. */
#define PYTHON_FRAME_BYTES 80
#define PYTHON_FRAME_OBJECT_BYTES 112
/* The most of a page of frames read at once: 3.11 on, a thread's frames
 * are pushed one after the other on its data stack (mmap'd chunks), the
 * caller below the callee, so the bytes from the start of the page of a
 * frame up to its end usually hold its callers too. */
#define PYTHON_PAGE_BYTES 4096
#define PYTHON_WINDOW_BYTES (PYTHON_PAGE_BYTES + PYTHON_FRAME_OBJECT_BYTES)
/* The most bytes of a code object (from its first guard field to the end
 * of the other) and of a thread state (from 0 to the end of the last field
 * read) read at once; farther apart, each field is read alone. */
#define PYTHON_CODE_BYTES 128
#define PYTHON_TSTATE_BYTES 256
/* A thread not found by a long search (a thread that runs no Python in a
 * process of many threads) is looked for again after this long, ns: until
 * then its samples cost one lookup. */
#define PYTHON_RETRY_NS 10000000ULL
/* Searches this short are not worth remembering a miss for. */
#define PYTHON_SHORT_SEARCH 64
/* python_frame.word bit 63: the outermost frame its eval-loop call ran. */
#define PYTHON_ENTRY_BIT (1ULL << 63)

/* Processes whose interpreter user space found: pid -> python_proc. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct python_proc);
} python_procs SEC(".maps");

/* A sampled thread's PyThreadState, found once by the list search. */
struct python_thread {
	__u64 tstate;               /* its address; 0: not in the list when last searched */
	__u64 retry_ns;             /* tstate 0: search again from this time (bpf_ktime_get_ns) */
};

/* (pid << 32 | tid, init pid namespace) -> python_thread. An entry is
 * trusted only while the thread state it names still carries the thread's
 * id (one read, which also gives the frame pointer); else the list is
 * searched again and the entry refilled. LRU: entries of gone threads age out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct python_thread);
} python_threads SEC(".maps");

/* One CPU's copies of what the walk reads: frames (window), a code
 * object's guard fields (code), a thread state's head (tstate). */
struct python_scratch {
	__u8 window[PYTHON_WINDOW_BYTES + 32]; /* + 32: python_get's mask of a frame's field offsets */
	__u8 code[PYTHON_CODE_BYTES + 8];
	__u8 tstate[PYTHON_TSTATE_BYTES + 8];
	/* What the walk knows of the copies, kept here rather than in
	 * python_walk (the stack): the verifier then sees no new state per
	 * step of bpf_loop (1M instructions on the stack). */
	__u64 window_base;          /* window holds [window_base, window_base + window_len) */
	__u64 window_len;
	__u64 last_code;            /* the code object of the previous frame, and its guard */
	__u64 last_guard;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct python_scratch);
} python_scratch SEC(".maps");

/* The frame walk's state, as bpf_loop's callbacks see it. */
struct python_walk {
	struct scratch_space *sc;
	struct python_proc *proc;
	struct python_scratch *buf;
	__u64 frame;                /* the next frame to read (0: done) */
	__u64 tid;                  /* the thread as CPython knows it (python_thread_id) */
	__u64 tstate;               /* thread state being searched / found */
	__u32 first_slot;           /* frame slot of the first python_frame */
	__u32 frames;               /* python_frames written */
	__u16 frame_bytes;          /* PYTHON_FRAME_BYTES or PYTHON_FRAME_OBJECT_BYTES */
	__u16 code_lo;              /* the first guard field's offset, and bytes to the end of the other */
	__u16 code_span;
	__u16 tstate_span;          /* bytes from a thread state's start to the end of its last field read */
};

/* A field of `width` bytes (8, 4 or 1) at `off` of a copy of `limit`
 * bytes at `bytes`, a buffer of `size` + 8 bytes (a constant; a frame's
 * copy has 127 + 8 after it); 0 if out of the copy. */
static __always_inline __u64 python_get(__u8 *bytes, __u32 size, __u32 limit, __u16 off, int width)
{
	if (off > size - 8 || off + width > limit)
		return 0;
	/* For the verifier: clang may check a copy of off and index with
	 * another; a mask (a no-op here: size is at most 128 or 256) on the
	 * register that indexes bounds it. */
	__u32 at = off;
	barrier_var(at);
	at &= size <= 128 ? 127 : 255;
	if (width == 8)
		return *(__u64 *)&bytes[at];
	if (width == 4)
		return *(__u32 *)&bytes[at];
	return bytes[at];
}

/* A field of the copy of a thread state's head. */
static __always_inline __u64 python_tstate_field(struct python_walk *w, __u16 off)
{
	return python_get(w->buf->tstate, PYTHON_TSTATE_BYTES, w->tstate_span, off, 8);
}

/* The sampled thread as CPython knows it: its id in its own pid namespace
 * (native_thread_id, 3.11 on), or with frame objects (3.8-3.10) its thread
 * pointer (thread_id: pthread_self()). */
static __always_inline __u64 python_thread_id(struct python_offsets *o)
{
	struct task_struct *task = bpf_get_current_task_btf();
	if (o->frame_objects)
		return arch_thread_pointer(task);
	struct pid *p = task->thread_pid;
	if (!p)
		return 0;
	unsigned int level = p->level;
	int nr = 0;
	if (level > 31)
		return 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &p->numbers[level].nr);
	return nr;
}

/* Copy the head of thread state w->tstate (w->tstate_span bytes) into
 * buf->tstate; false if it cannot be read. */
static __always_inline bool python_read_tstate(struct python_walk *w)
{
	__u32 span = w->tstate_span;
	if (span > PYTHON_TSTATE_BYTES)
		return false;
	return bpf_probe_read_user(w->buf->tstate, span, (void *)w->tstate) == 0;
}

/* One step of the thread search: stop at the thread state of w->tid, else
 * move to the next (w->tstate 0 at the end of the list). */
static long python_find_step(__u64 index, void *data)
{
	struct python_walk *w = data;
	struct python_offsets *o = &w->proc->offsets;
	if (w->tstate == 0)
		return 1;
	if (!python_read_tstate(w)) {
		w->tstate = 0;
		return 1;
	}
	if (python_tstate_field(w, o->tstate_native_thread_id) == w->tid)
		return 1;
	w->tstate = python_tstate_field(w, o->tstate_next);
	return 0;
}

/* Find the sampled thread's PyThreadState (w->tstate, its head in
 * buf->tstate): the one python_threads remembers if it still carries the
 * thread's id, else by a search of the main interpreter's list, remembered
 * for the thread's next samples. 0 if not found. */
static __always_inline void python_find_thread(struct python_walk *w)
{
	struct python_offsets *o = &w->proc->offsets;
	struct sample_header *h = &w->sc->sample.header;
	__u64 key = ((__u64)h->pid << 32) | h->tid;
	struct python_thread *known = bpf_map_lookup_elem(&python_threads, &key);
	if (known) {
		w->tstate = known->tstate;
		if (w->tstate == 0 && bpf_ktime_get_ns() < known->retry_ns)
			return;
		if (w->tstate && python_read_tstate(w) &&
		    python_tstate_field(w, o->tstate_native_thread_id) == w->tid)
			return;
	}
	__u64 interp = 0;
	w->tstate = 0;
	if (bpf_probe_read_user(&interp, 8, (void *)(w->proc->runtime + o->runtime_interpreters)) != 0 ||
	    bpf_probe_read_user(&w->tstate, 8, (void *)(interp + o->interp_threads)) != 0) {
		w->tstate = 0;
		h->python_status = PYTHON_READ_FAULT;
		return;
	}
	long searched = bpf_loop(PYTHON_MAX_THREADS, python_find_step, w, 0);
	/* A miss is remembered only after a long search, so that a thread
	 * whose state is not bound yet (just started) is found at once in a
	 * small process, as before there was a cache. */
	if (w->tstate == 0 && searched <= PYTHON_SHORT_SEARCH)
		return;
	struct python_thread found = {
		.tstate = w->tstate,
		.retry_ns = w->tstate ? 0 : bpf_ktime_get_ns() + PYTHON_RETRY_NS,
	};
	bpf_map_update_elem(&python_threads, &key, &found, BPF_ANY);
}

/* The frame_bytes bytes of frame w->frame, in buf->window at the returned
 * offset: from the copy already there, else read anew (3.11 on with the
 * frames below it on its page); -1 if it cannot be read. */
static __always_inline long python_frame_at(struct python_walk *w)
{
	struct python_scratch *buf = w->buf;
	__u64 frame = w->frame;
	__u32 want = w->frame_bytes;
	__u64 at = frame - buf->window_base;
	__u64 have = buf->window_len;
	if (have >= want && at <= have - want && at <= PYTHON_PAGE_BYTES)
		return at;
	if (want > PYTHON_FRAME_OBJECT_BYTES)
		return -1;
	if (!w->proc->offsets.frame_objects) {
		__u64 in_page = frame & (PYTHON_PAGE_BYTES - 1);
		__u64 len = in_page + want;
		if (len <= PYTHON_WINDOW_BYTES &&
		    bpf_probe_read_user(buf->window, len, (void *)(frame - in_page)) == 0) {
			buf->window_base = frame - in_page;
			buf->window_len = len;
			return in_page;
		}
	}
	/* Frame objects (3.8-3.10) lie apart on the heap: read the one. */
	buf->window_len = 0;
	if (bpf_probe_read_user(buf->window, want, (void *)frame) != 0)
		return -1;
	buf->window_base = frame;
	buf->window_len = want;
	return 0;
}

/* The guard against a freed code object's memory holding another one: its
 * first line and its line table's address (src/unwind/interp/python/names.rs),
 * read at once where they are close. A code object met twice in one sample
 * (recursion) is read once: a frame on the chain holds a reference to its
 * code, so the object cannot change between two frames of the walk. */
static __always_inline __u64 python_guard(struct python_walk *w, __u64 code)
{
	struct python_offsets *o = &w->proc->offsets;
	struct python_scratch *buf = w->buf;
	if (code == buf->last_code && code != 0)
		return buf->last_guard;
	__u32 firstlineno = 0;
	__u64 linetable = 0;
	__u32 span = w->code_span;
	/* One bound on span, not two: clang folds a range check into a
	 * copy of the register and the verifier loses the bound. */
	if (span <= PYTHON_CODE_BYTES) {
		if (bpf_probe_read_user(w->buf->code, span, (void *)(code + w->code_lo)) == 0) {
			firstlineno = python_get(w->buf->code, PYTHON_CODE_BYTES, span,
						 o->code_firstlineno - w->code_lo, 4);
			linetable = python_get(w->buf->code, PYTHON_CODE_BYTES, span,
					       o->code_linetable - w->code_lo, 8);
		}
	} else {
		bpf_probe_read_user(&firstlineno, sizeof(firstlineno), (void *)(code + o->code_firstlineno));
		bpf_probe_read_user(&linetable, sizeof(linetable), (void *)(code + o->code_linetable));
	}
	__u64 guard = (firstlineno ^ (__u32)(linetable >> 4)) & 0x7fffffff;
	buf->last_code = code;
	buf->last_guard = guard;
	return guard;
}

/* One step of the frame walk: record the frame at w->frame and move to its caller. */
static long python_step(__u64 index, void *data)
{
	struct python_walk *w = data;
	struct python_offsets *o = &w->proc->offsets;
	if (w->frame == 0)
		return 1;
	long at = python_frame_at(w);
	if (at < 0 || at > PYTHON_PAGE_BYTES) {
		w->sc->sample.header.python_status = PYTHON_READ_FAULT;
		return 1;
	}
	__u8 *f = &w->buf->window[at];
	__u32 size = PYTHON_FRAME_OBJECT_BYTES, limit = w->frame_bytes;
	__u64 code = python_get(f, size, limit, o->frame_code, 8);
	__u64 instr = python_get(f, size, limit, o->frame_instr, 8);
	__u8 owner = python_get(f, size, limit, o->frame_owner, 1);
	__u8 entry = o->frame_is_entry != PYTHON_NO_OFFSET &&
		     python_get(f, size, limit, o->frame_is_entry, 1);
	__u64 offset = instr - (code + o->code_adaptive);
	if (o->frame_objects) {
		/* Each frame object on the chain is its own eval-loop call. */
		offset = (__u32)python_get(f, size, limit, o->frame_lasti, 4);
		entry = 1;
	}
	w->frame = python_get(f, size, limit, o->frame_previous, 8);
	if (o->cstack_owner != 0xff && owner == o->cstack_owner) {
		/* A shim the eval loop pushes at its entry: the frame before it was the first it ran. */
		if (w->frames > 0) {
			__u32 prev = w->first_slot + 2 * (w->frames - 1) + 1;
			barrier_var(prev);
			if (prev < MAX_KERNEL_FRAMES + MAX_USER_FRAMES)
				w->sc->sample.frames[prev] |= PYTHON_ENTRY_BIT;
		}
		return 0;
	}
	__u64 guard = python_guard(w, code);
	__u64 word = (offset & 0xffffffff) | (guard << 32) | (entry ? PYTHON_ENTRY_BIT : 0);
	__u32 slot = w->first_slot + 2 * w->frames;
	barrier_var(slot);
	if (w->frames >= PYTHON_MAX_FRAMES || slot > MAX_KERNEL_FRAMES + MAX_USER_FRAMES - 2) {
		w->sc->sample.header.python_status = PYTHON_TRUNCATED;
		return 1;
	}
	__u64 *dst = &w->sc->sample.frames[slot];
	dst[0] = code;
	dst[1] = word;
	w->frames++;
	return 0;
}

/* Bytes from the lower of two field offsets to the end of the higher (8 bytes). */
static __always_inline __u16 python_span(__u16 a, __u16 b)
{
	return (a > b ? a : b) + 8 - (a < b ? a : b);
}

/* Find the sampled thread's PyThreadState and walk its frames into the record. */
static __always_inline void python_walk(struct scratch_space *sc, struct python_proc *proc)
{
	__u32 zero = 0;
	struct python_offsets *o = &proc->offsets;
	__u16 tstate_end = o->tstate_next > o->tstate_frame ? o->tstate_next : o->tstate_frame;
	if (o->tstate_native_thread_id > tstate_end)
		tstate_end = o->tstate_native_thread_id;
	struct python_walk w = {
		.sc = sc,
		.proc = proc,
		.buf = bpf_map_lookup_elem(&python_scratch, &zero),
		.tid = python_thread_id(o),
		.first_slot = sc->state.kernel_frames + sc->state.user_frames,
		.frame_bytes = o->frame_objects ? PYTHON_FRAME_OBJECT_BYTES : PYTHON_FRAME_BYTES,
		.code_lo = o->code_firstlineno < o->code_linetable ? o->code_firstlineno : o->code_linetable,
		.code_span = python_span(o->code_firstlineno, o->code_linetable),
		.tstate_span = tstate_end + 8,
	};
	if (!w.buf)
		return;
	w.buf->window_len = 0;
	w.buf->last_code = 0;
	python_find_thread(&w);
	if (!w.tstate) {
		if (sc->sample.header.python_status == PYTHON_NOT_WALKED)
			sc->sample.header.python_status = PYTHON_NO_THREAD;
		return;
	}
	__u64 frame = python_tstate_field(&w, o->tstate_frame);
	if (frame && o->cframe_current_frame != PYTHON_NO_OFFSET &&
	    bpf_probe_read_user(&frame, 8, (void *)(frame + o->cframe_current_frame)) != 0)
		frame = 0;
	sc->sample.header.python_status = PYTHON_WALKED;
	w.frame = frame;
	bpf_loop(PYTHON_MAX_FRAMES + 64, python_step, &w, 0);
	sc->state.python_frames = w.frames;
}

/* The native walk of a sample is done: go on in walk_python when the
 * process runs an interpreter user space found (the bpf_loop variant's
 * walker only; elsewhere the slot is empty and the record is sent as it is). */
static __always_inline void python_hook(void *ctx, struct scratch_space *sc, void *programs)
{
	__u32 pid = sc->sample.header.pid;
	if (bpf_map_lookup_elem(&python_procs, &pid))
		bpf_tail_call(ctx, programs, PYTHON_PROGRAM_SLOT);
}

/* Walk the Python frames of the record in sc, if its process has a known
 * interpreter, and send it (the body of walk_python and walk_python_off_cpu). */
static __always_inline void python_walk_and_send(struct scratch_space *sc)
{
	__u32 pid = sc->sample.header.pid;
	struct python_proc *proc = bpf_map_lookup_elem(&python_procs, &pid);
	if (proc)
		python_walk(sc, proc);
	send_sample(sc, false);
}

SEC("perf_event")
int walk_python(struct bpf_perf_event_data *ctx)
{
	struct scratch_space *sc = get_scratch();
	if (sc)
		python_walk_and_send(sc);
	return 0;
}

#endif
