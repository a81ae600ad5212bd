/* SPDX-License-Identifier: MIT */
/*
 * Types shared by the BPF programs (profiler.bpf.c) and user space. User
 * space reads these records byte for byte through the types the skeleton
 * generates from the object's BTF (src/sampling/skel.rs), enums included (their
 * `*_layout` globals in state.h put them into the BTF): it never numbers
 * a counter, status, flag or event itself.
 */
#ifndef LIGHTSWITCH_PROFILER_H
#define LIGHTSWITCH_PROFILER_H

/* Most kernel frames bpf_get_stack returns; the kernel caps it at
 * kernel.perf_event_max_stack (default 127). */
#define MAX_KERNEL_FRAMES 127
/* Most user frames one sample carries. */
#define MAX_USER_FRAMES 1024
/* User frames one program invocation walks (one bpf_loop); the walk goes on
 * in the same program through tail calls, up to MAX_USER_FRAMES. */
#define FRAMES_PER_PROGRAM 128
/* Executable mappings per process the BPF walker knows about. */
#define MAX_PROCESS_MAPPINGS 256
/* Bytes of user stack the walker copies at once; return addresses and saved
 * registers inside the copy cost no further read of user memory. */
#define STACK_CHUNK_SIZE 512
/* Entries of each CPU's direct-mapped cache of unwind rows found recently. */
#define ROW_CACHE_ENTRIES 1024
/* Each CPU's cache of rows by stack position: entries, and the bytes of
 * stack one entry stands for (the x86-64 ABI keeps rsp 16-byte aligned at
 * calls, so callers' frames are at least 16 bytes apart). 128 entries
 * cover 2 KiB of stack; frames further apart share entries. */
#define STACK_SLOT_ENTRIES 128
#define STACK_SLOT_BYTES 16
/* Each CPU remembers its last complete CFI walk (docs/unwind-tables.md,
 * "Reusing the previous walk"): frames remembered at most (longer walks are
 * not remembered), the first frames of a walk that may join the remembered
 * one, and entries of its index by stack position (STACK_SLOT_BYTES each). */
#define MEMO_FRAMES 128
#define MEMO_JOIN_FRAMES 4
#define MEMO_INDEX_ENTRIES 128
/* Stack words a remembered walk holds: two per frame (return address, rbp). */
#define MEMO_CHECKS (2 * MEMO_FRAMES)
/* Most bytes of stack from a joined frame up to the end of the remembered
 * walk's reads; a walk reaching further is walked, not reused. */
#define REPLAY_STACK_BYTES 8192
/* The walker indexes these arrays with masks, keeps frame indices in a u8
 * (walk_memo.by_sp) and check indices in a u16 (memo_regs.first_check). */
_Static_assert((MEMO_FRAMES & (MEMO_FRAMES - 1)) == 0 && MEMO_FRAMES <= 256, "MEMO_FRAMES");
_Static_assert((MEMO_CHECKS & (MEMO_CHECKS - 1)) == 0 && MEMO_CHECKS < 65536, "MEMO_CHECKS");
_Static_assert((MEMO_INDEX_ENTRIES & (MEMO_INDEX_ENTRIES - 1)) == 0, "MEMO_INDEX_ENTRIES");
_Static_assert(((REPLAY_STACK_BYTES / 8) & (REPLAY_STACK_BYTES / 8 - 1)) == 0, "REPLAY_STACK_BYTES");
/* Unsupported-rule kinds counted separately (see docs/unwind-tables.md). */
#define MAX_UNSUPPORTED_KINDS 16
#define TASK_COMM_LEN 16

