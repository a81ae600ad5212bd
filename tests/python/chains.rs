//! Stacks as the two tools print them, and the chains a scenario expects:
//! `go tool pprof -traces -lines` output of our pprof profile (labels, then
//! frames leaf first) and py-spy's raw output (`frame (file:line);... count`,
//! root first) are read into [`Stack`]s, root first; an [`Expected`] chain
//! names the script's frames (qualified name and line) and the native
//! frames that must lie between two of them.

/// One frame: function name, file and line (0 and "" for a native frame
/// without line).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub name: String,
    pub file: String,
    pub line: u32,
}

/// One stack with its sample count and thread id (0 where the tool gives none).
#[derive(Debug)]
pub struct Stack {
    pub tid: u32,
    pub count: u64,
    /// Root first.
    pub frames: Vec<Frame>,
}

impl Stack {
    /// The frames, leaf first, one a line, after the count.
    pub fn render(&self) -> String {
        let frames = self.frames.iter().rev().map(|f| match f.line {
            0 => f.name.clone(),
            line => format!("{} {}:{line}", f.name, f.file),
        });
        format!(
            "{} samples, tid {}:\n  {}",
            self.count,
            self.tid,
            frames.collect::<Vec<_>>().join("\n  ")
        )
    }
}

/// A pprof frame line: `NAME FILE:LINE [(inline)]`, `FILE:LINE` or `NAME`.
fn pprof_frame(text: &str) -> Frame {
    let text = text.trim().trim_end_matches("(inline)").trim_end();
    // A file is a path, or `<frozen MODULE>` (which has a space).
    let (name, place) = match text.find("<frozen ") {
        Some(at) => (text[..at].trim_end(), &text[at..]),
        None => text.rsplit_once(' ').unwrap_or(("", text)),
    };
    if let Some((file, line)) = place.rsplit_once(':') {
        if let Ok(line) = line.parse() {
            return Frame {
                name: name.to_string(),
                file: file.to_string(),
                line,
            };
        }
    }
    Frame {
        name: text.to_string(),
        file: String::new(),
        line: 0,
    }
}

/// `go tool pprof -sample_index=0 -traces -lines` of the pprof file
/// `profile`: every sample's stack with files and lines, as text.
pub fn traces_of(profile: &std::path::Path) -> String {
    crate::common::go_pprof(&[
        "-sample_index=0",
        "-traces",
        "-lines",
        crate::common::s(profile),
    ])
}

/// Stacks of `go tool pprof -sample_index=0 -traces -lines` output.
pub fn pprof_stacks(traces: &str) -> Vec<Stack> {
    let mut stacks = Vec::new();
    for block in traces.split("-----------+").skip(1) {
        let (mut tid, mut count, mut frames) = (0, None, Vec::new());
        for line in block.lines() {
            let trimmed = line.trim();
            if count.is_none() {
                if let Some(value) = trimmed.strip_prefix("tid:") {
                    tid = value.trim().parse().unwrap_or(0);
                    continue;
                }
                match trimmed.split_once("   ").map(|(n, rest)| (n.parse(), rest)) {
                    Some((Ok(n), rest)) => {
                        count = Some(n);
                        frames.push(pprof_frame(rest));
                    }
                    _ => continue,
                }
            } else if !trimmed.is_empty() {
                frames.push(pprof_frame(trimmed));
            }
        }
        frames.reverse();
        if let Some(count) = count {
            stacks.push(Stack { tid, count, frames });
        }
    }
    stacks
}

/// Stacks of py-spy's raw output.
pub fn spy_stacks(raw: &str) -> Vec<Stack> {
    let mut stacks = Vec::new();
    for l in raw.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let Ok(count) = n.parse() else {
            continue;
        };
        let frames = stack
            .split(';')
            .map(|f| {
                let (name, place) = f.rsplit_once(" (").unwrap_or((f, ")"));
                let place = place.trim_end_matches(')');
                let (file, line) = place.rsplit_once(':').unwrap_or((place, "0"));
                Frame {
                    name: name.to_string(),
                    file: file.to_string(),
                    line: line.parse().unwrap_or(0),
                }
            })
            .collect();
        stacks.push(Stack {
            tid: 0,
            count,
            frames,
        });
    }
    stacks
}

