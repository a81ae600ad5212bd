//! Probes of what the kernel's BPF verifier accepts, for which libbpf has
//! no probe: a program of a few instructions is loaded and closed again.

use std::os::fd::{FromRawFd, OwnedFd};

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

/// Whether a `perf_event` program may look up a hash map created with
/// `BPF_F_NO_PREALLOC` (Linux 6.1, with the BPF memory allocator; before,
/// the verifier refuses: "perf_event programs can only use preallocated
/// hash map"). Needs CAP_BPF; errors only if the probe map cannot be made.
pub fn perf_event_allows_unpreallocated_hash() -> Result<bool> {
    let map_opts = sys::bpf_map_create_opts {
        sz: std::mem::size_of::<sys::bpf_map_create_opts>() as sys::size_t,
        map_flags: sys::BPF_F_NO_PREALLOC,
        ..Default::default()
    };
    // SAFETY: a valid options struct; no name; the kernel copies what it needs.
    let map_fd = unsafe {
        sys::bpf_map_create(sys::BPF_MAP_TYPE_HASH, std::ptr::null(), 4, 8, 1, &map_opts)
    };
    if map_fd < 0 {
        bail!(
            "creating a hash map to probe the verifier: {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    let map = unsafe { OwnedFd::from_raw_fd(map_fd) };
    // u32 key = 0; bpf_map_lookup_elem(map, &key); return 0;
    let program = [
        insn(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0
        insn(0xbf, 2, 10, 0, 0),  // r2 = r10
        insn(0x07, 2, 0, 0, -4),  // r2 += -4
        insn(0x18, 1, sys::BPF_PSEUDO_MAP_FD as u8, 0, map_fd), // r1 = map (ld_imm64)
        insn(0, 0, 0, 0, 0),
        insn(0x85, 0, 0, 0, sys::BPF_FUNC_map_lookup_elem as i32), // call
        insn(0xb7, 0, 0, 0, 0),                                    // r0 = 0
        insn(0x95, 0, 0, 0, 0),                                    // exit
    ];
    let mut opts = sys::bpf_prog_load_opts {
        sz: std::mem::size_of::<sys::bpf_prog_load_opts>() as sys::size_t,
        ..Default::default()
    };
    // SAFETY: `program` and the license outlive the call; `opts` is valid.
    let prog_fd = unsafe {
        sys::bpf_prog_load(
            sys::BPF_PROG_TYPE_PERF_EVENT,
            std::ptr::null(),
            c"GPL".as_ptr(),
            program.as_ptr(),
            program.len() as sys::size_t,
            &mut opts,
        )
    };
    drop(map);
    if prog_fd < 0 {
        return Ok(false);
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    drop(unsafe { OwnedFd::from_raw_fd(prog_fd) });
    Ok(true)
}

#[cfg(test)]
mod tests {
    /// This machine's kernel (6.x) accepts it (as root).
    #[test]
    fn this_kernel_lets_perf_event_programs_use_unpreallocated_hash_maps() {
        assert!(super::perf_event_allows_unpreallocated_hash().unwrap());
    }
}
