//! What the kernel reports of the BPF programs lightswitch loaded: the
//! instructions its verifier processed per program (`verified_insns` of
//! `struct bpf_prog_info`, Linux 5.16 and newer), the figure that decides
//! whether a program fits the verifier's 1 M instruction limit on a kernel.
//! docs/kernels.md records it per tested kernel.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use libbpf_rs::query::ProgInfoIter;
use libbpf_rs::Program;

/// One loaded program's verifier figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedProgram {
    /// The program's name in `src/sampling/bpf/profiler.bpf.c`.
    pub name: String,
    /// Instructions the verifier processed loading it (0 where the kernel
    /// does not report it).
    pub verified_insns: u32,
}

/// The verifier figures of `programs` (name, program fd), in that order, from
/// the kernel's list of loaded programs (`BPF_PROG_GET_NEXT_ID`; needs
/// CAP_SYS_ADMIN or CAP_BPF). A program the kernel does not list reports 0.
pub fn verified_programs(programs: &[(&str, BorrowedFd<'_>)]) -> Vec<VerifiedProgram> {
    let ids: Vec<Option<u32>> = programs
        .iter()
        .map(|(_, fd)| Program::id_from_fd(*fd).ok())
        .collect();
    let mut found = vec![0u32; programs.len()];
    for info in ProgInfoIter::default() {
        if let Some(i) = ids.iter().position(|id| *id == Some(info.id)) {
            found[i] = info.verified_insns;
        }
    }
    programs
        .iter()
        .zip(found)
        .map(|((name, _), verified_insns)| VerifiedProgram {
            name: (*name).to_string(),
            verified_insns,
        })
        .collect()
}

/// One line for the log: `loaded in 412 ms; verified instructions:
/// on_cpu_sample=63078 walk_user_stack=...`, or, when the kernel reports
/// none (before 5.16), `verified instructions: not reported by this kernel`.
pub fn load_report(load_time: Duration, programs: &[VerifiedProgram]) -> String {
    if programs.iter().all(|p| p.verified_insns == 0) {
        return format!(
            "loaded in {} ms; verified instructions: not reported by this kernel (Linux 5.16 and newer)",
            load_time.as_millis()
        );
    }
    let counts: Vec<String> = programs
        .iter()
        .map(|p| format!("{}={}", p.name, p.verified_insns))
        .collect();
    format!(
        "loaded in {} ms; verified instructions: {}",
        load_time.as_millis(),
        counts.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_line_names_each_program() {
        let programs = [
            VerifiedProgram {
                name: "a".into(),
                verified_insns: 10,
            },
            VerifiedProgram {
                name: "b".into(),
                verified_insns: 0,
            },
        ];
        assert_eq!(
            load_report(Duration::from_millis(1500), &programs),
            "loaded in 1500 ms; verified instructions: a=10 b=0"
        );
        let unreported = [VerifiedProgram {
            name: "a".into(),
            verified_insns: 0,
        }];
        assert_eq!(
            load_report(Duration::from_millis(7), &unreported),
            "loaded in 7 ms; verified instructions: not reported by this kernel (Linux 5.16 and newer)"
        );
    }
}
