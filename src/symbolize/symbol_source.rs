//! The seam between the symbolizer and the places names come from: every
//! source (kernel symbols, the vDSO, ELF objects, JIT perf maps, ...)
//! implements [`SymbolSource`], and [`super::Symbolizer::build_profile`]
//! asks each, in order, which frames are its own, hands it all of them in
//! one batch per window, and assembles the lines it returns. A new source
//! is one new file implementing the trait plus one entry in
//! [`super::Symbolizer::sources`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::cache::LineCache;
use super::lines::SharedLines;
use super::{Lines, MappingSource};
use crate::process::Mapping;

/// Where a source looks a frame up (defined beside [`Lines`], which the
/// cache shares too).
pub(super) use super::lines::Site;

/// A frame as the sources see it.
#[derive(Debug, Clone, Copy)]
pub(super) enum FrameRef<'a> {
    /// A kernel address (a call site for non-leaf frames).
    Kernel(u64),
    /// A user address (a call site for non-leaf frames) inside `mapping`,
    /// a mapping of process `mapping.pid`.
    User {
        /// Absolute address in the process.
        address: u64,
        /// The mapping that holds it.
        mapping: &'a Mapping,
    },
}

/// The sites of one source a window needs, by group, each group's
/// addresses sorted and distinct.
pub(super) type Batch = BTreeMap<u64, BTreeSet<u64>>;

/// One place frame names come from.
pub(super) trait SymbolSource {
    /// The site at which this source names `frame`, or `None` when the
    /// frame is not this source's (the next source is asked). `tracker`
    /// tells what is known of the frame's process and objects.
    fn locate(&self, tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site>;

    /// Lines (innermost first) for every site of `batch`, with whether each
    /// was named (`false` for a placeholder such as `object+0xOFFSET`). A
    /// site left out gets the mapping's placeholder (and is asked again in
    /// a later window). Called once per window with all of the window's
    /// sites of this source that the lines cache does not hold (possibly
    /// none), so that a source can keep or drop its per-window state
    /// (parsed files, read maps) here.
    /// `tracker` holds the mappings and objects the window refers to.
    fn symbolize(&self, tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines>;

    /// Whether a site's lines stay right for the whole run, so that
    /// [`Resolved::resolve`] may keep them in the lines cache and not ask
    /// again. `false` for sources whose addresses get new names as code
    /// moves (JIT code: perf maps, jitdump files).
    fn cacheable(&self) -> bool {
        true
    }
}

/// The sources' lines for one window: for each source (by its index in the
/// symbolizer's list), the lines of its sites.
pub(super) struct Resolved<'s> {
    sources: &'s [&'s dyn SymbolSource],
    tracker: &'s dyn MappingSource,
    lines: Vec<HashMap<Site, SharedLines>>,
}

impl<'s> Resolved<'s> {
    /// Asks `sources` to name every frame in `frames`: each frame goes to
    /// the first source that locates it; frames none locates are left out.
    /// Sites `cache` holds (of [`SymbolSource::cacheable`] sources) are
    /// answered from it; the lines sources give for the others are stored
    /// in it. Every source is called, with an empty batch when it has no
    /// new sites.
    pub(super) fn resolve<'f>(
        sources: &'s [&'s dyn SymbolSource],
        tracker: &'s dyn MappingSource,
        frames: impl Iterator<Item = FrameRef<'f>>,
        cache: &mut LineCache,
    ) -> Self {
        let mut batches: Vec<Batch> = vec![Batch::new(); sources.len()];
        for frame in frames {
            if let Some((index, (group, address))) = locate(sources, tracker, frame) {
                batches[index].entry(group).or_default().insert(address);
            }
        }
        let lines = sources
            .iter()
            .zip(batches)
            .enumerate()
            .map(|(index, (source, mut batch))| {
                let mut lines = HashMap::new();
                if source.cacheable() {
                    for (&group, addresses) in batch.iter_mut() {
                        addresses.retain(|&address| {
                            let site = (group, address);
                            let Some(found) = cache.get((index, site)) else {
                                return true;
                            };
                            lines.insert(site, found);
                            false
                        });
                    }
                    batch.retain(|_, addresses| !addresses.is_empty());
                }
                for (site, found) in source.symbolize(tracker, &batch) {
                    let found = if source.cacheable() {
                        cache.insert((index, site), found)
                    } else {
                        (found.0.into(), found.1)
                    };
                    lines.insert(site, found);
                }
                lines
            })
            .collect();
        Resolved {
            sources,
            tracker,
            lines,
        }
    }

    /// The lines a source gave `frame`, if any located and named it.
    pub(super) fn lines(&self, frame: FrameRef<'_>) -> Option<&SharedLines> {
        let (index, site) = locate(self.sources, self.tracker, frame)?;
        self.lines[index].get(&site)
    }
}

