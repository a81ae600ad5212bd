/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every feature of the programs shares: the settings user space bakes
 * in before load, the rings and maps they all use, the per-CPU scratch space
 * where a record and the state of its user-stack walk are kept (across tail
 * calls), and the few helpers every file needs (counters, process events,
 * the current task, ending a walk). Included first by profiler.bpf.c.
 */
#ifndef LIGHTSWITCH_STATE_H
#define LIGHTSWITCH_STATE_H

/* Set by user space before load (read-only data section). */
const volatile bool filter_pids = false; /* only sample pids in target_pids */
const volatile __u32 exclude_pid = 0;    /* never sample this pid (--exclude-self) */
/* `record`: the processes a wanted process creates are wanted too (on_fork),
 * and a wanted process leaves target_pids when its last thread exits. */
const volatile bool follow_children = false;
/* Unconsumed bytes in a CPU's `samples` ring above which a new record wakes user space;
 * below it, user space reads records at its next periodic poll, which spares
 * each sample the cost of a wake-up (an inter-processor interrupt). */
const volatile __u64 samples_wakeup_bytes = 1024 * 1024;

/* Processes to sample when filter_pids is set: tgid -> unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} target_pids SEC(".maps");

/* One record per sample, in one ring buffer per CPU (index: CPU id), which
 * user space creates and sizes for the frequency. With a single shared ring,
 * every record took its lock and producer position from the cache of the
 * CPU that wrote the previous one: sending cost 450 ns per sample at 10 kHz
 * on two busy CPUs, 240 ns with a ring per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_RINGBUF);
		__uint(max_entries, 256 * 1024);
	});
} samples SEC(".maps");

/* Process events for user space (struct process_event). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* Never read: puts struct process_event into the object's BTF, so that the
 * skeleton generates its Rust type (src/sampling/records.rs parses events with it). */
const volatile struct process_event process_event_layout = {};
/* Likewise for struct stack_copy (records with a stack copy are assembled
 * in the ring, from no map value). */
const volatile struct stack_copy stack_copy_layout = {};
/* Likewise for the enums whose numbers user space reads (counters, walk
 * outcomes, record flags, process events, mapping kinds, Python walks, the
 * unwind rows' CFA and rbp rules): it names them, never numbers them
 * itself. Numbers written as #define in profiler.h and arch_x86_64.h reach
 * it through build.rs (`skel::defines`). */
const volatile enum stat_index stat_index_layout = STAT_SAMPLES;
const volatile enum unwind_status unwind_status_layout = UNWIND_COMPLETE;
const volatile enum event_type event_type_layout = EVENT_EXEC;
const volatile enum sample_flag sample_flag_layout = SAMPLE_FLAG_KERNEL_THREAD;
const volatile enum mapping_kind mapping_kind_layout = MAPPING_TABLE;
const volatile enum python_status python_status_layout = PYTHON_NOT_WALKED;
const volatile enum cfa_type cfa_type_layout = CFA_END_OF_FUNCTION;
const volatile enum fp_type fp_type_layout = FP_UNCHANGED;

/* Per-CPU counters, indexed by enum stat_index. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* Executable mappings of the processes user space has described: pid -> info. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct process_info);
} process_mappings SEC(".maps");

/* Objects whose table is fully loaded: object_id -> unused. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} loaded_objects SEC(".maps");

/* Where each page's rows are in unwind_rows. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct page_key);
	__type(value, struct page_value);
} unwind_pages SEC(".maps");

/* Every loaded row of every object; user space sizes it (--max-unwind-info-mb)
 * and allocates a contiguous range per object, writing rows through mmap. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* A row found for (object, vaddr) on this CPU. */
struct row_cache_entry {
	__u64 vaddr;        /* object vaddr the row was looked up for */
	__u32 object_tag;   /* object_id + 1; 0 marks an empty entry */
	__u32 row_end;      /* page offset where the row's rule ends: the next row's
	                     * pc_low, or UNWIND_PAGE_SIZE */
	struct unwind_row row;
};

struct row_cache {
	struct row_cache_entry entries[ROW_CACHE_ENTRIES];
};