/* How the user-stack walk of one sample ended. Stored in sample_header.user_status. */
enum unwind_status {
	UNWIND_COMPLETE = 0,        /* reached the outermost frame */
	UNWIND_TRUNCATED = 1,       /* stopped at MAX_USER_FRAMES */
	UNWIND_READ_FAULT = 2,      /* reading the user stack failed */
	UNWIND_NO_USER_STACK = 3,   /* kernel thread: no user stack exists */
	UNWIND_FRAME_POINTER = 4,   /* some frames were walked with frame pointers (no CFI
	                             * for them); the walk ended where that chain ended */
	UNWIND_NO_MAPPING = 5,      /* a PC fell outside every known mapping */
	UNWIND_NO_TABLE = 6,        /* the object's unwind table is not loaded yet */
	UNWIND_UNSUPPORTED_RULE = 7,/* the CFI rule cannot be evaluated in BPF */
	UNWIND_MAPPINGS_UNKNOWN = 8,/* the process's mappings were not known yet (a process
	                             * that existed before its exec or fork could be followed,
	                             * or whose description is from before its latest exec):
	                             * frame pointers gave the frames there are */
	/* 9 is user space's own (UnwindStatus::StackCopyEnded in src/sampling/records.rs):
	 * a walk user space went on with from a stack copy ended with the copy. */
	UNWIND_NOT_WALKED = 10,     /* an off-CPU wait that did not end in a system call's
	                             * return (a preemption, a page fault): the thread's
	                             * user stack could not be read in its own context
	                             * before it ran on, so only its user pc is sent */
};

/* Indices into the per-CPU `stats` array map. */
enum stat_index {
	STAT_SAMPLES = 0,           /* perf events that reached the program for a wanted task */
	STAT_LOST_RINGBUF = 1,      /* records their CPU's ring buffer had no room for */
	STAT_KERNEL_STACK_ERROR = 2,/* bpf_get_stack failed for the kernel stack */
	STAT_EVENTS_LOST = 3,       /* process events the events ring buffer had no room for */
	STAT_WALKS_REUSED = 4,      /* walks that took their callers from the CPU's previous walk */
	STAT_UNSUPPORTED_BASE = 5,  /* + kind: walks stopped by an unsupported rule of that kind */
	STAT_STACK_COPY_SKIPPED = STAT_UNSUPPORTED_BASE + MAX_UNSUPPORTED_KINDS,
	                            /* walks that stopped for want of a table or mapping and went
	                             * without a stack copy: no room in the ring, or the stack
	                             * unreadable */
	/* Off-CPU (programs off_cpu_switch and off_cpu_resume): */
	STAT_OFF_CPU_WAITS,         /* waits recorded (at least off_cpu_min_ns) */
	STAT_OFF_CPU_SHORT,         /* waits left out: shorter than off_cpu_min_ns */
	STAT_OFF_CPU_SHORT_NS,      /* their total length, ns */
	STAT_OFF_CPU_UNTRACKED,     /* waits left out: no task storage, or off_cpu_pending full */
	STAT_SAMPLES_BUSY,          /* cpu-clock samples skipped: they interrupted an off-CPU
	                             * walk of their CPU (scratch_busy) */
	STAT_MAX,
};

/* A wanted thread that left its CPU (its task storage in off_cpu_starts). */
struct off_cpu_start {
	__u64 time_ns;              /* bpf_ktime_get_ns() at the switch */
	__u32 runnable;             /* it was preempted or yielded, not blocked */
	__u32 padding;
};

/* Flags in sample_header.flags */
enum sample_flag {
	SAMPLE_FLAG_KERNEL_THREAD = 1,
	SAMPLE_FLAG_STACK_COPY = 2, /* a struct stack_copy follows the whole stack_sample */
	SAMPLE_FLAG_OFF_CPU = 4,    /* not a cpu-clock sample but a wait: the thread was off
	                             * its CPU for off_cpu_ns up to timestamp_ns, and the
	                             * stacks are where it left the CPU */
	SAMPLE_FLAG_RUNNABLE = 8,   /* with SAMPLE_FLAG_OFF_CPU: the thread did not block, it
	                             * was preempted (or yielded) and waited for a CPU */
};

/* Bytes of user stack a stack_copy holds at most (perf's default is 8 KiB;
 * a compiler's stack is often deeper). */
#define STACK_COPY_BYTES 32768

