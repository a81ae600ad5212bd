//! A process's images in time: an exec gives the process a new image (new
//! mappings) from the exec's timestamp on, and a fork gives the child its
//! parent's mappings from the fork's. Samples are resolved through the image
//! the process had when they were taken, whatever the order in which
//! samples and events are drained; a read of `/proc/PID/maps` is trusted
//! only for the image that was current before and after it (the latest exec
//! of each process comes from the BPF exec program, [`ExecClock`]).

use std::fmt;

use tracing::debug;

use super::{
    maps, MappingId, ObjectId, ProcessMaps, ProcessTracker, MIN_REREAD_INTERVAL, REFRESH_INTERVAL,
};

/// Earlier images kept per process (besides those no open window can need,
/// which go at every retirement): a process that execs every 0.6 ms makes
/// about 170 between two drains 100 ms apart; each image costs about 100
/// bytes.
const MAX_EARLIER_IMAGES: usize = 4096;

/// How long after an exec a read of the maps is checked against the
/// mappings the BPF programs reported for the new image, ns.
const FRESH_IMAGE_NS: u64 = 50_000_000;

/// How long before an exec's recorded time (CLOCK_MONOTONIC ns) a sample
/// may already be of the new image ([`ProcessTracker::find_in_earlier_image`]):
/// the kernel installs the new image, then runs the exec tracepoint, within
/// microseconds.
pub(super) const EXEC_SWITCH_NS: u64 = 1_000_000;

/// Reads of a process's maps tried while execs keep coming.
const READ_ATTEMPTS: usize = 3;

/// One image a process had until an exec replaced it.
#[derive(Debug, Default)]
pub(super) struct Image {
    /// When the exec that ended it happened (CLOCK_MONOTONIC ns).
    pub until_ns: u64,
    /// `(start, end)` of each of `mappings`, sorted.
    pub ranges: Vec<(u64, u64)>,
    pub mappings: Vec<MappingId>,
}

/// The time (CLOCK_MONOTONIC ns) of the latest exec of a pid, as the BPF
/// exec program recorded it (`Sampler::exec_clock`); without one (tests,
/// symbolization only), execs are known only from
/// [`ProcessTracker::process_exec`].
#[derive(Default)]
pub struct ExecClock(Option<Box<dyn Fn(u32) -> Option<u64>>>);

impl ExecClock {
    /// A clock that asks `latest` for a pid's latest exec.
    pub fn new(latest: impl Fn(u32) -> Option<u64> + 'static) -> Self {
        ExecClock(Some(Box::new(latest)))
    }

    fn latest(&self, pid: u32) -> Option<u64> {
        self.0.as_ref().and_then(|f| f(pid))
    }
}

impl fmt::Debug for ExecClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "ExecClock(bpf)"
        } else {
            "ExecClock(none)"
        })
    }
}

/// Look `count` addresses up in sorted `ranges` (`mappings` in the same
/// order), the previous address's range tried first. Whether all were found.
pub(super) fn lookup_ranges(
    ranges: &[(u64, u64)],
    mappings: &[MappingId],
    count: usize,
    addr: &impl Fn(usize) -> u64,
    found: &mut impl FnMut(usize, Option<MappingId>),
) -> bool {
    let mut complete = true;
    let mut previous: Option<usize> = None;
    for i in 0..count {
        let a = addr(i);
        let hit = previous
            .filter(|&p| {
                let (start, end) = ranges[p];
                start <= a && a < end
            })
            .or_else(|| {
                let p = ranges
                    .partition_point(|&(start, _)| start <= a)
                    .checked_sub(1)?;
                (a < ranges[p].1).then_some(p)
            });
        if hit.is_some() {
            previous = hit;
        } else {
            complete = false;
        }
        found(i, hit.and_then(|p| mappings.get(p).copied()));
    }
    complete
}

impl ProcessTracker {
    /// The mapping of `pid` containing `addr`, for a sample taken at
    /// `timestamp_ns` (CLOCK_MONOTONIC). See [`Self::find_mappings`].
    pub fn find_mapping(&mut self, pid: u32, timestamp_ns: u64, addr: u64) -> Option<MappingId> {
        let mut mapping = None;
        self.find_mappings(pid, timestamp_ns, 1, |_| addr, |_, m| mapping = m);
        mapping
    }

