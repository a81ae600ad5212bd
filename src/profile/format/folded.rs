//! Folded stacks (Brendan Gregg's FlameGraph input, also read by inferno):
//! one line per distinct stack, `comm;root;...;leaf COUNT`, frames joined by
//! `;`, the count after the last space. User frames come first (root to leaf,
//! inlined functions after the function they were inlined into), then kernel
//! frames, each suffixed `_[k]` so flame graph palettes colour them as kernel.
//! A stack whose user walk stopped early starts with its unwind marker
//! (e.g. `[unwind: truncated]`) right after the process name.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::io::{self, Write};

use super::FormatSpec;
use crate::profile::{FrameKind, Profile};

/// The registry entry: `folded`, `folded.txt`, plain text. An empty profile
/// is an empty file.
pub const SPEC: FormatSpec = FormatSpec {
    name: "folded",
    aliases: &["collapsed"],
    noun: "folded stacks file",
    help: "folded stacks, `comm;root;..;leaf count` per line; default file name folded.txt",
    default_file_name: "folded.txt",
    mime_type: "text/plain; charset=utf-8",
    encodes_empty: true,
    timeline: false,
    off_cpu: false,
    encode: |profile, _, out| Ok(write(profile, out)?),
};

/// Suffix that marks a kernel frame in folded stacks.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// A frame name made safe for the folded format (`;` separates frames and a
/// newline ends the line): `;` becomes `:`, line breaks spaces.
pub fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// A profile's folded stacks with their names interned: each stack is the
/// list of its names' indices (process name, then frames root to leaf), so
/// that merging and sorting hold 4 bytes a frame, not the stack's text (a
/// 60 s whole-machine run of Rust builds has 500 k distinct stacks whose
/// text is 1 GB).
struct Folded {
    /// Cleaned names; kernel frames carry [`KERNEL_SUFFIX`].
    names: Vec<String>,
    /// Distinct stacks (identical stacks of different threads merged) with
    /// their counts, in the order of their text.
    stacks: Vec<(Box<[u32]>, u64)>,
}

impl Folded {
    fn new(profile: &Profile) -> Self {
        let mut names = Vec::new();
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut intern = |name: String| -> u32 {
            *ids.entry(name).or_insert_with_key(|name| {
                names.push(name.clone());
                (names.len() - 1) as u32
            })
        };
        let mut frame_names: Vec<Option<Box<[u32]>>> = vec![None; profile.frames.len()];
        let mut merged: HashMap<Box<[u32]>, u64> = HashMap::new();
        // A stack only seen off its CPU (count 0) has no line here.
        for sample in profile.samples.iter().filter(|s| s.count > 0) {
            let mut key = vec![intern(clean(&sample.process_comm))];
            for &index in sample.frames.iter().rev() {
                let ids = frame_names[index].get_or_insert_with(|| {
                    let frame = &profile.frames[index];
                    let suffix = match frame.kind {
                        FrameKind::Kernel => KERNEL_SUFFIX,
                        _ => "",
                    };
                    frame
                        .lines
                        .iter()
                        .rev()
                        .map(|line| intern(clean(&line.function) + suffix))
                        .collect()
                });
                key.extend_from_slice(ids);
            }
            *merged.entry(key.into_boxed_slice()).or_insert(0) += sample.count;
        }
        drop(frame_names);
        let mut stacks: Vec<_> = merged.into_iter().collect();
        stacks.sort_unstable_by(|a, b| compare_joined(&names, &a.0, &b.0));
        Folded { names, stacks }
    }

    /// For each stack (in order), the depth of the first box on its path
    /// that a flame graph does not draw, being narrower than `threshold`
    /// (in counts), if any. A box is a run of consecutive stacks with the
    /// same names down to its depth, as a flame graph merges them. Time:
    /// each (stack, depth) is written at most once per box over it.
    fn narrow_cuts(&self, threshold: f64) -> Vec<Option<usize>> {
        let mut cuts = vec![None; self.stacks.len()];
        // The boxes open at the current stack: (name, first stack, count).
        let mut open: Vec<(u32, usize, u64)> = Vec::new();
        let close = |open: &mut Vec<(u32, usize, u64)>, depth, end, cuts: &mut [Option<usize>]| {
            while open.len() > depth {
                let (_, first, count) = open.pop().expect("open is longer than depth");
                if (count as f64) < threshold {
                    // A box higher up, closed later, overwrites this.
                    cuts[first..end].fill(Some(open.len()));
                }
            }
        };
        for (i, (ids, count)) in self.stacks.iter().enumerate() {
            let common = open
                .iter()
                .zip(ids.iter())
                .take_while(|(node, &id)| node.0 == id)
                .count();
            close(&mut open, common, i, &mut cuts);
            open.extend(ids[common..].iter().map(|&id| (id, i, 0)));
            for node in &mut open {
                node.2 += count;
            }
        }
        close(&mut open, 0, self.stacks.len(), &mut cuts);
        cuts
    }

