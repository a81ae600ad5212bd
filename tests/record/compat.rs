//! `record` with the compat variant of the BPF programs (kernels 5.10 to
//! 5.16) forced on this machine's kernel: without `bpf_find_vma` the exec
//! program leaves the new image to user space, and the command's first
//! milliseconds must still be walked whole (from stack copies where the
//! walker had no description yet).

use super::*;

#[test]
fn compat_record_walks_a_short_program_without_frame_pointers_from_its_start() {
    with_bpf_variant(
        "compat",
        start::record_walks_a_short_program_without_frame_pointers_from_its_start,
    );
}

#[test]
fn compat_record_walks_a_new_program_a_shell_script_starts_from_its_start() {
    with_bpf_variant(
        "compat",
        start::record_walks_a_new_program_a_shell_script_starts_from_its_start,
    );
}
