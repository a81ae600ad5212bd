//! `lightswitch show-unwind PATH`: an object's table as text, one row per
//! line, then a summary.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::cfi::build_table_at;
use super::identity::ObjectKey;
use super::table::UnwindTable;

/// Builds the table of the object at `path` (its separate debug file, found
/// under `debug_dirs`, is used when the object has no CFI) and renders it
/// with [`render`].
pub fn show_unwind(path: &Path, debug_dirs: &[PathBuf]) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let table = build_table_at(path, &bytes, debug_dirs)
        .with_context(|| format!("unwind table of {}", path.display()))?;
    let key = ObjectKey::for_object(&bytes);
    Ok(render(&format!("{} ({key})", path.display()), &table))
}

/// The table as text: a header naming `title`, one line per row (start
/// address in hex, CFA rule such as `rsp+8`, `rbp+16`, `plt(11)`,
/// `signal-frame`, `end-of-function`, `outermost`, `unsupported(kind)`, and
/// for CFA rules the rbp rule such as `rbp=*(cfa-16)` or `rbp=unchanged`
/// and the rbx rule such as `rbx=*(cfa-56)`),
/// then the summary: rows, pages, bytes, FDEs, unsupported rules by kind and
/// the source section.
pub fn render(title: &str, table: &UnwindTable) -> String {
    let stats = table.stats();
    let mut out = String::with_capacity(table.rows().len() * 40 + 512);
    // Writing to a String cannot fail.
    let _ = writeln!(out, "unwind table of {title}");
    let _ = writeln!(out, "{:<18} {:<28} {:<20} rbx", "address", "cfa", "rbp");
    for row in table.iter_rows() {
        let _ = match (row.rule.fp(), row.rule.bx()) {
            (Some(fp), Some(bx)) => writeln!(
                out,
                "{:<#18x} {:<28} {:<20} {bx}",
                row.start,
                row.rule.to_string(),
                fp.to_string()
            ),
            _ => writeln!(out, "{:<#18x} {}", row.start, row.rule),
        };
    }
    let _ = writeln!(out, "rows: {}", stats.rows);
    let _ = writeln!(
        out,
        "pages: {} (at most {} rows in one)",
        stats.pages, stats.max_page_rows
    );
    let _ = writeln!(
        out,
        "bytes: {} ({} rows * 8 + {} pages * 16)",
        stats.bytes, stats.rows, stats.pages
    );
    let _ = writeln!(out, "fdes: {}", stats.fdes);
    if stats.unsupported.is_empty() {
        let _ = writeln!(out, "unsupported rules: none");
    } else {
        let total: u64 = stats.unsupported.values().sum();
        let _ = writeln!(out, "unsupported rules: {total}");
        for (kind, count) in &stats.unsupported {
            let _ = writeln!(out, "  {kind} ({}): {count}", kind.code());
        }
    }
    let _ = writeln!(out, "source: {}", stats.source);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_table_renders_rows_and_summary() {
        let path = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        if !path.exists() {
            eprintln!("skipped: {} is absent", path.display());
            return;
        }
        let text = show_unwind(path, &[]).expect("libc has a table");
        assert!(text.starts_with("unwind table of /lib/x86_64-linux-gnu/libc.so.6 (buildid-"));
        for needle in [
            "signal-frame",
            "plt(11)",
            "end-of-function",
            "rbp=*(cfa-16)",
            "rbp=unchanged",
            "rbx=*(cfa-56)",
            "rbx=unchanged",
            "\nrows: ",
            "\npages: ",
            "\nbytes: ",
            "\nfdes: ",
            "\nunsupported rules: ",
            "\nsource: .eh_frame\n",
        ] {
            assert!(text.contains(needle), "missing {needle:?}");
        }
    }

    #[test]
    fn missing_and_non_elf_files_are_errors() {
        assert!(show_unwind(Path::new("/nonexistent/lib.so"), &[]).is_err());
        let dir = tempfile::tempdir().expect("tempdir");
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not an object").expect("write");
        let err = show_unwind(&text, &[]).expect_err("not ELF");
        assert!(format!("{err:#}").contains("notes.txt"), "{err:#}");
    }
}