    /// The text of stack `ids`: its names joined by `;`.
    fn text(&self, ids: &[u32]) -> String {
        let names: Vec<&str> = ids
            .iter()
            .map(|&i| self.names[i as usize].as_str())
            .collect();
        names.join(";")
    }
}

/// How the texts of two stacks (their names joined by `;`) compare, byte by
/// byte as `String`s do, without building them: the names both share are
/// skipped, the rest compared as bytes.
fn compare_joined(names: &[String], a: &[u32], b: &[u32]) -> Ordering {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if common == a.len() || common == b.len() {
        return a.len().cmp(&b.len());
    }
    // Both go on after the shared names, each with a `;` or nothing first
    // alike: compare from there.
    joined_bytes(names, &a[common..]).cmp(joined_bytes(names, &b[common..]))
}

/// The bytes of `ids`' names joined by `;`.
fn joined_bytes<'a>(names: &'a [String], ids: &'a [u32]) -> impl Iterator<Item = u8> + 'a {
    ids.iter().enumerate().flat_map(move |(i, &id)| {
        let separator: &'static [u8] = if i == 0 { b"" } else { b";" };
        separator
            .iter()
            .chain(names[id as usize].as_bytes())
            .copied()
    })
}

/// The folded stacks of `profile`, merged (identical stacks of different
/// threads add up) and sorted, as `(stack, count)`: what [`write`] writes,
/// for tests to compare.
#[cfg(test)]
pub(crate) fn folded_stacks(profile: &Profile) -> std::collections::BTreeMap<String, u64> {
    let folded = Folded::new(profile);
    folded
        .stacks
        .iter()
        .map(|(ids, count)| (folded.text(ids), *count))
        .collect()
}

/// Name of the frame that stands, in [`flame_graph_lines`], for all the
/// frames under a box too narrow to be drawn. It is never drawn itself: it
/// is no wider than the box above it.
pub const NARROW_FRAMES: &str = "[narrower than the flame graph draws]";

/// `profile`'s folded lines (`stack count`, in the order [`write`]
/// writes them) for a flame graph that leaves out every box narrower
/// than `min_percent` of the total (inferno's `Options::min_width`, a
/// percent of the image width; and so every box under such a box). The
/// boxes such a flame graph draws come out the same, with the same counts
/// and places, as from every stack's line, but below a box it does not
/// draw all of a stack's frames become one [`NARROW_FRAMES`] frame, so the
/// lines under it merge into one. The memory is that of the lines drawn,
/// not of every distinct stack: an hour of a collector's samples has
/// hundreds of thousands of distinct stacks, whose text is gigabytes.
pub fn flame_graph_lines(profile: &Profile, min_percent: f64) -> Vec<String> {
    let folded = Folded::new(profile);
    let total: u64 = folded.stacks.iter().map(|(_, count)| count).sum();
    let cuts = folded.narrow_cuts(total as f64 * min_percent / 100.0);
    let mut kept: Vec<(&[u32], bool, u64)> = Vec::new();
    for ((ids, count), cut) in folded.stacks.iter().zip(cuts) {
        let (ids, narrow) = match cut {
            Some(depth) if ids.len() > depth + 1 => (&ids[..=depth], true),
            _ => (&ids[..], false),
        };
        match kept.last_mut() {
            Some(last) if last.0 == ids && last.1 == narrow => last.2 += count,
            _ => kept.push((ids, narrow, *count)),
        }
    }
    kept.into_iter()
        .map(|(ids, narrow, count)| {
            let mut text = folded.text(ids);
            if narrow {
                text.push(';');
                text.push_str(NARROW_FRAMES);
            }
            format!("{text} {count}")
        })
        .collect()
}

/// Write `profile` as folded-stack text into `out`, one `stack count` line
/// per stack, in the order of the stacks' text. Errors: `out`'s.
pub fn write(profile: &Profile, out: &mut dyn Write) -> io::Result<()> {
    let folded = Folded::new(profile);
    let mut out = io::BufWriter::with_capacity(1 << 16, out);
    for (ids, count) in &folded.stacks {
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 {
                out.write_all(b";")?;
            }
            out.write_all(folded.names[id as usize].as_bytes())?;
        }
        writeln!(out, " {count}")?;
    }
    out.flush()
}

