//! Which build of the BPF programs runs on this kernel. `profiler.bpf.c`
//! holds two variants of the sampling, walking and exec programs, and the
//! loader loads one of them (libbpf's `bpf_program__set_autoload`), chosen
//! from feature probes (docs/kernels.md):
//!
//! - [`ProgramVariant::BpfLoop`] (Linux 5.17 and newer): the walker steps
//!   through `bpf_loop`, adds unknown mappings with `bpf_find_vma`, reads
//!   the task through `bpf_get_current_task_btf` and its saved user
//!   registers through `bpf_task_pt_regs`.
//! - [`ProgramVariant::Compat`] (5.10 to 5.16): the same step body called
//!   from a global function in a bounded loop (`src/sampling/bpf/walker_variants.h`),
//!   the task and its registers read with `bpf_probe_read_kernel`, unknown
//!   mappings left to user space.
//!
//! Both give the same frames, depth (1024 frames) and unwind results; the
//! compat variant's samples cost more BPF time (docs/performance.md,
//! docs/decisions/0005-compat-variant.md).
//! [`FORCE_VARIANT_ENV`] forces one, so that tests run the compat variant
//! on a kernel that has everything.

use anyhow::{bail, Context, Result};
use libbpf_rs::{OpenProgramMut, ProgramMut};

use crate::sampling::preflight::{self, KernelFeature};
use crate::sampling::skel::{OpenProfilerMaps, OpenProfilerProgs, ProfilerProgs};

/// Process descriptions (`process_mappings`) a kernel before 6.1 holds:
/// there the map is preallocated (about 8.3 KiB per entry: 34 MiB of kernel
/// memory), where newer kernels hold 8192 allocated as they are written.
pub const PREALLOCATED_PROCESS_DESCRIPTIONS: u32 = 4096;

/// The environment variable that forces a variant: `compat` or `bpf_loop`
/// (for tests; not a user option).
pub const FORCE_VARIANT_ENV: &str = "LIGHTSWITCH_BPF_VARIANT";

/// A build of the BPF programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramVariant {
    /// `on_cpu_sample`, `walk_user_stack`, `on_exec`: needs every feature of
    /// [`preflight::BPF_LOOP_VARIANT_FEATURES`].
    BpfLoop,
    /// `on_cpu_sample_compat`, `walk_user_stack_compat`, `on_exec_compat`.
    Compat,
}

impl ProgramVariant {
    /// Its name in logs, `/metrics` and [`FORCE_VARIANT_ENV`].
    pub fn name(self) -> &'static str {
        match self {
            ProgramVariant::BpfLoop => "bpf_loop",
            ProgramVariant::Compat => "compat",
        }
    }

    /// Have libbpf load this variant's programs and not the other's
    /// (whose helpers the kernel may lack).
    pub(super) fn select(self, progs: &mut OpenProfilerProgs<'_>) {
        let compat = self == ProgramVariant::Compat;
        for (prog, load) in [
            (&mut progs.on_cpu_sample, !compat),
            (&mut progs.walk_user_stack, !compat),
            (&mut progs.on_exec, !compat),
            (&mut progs.walk_python, !compat),
            (&mut progs.on_cpu_sample_compat, compat),
            (&mut progs.walk_user_stack_compat, compat),
            (&mut progs.on_exec_compat, compat),
        ] {
            prog.set_autoload(load);
        }
    }

    /// Preallocate, before load, the two hash maps the walker reads
    /// (`process_mappings`, then with [`PREALLOCATED_PROCESS_DESCRIPTIONS`]
    /// entries, and `unwind_pages`) if this kernel lets `perf_event`
    /// programs use only preallocated hash maps (before Linux 6.1:
    /// [`preflight::perf_event_allows_unpreallocated_hash`]).
    pub(super) fn shape_maps(maps: &mut OpenProfilerMaps<'_>) -> Result<()> {
        if preflight::perf_event_allows_unpreallocated_hash()? {
            return Ok(());
        }
        maps.process_mappings
            .set_map_flags(0)
            .and_then(|()| {
                maps.process_mappings
                    .set_max_entries(PREALLOCATED_PROCESS_DESCRIPTIONS)
            })
            .context("preallocating the process_mappings map")?;
        maps.unwind_pages
            .set_map_flags(0)
            .context("preallocating the unwind_pages map")
    }

    /// This variant's sampling and walker programs before load (to set
    /// their log level).
    pub(super) fn open_sampling<'a, 'obj>(
        self,
        progs: &'a mut OpenProfilerProgs<'obj>,
    ) -> [&'a mut OpenProgramMut<'obj>; 2] {
        match self {
            ProgramVariant::BpfLoop => [&mut progs.on_cpu_sample, &mut progs.walk_user_stack],
            ProgramVariant::Compat => [
                &mut progs.on_cpu_sample_compat,
                &mut progs.walk_user_stack_compat,
            ],
        }
    }

    /// The loaded sampling program (attached to the perf events).
    pub(super) fn sampler<'a, 'obj>(self, progs: &'a ProfilerProgs<'obj>) -> &'a ProgramMut<'obj> {
        match self {
            ProgramVariant::BpfLoop => &progs.on_cpu_sample,
            ProgramVariant::Compat => &progs.on_cpu_sample_compat,
        }
    }

    /// The loaded walker (tail-called from the sampling program).
    pub(super) fn walker<'a, 'obj>(self, progs: &'a ProfilerProgs<'obj>) -> &'a ProgramMut<'obj> {
        match self {
            ProgramVariant::BpfLoop => &progs.walk_user_stack,
            ProgramVariant::Compat => &progs.walk_user_stack_compat,
        }
    }

    /// The loaded exec program.
    pub(super) fn exec<'a, 'obj>(self, progs: &'a ProfilerProgs<'obj>) -> &'a ProgramMut<'obj> {
        match self {
            ProgramVariant::BpfLoop => &progs.on_exec,
            ProgramVariant::Compat => &progs.on_exec_compat,
        }
    }
}

