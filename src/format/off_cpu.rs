//! The off-CPU twins of the formats with one value per stack: folded
//! stacks and flame graphs of the time threads spent off their CPU
//! ([`Profile::off_cpu_view`]: each stack weighted by its ns off-CPU).
//! `--off-cpu` writes them beside their on-CPU files (`folded-off-cpu.txt`,
//! `flamegraph-off-cpu.svg`); pprof, OTLP and the Firefox timeline carry
//! off-CPU time in the same file as on-CPU samples instead.

use super::{flamegraph, folded, FormatSpec, ProfileFormat};
use crate::profile::Profile;

/// The registry entry of off-CPU folded stacks: `comm;root;..;leaf NS`,
/// the count in ns.
pub const FOLDED: FormatSpec = FormatSpec {
    name: "folded-off-cpu",
    aliases: &["collapsed-off-cpu"],
    noun: "off-CPU folded stacks file",
    help: "folded stacks of off-CPU time, counts in ns (--off-cpu); default file name folded-off-cpu.txt",
    default_file_name: "folded-off-cpu.txt",
    mime_type: "text/plain; charset=utf-8",
    encodes_empty: true,
    timeline: false,
    off_cpu: true,
    encode: |profile, _, out| Ok(folded::write(&profile.off_cpu_view(), out)?),
};

/// The registry entry of the off-CPU flame graph: box widths are ns spent
/// off the CPU, the title says `Off-CPU profile`.
pub const FLAME_GRAPH: FormatSpec = FormatSpec {
    name: "flame-graph-off-cpu",
    aliases: &["flamegraph-off-cpu", "svg-off-cpu"],
    noun: "off-CPU flame graph",
    help: "SVG flame graph of off-CPU time (--off-cpu); default file name flamegraph-off-cpu.svg",
    default_file_name: "flamegraph-off-cpu.svg",
    mime_type: "image/svg+xml",
    encodes_empty: false,
    timeline: false,
    off_cpu: true,
    encode: |profile, _, out| {
        let view = profile.off_cpu_view();
        Ok(out.write_all(&flamegraph::encode(&view, &flamegraph::title(&view))?)?)
    },
};

/// The off-CPU twin of `format`, for the formats that show one value per
/// stack (folded, flame graph); `None` for the others, which carry
/// off-CPU time themselves.
pub fn twin(format: ProfileFormat) -> Option<ProfileFormat> {
    match format {
        ProfileFormat::Folded => Some(ProfileFormat::FoldedOffCpu),
        ProfileFormat::FlameGraph => Some(ProfileFormat::FlameGraphOffCpu),
        _ => None,
    }
}

/// Whether `profile` has nothing an off-CPU format could draw.
pub fn is_empty(profile: &Profile) -> bool {
    profile.total_off_cpu_ns() == 0
}
