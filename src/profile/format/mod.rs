//! Output formats. Each format is one file here with a [`FormatSpec`]: its
//! names (the `--profile-format` value, also the HTTP `format=` query value,
//! and the aliases people type), default file name, MIME type, whether an
//! empty profile can be encoded, and its encoder, a pure function from a
//! [`crate::profile::Profile`] to bytes. [`ProfileFormat`] names a format and
//! [`ProfileFormat::spec`] is the registry. Everything that writes or serves
//! a profile (one-shot runs, window files, the on-demand API, the collector's
//! merges) goes through [`encode`], so a new format is a new file, a variant
//! and one registry line.

pub mod firefox;
pub mod flamegraph;
pub mod folded;
pub mod off_cpu;
pub mod otlp;
pub mod perfetto;
pub mod pprof;

use std::io::Write;

use anyhow::Result;

pub use pprof::Compression;

use crate::profile::Profile;

/// An output format; [`ProfileFormat::spec`] says everything about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProfileFormat {
    /// SVG flame graph ([`flamegraph`]).
    FlameGraph,
    /// Folded stacks ([`folded`]).
    Folded,
    /// pprof protobuf ([`pprof`]).
    Pprof,
    /// Firefox Profiler timeline ([`firefox`]).
    Firefox,
    /// OpenTelemetry profiles protobuf, every sample's time kept ([`otlp`]).
    Otlp,
    /// Perfetto trace, every sample at its time on its thread's track ([`perfetto`]).
    Perfetto,
    /// Folded stacks of off-CPU time ([`off_cpu::FOLDED`]).
    FoldedOffCpu,
    /// Flame graph of off-CPU time ([`off_cpu::FLAME_GRAPH`]).
    FlameGraphOffCpu,
}

/// What one output format is: names, file name, MIME type, encoder.
#[derive(Debug)]
pub struct FormatSpec {
    /// Canonical name: the `--profile-format` value and the HTTP `format=`
    /// value, e.g. `flame-graph`.
    pub name: &'static str,
    /// Other accepted spellings (e.g. `flamegraph`, `svg`), matched without
    /// regard to case like [`FormatSpec::name`].
    pub aliases: &'static [&'static str],
    /// What it is called in prose ("flame graph"), for messages.
    pub noun: &'static str,
    /// One line for `--help`.
    pub help: &'static str,
    /// File name used when `--profile-name` is not given.
    pub default_file_name: &'static str,
    /// `Content-Type` of the encoded bytes when served over HTTP.
    pub mime_type: &'static str,
    /// Whether a profile without samples can be encoded. When false,
    /// [`encode`] answers [`EmptyProfile`] instead.
    pub encodes_empty: bool,
    /// Whether the encoder shows samples over time: it needs
    /// [`Profile::timeline`], which runs then keep (12 bytes a sample).
    pub timeline: bool,
    /// Whether it shows off-CPU time alone ([`Profile::off_cpu_view`]):
    /// then a profile without off-CPU time is the empty one.
    pub off_cpu: bool,
    /// The encoder: writes the encoded profile into the writer (a file
    /// for one-shot runs, so that no encoded output is held in memory;
    /// [`encode`] passes a `Vec`). The [`Compression`] applies where the
    /// format has a choice (pprof, OTLP, Perfetto); formats with a fixed encoding ignore it.
    pub encode: fn(&Profile, Compression, &mut dyn Write) -> Result<()>,
}

impl ProfileFormat {
    /// Every format, in the order `--help` lists them.
    pub const ALL: [ProfileFormat; 8] = [
        ProfileFormat::Pprof,
        ProfileFormat::FlameGraph,
        ProfileFormat::Folded,
        ProfileFormat::Firefox,
        ProfileFormat::Otlp,
        ProfileFormat::Perfetto,
        ProfileFormat::FlameGraphOffCpu,
        ProfileFormat::FoldedOffCpu,
    ];

