//! The lines of a frame, built from what a source found: demangled names,
//! source locations, inlined chains, and placeholders for what it did not.

use std::path::Path;
use std::sync::Arc;

use blazesym::symbolize::{CodeInfo, Symbolized};

use crate::profile::Line;

/// The lines of one frame (innermost first) and whether a source named it.
pub(super) type Lines = (Vec<Line>, bool);

/// [`Lines`] as the line cache and a window's profile hold them: shared by
/// every location of the same site (under process churn a 10 s window has
/// 60,000-70,000 locations, each process mapping its objects at addresses
/// of its own, for a few thousand sites).
pub(super) type SharedLines = (Arc<[Line]>, bool);

/// Where a source looks a frame up: `(group, address)`, where the group is
/// the source's own unit of work (an object id, a process id, or 0 when the
/// source has one unit) and the address is what the source resolves within
/// it (a file offset, an absolute address). See `sources.rs`.
pub(super) type Site = (u64, u64);

/// Demangle a Rust (legacy or v0) or C++ (Itanium) symbol name; other names
/// are returned unchanged.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        if let Some(d) = super::cpp_names::demangle(name) {
            return d;
        }
    }
    name.to_string()
}

fn source_file(info: &CodeInfo<'_>) -> Arc<str> {
    Arc::from(info.to_path().to_string_lossy().as_ref())
}

/// The line of function `name` (mangled or not), at `info` if known.
pub(super) fn line_of(name: &str, info: Option<&CodeInfo<'_>>) -> Line {
    Line {
        function: Arc::from(demangle(name)),
        system_name: Arc::from(name),
        file: info.map(source_file),
        line: info.and_then(|i| i.line),
    }
}

/// A placeholder line such as `object+0xOFFSET`.
pub(super) fn unknown_line(name: String) -> Line {
    let name: Arc<str> = Arc::from(name);
    Line {
        function: name.clone(),
        system_name: name,
        file: None,
        line: None,
    }
}

/// Lines for one address blazesym symbolized, innermost first.
pub(super) fn lines_of(sym: &Symbolized<'_>) -> Option<Vec<Line>> {
    let Symbolized::Sym(sym) = sym else {
        return None;
    };
    // blazesym reports `f` (the real function, with the code location of its
    // call into the first inlined function) and then the inlined chain
    // outermost first, each with its own location.
    let mut lines = Vec::with_capacity(sym.inlined.len() + 1);
    for inlined in sym.inlined.iter().rev() {
        lines.push(line_of(&inlined.name, inlined.code_info.as_ref()));
    }
    lines.push(line_of(&sym.name, sym.code_info.as_deref()));
    Some(lines)
}

/// The last component of `path` (all of it when it has none).
pub(super) fn file_name(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}
