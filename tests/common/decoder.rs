//! The independent decoders of the output formats: Python scripts run in
//! the virtual environments `scripts/setup.sh` makes under the target
//! directory (PyPI `opentelemetry-proto` for OTLP, `perfetto` for Perfetto
//! traces), each printing a JSON summary of one file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::Stack;

/// One decoder: the variable that may name its Python, its virtual
/// environment's folder in the target directory, and its script (relative
/// to the crate's root).
pub struct Decoder {
    pub python_var: &'static str,
    pub venv: &'static str,
    pub script: &'static str,
}

impl Decoder {
    /// The Python that runs the script: `$python_var`, else the virtual
    /// environment's.
    pub fn python(&self) -> PathBuf {
        if let Some(python) = std::env::var_os(self.python_var) {
            return python.into();
        }
        Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("the target directory")
            .join(self.venv)
            .join("bin/python3")
    }

    /// Run the script on `path`; its JSON summary. Panics with the script's
    /// message when a rule is broken or the package is missing.
    pub fn check(&self, path: &Path) -> Value {
        let python = self.python();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(self.script);
        let out = Command::new(&python)
            .arg(&script)
            .arg(path)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "running {} (scripts/setup.sh makes it, or set {}): {e}",
                    python.display(),
                    self.python_var
                )
            });
        assert!(
            out.status.success(),
            "{} on {}:\n{}",
            script.display(),
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the check's JSON summary")
    }
}

/// A decoder summary's folded lines (its `folded` object).
pub fn folded_of(summary: &Value) -> BTreeMap<String, u64> {
    summary["folded"]
        .as_object()
        .expect("folded")
        .iter()
        .map(|(line, n)| (line.clone(), n.as_u64().expect("a count")))
        .collect()
}

/// Folded stacks as lines with their counts (identical lines added up).
pub fn folded_lines(folded: &[Stack]) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for (frames, n) in folded {
        *lines.entry(frames.join(";")).or_default() += n;
    }
    lines
}