/* Bytes of user stack the large stack_copy holds. Where the stack's end is
 * known (a main thread's mm->start_stack; else the end of the mapping that
 * holds rsp, from bpf_find_vma) and more than this above rsp, it is split:
 * STACK_COPY_BYTES from rsp up, and the STACK_COPY_UPPER_BYTES below the
 * end, where the outermost frames are: rustc's compiler thread has a
 * 540 KiB frame between the two, and its outermost return address is
 * 52 KiB below its mapping's end (static TLS and struct pthread take the
 * top 30 KiB). Sent while the ring stays less than half full with it
 * (rings of 256 KiB, 999 Hz, when nearly empty; 512 KiB and more); else
 * the STACK_COPY_BYTES one. */
#define STACK_COPY_LARGE_BYTES 98304
#define STACK_COPY_UPPER_BYTES (STACK_COPY_LARGE_BYTES - STACK_COPY_BYTES)

/* Bytes of user stack the small stack_copy holds: a main thread's whole
 * stack often fits (a young process, a shell), and a record this size
 * leaves room in the ring for 2.5 times as many copies. */
#define STACK_COPY_SMALL_BYTES 8192

/* Bytes above mm->start_stack a small copy must also hold. */
#define STACK_TOP_SLACK 512

/* How the Python walk of a sample went (sample_header.python_status; src/sampling/bpf/python.h). */
enum python_status {
	PYTHON_NOT_WALKED = 0,      /* not a process with a known interpreter */
	PYTHON_WALKED = 1,          /* the thread's frames were walked to the end */
	PYTHON_NO_THREAD = 2,       /* no thread state of the main interpreter has this thread's id */
	PYTHON_READ_FAULT = 3,      /* reading the interpreter's memory failed part-way */
	PYTHON_TRUNCATED = 4,       /* stopped at the frame limit */
};

/* Offsets (bytes) the Python walker reads the interpreter's structures at;
 * PYTHON_NO_OFFSET (0xffff) where the version has no such field. User
 * space fills them from its table or the interpreter's _Py_DebugOffsets
 * (src/unwind/interp/python/layout.rs). */
struct python_offsets {
	__u16 runtime_interpreters; /* _PyRuntimeState.interpreters.head */
	__u16 interp_threads;       /* PyInterpreterState.threads.head */
	__u16 tstate_next;          /* PyThreadState.next */
	__u16 tstate_native_thread_id; /* .native_thread_id; 3.8-3.10: .thread_id (pthread_t) */
	__u16 tstate_frame;         /* PyThreadState.cframe (3.11, 3.12), .current_frame (3.13),
	                             * .frame (3.8-3.10) */
	__u16 cframe_current_frame; /* _PyCFrame.current_frame; none on 3.13 */
	__u16 frame_code;           /* _PyInterpreterFrame.f_code / f_executable; PyFrameObject.f_code */
	__u16 frame_previous;       /* _PyInterpreterFrame.previous; PyFrameObject.f_back */
	__u16 frame_instr;          /* prev_instr (3.11, 3.12) / instr_ptr (3.13) */
	__u16 frame_owner;
	__u16 frame_is_entry;       /* 3.11 only */
	__u16 code_firstlineno;     /* PyCodeObject.co_firstlineno */
	__u16 code_linetable;       /* PyCodeObject.co_linetable (co_lnotab on 3.8, 3.9) */
	__u16 code_adaptive;        /* PyCodeObject.co_code_adaptive: the first instruction */
	__u16 frame_lasti;          /* PyFrameObject.f_lasti (an int; 3.8-3.10 only) */
	__u8 cstack_owner;          /* owner value of the eval loop's entry shim (0xff: none) */
	__u8 frame_objects;         /* 1 on 3.8-3.10: a chain of PyFrameObject, each frame its own
	                             * eval-loop call, threads known by pthread_t (their thread
	                             * pointer); the offset is f_lasti as is */
};

/* A process running a CPython the walker knows (value of python_procs, key: pid). */
struct python_proc {
	__u64 runtime;              /* absolute address of _PyRuntime */
	struct python_offsets offsets;
};

/* One Python frame of a sample: two frame slots after its user frames. */
struct python_frame {
	__u64 code;                 /* address of the PyCodeObject */
	__u64 word;                 /* bits 0-31: bytes from the first instruction to the frame's
	                             * current (last started) one (3.8-3.10: f_lasti, bytes on 3.8
	                             * and 3.9, code units on 3.10); bits 32-62: guard (co_firstlineno
	                             * ^ (co_linetable address >> 4)); bit 63: the outermost frame
	                             * of its eval-loop call */
};