/// The variant chosen for this run and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantChoice {
    /// What is loaded.
    pub variant: ProgramVariant,
    /// Why, in words for the log: the kernel has every feature, lacks some
    /// (named), or [`FORCE_VARIANT_ENV`] forced it.
    pub reason: String,
}

/// Choose the variant: [`FORCE_VARIANT_ENV`] if set, else
/// [`ProgramVariant::BpfLoop`] when this kernel has every feature of
/// [`preflight::BPF_LOOP_VARIANT_FEATURES`] (probed by loading small
/// programs: needs CAP_BPF), else [`ProgramVariant::Compat`]. Errors for an
/// unknown forced value or a failed probe.
pub fn choose_variant() -> Result<VariantChoice> {
    if let Some(forced) = std::env::var_os(FORCE_VARIANT_ENV) {
        let variant = parse_forced(&forced.to_string_lossy())?;
        return Ok(VariantChoice {
            variant,
            reason: format!("forced by {FORCE_VARIANT_ENV}"),
        });
    }
    let mut missing: Vec<&KernelFeature> = Vec::new();
    for feature in preflight::BPF_LOOP_VARIANT_FEATURES {
        if !preflight::has_kernel_feature(feature)? {
            missing.push(feature);
        }
    }
    Ok(choice_for(&missing))
}

/// The variant for a kernel that lacks `missing`.
fn choice_for(missing: &[&KernelFeature]) -> VariantChoice {
    if missing.is_empty() {
        return VariantChoice {
            variant: ProgramVariant::BpfLoop,
            reason: "the kernel has bpf_loop and the helpers beside it".to_string(),
        };
    }
    let names: Vec<String> = missing
        .iter()
        .map(|f| format!("{} (Linux {})", f.name, f.since))
        .collect();
    VariantChoice {
        variant: ProgramVariant::Compat,
        reason: format!("the kernel lacks {}", names.join(", ")),
    }
}

/// A value of [`FORCE_VARIANT_ENV`].
fn parse_forced(value: &str) -> Result<ProgramVariant> {
    match value {
        "compat" => Ok(ProgramVariant::Compat),
        "bpf_loop" => Ok(ProgramVariant::BpfLoop),
        other => bail!("{FORCE_VARIANT_ENV}={other:?}: expected \"compat\" or \"bpf_loop\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_values() {
        assert_eq!(parse_forced("compat").unwrap(), ProgramVariant::Compat);
        assert_eq!(parse_forced("bpf_loop").unwrap(), ProgramVariant::BpfLoop);
        let err = parse_forced("fast").unwrap_err().to_string();
        assert!(err.contains("LIGHTSWITCH_BPF_VARIANT=\"fast\""), "{err}");
    }

    #[test]
    fn a_missing_feature_chooses_compat_and_names_it() {
        let choice = choice_for(&[&preflight::BPF_LOOP_VARIANT_FEATURES[0]]);
        assert_eq!(choice.variant, ProgramVariant::Compat);
        assert!(
            choice.reason.contains("bpf_loop BPF helper (Linux 5.17)"),
            "{}",
            choice.reason
        );
        assert_eq!(choice_for(&[]).variant, ProgramVariant::BpfLoop);
    }

    /// This machine's kernel (6.x) has everything: the probes choose
    /// bpf_loop (as root; the probes load programs).
    #[test]
    fn this_kernel_gets_the_bpf_loop_variant() {
        if std::env::var_os(FORCE_VARIANT_ENV).is_some() {
            return;
        }
        assert_eq!(choose_variant().unwrap().variant, ProgramVariant::BpfLoop);
    }
}
