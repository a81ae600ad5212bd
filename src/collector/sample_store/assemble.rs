//! Selected rows -> one [`Profile`], for `GET /v1/profiles/merged`: the
//! stacks of the stack table copied into the profile once each, every
//! (stack, thread) one profile sample with its count of on-CPU samples and
//! its ns off-CPU ([`Sample::off_cpu_ns`], the sum of its waits), and (for
//! timeline formats) every sample's time and every wait's start and
//! length ([`Profile::timeline`], [`Profile::waits`]), as the agent's
//! `--off-cpu` profiles have them.

use std::collections::HashMap;

use super::columns::Row;
use super::dict::Dictionary;
use super::query::{Scanned, Visitor};
use crate::profile::{Profile, Sample, TimedSample, TimedWait};

/// A [`Visitor`] building a [`Profile`]; memory: the distinct stacks and
/// threads, plus 12 bytes per sample and 24 per wait with a timeline.
#[derive(Debug, Default)]
pub struct Assembler {
    profile: Profile,
    frames: HashMap<u32, usize>,
    mappings: HashMap<u32, usize>,
    samples: HashMap<(u32, u32), u32>,
    /// Keep every sample's time (as (time, profile sample)).
    timeline: Option<Vec<(u64, u32)>>,
    /// With a timeline, every wait (as (start, ns, profile sample)).
    waits: Vec<(u64, u64, u32)>,
}

impl Assembler {
    /// An assembler keeping every sample's time when `timeline` is set.
    pub fn new(timeline: bool) -> Self {
        Assembler {
            timeline: timeline.then(Vec::new),
            ..Default::default()
        }
    }

    /// The profile of `[start, start + duration)` that `scanned` read: its
    /// sampling frequency, and off-CPU time when a window of it was
    /// recorded with `--off-cpu` (timeline offsets from `start`; time order).
    pub fn finish(mut self, start: u64, duration: u64, scanned: &Scanned) -> Profile {
        self.profile.start_unix_ns = start;
        self.profile.duration_ns = duration;
        self.profile.sample_freq_hz = scanned.freq_hz.max(1);
        self.profile.off_cpu |= scanned.off_cpu;
        self.waits.sort_unstable();
        self.profile.waits = self
            .waits
            .into_iter()
            .map(|(t, duration_ns, sample)| TimedWait {
                start_offset_ns: t.wrapping_sub(start) as i64,
                duration_ns,
                sample,
            })
            .collect();
        if let Some(mut times) = self.timeline {
            times.sort_unstable();
            self.profile.timeline = times
                .into_iter()
                .map(|(t, sample)| TimedSample {
                    offset_ns: t.wrapping_sub(start) as i64,
                    sample,
                })
                .collect();
        }
        self.profile
    }

    fn frame(&mut self, dict: &Dictionary, id: u32) -> usize {
        if let Some(&i) = self.frames.get(&id) {
            return i;
        }
        let (mut frame, mapping) = dict.frame(id);
        frame.mapping = mapping.map(|m| {
            *self.mappings.entry(m).or_insert_with(|| {
                self.profile.mappings.push(dict.mapping(m));
                self.profile.mappings.len() - 1
            })
        });
        self.profile.frames.push(frame);
        let i = self.profile.frames.len() - 1;
        self.frames.insert(id, i);
        i
    }
}

impl Visitor for Assembler {
    fn sample(&mut self, dict: &Dictionary, row: Row) {
        let Row {
            time,
            stack,
            thread,
            off_cpu_ns,
        } = row;
        let index = match self.samples.get(&(stack, thread)) {
            Some(&i) => i,
            None => {
                let rec = dict.stack_rec(stack);
                let frames = rec.frames.iter().map(|&f| self.frame(dict, f)).collect();
                let t = dict.thread_rec(thread);
                self.profile.samples.push(Sample {
                    pid: t.pid,
                    tid: t.tid,
                    process_comm: dict.str(t.comm).clone(),
                    thread_comm: dict.str(t.name).clone(),
                    frames,
                    unwind_status: dict.status(rec.status),
                    count: 0,
                    off_cpu_ns: 0,
                });
                let i = (self.profile.samples.len() - 1) as u32;
                self.samples.insert((stack, thread), i);
                if self.profile.host.is_none() {
                    self.profile.host = Some(dict.str(t.host).clone());
                }
                i
            }
        };
        let sample = &mut self.profile.samples[index as usize];
        if off_cpu_ns > 0 {
            sample.off_cpu_ns += off_cpu_ns;
            self.profile.off_cpu = true;
            if self.timeline.is_some() {
                self.waits.push((time, off_cpu_ns, index));
            }
            return;
        }
        sample.count += 1;
        if let Some(times) = &mut self.timeline {
            times.push((time, index));
        }
    }
}
