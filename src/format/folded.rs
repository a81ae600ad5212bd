//! Folded stacks (Brendan Gregg's FlameGraph input, also read by inferno):
//! one line per distinct stack, `comm;root;...;leaf COUNT`, frames joined by
//! `;`, the count after the last space. User frames come first (root to leaf,
//! inlined functions after the function they were inlined into), then kernel
//! frames, each suffixed `_[k]` so flame graph palettes colour them as kernel.
//! A stack whose user walk stopped early starts with its unwind marker
//! (e.g. `[unwind: truncated]`) right after the process name.

use std::collections::BTreeMap;

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
    encode: |profile, _| Ok(encode(profile).into_bytes()),
};

/// Suffix that marks a kernel frame in folded stacks.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// A frame name made safe for the folded format (`;` separates frames and a
/// newline ends the line): `;` becomes `:`, line breaks spaces.
pub fn clean(name: &str) -> String {
    name.replace(';', ":").replace(['\n', '\r'], " ")
}

/// The folded stacks of `profile`, merged (identical stacks of different
/// threads add up) and sorted, as `(stack, count)`.
pub fn folded_stacks(profile: &Profile) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for sample in &profile.samples {
        let mut names = vec![clean(&sample.process_comm)];
        for &index in sample.frames.iter().rev() {
            let frame = &profile.frames[index];
            for line in frame.lines.iter().rev() {
                let mut name = clean(&line.function);
                if frame.kind == FrameKind::Kernel {
                    name.push_str(KERNEL_SUFFIX);
                }
                names.push(name);
            }
        }
        *out.entry(names.join(";")).or_insert(0) += sample.count;
    }
    out
}

/// Encode `profile` as folded-stack text, one `stack count` line per stack.
pub fn encode(profile: &Profile) -> String {
    let mut text = String::new();
    for (stack, count) in folded_stacks(profile) {
        text.push_str(&stack);
        text.push(' ');
        text.push_str(&count.to_string());
        text.push('\n');
    }
    text
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::profile::{Frame, Line, Sample};
    use crate::sample::UnwindStatus;

    fn line(name: &str) -> Line {
        Line {
            function: Arc::from(name),
            system_name: Arc::from(name),
            file: None,
            line: None,
        }
    }

    fn frame(kind: FrameKind, address: u64, names: &[&str]) -> Frame {
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

    #[test]
    fn counts_sum_to_total() {
        let p = sample_profile();
        let sum: u64 = folded_stacks(&p).values().sum();
        assert_eq!(sum, p.total_samples());
    }
}
