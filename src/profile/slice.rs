//! A time range of a timeline profile as a profile of its own: what
//! `report --from/--to` prints and the agent's `/v1/profiles/merged` answers
//! for part of a recording.

use crate::profile::{LostSamples, ProcessMarker, Profile, Sample, TimedSample, TimedWait};

/// The part of a timeline `profile` from `from_ns` to `to_ns` (ns after
/// its start, `to_ns` excluded): only the samples, off-CPU waits (by their
/// start, as the collector selects them), markers and lost-sample spans
/// taken in it, counted again (each stack's [`Sample::off_cpu_ns`] the sum
/// of its waits in the slice); times and start moved so that the slice
/// starts at `from_ns`.
pub fn slice(profile: &Profile, from_ns: i64, to_ns: i64) -> Profile {
    let inside = |t: i64| (from_ns..to_ns).contains(&t);
    let mut out = Profile {
        start_unix_ns: profile.start_unix_ns.saturating_add_signed(from_ns),
        duration_ns: to_ns.saturating_sub(from_ns).max(0) as u64,
        sample_freq_hz: profile.sample_freq_hz,
        mappings: profile.mappings.clone(),
        frames: profile.frames.clone(),
        subject: profile.subject.clone(),
        host: profile.host.clone(),
        off_cpu: profile.off_cpu,
        ..Default::default()
    };
    let mut new_index: Vec<Option<u32>> = vec![None; profile.samples.len()];
    let mut index_of = |out: &mut Profile, i: u32| -> Option<u32> {
        let sample = profile.samples.get(i as usize)?;
        Some(*new_index[i as usize].get_or_insert_with(|| {
            out.samples.push(Sample {
                count: 0,
                off_cpu_ns: 0,
                ..sample.clone()
            });
            (out.samples.len() - 1) as u32
        }))
    };
    for timed in profile.timeline.iter().filter(|t| inside(t.offset_ns)) {
        let Some(index) = index_of(&mut out, timed.sample) else {
            continue;
        };
        out.samples[index as usize].count += 1;
        out.timeline.push(TimedSample {
            offset_ns: timed.offset_ns - from_ns,
            sample: index,
        });
    }
    for wait in profile.waits.iter().filter(|w| inside(w.start_offset_ns)) {
        let Some(index) = index_of(&mut out, wait.sample) else {
            continue;
        };
        out.samples[index as usize].off_cpu_ns += wait.duration_ns;
        out.waits.push(TimedWait {
            start_offset_ns: wait.start_offset_ns - from_ns,
            sample: index,
            ..*wait
        });
    }
    out.markers = profile
        .markers
        .iter()
        .filter(|m| inside(m.offset_ns))
        .map(|m| ProcessMarker {
            offset_ns: m.offset_ns - from_ns,
            ..*m
        })
        .collect();
    out.lost = profile
        .lost
        .iter()
        .filter(|l| l.start_offset_ns < to_ns && l.end_offset_ns >= from_ns)
        .map(|l| LostSamples {
            start_offset_ns: l.start_offset_ns - from_ns,
            end_offset_ns: l.end_offset_ns - from_ns,
            samples: l.samples,
        })
        .collect();
    out
}