/*
 * The fixed-size head of one sample record in a `samples` ring buffer. It is
 * followed by kernel_frames kernel addresses (leaf first), then user_frames user
 * addresses (leaf first, each a u64), then python_frames struct python_frame
 * (innermost first). Records are variable length: only the
 * frames that exist are sent.
 */
struct sample_header {
	__u64 timestamp_ns;         /* bpf_ktime_get_ns(): CLOCK_MONOTONIC, ns (an off-CPU
	                             * record: when the thread ran again) */
	__u32 pid;                  /* thread group id (process), init pid namespace */
	__u32 tid;                  /* thread id, init pid namespace */
	__u32 cpu;
	__u16 kernel_frames;
	__u16 user_frames;
	__u8 user_status;           /* enum unwind_status */
	__u8 flags;                 /* SAMPLE_FLAG_* */
	__u16 python_frames;        /* struct python_frame entries after the user frames */
	__u32 python_status;        /* enum python_status */
	__u64 off_cpu_ns;           /* SAMPLE_FLAG_OFF_CPU: ns from leaving the CPU to running
	                             * again (timestamp_ns); 0 for cpu-clock samples */
	char process_comm[TASK_COMM_LEN]; /* group leader's comm */
	char thread_comm[TASK_COMM_LEN];  /* this thread's comm */
};

struct stack_sample {
	struct sample_header header;
	__u64 frames[MAX_KERNEL_FRAMES + MAX_USER_FRAMES];
};

/*
 * The registers of the first frame the walker could not go past for want of
 * a table or a mapping (UNWIND_NO_TABLE, UNWIND_NO_MAPPING,
 * UNWIND_MAPPINGS_UNKNOWN), and how much of the user stack from its rsp up
 * follows. User space walks on from there once the table or mapping is
 * known (deferred unwinding, src/unwind/deferred.rs). Sent only with such
 * samples, after the whole stack_sample (its unused frame slots included),
 * and followed by len bytes of stack; only while the ring is less than half
 * full: such a record takes about 41 KiB of the ring.
 */
struct stack_copy {
	__u64 ip;                   /* the frame's pc (a return address unless exact_ip) */
	__u64 sp;                   /* its rsp: the first stack byte that follows is at this address */
	__u64 bp;                   /* its rbp */
	__u64 bx;                   /* its rbx, if bx_known */
	__u64 upper_start;          /* a split copy: the address of its upper part's first byte */
	__u32 frame;                /* its index among the sample's user frames */
	__u32 len;                  /* bytes of stack that follow (at most STACK_COPY_LARGE_BYTES):
	                             * from sp up, then the upper part */
	__u32 upper_len;            /* bytes of the upper part, at the end (0: one part) */
	__u32 missing;              /* pages of the part from sp that could not be read (holes):
	                             * bit i for the i-th page from the one holding sp */
	__u32 upper_missing;        /* the same for the upper part, from upper_start's page */
	__u8 exact_ip;              /* ip is the sampled pc or a signal frame's, not a return address */
	__u8 bx_known;              /* the walk recovered its rbx (no frame-pointer step or
	                             * unfollowed rbx rule below it) */
	__u8 padding[2];
};

/*
 * ---- Unwind tables (format documented in docs/unwind-tables.md) ----
 *
 * An object's table covers its ELF virtual address space, split into pages
 * of UNWIND_PAGE_SIZE bytes. Each page's rows are sorted by pc_low and the
 * first row of a non-empty page starts at pc_low 0 (the builder repeats the
 * rule in effect at the page boundary), so a lookup never leaves its page.
 */
#define UNWIND_PAGE_BITS 16
#define UNWIND_PAGE_SIZE (1 << UNWIND_PAGE_BITS)