    /// The mappings of `count` addresses of one sample of `pid` taken at
    /// `timestamp_ns` (CLOCK_MONOTONIC ns): `addr(i)` is the i-th address,
    /// `found(i, mapping)` receives its mapping. One process lookup for all
    /// of them, the previous address's mapping tried first (consecutive
    /// frames are often in the same object). The process's maps are read on
    /// first use, and again (at most once per [`REFRESH_INTERVAL`]) when an
    /// address is in no known mapping. A sample taken after the exit of the
    /// process the tracker knows under `pid` (more than [`EXIT_GRACE_NS`]
    /// after it was noticed: the kernel's exit path runs on after the exit
    /// event) belongs to a later process with the same pid: the exited
    /// one's mappings are never used for it.
    /// Every mapping found is noted as sampled: once its process is gone
    /// and every sample of it drained, only the sampled ones are kept for
    /// the windows ([`Self::trim_departed`]). A process's first sample
    /// has its container read ([`Self::container_id`]).
    pub fn find_mappings(
        &mut self,
        pid: u32,
        timestamp_ns: u64,
        count: usize,
        addr: impl Fn(usize) -> u64,
        mut found: impl FnMut(usize, Option<MappingId>),
    ) {
        let mut hits = std::mem::take(&mut self.sampled_scratch);
        self.resolve_in_image(pid, timestamp_ns, count, addr, |i, mapping| {
            if let Some(id) = mapping.filter(|&id| hits.last() != Some(&id)) {
                hits.push(id);
            }
            found(i, mapping);
        });
        for id in hits.drain(..) {
            if let Some(held) = self.mappings.get_mut(&id) {
                held.sampled = true;
            }
        }
        self.sampled_scratch = hits;
        self.learn_container(pid);
    }

    /// [`Self::find_mappings`] without noting what was found.
    fn resolve_in_image(
        &mut self,
        pid: u32,
        timestamp_ns: u64,
        count: usize,
        addr: impl Fn(usize) -> u64,
        mut found: impl FnMut(usize, Option<MappingId>),
    ) {
        if self.find_in_earlier_image(pid, timestamp_ns, count, &addr, &mut found) {
            return;
        }
        let now = crate::util::timefmt::monotonic_ns();
        let (due, stale) = match self.processes.get(&pid) {
            None => (true, false),
            Some(p) => (
                p.last_read_ns.is_none_or(|t| {
                    let since = now.saturating_sub(t);
                    since >= REFRESH_INTERVAL.as_nanos() as u64
                        || (t < timestamp_ns && since >= MIN_REREAD_INTERVAL.as_nanos() as u64)
                }),
                p.gone_after_ns().is_some_and(|gone| timestamp_ns > gone),
            ),
        };
        if stale {
            // Read the new process's maps (the old one's go to the orphans).
            if due {
                self.read_process(pid);
            }
            if self.is_exited_before(pid, timestamp_ns) {
                (0..count).for_each(|i| found(i, None));
                return;
            }
        }
        let complete = self.lookup_all(pid, count, &addr, &mut found);
        if !complete && due && !stale {
            self.read_process(pid);
            // The read may have found that an exec came before this sample.
            if !self.find_in_earlier_image(pid, timestamp_ns, count, &addr, &mut found) {
                self.lookup_all(pid, count, &addr, &mut found);
            }
        }
        if let Some(p) = self.processes.get_mut(&pid) {
            p.last_sample_ns = p.last_sample_ns.max(timestamp_ns);
        }
    }

    /// Whether the process known under `pid` was gone (its exit noticed,
    /// and the grace after it over) before `timestamp_ns`.
    fn is_exited_before(&self, pid: u32, timestamp_ns: u64) -> bool {
        self.processes
            .get(&pid)
            .and_then(ProcessMaps::gone_after_ns)
            .is_some_and(|gone| timestamp_ns > gone)
    }

    /// Whether every address was found.
    fn lookup_all(
        &self,
        pid: u32,
        count: usize,
        addr: &impl Fn(usize) -> u64,
        found: &mut impl FnMut(usize, Option<MappingId>),
    ) -> bool {
        let Some(process) = self.processes.get(&pid) else {
            (0..count).for_each(|i| found(i, None));
            return count == 0;
        };
        lookup_ranges(&process.ranges, &process.mappings, count, addr, found)
    }

    /// Learn the time of each process's latest exec from `clock` (the BPF
    /// exec program's record), so that a read of `/proc/PID/maps` is
    /// applied to the image it describes.
    pub fn set_exec_clock(&mut self, clock: ExecClock) {
        self.exec_clock = clock;
    }