    /// The registry: this format's [`FormatSpec`].
    pub fn spec(self) -> &'static FormatSpec {
        match self {
            ProfileFormat::FlameGraph => &flamegraph::SPEC,
            ProfileFormat::Folded => &folded::SPEC,
            ProfileFormat::Pprof => &pprof::SPEC,
            ProfileFormat::Firefox => &firefox::SPEC,
            ProfileFormat::Otlp => &otlp::SPEC,
            ProfileFormat::Perfetto => &perfetto::SPEC,
            ProfileFormat::FoldedOffCpu => &off_cpu::FOLDED,
            ProfileFormat::FlameGraphOffCpu => &off_cpu::FLAME_GRAPH,
        }
    }

    /// The canonical name (`flame-graph`, `folded`, `pprof`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The file name used when `--profile-name` is not given.
    pub fn default_file_name(self) -> &'static str {
        self.spec().default_file_name
    }

    /// Whether the format needs every sample's time ([`FormatSpec::timeline`]).
    pub fn is_timeline(self) -> bool {
        self.spec().timeline
    }

    /// `Content-Type` of this format's bytes.
    pub fn mime_type(self) -> &'static str {
        self.spec().mime_type
    }

    /// The format called `name` (canonical name or alias, any case). The
    /// error lists the canonical names.
    pub fn from_name(name: &str) -> Result<ProfileFormat, UnknownFormat> {
        Self::ALL
            .into_iter()
            .find(|f| {
                let spec = f.spec();
                std::iter::once(&spec.name)
                    .chain(spec.aliases)
                    .any(|n| n.eq_ignore_ascii_case(name))
            })
            .ok_or_else(|| UnknownFormat(name.to_string()))
    }
}

/// A format name that is neither a canonical name nor an alias.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("format {0:?} is not one of {names}", names = canonical_names())]
pub struct UnknownFormat(pub String);

/// The canonical names joined by ", ", for messages.
pub fn canonical_names() -> String {
    ProfileFormat::ALL.map(ProfileFormat::name).join(", ")
}

/// The profile has no samples and the format cannot draw nothing (e.g. a
/// flame graph). Callers that skip such a window check for this error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no samples were collected, so there is no {0} to draw")]
pub struct EmptyProfile(pub &'static str);

/// Encode `profile` as `format`. `compression` applies to formats with a
/// choice (pprof, OTLP). Errors with [`EmptyProfile`] for a profile without
/// samples in a format that cannot encode one, or with the encoder's error.
pub fn encode(
    profile: &Profile,
    format: ProfileFormat,
    compression: Compression,
) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    encode_to(profile, format, compression, &mut bytes)?;
    Ok(bytes)
}

/// Whether `format` can encode `profile`: [`EmptyProfile`] for a profile
/// without samples in a format that cannot encode one.
pub fn check_encodable(profile: &Profile, format: ProfileFormat) -> Result<(), EmptyProfile> {
    let spec = format.spec();
    let empty = if spec.off_cpu {
        off_cpu::is_empty(profile)
    } else {
        profile.total_samples() == 0
    };
    if !spec.encodes_empty && empty {
        return Err(EmptyProfile(spec.noun));
    }
    Ok(())
}

/// Encode `profile` as `format` into `out`, like [`encode`]. Errors as
/// [`encode`]'s, and `out`'s write errors.
pub fn encode_to(
    profile: &Profile,
    format: ProfileFormat,
    compression: Compression,
    out: &mut dyn Write,
) -> Result<()> {
    check_encodable(profile, format)?;
    (format.spec().encode)(profile, compression, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_resolve_and_unknown_names_list_the_formats() {
        for format in ProfileFormat::ALL {
            assert_eq!(ProfileFormat::from_name(format.name()), Ok(format));
            for alias in format.spec().aliases {
                assert_eq!(ProfileFormat::from_name(alias), Ok(format));
            }
        }
        for alias in ["flame", "flamegraph", "svg", "SVG", "Flame-Graph"] {
            assert_eq!(
                ProfileFormat::from_name(alias),
                Ok(ProfileFormat::FlameGraph)
            );
        }
        let err = ProfileFormat::from_name("png").unwrap_err().to_string();
        assert!(
            err.contains("png")
                && err.contains(
                    "pprof, flame-graph, folded, firefox, otlp, perfetto, flame-graph-off-cpu, folded-off-cpu"
                ),
            "{err}"
        );
    }

    #[test]
    fn names_are_unique_across_formats() {
        let mut seen = std::collections::HashSet::new();
        for format in ProfileFormat::ALL {
            let spec = format.spec();
            for name in std::iter::once(&spec.name).chain(spec.aliases) {
                assert!(seen.insert(name.to_ascii_lowercase()), "{name} twice");
            }
        }
    }

    #[test]
    fn empty_profiles_are_refused_only_where_the_format_cannot_draw_them() {
        let empty = Profile::default();
        for format in ProfileFormat::ALL {
            let result = encode(&empty, format, Compression::None);
            if format.spec().encodes_empty {
                assert!(result.is_ok(), "{format:?}: {result:?}");
            } else {
                let err = result.unwrap_err();
                assert!(err.downcast_ref::<EmptyProfile>().is_some(), "{err:#}");
            }
        }
    }
}
