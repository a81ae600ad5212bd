//! Parsers and value types of command-line values: durations with units,
//! `--label`s, and the registry-driven format and compression names.

use clap::ValueEnum;

use crate::commands::compare::command::{Annotations, DiffOutput};
use crate::profile::format::{Compression, ProfileFormat};

/// Parse a duration for `--duration`, `--profile-interval` and the other
/// time options, in seconds: a bare number is seconds (`5`, `0.5`); with a
/// unit it is read by jiff's friendly format (`5s`, `500ms`, `2m`, `1m30s`,
/// `1.5h`). The value must be above 0, finite and at most
/// [`crate::sampling::preflight::MAX_SECONDS`]; anything else is an error that clap
/// reports as a usage error (exit status 2, like a malformed number), with
/// the same words as [`crate::sampling::preflight::seconds`], which checks values set
/// by code.
pub fn parse_seconds(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let seconds = match text.parse::<f64>() {
        Ok(seconds) => seconds,
        Err(_) => {
            let duration: jiff::SignedDuration = text.parse().map_err(|_| {
                format!(
                    "{text:?} is not a duration: use seconds (5, 0.5) or a unit (5s, 500ms, 2m)"
                )
            })?;
            duration.as_secs_f64()
        }
    };
    crate::sampling::preflight::check_seconds(seconds)?;
    Ok(seconds)
}

/// Parse `--profile-interval`: [`parse_seconds`], within
/// [`crate::sampling::preflight::check_interval`]'s range.
pub fn parse_interval(text: &str) -> Result<f64, String> {
    let seconds = parse_seconds(text)?;
    crate::sampling::preflight::check_interval(seconds)?;
    Ok(seconds)
}

/// Parse a count or size option that must be at least 1 (`--max-profiles`,
/// the servers' and the sender's limits): a usage error (exit status 2)
/// otherwise, like a malformed number.
pub fn parse_count<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let value: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    crate::sampling::preflight::check_count(value)?;
    T::try_from(value).map_err(|_| format!("{value} is too large"))
}

/// Largest `--max-unwind-info-mb`, MiB: the `unwind_rows` map holds 8-byte
/// rows indexed by a u32, so at most 2^32 rows (32,767 MiB and a bit).
const MAX_UNWIND_INFO_MB: u32 = 32_767;

/// Parse `--max-unwind-info-mb`: [`parse_count`], at most
/// [`MAX_UNWIND_INFO_MB`]; a usage error (exit status 2) otherwise.
pub fn parse_unwind_budget_mb(text: &str) -> Result<u32, String> {
    let mb: u32 = parse_count(text)?;
    if mb > MAX_UNWIND_INFO_MB {
        return Err(format!("must be at most {MAX_UNWIND_INFO_MB} (MiB)"));
    }
    Ok(mb)
}

/// `--profile-format` values come from the format registry
/// ([`ProfileFormat::spec`]): canonical names, aliases and help lines.
impl ValueEnum for ProfileFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &ProfileFormat::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let spec = self.spec();
        // clap hides aliases: the help line names them.
        let help = match spec.aliases {
            [] => spec.help.to_string(),
            aliases => format!("{} (also: {})", spec.help, aliases.join(", ")),
        };
        Some(
            clap::builder::PossibleValue::new(spec.name)
                .aliases(spec.aliases.iter().copied())
                .help(help),
        )
    }
}

/// `--pprof-compression` values.
impl ValueEnum for Compression {
    fn value_variants<'a>() -> &'a [Self] {
        &[Compression::None, Compression::Gzip]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(match self {
            Compression::None => {
                clap::builder::PossibleValue::new("none").help("raw protobuf bytes")
            }
            Compression::Gzip => clap::builder::PossibleValue::new("gzip")
                .help("gzip-compressed protobuf (what `go tool pprof` and HTTP receivers prefer)"),
        })
    }
}

/// Parse `KEY=VALUE` for `--otlp-header`: a non-empty header name of
/// visible ASCII without `:` (RFC 9110 token characters are checked when the
/// sender starts); the value is taken as it is.
pub(super) fn parse_header(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))?;
    let key = key.trim();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(format!("{key:?} is not an HTTP header name"));
    }
    Ok((key.to_string(), value.trim().to_string()))
}

