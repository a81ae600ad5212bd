// SPDX-License-Identifier: GPL-2.0
/*
 * lightswitch's sampling program. Attached to one cpu-clock perf event per
 * online CPU; on each sample it records who was running, the kernel stack
 * and the user stack, and sends one variable-length record to user space
 * through its CPU's ring buffer in `samples`. Record and table layouts:
 * profiler.h.
 *
 * User stacks are walked from DWARF CFI compiled by user space into compact
 * unwind rows (docs/unwind-tables.md): for each frame the walker finds the
 * mapping of the pc in the process's sorted mapping list (the previous
 * frame's mapping is tried first), then the row: from this CPU's row cache,
 * or by a binary search in the object's page. It computes the CFA, reads the
 * return address at CFA - 8 and recovers rbp; both reads come from a copy of
 * STACK_CHUNK_SIZE bytes of the stack, refilled when a read falls outside
 * it. FRAMES_PER_PROGRAM frames are
 * walked per program run (bpf_loop); the walk continues in the same program
 * through tail calls up to MAX_USER_FRAMES. Mappings without CFI fall back to
 * frame pointers. Every sample records how its walk ended.
 *
 * Each CPU also remembers its last complete CFI walk: for every step, the
 * rsp and rbp it started from, the range of lookup addresses (pc, less 1 for
 * a return address) its unwind row covers, and
 * the stack words it read. When one of a new walk's first MEMO_JOIN_FRAMES
 * frames has the same rsp and rbp as a remembered step and a pc in its
 * range, and every word the remembered walk read from there on still holds
 * the same value, the rest of the walk would repeat it step for step: its
 * frames are copied instead of walked (docs/unwind-tables.md).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "profiler.h"
#include "arch_x86_64.h"

#define PF_KTHREAD 0x00200000
/* Shortest interval between two unknown-mapping notifications for one pid, ns. */
#define NOTIFY_INTERVAL_NS (200 * 1000 * 1000ULL)

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
 * skeleton generates its Rust type (src/sample.rs parses events with it). */
const volatile struct process_event process_event_layout = {};
/* Likewise for struct stack_copy (records with a stack copy are assembled
 * in the ring, from no map value). */
const volatile struct stack_copy stack_copy_layout = {};

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

/* The last unknown-mapping notification of a pid (rate limit). */
struct notice {
	__u64 time_ns;
	__u32 generation;   /* of the description the walk had (0: none) */
	__u32 padding;
};

/* Last unknown-mapping notification per pid. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct notice);
} last_notified SEC(".maps");

/* The latest exec of each process: user space reads it around its reads of
 * /proc/PID/maps to know which image they describe. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct exec_time);
} exec_times SEC(".maps");

/* Objects whose tables user space knows, by file: lets exec and mmap
 * describe a new mapping of them at once. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct file_key);
	__type(value, struct object_file);
} object_files SEC(".maps");

/* Per-CPU space where the exec program assembles a description. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct process_info);
} new_description SEC(".maps");

/* The walker itself, for tail calls (slot 0), and the Python walker (slot 1, python.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u32);
} walker_programs SEC(".maps");

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

/* Tell user space that pid's description (of this generation; 0: none)
 * lacks the mapping of address. At most once per NOTIFY_INTERVAL_NS per
 * description: a new description (after an exec, an mmap, a re-read) may
 * be notified at once. */
static __always_inline void notify_unknown_mapping(__u32 pid, __u64 address, __u32 generation)
{
	__u64 now = bpf_ktime_get_ns();
	struct notice *last = bpf_map_lookup_elem(&last_notified, &pid);
	if (last && now - last->time_ns < NOTIFY_INTERVAL_NS && last->generation == generation)
		return;
	struct notice notice = { .time_ns = now, .generation = generation };
	bpf_map_update_elem(&last_notified, &pid, &notice, BPF_ANY);
	send_event(EVENT_UNKNOWN_MAPPING, pid, address);
}

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

/* End the walk. A walk that needed a table not loaded yet reports
 * UNWIND_NO_TABLE even if its frame-pointer fallback reached an end. */