    /// `pid` exec'd at `exec_ns` (CLOCK_MONOTONIC): its current mappings
    /// become an earlier image (samples taken before `exec_ns` still
    /// resolve through them) and its maps are read again on next use. An
    /// exec not later than the current image's start changes nothing.
    pub fn process_exec(&mut self, pid: u32, exec_ns: u64) {
        let process = self.processes.entry(pid).or_default();
        if exec_ns <= process.since_ns {
            return;
        }
        let at = exec_ns.max(process.last_sample_ns);
        self.orphans
            .extend(process.all.drain(..).map(|id| (at, id)));
        process.earlier.push(Image {
            until_ns: exec_ns,
            ranges: std::mem::take(&mut process.ranges),
            mappings: std::mem::take(&mut process.mappings),
        });
        if process.earlier.len() > MAX_EARLIER_IMAGES {
            process.earlier.drain(..MAX_EARLIER_IMAGES / 2);
        }
        process.since_ns = exec_ns;
        process.last_read_ns = None;
    }

    /// `pid` was forked by `parent` at `fork_ns`: it has the parent's
    /// mappings until it execs. Whatever was known under `pid` before (an
    /// exited process) retires.
    pub fn process_forked(&mut self, pid: u32, parent: u32, fork_ns: u64) {
        let Some(p) = self.processes.get(&parent) else {
            return;
        };
        let (ranges, mappings) = (p.ranges.clone(), p.mappings.clone());
        // It starts in its parent's cgroup.
        let container = p.container.clone();
        if let Some(mut old) = self.processes.remove(&pid) {
            let at = fork_ns.max(old.last_sample_ns);
            old.container_departs(pid, at, &mut self.departed_containers);
            self.orphans.extend(old.all.into_iter().map(|id| (at, id)));
        }
        self.processes.insert(
            pid,
            ProcessMaps {
                all: mappings.clone(),
                ranges,
                mappings,
                since_ns: fork_ns,
                container,
                ..Default::default()
            },
        );
    }

    /// Add the mapping `range` of `object` from `file_offset` on, which
    /// `pid` had at `at_ns` (the BPF programs saw it: an exec's mappings, a
    /// library mapped since), to the image of that time. A mapping that
    /// overlaps one the image has, or of an object this tracker never gave
    /// out, is left out.
    pub fn add_mapping(
        &mut self,
        pid: u32,
        at_ns: u64,
        range: std::ops::Range<u64>,
        file_offset: u64,
        object: ObjectId,
    ) {
        let Some(path) = self.object(object).map(|o| o.path.clone()) else {
            return;
        };
        self.add_named_mapping(pid, at_ns, range, file_offset, path, Some(object));
    }

    /// Add `pid`'s vDSO at `range`, which the BPF programs described at
    /// `at_ns` (with the vDSO's table), as [`Self::add_mapping`] adds a
    /// file's: named `[vdso]`, as `/proc/PID/maps` names it, for the
    /// symbolizer's vDSO source.
    pub fn add_vdso_mapping(&mut self, pid: u32, at_ns: u64, range: std::ops::Range<u64>) {
        self.add_named_mapping(pid, at_ns, range, 0, "[vdso]".to_string(), None);
    }

    fn add_named_mapping(
        &mut self,
        pid: u32,
        at_ns: u64,
        range: std::ops::Range<u64>,
        file_offset: u64,
        name: String,
        object: Option<ObjectId>,
    ) {
        let id = self.intern(pid, range.start, range.end, file_offset, name, object);
        let process = self.processes.entry(pid).or_default();
        let (ranges, mappings) = if at_ns >= process.since_ns {
            (&mut process.ranges, &mut process.mappings)
        } else {
            match process.earlier.iter_mut().find(|i| at_ns < i.until_ns) {
                Some(image) => (&mut image.ranges, &mut image.mappings),
                None => return,
            }
        };
        let i = ranges.partition_point(|&(start, _)| start < range.start);
        let overlaps = |j: usize| {
            ranges
                .get(j)
                .is_some_and(|&(s, e)| s < range.end && range.start < e)
        };
        if overlaps(i) || (i > 0 && overlaps(i - 1)) {
            return;
        }
        ranges.insert(i, (range.start, range.end));
        mappings.insert(i, id);
        if at_ns >= process.since_ns {
            if !process.all.contains(&id) {
                process.all.push(id);
            }
        } else {
            let until = process
                .earlier
                .iter()
                .find(|i| at_ns < i.until_ns)
                .map_or(at_ns, |i| i.until_ns);
            self.orphans.push((until, id));
        }
    }