/// Parse `KEY=VALUE` for `--label`: the key must be a valid label name.
pub(super) fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))?;
    let mut chars = key.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "label name {key:?} must match [a-zA-Z_][a-zA-Z0-9_]*"
        ));
    }
    if ["__name__", "service_name", "host"].contains(&key) {
        return Err(format!(
            "label {key:?} is set by lightswitch (use --pyroscope-app-name for service_name)"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Most stored profiles one `GET /v1/profiles/merged` may cover, by default
/// (`lightswitch collector --max-merge-profiles`).
pub const DEFAULT_MAX_MERGE_PROFILES: usize = 20_000;

/// Most samples a merged answer in a timeline format may hold, by default
/// (12 bytes each while it is built).
pub const DEFAULT_MAX_TIMELINE_SAMPLES: u64 = 10_000_000;

/// Largest size a request body may decompress to by default, bytes.
pub const DEFAULT_MAX_DECODED_BYTES: usize = 64 * 1024 * 1024;

/// Parse `--retention`: a humantime duration (`7d`, `12h 30m`), in ns, at least 1 s.
pub(super) fn parse_retention(text: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("{text:?} is not a duration such as 7d or 36h: {e}"))?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("{text:?}: keep data at least 1s"));
    }
    u64::try_from(d.as_nanos()).map_err(|_| format!("{text:?} is too long"))
}

/// Parse `--max-storage`: a size with an optional unit (`20GiB`, `500MB`), bytes, at least 1 MiB.
pub(super) fn parse_storage_size(text: &str) -> Result<u64, String> {
    let size: bytesize::ByteSize = text
        .trim()
        .parse()
        .map_err(|e| format!("{text:?} is not a size such as 20GiB or 500MB: {e}"))?;
    if size.as_u64() < 1 << 20 {
        return Err(format!("{text:?}: at least 1MiB"));
    }
    Ok(size.as_u64())
}

/// `diff --output` values.
impl ValueEnum for DiffOutput {
    fn value_variants<'a>() -> &'a [Self] {
        &[DiffOutput::Text, DiffOutput::Json, DiffOutput::Markdown]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(match self {
            DiffOutput::Text => {
                clap::builder::PossibleValue::new("text").help("A table for people")
            }
            DiffOutput::Json => clap::builder::PossibleValue::new("json")
                .help("One JSON object (serde_json) for machines"),
            DiffOutput::Markdown => clap::builder::PossibleValue::new("markdown")
                .alias("md")
                .help("A Markdown table, for $GITHUB_STEP_SUMMARY or a review comment"),
        })
    }
}

impl ValueEnum for Annotations {
    fn value_variants<'a>() -> &'a [Self] {
        &[Annotations::Github]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(match self {
            Annotations::Github => clap::builder::PossibleValue::new("github")
                .help("GitHub Actions workflow commands (::error, ::warning)"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_help_lists_aliases() {
        let flame = ProfileFormat::FlameGraph.to_possible_value().unwrap();
        let help = flame.get_help().unwrap().to_string();
        assert!(help.contains("(also: flamegraph, flame, svg)"), "{help}");
        assert!(flame.matches("SVG", true));
    }

    #[test]
    fn durations_with_and_without_units() {
        assert_eq!(parse_seconds("5"), Ok(5.0));
        assert_eq!(parse_seconds("0.25"), Ok(0.25));
        assert_eq!(parse_seconds("5s"), Ok(5.0));
        assert_eq!(parse_seconds("500ms"), Ok(0.5));
        assert_eq!(parse_seconds("2m"), Ok(120.0));
        assert_eq!(parse_seconds("1m30s"), Ok(90.0));
        assert_eq!(parse_seconds("1h"), Ok(3600.0));
        // Numbers out of range are refused with the range.
        for bad in ["-2s", "-5", "0", "0s", "NaN", "inf", "1e20"] {
            let err = parse_seconds(bad).unwrap_err();
            assert!(err.contains("above 0 and at most"), "{bad:?}: {err}");
        }
        for bad in ["", "five", "5 parsecs", "5x"] {
            assert!(parse_seconds(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(parse_interval("100ms"), Ok(0.1));
        assert!(parse_interval("50ms").unwrap_err().contains("at least 0.1"));
    }
}