/* How the CFA is computed (bits 0-2 of unwind_row.cfa_type). */
enum cfa_type {
	CFA_END_OF_FUNCTION = 0, /* no FDE covers this pc: no unwind info */
	CFA_RSP_OFFSET = 1,      /* CFA = rsp + offset */
	CFA_RBP_OFFSET = 2,      /* CFA = rbp + offset */
	CFA_PLT = 3,             /* CFA = rsp + 8 + ((rip & 15) >= cfa_offset ? 8 : 0) (PLT stubs) */
	CFA_SIGNAL_FRAME = 4,    /* signal trampoline: registers come from the ucontext at rsp */
	CFA_OUTERMOST = 5,       /* return address undefined: this is the outermost frame */
	CFA_UNSUPPORTED = 6,     /* a rule BPF cannot evaluate; fp_offset holds the unsupported kind */
	CFA_RETURN_IN_REGISTER = 7, /* CFA = rsp + offset, rbp unchanged; the return address is in
	                             * the DWARF register fp_offset (0-15): followed in the
	                             * interrupted frame only (glibc's vfork keeps it in rdi) */
};
/* The unsupported kind counted when a CFA_RETURN_IN_REGISTER row is met
 * outside the interrupted frame (Rust: UnsupportedKind::ReturnAddress). */
#define UNSUPPORTED_KIND_RETURN_ADDRESS 4
/* The unsupported kind counted when an rbx-based CFA meets an rbx the walk
 * could not recover (Rust: UnsupportedKind::CfaRegister). */
#define UNSUPPORTED_KIND_CFA_REGISTER 2
#define CFA_TYPE_MASK 0x07
/* Set in unwind_row.cfa_type when the CFA offset is in units of 8 bytes;
 * bits 3-6 then hold bits 16-19 of the scaled offset (up to 8 MiB - 8). */
#define CFA_OFFSET_SCALED 0x80
#define CFA_OFFSET_HIGH_SHIFT 3
#define CFA_OFFSET_HIGH_MASK 0x0f

/* How the caller's rbp is recovered (bits 0-1 of unwind_row.fp_type). */
enum fp_type {
	FP_UNCHANGED = 0,        /* rbp keeps its value (same value / not saved) */
	FP_AT_CFA_OFFSET = 1,    /* rbp = *(CFA + fp_offset * 8) */
	FP_UNSUPPORTED = 2,      /* any other rule; the walk can continue while rbp is not needed */
};
#define FP_TYPE_MASK 0x03
/* Set in unwind_row.fp_type of a CFA_RBP_OFFSET row: CFA = rbx + offset
 * (glibc's lazy-binding trampolines keep the caller's rsp in rbx). */
#define FP_CFA_FROM_RBX 0x04
/* Bits 3-7 of unwind_row.fp_type: how the caller's rbx is recovered.
 * 0: it keeps its value; 1-30: saved at CFA - 8 * that; RBX_UNKNOWN: any
 * other rule (an rbx-based CFA further up cannot be computed). */
#define RBX_RULE_SHIFT 3
#define RBX_UNKNOWN 31

/* One unwind row: the rule in effect from this pc up to the next row. 8 bytes. */
struct unwind_row {
	__u16 pc_low;     /* pc - page start, bytes */
	__u8 cfa_type;    /* enum cfa_type | high offset bits << 3 | CFA_OFFSET_SCALED */
	__u8 fp_type;     /* enum fp_type | FP_CFA_FROM_RBX | rbx rule << RBX_RULE_SHIFT */
	__u16 cfa_offset; /* bytes, or units of 8 bytes with CFA_OFFSET_SCALED; PLT: the threshold */
	__s16 fp_offset;  /* units of 8 bytes (FP_AT_CFA_OFFSET); unsupported kind (CFA_UNSUPPORTED);
	                   * DWARF register (CFA_RETURN_IN_REGISTER) */
};

/* Key of the unwind_pages map: one page of one object's table. */
struct page_key {
	__u32 object_id;
	__u32 page;       /* vaddr >> UNWIND_PAGE_BITS */
};

/* Where a page's rows are in the unwind_rows array map. */
struct page_value {
	__u32 first_row;
	__u32 row_count;
};

/* How the walker handles a mapping. */
enum mapping_kind {
	MAPPING_TABLE = 0,          /* the object has CFI: look its rows up */
	MAPPING_FRAME_POINTERS = 1, /* no CFI (JIT code, objects without unwind info): frame pointers */
};

