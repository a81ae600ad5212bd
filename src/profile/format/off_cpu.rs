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

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read;

    use super::*;
    use crate::profile::format::firefox::tests::timed_profile;
    use crate::profile::format::{encode, Compression};
    use crate::profile::TimedWait;

    /// The Firefox tests' profile with off-CPU time: its third stack
    /// (thread 8, truncated) waited twice, 3 ms and 5 ms, and a fourth
    /// stack of thread 9 only waited (1 ms).
    pub(crate) fn waited_profile() -> Profile {
        let mut profile = timed_profile();
        profile.off_cpu = true;
        profile.samples[2].off_cpu_ns = 8_000_000;
        let mut only_waited = profile.samples[0].clone();
        only_waited.tid = 9;
        only_waited.count = 0;
        only_waited.off_cpu_ns = 1_000_000;
        profile.samples.push(only_waited);
        profile.waits = vec![
            TimedWait {
                start_offset_ns: 1_000,
                duration_ns: 3_000_000,
                sample: 2,
            },
            TimedWait {
                start_offset_ns: 4_000_000,
                duration_ns: 1_000_000,
                sample: 3,
            },
            TimedWait {
                start_offset_ns: 5_000_000,
                duration_ns: 5_000_000,
                sample: 2,
            },
        ];
        profile
    }

    #[test]
    fn folded_twins_weigh_stacks_by_their_ns_off_cpu() {
        let profile = waited_profile();
        let on = encode(&profile, ProfileFormat::Folded, Compression::None).unwrap();
        let off = encode(&profile, ProfileFormat::FoldedOffCpu, Compression::None).unwrap();
        let off = String::from_utf8(off).unwrap();
        assert!(!String::from_utf8(on).unwrap().contains(" 0\n"));
        let counts: Vec<u64> = off
            .lines()
            .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(counts.iter().sum::<u64>(), 9_000_000, "{off}");
        assert!(off.contains("[unwind: truncated]"), "{off}");
        let svg = encode(&profile, ProfileFormat::FlameGraphOffCpu, Compression::None).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("Off-CPU profile"), "no off-CPU title");
        assert!(svg.contains("0.009 s off-CPU"), "no off-CPU total");
        let empty = Profile::default();
        assert!(encode(&empty, ProfileFormat::FlameGraphOffCpu, Compression::None).is_err());
    }

    #[test]
    fn pprof_has_an_off_cpu_sample_type_that_reads_back() {
        let profile = waited_profile();
        let message = crate::profile::format::pprof::to_proto(&profile);
        let types: Vec<&str> = message
            .sample_type
            .iter()
            .map(|t| message.string_table[t.r#type as usize].as_str())
            .collect();
        assert_eq!(types, ["samples", "cpu", "off_cpu"]);
        assert_eq!(message.sample[2].value[2], 8_000_000);
        assert_eq!(message.sample[3].value, [0, 0, 1_000_000]);
        let back = crate::profile::merge::profile_from_pprof(&message);
        assert!(back.off_cpu);
        assert_eq!(back.total_off_cpu_ns(), 9_000_000);
        assert_eq!(back.total_samples(), profile.total_samples());
    }

    #[test]
    fn otlp_carries_each_wait_with_its_start_and_reads_back() {
        let profile = waited_profile();
        let request = crate::profile::format::otlp::to_request(&profile).unwrap();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2);
        let waited: Vec<(Vec<i64>, usize)> = profiles[1]
            .samples
            .iter()
            .map(|s| (s.values.clone(), s.timestamps_unix_nano.len()))
            .collect();
        assert_eq!(
            waited,
            [(vec![3_000_000, 5_000_000], 2), (vec![1_000_000], 1)]
        );
        let back = crate::profile::format::otlp::read::profile_from_request(&request).unwrap();
        assert!(back.off_cpu);
        assert_eq!(back.total_off_cpu_ns(), 9_000_000);
        assert_eq!(back.waits.len(), 3);
        assert_eq!(back.total_samples(), profile.total_samples());
    }

    #[test]
    fn firefox_shows_each_wait_as_a_marker_with_its_stack() {
        let profile = waited_profile();
        let bytes = encode(&profile, ProfileFormat::Firefox, Compression::None).unwrap();
        let mut json = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut json)
            .unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        let mut waits = Vec::new();
        for thread in value["threads"].as_array().unwrap() {
            let markers = &thread["markers"];
            for i in 0..markers["length"].as_u64().unwrap() as usize {
                let data = &markers["data"][i];
                if data["type"] == crate::profile::format::firefox::OFF_CPU_MARKER_TYPE {
                    assert!(
                        data["cause"]["stack"].is_u64(),
                        "a wait without its stack: {data}"
                    );
                    let span = markers["endTime"][i].as_f64().unwrap()
                        - markers["startTime"][i].as_f64().unwrap();
                    waits.push((thread["tid"].to_string(), (span * 1e3).round() as u64));
                }
            }
        }
        waits.sort();
        assert_eq!(
            waits,
            [
                ("\"8\"".to_string(), 3000),
                ("\"8\"".to_string(), 5000),
                ("\"9\"".to_string(), 1000)
            ]
        );
    }
}