/// Encode `profile` as folded-stack text, one `stack count` line per stack.
pub fn encode(profile: &Profile) -> String {
    let mut text = Vec::new();
    write(profile, &mut text).expect("writing into memory does not fail");
    String::from_utf8(text).expect("names are text")
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::profile::{Frame, Line, Sample};
    use crate::sampling::records::UnwindStatus;

    fn line(name: &str) -> Line {
        Line {
            function: Arc::from(name),
            system_name: Arc::from(name),
            file: None,
            line: None,
        }
    }

    pub(crate) fn frame(kind: FrameKind, address: u64, names: &[&str]) -> Frame {
        Frame {
            kind,
            address,
            mapping: None,
            lines: names.iter().map(|n| line(n)).collect(),
            symbolized: true,
        }
    }

    /// A small profile: two threads of `app` with one stack each (one with
    /// an inlined frame and kernel frames), and a truncated stack.
    pub(crate) fn sample_profile() -> Profile {
        let frames = vec![
            frame(FrameKind::Kernel, 0xffff_0001, &["vfs_read"]),
            frame(FrameKind::Kernel, 0xffff_0002, &["do_syscall_64"]),
            frame(FrameKind::User, 0x1000, &["inner_inlined", "c"]),
            frame(FrameKind::User, 0x2000, &["main"]),
            frame(FrameKind::UnwindMarker, 0, &["[unwind: truncated]"]),
        ];
        let sample = |tid, frames: Vec<usize>, count, status| Sample {
            pid: 7,
            tid,
            process_comm: Arc::from("app"),
            thread_comm: Arc::from("worker;1"),
            frames,
            unwind_status: status,
            off_cpu_ns: 0,
            count,
        };
        Profile {
            start_unix_ns: 1_700_000_000_000_000_000,
            duration_ns: 2_000_000_000,
            sample_freq_hz: 100,
            mappings: vec![],
            frames,
            samples: vec![
                sample(7, vec![0, 1, 2, 3], 5, UnwindStatus::Complete),
                sample(8, vec![0, 1, 2, 3], 2, UnwindStatus::Complete),
                sample(8, vec![2, 4], 1, UnwindStatus::Truncated),
            ],
            timeline: vec![],
            markers: vec![],
            lost: vec![],
            subject: None,
            host: None,
            targets: None,
            ..Profile::default()
        }
    }

    #[test]
    fn folds_root_to_leaf_with_kernel_suffix_and_markers() {
        let text = encode(&sample_profile());
        assert_eq!(
            text,
            "app;[unwind: truncated];c;inner_inlined 1\n\
             app;main;c;inner_inlined;do_syscall_64_[k];vfs_read_[k] 7\n"
        );
    }

    /// Stacks whose names differ where the text's order and the names'
    /// order disagree (`a b` sorts before `a;...` as text, `;` being 0x3B
    /// and space 0x20), one a prefix of another, and the same stack in two
    /// threads: the lines come out merged and in the order of their text.
    #[test]
    fn stacks_sort_as_their_text_and_merge_across_threads() {
        let names = [
            vec!["a", "b"],
            vec!["a b", "c"],
            vec!["a"],
            vec!["a", "b", "c"],
            vec!["ab"],
            vec!["a", "b"],
        ];
        let frames: Vec<Frame> = names
            .iter()
            .flatten()
            .map(|n| frame(FrameKind::User, 0x1000, &[n]))
            .collect();
        let mut next = 0;
        let samples = names
            .iter()
            .enumerate()
            .map(|(i, stack)| {
                // Leaf first, as profiles hold them.
                let indices: Vec<usize> = (next..next + stack.len()).rev().collect();
                next += stack.len();
                Sample {
                    pid: 7,
                    tid: i as u32,
                    process_comm: Arc::from("p"),
                    thread_comm: Arc::from("t"),
                    frames: indices,
                    unwind_status: UnwindStatus::Complete,
                    off_cpu_ns: 0,
                    count: 1 + i as u64,
                }
            })
            .collect();
        let profile = Profile {
            frames,
            samples,
            ..sample_profile()
        };
        let mut expected: BTreeMap<String, u64> = BTreeMap::new();
        for (i, stack) in names.iter().enumerate() {
            *expected
                .entry(format!("p;{}", stack.join(";")))
                .or_default() += 1 + i as u64;
        }
        let expected: String = expected
            .iter()
            .map(|(stack, count)| format!("{stack} {count}\n"))
            .collect();
        assert_eq!(encode(&profile), expected);
        assert!(
            expected.starts_with("p;a 3\np;a b;c 2\np;a;b 7\n"),
            "{expected}"
        );
    }

    #[test]
    fn counts_sum_to_total() {
        let p = sample_profile();
        let sum: u64 = folded_stacks(&p).values().sum();
        assert_eq!(sum, p.total_samples());
    }
}