/* One executable mapping of a process, as the walker sees it. */
struct exec_mapping {
	__u64 start;                /* first address (inclusive) */
	__u64 end;                  /* end address (exclusive) */
	__u64 bias;                 /* object vaddr = pc - bias */
	__u32 object_id;            /* key of the object's table (page_key.object_id) */
	__u32 kind;                 /* enum mapping_kind */
};

/* The executable mappings of one process, sorted by start. Value of the
 * process_mappings map (key: pid). */
struct process_info {
	__u32 mapping_count;
	__u32 generation;           /* differs on every update of any process: a remembered
	                             * walk is only reused under the mappings it was made with;
	                             * user space counts up from 1, the BPF programs (exec,
	                             * mmap) from BPF_GENERATION_BASE */
	__u64 exec_id;              /* the task's self_exec_id these mappings belong to (it
	                             * grows by one at every exec); 0: not checked (a process
	                             * running since before the profiler saw any exec of it) */
	struct exec_mapping mappings[MAX_PROCESS_MAPPINGS];
};

/* Notifications for user space, sent through the `events` ring buffer. */
enum event_type {
	EVENT_EXEC = 1,             /* a wanted process called exec: its mappings changed */
	EVENT_EXIT = 2,             /* a known process exited */
	EVENT_UNKNOWN_MAPPING = 3,  /* a pc in no known mapping (e.g. after dlopen), or a sample
	                             * of a process not described yet; rate-limited per pid
	                             * unless its description changed since the last one */
	EVENT_FORK = 4,             /* a described process forked: the child (pid) got a copy
	                             * of the parent's (address) description */
	EVENT_MAPPING = 5,          /* the BPF programs added a mapping of a known object to a
	                             * description (exec, or a pc the walker did not know) */
};

struct process_event {
	__u32 type;                 /* enum event_type */
	__u32 pid;
	__u64 address;              /* EVENT_UNKNOWN_MAPPING: the pc; EVENT_FORK: the parent's pid;
	                             * EVENT_MAPPING: the mapping's start */
	__u64 timestamp_ns;         /* bpf_ktime_get_ns() when it happened (CLOCK_MONOTONIC);
	                             * EVENT_MAPPING from an exec: the exec's */
	__u64 end;                  /* EVENT_MAPPING: the mapping's end (exclusive) */
	__u64 file_offset;          /* EVENT_MAPPING: the file offset of its start */
	__u32 object_id;            /* EVENT_MAPPING: object_file.object_id of its file */
	__u32 padding;
};

/* Generations the BPF programs give the descriptions they write start here. */
#define BPF_GENERATION_BASE 0x80000000u

/* The latest exec of a process (value of the exec_times map, key: pid). */
struct exec_time {
	__u64 timestamp_ns;         /* bpf_ktime_get_ns() at the exec */
	__u64 exec_id;              /* the task's self_exec_id after it */
};

/* Executable PT_LOAD segments an object_file keeps. */
#define OBJECT_SEGMENTS 4

/* Key of the object_files map: a file as the kernel knows it. */
struct file_key {
	__u64 dev;                  /* (major << 32) | minor, as /proc/PID/maps shows it */
	__u64 inode;
};

/* The key user space registers the vDSO's table under in object_files: no
 * file has inode 0. Its one segment maps offset 0 to the image's first
 * PT_LOAD vaddr. */
#define VDSO_FILE_DEV 0
#define VDSO_FILE_INODE 0

/* An executable segment: a mapping at file offset off with
 * offset_lo <= off < offset_hi has object vaddr off + vaddr_delta
 * (wrapping); offsets outside every segment have vaddr = offset. */
struct object_segment {
	__u64 offset_lo;
	__u64 offset_hi;
	__u64 vaddr_delta;
};

/* An object whose table user space knows, so that the BPF programs can
 * describe a new mapping of it (exec, mmap) without waiting for user space. */
struct object_file {
	__u32 object_id;            /* page_key.object_id of its table */
	__u32 segment_count;
	struct object_segment segments[OBJECT_SEGMENTS];
};

#endif