static __always_inline void finish(struct walk_state *st, __u8 status)
{
	if (st->missing_table && (status == UNWIND_COMPLETE || status == UNWIND_FRAME_POINTER))
		status = UNWIND_NO_TABLE;
	st->status = status;
	st->done = 1;
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

/* What every step of one program run's walk needs, looked up once. */
struct walk_context {
	struct scratch_space *sc;
	struct process_info *proc;
	struct row_cache *cache;
	struct walk_memos *memos;
};

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

#define VM_EXEC 0x4

/* A generation for a description these programs write: random (atomics
 * that return a value need a newer BPF instruction set), so two of one
 * process are equal once in 2^31. */
static __always_inline __u32 next_generation(void)
{
	return BPF_GENERATION_BASE | bpf_get_prandom_u32();
}

/* How the walker sees [start, end) of the object user space registered
 * under key, from page pgoff on; false when it has not. */
static __always_inline bool describe_object_mapping(struct exec_mapping *out, struct file_key *key, __u64 start,
						    __u64 end, __u64 pgoff)
{
	struct object_file *object = bpf_map_lookup_elem(&object_files, key);
	if (!object)
		return false;
	__u64 offset = pgoff << 12;
	__u64 vaddr = offset;
	for (int i = 0; i < OBJECT_SEGMENTS; i++) {
		if (i < object->segment_count && object->segments[i].offset_lo <= offset &&
		    offset < object->segments[i].offset_hi) {
			vaddr = offset + object->segments[i].vaddr_delta;
			break;
		}
	}
	out->start = start;
	out->end = end;
	out->bias = start - vaddr;
	out->object_id = object->object_id;
	out->kind = MAPPING_TABLE;
	return true;
}

/* How the walker sees [start, end) of file from page pgoff on; false when
 * user space has not told the programs about the file's object. */
static __always_inline bool describe_file_mapping(struct exec_mapping *out, struct file *file, __u64 start,
						  __u64 end, __u64 pgoff)
{
	struct inode *inode = BPF_CORE_READ(file, f_inode);
	__u32 s_dev = BPF_CORE_READ(inode, i_sb, s_dev);
	struct file_key key = {
		/* The kernel's dev_t is major << 20 | minor. */
		.dev = ((__u64)(s_dev >> 20) << 32) | (s_dev & 0xfffff),
		.inode = BPF_CORE_READ(inode, i_ino),
	};
	return describe_object_mapping(out, &key, start, end, pgoff);
}

/* How the walker sees vma if it is its process's vDSO (no file backs it)
 * and user space has registered the vDSO's table (under VDSO_FILE_KEY):
 * a process's first calls of clock_gettime are walked before user space
 * has read its maps. */
static __always_inline bool describe_vdso_mapping(struct exec_mapping *out, struct vm_area_struct *vma)
{
	__u64 vdso = (__u64)BPF_CORE_READ(vma, vm_mm, context.vdso);
	if (vdso == 0 || vdso != vma->vm_start)
		return false;
	struct file_key key = { .dev = VDSO_FILE_DEV, .inode = VDSO_FILE_INODE };
	return describe_object_mapping(out, &key, vma->vm_start, vma->vm_end, 0);
}

/* An insertion into a sorted mapping list, as bpf_loop callbacks see it. */
struct insertion {
	struct process_info *proc;
	struct exec_mapping m;
	__u32 count;
	__u32 pos;      /* where m goes */
	bool overlap;   /* m overlaps a mapping in the list */
};

/* Step i of the search for where m goes. */
static long insertion_position(__u64 i, void *data)
{
	struct insertion *c = data;
	struct process_info *proc = c->proc;
	if (!proc || i >= c->count)
		return 1;
	__u32 index = i & (MAX_PROCESS_MAPPINGS - 1);
	barrier_var(index);
	struct exec_mapping *e = &proc->mappings[index];
	if (e->start < c->m.end && c->m.start < e->end) {
		c->overlap = true;
		return 1;
	}
	if (e->start < c->m.start)
		c->pos = i + 1;
	return 0;
}

/* Step k of making room at c->pos: entry count - k moves up by one. */
static long insertion_shift(__u64 k, void *data)
{
	struct insertion *c = data;
	struct process_info *proc = c->proc;
	__u32 i = c->count - (__u32)k;
	/* pos <= count: the walk down stops at pos before i could wrap. */
	if (!proc || i <= c->pos)
		return 1;
	/* Masked where they are used: the verifier must see the bound on the
	 * very registers that index. */
	__u32 dst = i & (MAX_PROCESS_MAPPINGS - 1), src = (i - 1) & (MAX_PROCESS_MAPPINGS - 1);
	barrier_var(dst);
	barrier_var(src);
	proc->mappings[dst] = proc->mappings[src];
	return 0;
}

/* Insert m into proc's sorted list. False (and no change) when the list is
 * full or m overlaps a mapping already there. */
static __always_inline bool insert_mapping(struct process_info *proc, struct exec_mapping *m)
{
	struct insertion c = { .proc = proc, .m = *m, .count = proc->mapping_count };
	if (c.count >= MAX_PROCESS_MAPPINGS)
		return false;
	bpf_loop(MAX_PROCESS_MAPPINGS, insertion_position, &c, 0);
	if (c.overlap)
		return false;
	bpf_loop(MAX_PROCESS_MAPPINGS, insertion_shift, &c, 0);
	__u32 pos = c.pos & (MAX_PROCESS_MAPPINGS - 1);
	barrier_var(pos);
	proc->mappings[pos] = *m;
	proc->mapping_count = c.count + 1;
	return true;
}

/* Where add_vma puts what it finds. */
struct vma_request {
	struct process_info *proc;  /* the description to add to */
	__u64 timestamp_ns;         /* for the event: when the mapping was seen */
	__u32 pid;
};

/* bpf_find_vma callback: add the executable file mapping vma (or the
 * vDSO) to the description of the request in data, and tell user space. */
static long add_vma(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_request *req = data;
	struct process_info *proc = req->proc;
	struct exec_mapping m;
	struct file *file = vma->vm_file;
	if (!proc || !(vma->vm_flags & VM_EXEC))
		return 0;
	bool described = file ? describe_file_mapping(&m, file, vma->vm_start, vma->vm_end, vma->vm_pgoff)
			      : describe_vdso_mapping(&m, vma);
	if (!described || !insert_mapping(proc, &m))
		return 0;
	proc->generation = next_generation();
	struct process_event event = {
		.type = EVENT_MAPPING,
		.pid = req->pid,
		.address = m.start,
		.timestamp_ns = req->timestamp_ns,
		.end = m.end,
		.file_offset = vma->vm_pgoff << 12,
		.object_id = m.object_id,
	};
	if (bpf_ringbuf_output(&events, &event, sizeof(event), 0) != 0)
		count(STAT_EVENTS_LOST);
	return 0;
}

/* Walk one frame: record st->ip, then compute the caller's registers.
 * Returns 1 to stop. The one step body of both walkers: the bpf_loop
 * callback (unwind_step) and the compat variant's global function
 * (unwind_step_compat, profiler_compat.h). */
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
	/* Record this step in the walk being remembered. Beyond MEMO_FRAMES
	 * the indices wrap and overwrite earlier steps: such a walk is not
	 * remembered anyway. */
	struct walk_memo *rec = &memos->memos[(memos->current ^ 1) & 1];
	struct memo_regs *r = &rec->regs[st->user_frames & (MEMO_FRAMES - 1)];
	rec->by_sp[(st->sp / STACK_SLOT_BYTES) & (MEMO_INDEX_ENTRIES - 1)] = st->user_frames;
	/* An empty range: no frame joins at this step unless its row sets one. */
	r->lookup_lo = 0;
	r->lookup_hi = 0;
	r->sp = st->sp;
	r->bp = st->bp;
	r->first_check = st->rec_checks;
	rec->ips[st->user_frames & (MEMO_FRAMES - 1)] = st->ip;
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
	struct row_cache_entry *by_sp = &sc->stack_slots[(st->sp / STACK_SLOT_BYTES) & (STACK_SLOT_ENTRIES - 1)];
	struct row_cache_entry *cached;
	struct unwind_row row;
	__u32 row_end;
	if (by_sp->object_tag == object_id + 1 && by_sp->vaddr == vaddr) {
		row = by_sp->row;
		row_end = by_sp->row_end;
		goto have_row;
	}
	cached = &cache->entries[row_cache_slot(object_id, vaddr)];
	if (cached->object_tag == object_id + 1 && cached->vaddr == vaddr) {
		row = cached->row;
		row_end = cached->row_end;
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
				frame_pointer_step(st);
				return st->done ? 1 : 0;
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
		if (!found) {
			/* No CFI covers this pc. */
			frame_pointer_step(st);
			return st->done ? 1 : 0;
		}
		row = *found;
		row_end = st->search_end;
		cached->vaddr = vaddr;
		cached->object_tag = object_id + 1;
		cached->row_end = row_end;
		cached->row = row;
	}
	by_sp->vaddr = vaddr;
	by_sp->object_tag = object_id + 1;
	by_sp->row_end = row_end;
	by_sp->row = row;
have_row:;
	__u8 cfa_type = row.cfa_type & CFA_TYPE_MASK;
	if (cfa_type == CFA_END_OF_FUNCTION) {
		/* No CFI covers this pc. */
		frame_pointer_step(st);
		return st->done ? 1 : 0;
	}
	bool cfa_from_rbx = cfa_type == CFA_RBP_OFFSET && (row.fp_type & FP_CFA_FROM_RBX);
	if (cfa_type != CFA_PLT && cfa_type != CFA_RETURN_IN_REGISTER && !cfa_from_rbx) {
		/* Every ip of this row (within this mapping) steps the same way.
		 * A PLT row's CFA depends on the ip itself, a return address in a
		 * register or an rbx-based CFA on that register: no join there. */
		__u64 page_start = vaddr & ~((__u64)UNWIND_PAGE_SIZE - 1);
		__u64 lo = page_start + row.pc_low + bias;
		__u64 hi = page_start + row_end + bias;
		/* Below mapping_end - 1, so that the ip of a return address
		 * (lookup + 1) is inside the mapping too. */
		r->lookup_lo = lo > mapping_start ? lo : mapping_start;
		r->lookup_hi = hi < mapping_end - 1 ? hi : mapping_end - 1;
	}

	__u64 cfa_offset = row.cfa_offset;
	if (row.cfa_type & CFA_OFFSET_SCALED)
		cfa_offset = (cfa_offset | (__u64)((row.cfa_type >> CFA_OFFSET_HIGH_SHIFT) & CFA_OFFSET_HIGH_MASK)
						   << 16) * 8;
	__u64 cfa;
	switch (cfa_type) {
	case CFA_RSP_OFFSET:
	case CFA_RETURN_IN_REGISTER:
		cfa = st->sp + cfa_offset;
		break;
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
			cfa = bx + cfa_offset;
		} else {
			cfa = st->bp + cfa_offset;
		}
		break;
	case CFA_PLT:
		cfa = st->sp + 8 + (((st->ip & 15) >= row.cfa_offset) ? 8 : 0);
		break;
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
		__u32 kind = (__u16)row.fp_offset;
		if (kind >= MAX_UNSUPPORTED_KINDS)
			kind = MAX_UNSUPPORTED_KINDS - 1;
		count(STAT_UNSUPPORTED_BASE + kind);
		finish(st, UNWIND_UNSUPPORTED_RULE);
		return 1;
	}
	}

	__u64 ra;
	struct memo_check *k;
	if (cfa_type == CFA_RETURN_IN_REGISTER) {
		/* Only the interrupted frame's registers are known (st->user_frames
		 * already counts this frame). */
		if (st->user_frames != 1 ||
		    read_interrupted_user_register(&sc->user_regs, (__u16)row.fp_offset, &ra, compat) != 0) {
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
		/* At most two words per frame: within MEMO_FRAMES frames, the
		 * index stays below MEMO_CHECKS. */
		k = &rec->checks[st->rec_checks++ & (MEMO_CHECKS - 1)];
		k->addr = cfa - 8;
		k->value = ra;
		if (cfa > st->rec_end)
			st->rec_end = cfa;
	}
	/* The caller's rbx: only its address is kept (a word read only if an
	 * rbx-based CFA needs it). */
	__u8 bx_rule = row.fp_type >> RBX_RULE_SHIFT;
	if (bx_rule == RBX_UNKNOWN) {
		st->bx_unknown = 1;
	} else if (bx_rule != 0) {
		st->bx_addr = cfa - (__u64)bx_rule * 8;
		st->bx_unknown = 0;
	}
	if ((row.fp_type & FP_TYPE_MASK) == FP_AT_CFA_OFFSET) {
		__u64 bp;
		__u64 bp_addr = cfa + (__s64)row.fp_offset * 8;
		if (read_stack_word(sc, bp_addr, &bp) != 0) {
			finish(st, UNWIND_READ_FAULT);
			return 1;
		}
		st->bp = bp;
		k = &rec->checks[st->rec_checks++ & (MEMO_CHECKS - 1)];
		k->addr = bp_addr;
		k->value = bp;
		if (bp_addr + 8 > st->rec_end)
			st->rec_end = bp_addr + 8;
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

/* One frame of the bpf_loop walker (continue_walk). */
static long unwind_step(__u64 index, void *data)
{
	return walk_step(data, false);
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

#include "profiler_compat.h"

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

#include "python.h"

/* Walk up to FRAMES_PER_PROGRAM frames, then either send the record or go
 * on in a fresh run of this program: the walker in slot 0 of `programs`, a
 * program array of ctx's program type (walker_programs holds the walker of
 * the variant user space loaded). `compat`: the variant for kernels without
 * bpf_loop and bpf_find_vma (profiler_compat.h); off-CPU walks are never
 * compat (off_cpu.h). */
static __always_inline int continue_walk(void *ctx, struct scratch_space *sc, struct process_info *proc,
					 bool compat, void *programs)
{
	__u32 zero = 0;
	struct walk_state *st = &sc->state;
	struct walk_context wc = {
		.sc = sc,
		.proc = proc,
		.cache = bpf_map_lookup_elem(&row_cache, &zero),
		.memos = bpf_map_lookup_elem(&walk_memo, &zero),
	};
	if (!wc.proc || !wc.cache || !wc.memos) {
		finish(st, UNWIND_NO_TABLE);
	} else {
		if (compat)
			walk_frames_compat();
		else
			bpf_loop(FRAMES_PER_PROGRAM, unwind_step, &wc, 0);
		/* Never wanted by the compat walk (vma_looked_up is set at its start). */
		if (!compat && st->vma_wanted) {
			/* Which file is mapped at the pc, once per sample
			 * (bpf_find_vma cannot run twice in one interrupt): a
			 * mapping of an object whose table user space knows joins
			 * the description, for this walk and the next ones. The
			 * walk goes on in the next run of this program. */
			st->vma_wanted = 0;
			st->vma_looked_up = 1;
			struct vma_request req = {
				.proc = wc.proc,
				.timestamp_ns = sc->sample.header.timestamp_ns,
				.pid = sc->sample.header.pid,
			};
			bpf_find_vma(bpf_get_current_task_btf(), st->ip, add_vma, &req, 0);
		}
		if (st->joining) {
			st->joining = 0;
			/* If the stack changed since, the walk goes on from the join
			 * in the next run of this program (below): a second bpf_loop
			 * here would have the verifier check unwind_step once more. */
			if (!replay_remembered_walk(sc, &wc.memos->memos[wc.memos->current & 1]))
				st->join_failed = 1;
		}
		/* Remember a walk that used CFI for every frame, read nothing
		 * but the stack words it recorded, and saw one generation of
		 * the process's mappings (a later program run looks it up anew). */
		if (st->done && st->status == UNWIND_COMPLETE && !st->joined && !st->unrepeatable &&
		    st->user_frames <= MEMO_FRAMES && st->generation == wc.proc->generation) {
			struct walk_memo *recording = &wc.memos->memos[(wc.memos->current ^ 1) & 1];
			recording->pid = sc->sample.header.pid;
			recording->generation = st->generation;
			recording->frame_count = st->user_frames;
			recording->check_count = st->rec_checks;
			recording->end = st->rec_end;
			wc.memos->current ^= 1;
		}
	}
	if (!sc->state.done) {
		if (sc->state.user_frames >= MAX_USER_FRAMES) {
			finish(&sc->state, UNWIND_TRUNCATED);
		} else {
			sc->state.tail_calls++;
			bpf_tail_call(ctx, programs, 0);
			/* Only reached if the tail call failed. */
			finish(&sc->state, UNWIND_TRUNCATED);
		}
	}
	if (!compat)
		python_hook(ctx, sc, programs);
	send_sample(sc, compat);
	return 0;
}

/* The walk's next FRAMES_PER_PROGRAM frames, through a tail call. */
static __always_inline int walk_more(struct bpf_perf_event_data *ctx, bool compat)
{
	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 0;
	__u32 pid = sc->sample.header.pid;
	return continue_walk(ctx, sc, bpf_map_lookup_elem(&process_mappings, &pid), compat,
			     &walker_programs);
}

/* Start the record of a sample (or wait) of thread tid of process pid,
 * task the current task, at timestamp_ns: its header and a fresh walk state. */
static __always_inline void begin_record(struct scratch_space *sc, struct task_struct *task, __u32 pid,
					 __u32 tid, __u64 timestamp_ns)
{
	struct sample_header *h = &sc->sample.header;
	__builtin_memset(&sc->state, 0, sizeof(sc->state));
	h->timestamp_ns = timestamp_ns;
	h->pid = pid;
	h->tid = tid;
	h->cpu = bpf_get_smp_processor_id();
	h->flags = 0;
	h->python_frames = 0;
	h->python_status = PYTHON_NOT_WALKED;
	h->off_cpu_ns = 0;
	bpf_get_current_comm(h->thread_comm, sizeof(h->thread_comm));
	if (pid == tid)
		__builtin_memcpy(h->process_comm, h->thread_comm, TASK_COMM_LEN);
	else
		BPF_CORE_READ_STR_INTO(&h->process_comm, task, group_leader, comm);
}

/* Walk the user stack from the registers in sc->state (the kernel frames
 * are in place) and send the record: by the process's description, or, for
 * a process not described yet, by frame pointers. `programs`: the walker
 * program array of ctx's program type. */
static __always_inline int walk_from(void *ctx, struct scratch_space *sc, struct task_struct *task,
				     void *programs, bool compat)
{
	struct walk_state *st = &sc->state;
	__u32 pid = sc->sample.header.pid;
	struct process_info *proc = bpf_map_lookup_elem(&process_mappings, &pid);
	/* A description from before the latest exec describes another image. */
	if (proc && proc->exec_id != 0 && proc->exec_id != TASK_FIELD(compat, task, self_exec_id))
		proc = NULL;
	if (!proc) {
		/* Not described yet: user space is told at once (not at its next
		 * poll). Meanwhile, frame pointers give a best-effort stack. */
		notify_unknown_mapping(pid, st->ip, 0);
		/* User space walks the leaf's frame on from a copy of the stack. */
		note_copy_start(st, 0);
		if (compat)
			walk_frame_pointers_compat();
		else
			bpf_loop(MAX_USER_FRAMES, frame_pointer_only_step, NULL, 0);
		if (!st->done)
			finish(st, UNWIND_TRUNCATED);
		if (st->status != UNWIND_TRUNCATED)
			st->status = UNWIND_MAPPINGS_UNKNOWN;
		send_sample(sc, compat);
		return 0;
	}
	st->generation = proc->generation;
	return continue_walk(ctx, sc, proc, compat, programs);
}

SEC("perf_event")
int walk_user_stack(struct bpf_perf_event_data *ctx)
{
	return walk_more(ctx, false);
}

SEC("perf_event")
int walk_user_stack_compat(struct bpf_perf_event_data *ctx)
{
	return walk_more(ctx, true);
}

/* A sample: who runs, its kernel stack, its user stack, sent as one record.
 * `compat`: the variant for kernels before 5.17 (profiler_compat.h). */
static __always_inline int take_sample(struct bpf_perf_event_data *ctx, bool compat)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = id >> 32;
	__u32 tid = (__u32)id;

	/* The idle task (pid 0, one per CPU) is not sampled. */
	if (tid == 0)
		return 0;
	if (exclude_pid != 0 && pid == exclude_pid)
		return 0;
	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;

	count(STAT_SAMPLES);
	if (scratch_is_busy()) {
		count(STAT_SAMPLES_BUSY);
		return 0;
	}

	struct scratch_space *sc = get_scratch();
	if (!sc)
		return 0;
	struct stack_sample *s = &sc->sample;
	struct walk_state *st = &sc->state;
	struct task_struct *task = current_task(compat);
	begin_record(sc, task, pid, tid, bpf_ktime_get_ns());
	/* The compat walk cannot ask the kernel for a mapping (bpf_find_vma):
	 * as if it had asked already. */
	st->vma_looked_up = compat;
	struct sample_header *h = &s->header;

	/* The registers at the interrupt. */
	const struct sample_regs *regs = sample_regs_of(ctx);
	__u64 ip = regs->ip, sp = regs->sp, bp = regs->bp, bx = regs->bx;
	bool in_user_mode = sample_in_user_mode(regs);

	/* Kernel stack, leaf first, from the kernel's own unwinder. A sample
	 * taken in user mode has none. */
	if (!in_user_mode) {
		long kbytes = bpf_get_stack(ctx, s->frames, MAX_KERNEL_FRAMES * sizeof(__u64), 0);
		if (kbytes < 0)
			count(STAT_KERNEL_STACK_ERROR);
		else
			st->kernel_frames = kbytes / sizeof(__u64);
		if (st->kernel_frames > MAX_KERNEL_FRAMES)
			st->kernel_frames = MAX_KERNEL_FRAMES;
	}

	if (TASK_FIELD(compat, task, flags) & PF_KTHREAD) {
		h->flags |= SAMPLE_FLAG_KERNEL_THREAD;
		finish(st, UNWIND_NO_USER_STACK);
		send_sample(sc, compat);
		return 0;
	}

	if (!in_user_mode && compat) {
		/* Interrupted in the kernel: the user registers are the ones
		 * saved at kernel entry (found without bpf_task_pt_regs). */
		if (read_task_user_regs_compat(task, &sc->user_regs) != 0) {
			finish(st, UNWIND_READ_FAULT);
			send_sample(sc, compat);
			return 0;
		}
		ip = sc->user_regs.ip;
		sp = sc->user_regs.sp;
		bp = sc->user_regs.bp;
		bx = sc->user_regs.bx;
	} else if (!in_user_mode) {
		/* Interrupted in the kernel: the user registers are the ones
		 * saved at kernel entry. */
		struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(task);
		ip = BPF_CORE_READ(uregs, ip);
		sp = BPF_CORE_READ(uregs, sp);
		bp = BPF_CORE_READ(uregs, bp);
		bx = BPF_CORE_READ(uregs, bx);
	}
	st->ip = ip;
	st->sp = sp;
	st->bp = bp;
	st->bx = bx;
	st->exact_ip = 1;

	return walk_from(ctx, sc, task, &walker_programs, compat);
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	return take_sample(ctx, false);
}

SEC("perf_event")
int on_cpu_sample_compat(struct bpf_perf_event_data *ctx)
{
	return take_sample(ctx, true);
}

/* ---- Following processes: exec, fork, mmap, exit ----
 *
 * User space describes a process from /proc/PID/maps, which takes it a poll
 * period to notice. The programs below keep a description current in the
 * meantime, from what the kernel knows at the event, for objects whose
 * tables user space already knows (object_files): an exec describes the
 * new image (executable and interpreter), a fork gives the child its
 * parent's description, and the walker adds the mapping of a pc it does
 * not know (a library the dynamic loader mapped since, dlopen) by asking
 * the kernel (unwind_step). */

/* A process replaced its image. Its old description goes: a walk never
 * uses the old image's mappings (the exec_id check covers a description
 * user space wrote from a read made before the exec). In its place, the
 * executable's, the interpreter's and the vDSO's mappings, when their objects
 * are known. */
static __always_inline int handle_exec(struct task_struct *p, bool compat)
{
	__u32 pid = p->tgid;
	__u32 zero = 0;
	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;
	if (exclude_pid != 0 && pid == exclude_pid)
		return 0;
	struct exec_time t = { .timestamp_ns = bpf_ktime_get_ns(), .exec_id = p->self_exec_id };
	bpf_map_update_elem(&exec_times, &pid, &t, BPF_ANY);
	/* The exec's time as exec_times has it: user space matches the two.
	 * Sent before the new image's mappings, which belong to it. */
	send_event_at(EVENT_EXEC, pid, 0, t.timestamp_ns);
	if (compat) {
		/* Without bpf_find_vma the new image is described by user space
		 * alone (from /proc/PID/maps, on the exec event): until then
		 * frame pointers. */
		bpf_map_delete_elem(&process_mappings, &pid);
		return 0;
	}
	struct process_info *info = bpf_map_lookup_elem(&new_description, &zero);
	if (info) {
		struct vma_request req = { .proc = info, .timestamp_ns = t.timestamp_ns, .pid = pid };
		info->mapping_count = 0;
		info->generation = next_generation();
		info->exec_id = t.exec_id;
		struct mm_struct *mm = p->mm;
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(p);
		if (mm) {
			/* The executable's text, then the interpreter's (the entry
			 * point), then the vDSO. */
			bpf_find_vma(p, mm->start_code, add_vma, &req, 0);
			bpf_find_vma(p, BPF_CORE_READ(regs, ip), add_vma, &req, 0);
			bpf_find_vma(p, (__u64)BPF_CORE_READ(mm, context.vdso), add_vma, &req, 0);
		}
		if (info->mapping_count > 0)
			bpf_map_update_elem(&process_mappings, &pid, info, BPF_ANY);
		else
			bpf_map_delete_elem(&process_mappings, &pid);
	}
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	return handle_exec(p, false);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec_compat, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
	return handle_exec(p, true);
}

/* A new process (not a thread) has its parent's mappings until it execs. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 pid = child->tgid, parent_pid = parent->tgid;
	if (child->pid != child->tgid)
		return 0;
	/* `record`: a new process (fork, or clone without CLONE_THREAD) of a
	 * wanted process is wanted from its first instruction. The tracepoint
	 * fires in the parent before the child can run, so no sample of the
	 * child is missed; exec keeps the pid, so it needs nothing. */
	if (follow_children && bpf_map_lookup_elem(&target_pids, &parent_pid)) {
		__u8 wanted = 1;
		bpf_map_update_elem(&target_pids, &pid, &wanted, BPF_ANY);
	}
	if (filter_pids && !bpf_map_lookup_elem(&target_pids, &pid))
		return 0;
	struct process_info *proc = bpf_map_lookup_elem(&process_mappings, &parent_pid);
	if (!proc)
		return 0;
	if (bpf_map_update_elem(&process_mappings, &pid, proc, BPF_ANY) == 0)
		send_event(EVENT_FORK, pid, parent_pid);
	return 0;
}

/* A process user space described has exited (its last thread, the leader, is gone). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	__u32 pid = p->tgid;
	/* `record`: a followed process whose last thread exits leaves the
	 * filter, so that a long build's many short processes do not fill it
	 * (signal->live counts the group's threads not yet exiting). */
	if (follow_children && BPF_CORE_READ(p, signal, live.counter) == 0)
		bpf_map_delete_elem(&target_pids, &pid);
	if (p->pid != p->tgid)
		return 0;
	if (bpf_map_lookup_elem(&process_mappings, &pid))
		send_event(EVENT_EXIT, pid, 0);
	return 0;
}

/* Off-CPU waits: programs off_cpu_switch and off_cpu_resume. */
#include "off_cpu.h"

char LICENSE[] SEC("license") = "GPL";