/* Per-CPU cache of rows, indexed by a hash of (object_id, vaddr). Object ids
 * are never reused within a run and a row never changes, so entries stay
 * valid; a CPU-bound workload finds all its rows here after its first
 * samples. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct row_cache);
} row_cache SEC(".maps");

/* One step of a remembered walk: the registers it started from. Any frame
 * whose lookup address (ip, less 1 for a return address) is in
 * [lookup_lo, lookup_hi) uses the same unwind row, so with the same rsp and
 * rbp it computes the same CFA and reads the same words. (A PLT row also
 * depends on the ip itself: its range is empty.) */
struct memo_regs {
	__u64 lookup_lo;
	__u64 lookup_hi;
	__u64 sp;
	__u64 bp;
	__u16 first_check;  /* index in walk_memo.checks of the step's first read */
	__u8 padding[6];
};

/* One stack word a remembered walk read: its address and value. */
struct memo_check {
	__u64 addr;
	__u64 value;
};

/* A complete CFI walk of one process. */
struct walk_memo {
	__u32 pid;
	__u32 generation;   /* process_info.generation of the mappings it used */
	__u32 frame_count;  /* 0: nothing remembered */
	__u32 check_count;
	__u64 end;          /* one past the highest stack byte the walk read */
	/* Index of the frame with a given rsp: (rsp / STACK_SLOT_BYTES) mod
	 * MEMO_INDEX_ENTRIES. Entries may be stale; a candidate is checked. */
	__u8 by_sp[MEMO_INDEX_ENTRIES];
	struct memo_regs regs[MEMO_FRAMES];
	__u64 ips[MEMO_FRAMES];
	/* Every word the walk read, in the order it read them (at most two
	 * per frame: the return address and the caller's rbp). */
	struct memo_check checks[MEMO_CHECKS];
};

/* memos[current] is the remembered walk; the walk in progress records its
 * steps in the other one, which becomes current if the walk qualifies. */
struct walk_memos {
	__u32 current;
	__u32 padding;
	struct walk_memo memos[2];
};

/* Per-CPU remembered walks (a separate map: together with scratch_space
 * they would exceed the 32 KiB a per-CPU value may have). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct walk_memos);
} walk_memo SEC(".maps");

/* State of one user-stack walk, carried across tail calls. */
struct walk_state {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	/* The current frame's rbx, which only an rbx-based CFA (CFA_RBP_OFFSET
	 * with FP_CFA_FROM_RBX) reads: the word at bx_addr, a caller's save
	 * slot (bx_addr 0: the interrupted register, in bx); bx_unknown when a
	 * frame-pointer step or an unfollowed rbx rule lost it. */
	__u64 bx;
	__u64 bx_addr;
	__u8 bx_unknown;
	__u32 kernel_frames;
	__u32 user_frames;
	__u32 tail_calls;
	__u32 python_frames;  /* struct python_frame entries after the user frames (python.h) */
	__u8 status;        /* enum unwind_status, valid once done */
	__u8 done;
	__u8 exact_ip;      /* ip is not a return address (leaf, or after a signal frame) */
	__u8 used_fp;       /* a frame was walked by frame pointers */
	__u8 missing_table; /* a frame's object had no table loaded yet (walked by frame pointers) */
	__u8 last_step_fp;  /* st->ip came from a frame-pointer step (may be garbage) */
	__u8 unrepeatable;  /* a step took registers from somewhere other than the stack words
	                     * recorded (a signal frame, the interrupted frame's return-address
	                     * register): the walk is not remembered */
	__u8 joining;       /* the current frame matches the remembered walk's frame memo_next */
	__u8 join_failed;   /* the remembered walk did not hold: walk every frame */
	__u8 joined;        /* the frames from memo_next on were copied from the remembered walk */
	__u8 vma_looked_up; /* the kernel was asked for the mapping of a pc (once per sample) */
	__u8 vma_wanted;    /* the walk stopped at a pc in no known mapping: ask the kernel */
	__u8 copy_wanted;   /* copy_* hold the first frame walked without its table or mapping */
	__u8 copy_exact_ip;
	__u32 copy_frame;
	__u64 copy_ip;
	__u64 copy_sp;
	__u64 copy_bp;
	__u64 copy_bx;
	__u64 copy_bx_addr;
	__u8 copy_bx_unknown;
	__u32 memo_next;
	__u32 generation;   /* process_info.generation when the walk started */
	__u32 rec_checks;   /* words recorded so far in the walk being remembered */
	__u64 rec_end;      /* one past the highest stack byte read so far */
	/* The page the previous frame's row came from: consecutive frames are
	 * often in the same page, which then costs no hash lookup. */
	__u8 cached_page_valid;
	struct page_key cached_key;
	struct page_value cached_page;
	/* Binary-search bounds. They live in map memory, not registers, so the
	 * verifier does not track every (lo, hi) pair as a separate state. */
	__u32 search_lo;
	__u32 search_hi;
	__u32 search_end;
	/* Index of the previous frame's mapping in the process's list. */
	__u32 last_mapping;
	/* Bytes of scratch_space.stack_chunk that hold user memory from
	 * chunk_start (8-byte aligned) on (0: none). */
	__u32 chunk_len;
	__u64 chunk_start;
};

