//! Probes of what the kernel's BPF verifier accepts, for which libbpf has
//! no probe: a program of a few instructions is loaded and closed again.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Result};
use libbpf_rs::libbpf_sys as sys;

/// One BPF instruction.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> sys::bpf_insn {
    let mut insn = sys::bpf_insn {
        code,
        off,
        imm,
        ..Default::default()
    };
    insn.set_dst_reg(dst);
    insn.set_src_reg(src);
    insn
}

/// A map for a probe program, closed on drop.
fn probe_map(map_type: sys::bpf_map_type, value_size: u32, flags: u32) -> Result<OwnedFd> {
    let opts = sys::bpf_map_create_opts {
        sz: std::mem::size_of::<sys::bpf_map_create_opts>() as sys::size_t,
        map_flags: flags,
        ..Default::default()
    };
    // SAFETY: a valid options struct; no name; the kernel copies what it needs.
    let fd = unsafe { sys::bpf_map_create(map_type, std::ptr::null(), 4, value_size, 1, &opts) };
    if fd < 0 {
        bail!(
            "creating a map to probe the verifier: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the kernel loads `program` as a `perf_event` program (closed
/// again at once).
fn loads(program: &[sys::bpf_insn]) -> bool {
    let mut opts = sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<sys::bpf_prog_load_opts>() as sys::size_t,
        ..Default::default()
    };
    // SAFETY: `program` and the license outlive the call; `opts` is valid.
    let fd = unsafe {
        sys::bpf_prog_load(
            sys::BPF_PROG_TYPE_PERF_EVENT,
            std::ptr::null(),
            c"GPL".as_ptr(),
            program.as_ptr(),
            program.len() as sys::size_t,
            &mut opts,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    true
}

/// Whether a program with a BPF-to-BPF call may make a tail call (Linux
/// 5.10 on x86-64; before, the verifier refuses: "tail_calls are not
/// allowed in programs with bpf-to-bpf calls"). The compat variant's walker
/// does both. Needs CAP_BPF; errors only if the probe map cannot be made.
pub fn tail_calls_with_subprograms() -> Result<bool> {
    let programs = probe_map(sys::BPF_MAP_TYPE_PROG_ARRAY, 4, 0)?;
    let fd = programs.as_raw_fd();
    let pseudo_call = sys::BPF_PSEUDO_CALL as u8;
    Ok(loads(&[
        insn(0xbf, 6, 1, 0, 0),                             // r6 = r1 (ctx)
        insn(0x85, 0, pseudo_call, 0, 7),                   // call insn 9
        insn(0xbf, 1, 6, 0, 0),                             // r1 = ctx
        insn(0x18, 2, sys::BPF_PSEUDO_MAP_FD as u8, 0, fd), // r2 = programs (ld_imm64)
        insn(0, 0, 0, 0, 0),
        insn(0xb7, 3, 0, 0, 0),                              // r3 = 0
        insn(0x85, 0, 0, 0, sys::BPF_FUNC_tail_call as i32), // tail call
        insn(0xb7, 0, 0, 0, 0),                              // r0 = 0
        insn(0x95, 0, 0, 0, 0),                              // exit
        insn(0xb7, 0, 0, 0, 0),                              // 9: r0 = 0
        insn(0x95, 0, 0, 0, 0),                              // exit
    ]))
}

/// Whether a `perf_event` program may look up a hash map created with
/// `BPF_F_NO_PREALLOC` (Linux 6.1, with the BPF memory allocator; before,
/// the verifier refuses: "perf_event programs can only use preallocated
/// hash map"). Needs CAP_BPF; errors only if the probe map cannot be made.
pub fn perf_event_allows_unpreallocated_hash() -> Result<bool> {
    let map = probe_map(sys::BPF_MAP_TYPE_HASH, 8, sys::BPF_F_NO_PREALLOC)?;
    let fd = map.as_raw_fd();
    // u32 key = 0; bpf_map_lookup_elem(map, &key); return 0;
    Ok(loads(&[
        insn(0x62, 10, 0, -4, 0),                           // *(u32 *)(r10 - 4) = 0
        insn(0xbf, 2, 10, 0, 0),                            // r2 = r10
        insn(0x07, 2, 0, 0, -4),                            // r2 += -4
        insn(0x18, 1, sys::BPF_PSEUDO_MAP_FD as u8, 0, fd), // r1 = map (ld_imm64)
        insn(0, 0, 0, 0, 0),
        insn(0x85, 0, 0, 0, sys::BPF_FUNC_map_lookup_elem as i32), // call
        insn(0xb7, 0, 0, 0, 0),                                    // r0 = 0
        insn(0x95, 0, 0, 0, 0),                                    // exit
    ]))
}

#[cfg(test)]
mod tests {
    /// This machine's kernel (6.x) accepts both (as root).
    #[test]
    fn this_kernel_passes_both_probes() {
        assert!(super::perf_event_allows_unpreallocated_hash().unwrap());
        assert!(super::tail_calls_with_subprograms().unwrap());
    }
}