    /// If a sample of `pid` at `timestamp_ns` predates its current image,
    /// resolve its addresses through the image it had then (none: not
    /// found) and return true. An address that image lacks, in a sample
    /// taken within [`EXEC_SWITCH_NS`] before the exec that ended it, is
    /// looked up in the image that followed: the kernel switches the
    /// process to its new image (address space, registers at the new entry
    /// point) before the exec tracepoint where the BPF program takes the
    /// exec's time, so a sample in between has the new image's pc but a
    /// time of the old one.
    pub(super) fn find_in_earlier_image(
        &self,
        pid: u32,
        timestamp_ns: u64,
        count: usize,
        addr: &impl Fn(usize) -> u64,
        found: &mut impl FnMut(usize, Option<MappingId>),
    ) -> bool {
        let Some(process) = self.processes.get(&pid) else {
            return false;
        };
        if timestamp_ns >= process.since_ns {
            return false;
        }
        let Some(k) = process
            .earlier
            .iter()
            .position(|i| timestamp_ns < i.until_ns)
        else {
            (0..count).for_each(|i| found(i, None));
            return true;
        };
        let image = &process.earlier[k];
        if image.until_ns - timestamp_ns > EXEC_SWITCH_NS {
            lookup_ranges(&image.ranges, &image.mappings, count, addr, found);
            return true;
        }
        let mut missed = Vec::new();
        lookup_ranges(
            &image.ranges,
            &image.mappings,
            count,
            addr,
            &mut |i, m| match m {
                Some(_) => found(i, m),
                None => missed.push(i),
            },
        );
        let (ranges, mappings) = process
            .earlier
            .get(k + 1)
            .map_or((&process.ranges, &process.mappings), |next| {
                (&next.ranges, &next.mappings)
            });
        let addr_missed = |j: usize| addr(missed[j]);
        lookup_ranges(ranges, mappings, missed.len(), &addr_missed, &mut |j, m| {
            found(missed[j], m)
        });
        true
    }

    /// Read `pid`'s maps and apply them to the image they describe: the
    /// latest exec before and after the read must be the same (else the
    /// read is tried again; a process exec'ing faster than that is left
    /// for a later read).
    pub(super) fn read_process(&mut self, pid: u32) {
        for _ in 0..READ_ATTEMPTS {
            let before = self.exec_clock.latest(pid);
            let entries = match maps::read_maps(pid) {
                Ok(entries) => entries,
                Err(err) => {
                    debug!("pid {pid}: {err:#}");
                    self.stats.maps_unreadable += 1;
                    break;
                }
            };
            let after = self.exec_clock.latest(pid);
            if before != after || self.read_is_of_a_later_image(pid, &entries) {
                continue;
            }
            if self.read_is_of_an_exiting_process(pid, &entries) {
                break;
            }
            if let Some(exec_ns) = after {
                self.process_exec(pid, exec_ns);
            }
            self.apply_maps(pid, &entries);
            return;
        }
        self.processes.entry(pid).or_default().last_read_ns =
            Some(crate::util::timefmt::monotonic_ns());
    }

    /// Whether a read of `pid`'s maps, with no executable mapping in it, is
    /// of the process whose exit was noticed, past the release of its
    /// address space or a zombie: it replaces nothing (taken as a new
    /// process with the same pid, it would drop the mappings that samples
    /// from its exit path still resolve through).
    fn read_is_of_an_exiting_process(&self, pid: u32, entries: &[maps::MapsEntry]) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|p| p.exited_at_ns.is_some())
            && !entries.iter().any(|e| e.executable)
    }

    /// Whether a read of `pid`'s maps shows a later image than its current
    /// one, although the exec clock saw no exec: the kernel switches a
    /// process to its new image before the exec tracepoint runs. Shortly
    /// (within [`FRESH_IMAGE_NS`]) after the exec that began it, an image
    /// whose mappings (those the BPF programs reported) a read lacks is
    /// not the image the read shows.
    fn read_is_of_a_later_image(&self, pid: u32, entries: &[maps::MapsEntry]) -> bool {
        let Some(process) = self.processes.get(&pid) else {
            return false;
        };
        let now = crate::util::timefmt::monotonic_ns();
        if process.since_ns == 0 || now.saturating_sub(process.since_ns) > FRESH_IMAGE_NS {
            return false;
        }
        process.ranges.iter().any(|&(start, end)| {
            !entries
                .iter()
                .any(|e| e.executable && e.start == start && e.end == end)
        })
    }

    /// Drop earlier images that ended before `before_ns`: no sample an
    /// open window can still receive was taken in them.
    pub(super) fn prune_earlier_images(&mut self, before_ns: u64) {
        for process in self.processes.values_mut() {
            process.earlier.retain(|image| image.until_ns >= before_ns);
        }
    }
}
