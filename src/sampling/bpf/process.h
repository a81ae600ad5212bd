/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Process and exec tracking: exec, fork, mmap, exit.
 *
 * User space describes a process from /proc/PID/maps, which takes it a poll
 * period to notice. The programs here keep a description current in the
 * meantime, from what the kernel knows at the event, for objects whose
 * tables user space already knows (object_files): an exec describes the
 * new image (executable and interpreter), a fork gives the child its
 * parent's description, and the walker adds the mapping of a pc it does
 * not know (a library the dynamic loader mapped since, dlopen) by asking
 * the kernel (add_vma, from continue_walk in record.h). User space is told
 * of what changed through the `events` ring.
 */
#ifndef LIGHTSWITCH_PROCESS_H
#define LIGHTSWITCH_PROCESS_H

/* Shortest interval between two unknown-mapping notifications for one pid, ns. */
#define NOTIFY_INTERVAL_NS (200 * 1000 * 1000ULL)

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

#endif