fn locate(
    sources: &[&dyn SymbolSource],
    tracker: &dyn MappingSource,
    frame: FrameRef<'_>,
) -> Option<(usize, Site)> {
    sources
        .iter()
        .enumerate()
        .find_map(|(index, source)| Some((index, source.locate(tracker, frame)?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Line;
    use std::cell::RefCell;

    /// Names kernel addresses in `range` (`f<address>`), except `unnamed`,
    /// which it leaves out; records each batch it is given.
    struct Recording {
        range: std::ops::Range<u64>,
        unnamed: u64,
        cacheable: bool,
        batches: RefCell<Vec<Vec<u64>>>,
    }

    impl SymbolSource for Recording {
        fn locate(&self, _tracker: &dyn MappingSource, frame: FrameRef<'_>) -> Option<Site> {
            match frame {
                FrameRef::Kernel(a) if self.range.contains(&a) => Some((0, a)),
                _ => None,
            }
        }

        fn symbolize(&self, _tracker: &dyn MappingSource, batch: &Batch) -> HashMap<Site, Lines> {
            let addresses: Vec<u64> = batch.values().flatten().copied().collect();
            self.batches.borrow_mut().push(addresses.clone());
            addresses
                .into_iter()
                .filter(|&a| a != self.unnamed)
                .map(|a| {
                    let name: std::sync::Arc<str> = format!("f{a}").into();
                    let line = Line {
                        function: name.clone(),
                        system_name: name,
                        file: None,
                        line: None,
                    };
                    ((0, a), (vec![line], true))
                })
                .collect()
        }

        fn cacheable(&self) -> bool {
            self.cacheable
        }
    }

    #[test]
    fn cached_sites_are_not_asked_again_unless_uncacheable_or_left_out() {
        let source = |range, unnamed, cacheable| Recording {
            range,
            unnamed,
            cacheable,
            batches: Default::default(),
        };
        let stable = source(0..100, 5, true);
        let moving = source(100..200, 0, false);
        let sources: [&dyn SymbolSource; 2] = [&stable, &moving];
        let tracker = crate::process::ProcessTracker::new();
        let mut cache = LineCache::new(100);
        let frames = [4, 5, 6, 150].map(FrameRef::Kernel);
        for _ in 0..2 {
            let resolved = Resolved::resolve(&sources, &tracker, frames.into_iter(), &mut cache);
            let name = |a| {
                let (lines, _) = resolved.lines(FrameRef::Kernel(a))?;
                Some(lines[0].function.to_string())
            };
            assert_eq!(name(4).as_deref(), Some("f4"));
            assert!(name(5).is_none());
            assert_eq!(name(150).as_deref(), Some("f150"));
            cache.end_window();
        }
        // The stable source is asked for what it left out only; the moving
        // one for its address every window.
        assert_eq!(*stable.batches.borrow(), vec![vec![4, 5, 6], vec![5]]);
        assert_eq!(*moving.batches.borrow(), vec![vec![150], vec![150]]);
        // A window without its frames: each source still called, empty.
        let _ = Resolved::resolve(&sources, &tracker, std::iter::empty(), &mut cache);
        assert_eq!(stable.batches.borrow().last(), Some(&vec![]));
    }
}