struct scratch_space {
	struct walk_state state;
	/* Rows by stack position: a frame whose rsp is sp uses the entry
	 * (sp / STACK_SLOT_BYTES) mod STACK_SLOT_ENTRIES. A CPU that keeps
	 * sampling the same call chain finds every row in a few contiguous
	 * lines, where the hashed row_cache costs one scattered line per frame:
	 * after a pause between samples (100 Hz), each of those lines is a
	 * cache and TLB miss. Indexing by rsp rather than by frame number keeps
	 * a frame in its entry when the leaf differs (a sample in a system call
	 * has the libc wrapper below the frames a user-mode sample starts
	 * with). */
	struct row_cache_entry stack_slots[STACK_SLOT_ENTRIES];
	struct stack_sample sample;
	/* A copy of user stack memory, as words: an aligned load is one
	 * instruction, where a possibly unaligned one compiles to eight. */
	__u64 stack_chunk[STACK_CHUNK_SIZE / 8];
	/* The stack from a joined frame's rsp up to the end of what the
	 * remembered walk read. */
	__u64 replay_stack[REPLAY_STACK_BYTES / 8];
	/* The interrupted user registers, read when a CFA_RETURN_IN_REGISTER
	 * row needs one (not cleared per sample). */
	struct sample_regs user_regs;
};

/* Per-CPU space where a record is assembled before it is copied out. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch_space);
} scratch SEC(".maps");

/* Per-CPU: 1 while an off-CPU walk (off_cpu.h, from a syscall-exit
 * tracepoint, which a cpu-clock sample can interrupt) uses this CPU's
 * scratch space; the other programs then leave it alone. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} scratch_busy SEC(".maps");

static __always_inline bool scratch_is_busy(void)
{
	__u32 zero = 0;
	__u32 *busy = bpf_map_lookup_elem(&scratch_busy, &zero);
	return busy && *busy;
}

static __always_inline void count(__u32 index)
{
	__u64 *value = bpf_map_lookup_elem(&stats, &index);
	if (value)
		*value += 1;
}

static __always_inline struct scratch_space *get_scratch(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&scratch, &zero);
}

/* The current task: a BTF pointer (bpf_get_current_task_btf, Linux 5.11)
 * whose fields the program reads directly, or (compat) a plain address whose
 * fields it reads with bpf_probe_read_kernel (TASK_FIELD). */
static __always_inline struct task_struct *current_task(bool compat)
{
	if (compat)
		return (struct task_struct *)bpf_get_current_task();
	return bpf_get_current_task_btf();
}

#define TASK_FIELD(compat, task, field) ((compat) ? BPF_CORE_READ(task, field) : (task)->field)

static __always_inline void send_event_at(__u32 type, __u32 pid, __u64 address, __u64 timestamp_ns)
{
	struct process_event event = {
		.type = type,
		.pid = pid,
		.address = address,
		.timestamp_ns = timestamp_ns,
	};
	if (bpf_ringbuf_output(&events, &event, sizeof(event), 0) != 0)
		count(STAT_EVENTS_LOST);
}

static __always_inline void send_event(__u32 type, __u32 pid, __u64 address)
{
	send_event_at(type, pid, address, bpf_ktime_get_ns());
}

/* End the walk. A walk that needed a table not loaded yet reports
 * UNWIND_NO_TABLE even if its frame-pointer fallback reached an end. */
static __always_inline void finish(struct walk_state *st, __u8 status)
{
	if (st->missing_table && (status == UNWIND_COMPLETE || status == UNWIND_FRAME_POINTER))
		status = UNWIND_NO_TABLE;
	st->status = status;
	st->done = 1;
}

/* What every step of one program run's walk needs, looked up once. */
struct walk_context {
	struct scratch_space *sc;
	struct process_info *proc;
	struct row_cache *cache;
	struct walk_memos *memos;
};

#endif