/// One step of an expected chain, root first.
#[derive(Debug, Clone)]
pub enum Step {
    /// A frame of the script: qualified name, accepted lines.
    Python(String, Vec<u32>),
    /// Native code between the script frames around it: one frame with
    /// this name, or (an interpreter without a symbol table for it) one
    /// frame the profile names only as `OBJECT+0xOFFSET`.
    Native(&'static str),
}

/// A chain of steps over the frames of one script.
#[derive(Debug, Clone)]
pub struct Expected {
    pub script: String,
    pub steps: Vec<Step>,
}

impl Expected {
    /// The script's frames of `stack`, root first, with their indices.
    fn script_frames<'a>(&self, stack: &'a Stack) -> Vec<(usize, &'a Frame)> {
        stack
            .frames
            .iter()
            .enumerate()
            .filter(|(_, f)| f.file == self.script)
            .collect()
    }

    /// The name of the script's outermost frame in `stack`, if any.
    pub fn root(&self, stack: &Stack) -> Option<String> {
        self.script_frames(stack)
            .first()
            .map(|(_, f)| f.name.clone())
    }

    /// Whether `stack`'s script frames are exactly the chain (names and
    /// lines), with the native steps between them when `native` is set.
    pub fn matches(&self, stack: &Stack, native: bool) -> bool {
        let mine = self.script_frames(stack);
        let python: Vec<(&String, &Vec<u32>)> = self
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Python(name, lines) => Some((name, lines)),
                Step::Native(_) => None,
            })
            .collect();
        if mine.len() != python.len()
            || !mine
                .iter()
                .zip(&python)
                .all(|((_, f), (name, lines))| f.name == **name && lines.contains(&f.line))
        {
            return false;
        }
        if !native {
            return true;
        }
        let mut seen = 0; // Python steps passed
        for step in &self.steps {
            match step {
                Step::Python(..) => seen += 1,
                Step::Native(want) => {
                    if seen == 0 || seen >= mine.len() {
                        return false;
                    }
                    let between = &stack.frames[mine[seen - 1].0 + 1..mine[seen].0];
                    let unnamed = |f: &Frame| f.file.is_empty() && f.name.contains("+0x");
                    if !between.iter().any(|f| f.name == *want || unnamed(f)) {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// Line (1-based) of the first line of `script` containing `needle`.
pub fn line_of(script: &str, needle: &str) -> u32 {
    script
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in the script")) as u32
        + 1
}

/// Lines of the body of `def NAME(`: from the line after it to the last
/// non-blank line before the next blank line.
pub fn body_of(script: &str, name: &str) -> Vec<u32> {
    let def = line_of(script, &format!("def {name}("));
    script
        .lines()
        .skip(def as usize)
        .take_while(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, _)| def + 1 + i as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_of_both_tools_are_read() {
        let f = pprof_frame("leaf_work /tmp/x/s.py:6");
        assert_eq!(
            (f.name.as_str(), f.file.as_str(), f.line),
            ("leaf_work", "/tmp/x/s.py", 6)
        );
        let f = pprof_frame("/tmp/x/s.py:140");
        assert_eq!((f.name.as_str(), f.line), ("", 140));
        let f = pprof_frame("pymalloc_free /a/obmalloc.c:1809 (inline)");
        assert_eq!((f.name.as_str(), f.line), ("pymalloc_free", 1809));
        let f = pprof_frame("_load_unlocked <frozen importlib._bootstrap>:690");
        assert_eq!(
            (f.name.as_str(), f.file.as_str()),
            ("_load_unlocked", "<frozen importlib._bootstrap>")
        );
        let f = pprof_frame("<frozen importlib._bootstrap_external>:1550");
        assert_eq!((f.name.as_str(), f.line), ("", 1550));
        let f = pprof_frame("[python: unknown]");
        assert_eq!((f.name.as_str(), f.line), ("[python: unknown]", 0));
        let s = spy_stacks("<module> (/s.py:9);Shape.area (/s.py:3) 12\n");
        assert_eq!(s[0].count, 12);
        assert_eq!(s[0].frames[1].name, "Shape.area");
        assert_eq!(s[0].frames[1].line, 3);
    }
}
