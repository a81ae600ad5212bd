/* SPDX-License-Identifier: MIT */
/*
 * x86-64 specifics of the BPF program: the user address space, the signal
 * frame layout, and the registers as a sample's context holds them (the Rust
 * side's register numbers and CFI translation: src/unwind/x86_64.rs).
 */
#ifndef LIGHTSWITCH_ARCH_X86_64_H
#define LIGHTSWITCH_ARCH_X86_64_H

/* No code lives below this address (mmap_min_addr) or at/above the end of
 * the x86-64 user address space (47-bit, 4-level page tables). */
#define USER_MIN_ADDRESS 4096ULL
#define USER_ADDRESS_LIMIT 0x0000800000000000ULL

/* Offsets in the ucontext a signal trampoline's rsp points at
 * (struct ucontext: uc_mcontext at 40; struct sigcontext: rbp 80, rbx 88, rsp 120,
 * rip 128). */
#define UCONTEXT_RBP (40 + 80)
#define UCONTEXT_RBX (40 + 88)
#define UCONTEXT_RSP (40 + 120)
#define UCONTEXT_RIP (40 + 128)

/*
 * The registers a perf_event program's context holds at the interrupt: the
 * kernel's struct pt_regs, whose x86-64 layout is the ptrace ABI (struct
 * user_regs_struct, 21 eight-byte slots) and so the same on every kernel.
 *
 * Declared here, without CO-RE, on purpose: the verifier rewrites loads from
 * the context by offset and accepts only 8-byte loads, while the kernel's BTF
 * types pt_regs.cs differently across versions (a 2-byte field on 6.1, a union
 * with an 8-byte csx since FRED support in 6.9). A CO-RE relocation of the
 * vmlinux.h field would fail to load on the kernels where it is 2 bytes.
 */
struct sample_regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
	__u64 ax, cx, dx, si, di, orig_ax;
	__u64 ip, cs, flags, sp, ss;
};

/* The interrupted registers of a perf_event sample (struct bpf_perf_event_data
 * starts with them). */
static __always_inline const struct sample_regs *sample_regs_of(struct bpf_perf_event_data *ctx)
{
	return (const struct sample_regs *)ctx;
}

/* True when the sample interrupted user mode: the privilege level (the low
 * two bits of the code segment selector) is 3. */
static __always_inline bool sample_in_user_mode(const struct sample_regs *regs)
{
	return (regs->cs & 3) == 3;
}

/* Slot (8-byte index) in struct sample_regs of each DWARF register 0-15
 * (System V AMD64 ABI numbering: rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp,
 * r8-r15). A read-only global (.rodata): as a static constant, clang put it
 * in a mergeable string section the loader rejected the program over. */
const volatile __u8 dwarf_register_slot[16] = {
	10, 12, 11, 5, 13, 14, 4, 19, 9, 8, 7, 6, 3, 2, 1, 0,
};

/* The bytes of a task's kernel stack (THREAD_SIZE): 16 KiB on x86-64, 32 KiB
 * with KASAN. The user registers saved at kernel entry sit at its top (x86-64
 * has no padding above them): what the kernel's task_pt_regs() computes. */
#define KERNEL_STACK_BYTES 16384
#define KERNEL_STACK_BYTES_KASAN 32768

/* Read task's saved user registers into `out` without bpf_task_pt_regs
 * (Linux 5.15): from the top of its kernel stack, trying the KASAN size if
 * the first place holds no user-mode code and stack segments (the low two
 * bits of a user selector are 3). 0 on success. */
static __always_inline long read_task_user_regs_compat(struct task_struct *task, struct sample_regs *out)
{
	__u64 stack = (__u64)BPF_CORE_READ(task, stack);
	if (bpf_probe_read_kernel(out, sizeof(*out), (void *)(stack + KERNEL_STACK_BYTES - sizeof(*out))) == 0 &&
	    (out->cs & 3) == 3 && (out->ss & 3) == 3)
		return 0;
	if (bpf_probe_read_kernel(out, sizeof(*out),
				  (void *)(stack + KERNEL_STACK_BYTES_KASAN - sizeof(*out))) == 0 &&
	    (out->cs & 3) == 3 && (out->ss & 3) == 3)
		return 0;
	return -1;
}

/* Read the current task's saved user registers into `out` (map memory:
 * too large for the BPF stack): with bpf_task_pt_regs, or (compat) from the
 * top of its kernel stack. 0 on success. */
static __always_inline long read_current_user_regs(struct sample_regs *out, bool compat)
{
	if (compat)
		return read_task_user_regs_compat((struct task_struct *)bpf_get_current_task(), out);
	struct task_struct *task = bpf_get_current_task_btf();
	struct pt_regs *uregs = (struct pt_regs *)bpf_task_pt_regs(task);
	return bpf_probe_read_kernel(out, sizeof(*out), uregs);
}

/* Read DWARF register `reg` (0-15) of the interrupted user context into
 * `out`: the user registers the kernel saved, at the top of the task's
 * kernel stack, on the entry the sample interrupted (an interrupt taken in
 * user mode saves them there too). `buf` receives all of them (map memory:
 * too large for the BPF stack). 0 on success. */
static __always_inline long read_interrupted_user_register(struct sample_regs *buf, __u32 reg,
							   __u64 *out, bool compat)
{
	if (read_current_user_regs(buf, compat) != 0)
		return -1;
	__u32 slot = dwarf_register_slot[reg & 15];
	if (slot >= sizeof(*buf) / sizeof(__u64))
		return -1;
	*out = ((const __u64 *)buf)[slot];
	return 0;
}

/* Where a thread's stack ends, from its TLS pointer (fs base), for when
 * the mapping that holds its rsp cannot be looked up: glibc and musl put a
 * thread's control block at the top of its stack mapping, with the static
 * TLS just below it and the outermost frames below that. The end of the
 * page fs points into (which is mapped: the block starts there), if that
 * is above sp and less than 64 MiB above it; else 0. */
static __always_inline __u64 stack_end_from_tls(struct task_struct *task, __u64 sp)
{
	__u64 fs = BPF_CORE_READ(task, thread.fsbase);
	__u64 end = (fs & ~4095ULL) + 4096;
	return fs > sp && fs - sp < (64ULL << 20) ? end : 0;
}

/* The thread pointer of `task` (its fs base, which the kernel keeps from
 * arch_prctl or clone's TLS argument): what pthread_self() returns with glibc
 * and musl, so what CPython 3.8-3.10 keep as PyThreadState.thread_id. */
static __always_inline __u64 arch_thread_pointer(struct task_struct *task)
{
	return BPF_CORE_READ(task, thread.fsbase);
}

#endif
