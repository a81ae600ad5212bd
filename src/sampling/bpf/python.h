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

/* Slot of walk_python in walker_programs. */
#define PYTHON_PROGRAM_SLOT 1
/* Threads of the main interpreter searched for the sampled one. */
#define PYTHON_MAX_THREADS 64
/* Python frames one sample carries at most (each takes two frame slots). */
#define PYTHON_MAX_FRAMES 256
/* An offset the version does not have. */
#define PYTHON_NO_OFFSET 0xffff
/* Bytes of a _PyInterpreterFrame read at once (every field the walk uses lies in them). */
#define PYTHON_FRAME_BYTES 80
/* python_frame.word bit 63: the outermost frame its eval-loop call ran. */
#define PYTHON_ENTRY_BIT (1ULL << 63)

/* Processes whose interpreter user space found: pid -> python_proc. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct python_proc);
} python_procs SEC(".maps");

/* One CPU's copy of the frame being read. */
struct python_scratch {
	__u8 frame[PYTHON_FRAME_BYTES + 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct python_scratch);
} python_scratch SEC(".maps");

/* The frame walk's state, as bpf_loop's callback sees it. */
struct python_walk {
	struct scratch_space *sc;
	struct python_proc *proc;
	struct python_scratch *buf;
	__u64 frame;                /* the next _PyInterpreterFrame to read (0: done) */
	__u32 first_slot;           /* frame slot of the first python_frame */
	__u32 frames;               /* python_frames written */
};

/* A field of `width` bytes (8, 4 or 1) at `off` in the frame copy; 0 if out of it. */
static __always_inline __u64 python_field(struct python_scratch *buf, __u16 off, int width)
{
	if (off > PYTHON_FRAME_BYTES - 8)
		return 0;
	if (width == 8)
		return *(__u64 *)&buf->frame[off];
	if (width == 4)
		return *(__u32 *)&buf->frame[off];
	return buf->frame[off];
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

/* One step of the frame walk: record the frame at w->frame and move to its caller. */
static long python_step(__u64 index, void *data)
{
	struct python_walk *w = data;
	struct python_proc *proc = w->proc;
	struct python_offsets *o = &proc->offsets;
	if (w->frame == 0)
		return 1;
	if (bpf_probe_read_user(w->buf->frame, PYTHON_FRAME_BYTES, (void *)w->frame) != 0) {
		w->sc->sample.header.python_status = PYTHON_READ_FAULT;
		return 1;
	}
	__u64 code = python_field(w->buf, o->frame_code, 8);
	__u64 instr = python_field(w->buf, o->frame_instr, 8);
	__u8 owner = python_field(w->buf, o->frame_owner, 1);
	__u8 entry = o->frame_is_entry != PYTHON_NO_OFFSET && python_field(w->buf, o->frame_is_entry, 1);
	__u64 frame = w->frame;
	w->frame = python_field(w->buf, o->frame_previous, 8);
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
	/* The guard against a freed code object's memory holding another one:
	 * its first line and its line table's address (src/unwind/interp/python/names.rs). */
	__u32 firstlineno = 0;
	__u64 linetable = 0;
	bpf_probe_read_user(&firstlineno, sizeof(firstlineno), (void *)(code + o->code_firstlineno));
	bpf_probe_read_user(&linetable, sizeof(linetable), (void *)(code + o->code_linetable));
	__u64 guard = (firstlineno ^ (__u32)(linetable >> 4)) & 0x7fffffff;
	__u64 offset = instr - (code + o->code_adaptive);
	if (o->frame_objects) {
		/* Each frame object on the chain is its own eval-loop call. */
		__s32 lasti = -1;
		bpf_probe_read_user(&lasti, sizeof(lasti), (void *)(frame + o->frame_lasti));
		offset = (__u32)lasti;
		entry = 1;
	}
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

/* Find the sampled thread's PyThreadState and walk its frames into the record. */
static __always_inline void python_walk(struct scratch_space *sc, struct python_proc *proc)
{
	__u32 zero = 0;
	struct python_offsets *o = &proc->offsets;
	struct python_walk w = {
		.sc = sc,
		.proc = proc,
		.buf = bpf_map_lookup_elem(&python_scratch, &zero),
		.first_slot = sc->state.kernel_frames + sc->state.user_frames,
	};
	if (!w.buf)
		return;
	__u64 interp = 0, tstate = 0, frame = 0;
	if (bpf_probe_read_user(&interp, 8, (void *)(proc->runtime + o->runtime_interpreters)) != 0 ||
	    bpf_probe_read_user(&tstate, 8, (void *)(interp + o->interp_threads)) != 0) {
		sc->sample.header.python_status = PYTHON_READ_FAULT;
		return;
	}
	__u64 tid = python_thread_id(o);
	for (int i = 0; i < PYTHON_MAX_THREADS && tstate; i++) {
		__u64 native = 0;
		bpf_probe_read_user(&native, 8, (void *)(tstate + o->tstate_native_thread_id));
		if (native == tid)
			break;
		if (bpf_probe_read_user(&tstate, 8, (void *)(tstate + o->tstate_next)) != 0)
			tstate = 0;
	}
	if (!tstate) {
		sc->sample.header.python_status = PYTHON_NO_THREAD;
		return;
	}
	if (bpf_probe_read_user(&frame, 8, (void *)(tstate + o->tstate_frame)) != 0)
		frame = 0;
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

SEC("perf_event")
int walk_python(struct bpf_perf_event_data *ctx)
{
	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 0;
	__u32 pid = sc->sample.header.pid;
	struct python_proc *proc = bpf_map_lookup_elem(&python_procs, &pid);
	if (proc)
		python_walk(sc, proc);
	send_sample(sc, false);
	return 0;
}

#endif
