//! Tables of small C programs compiled by the test (a 100 KiB frame,
//! frame-pointer functions, `.debug_frame` and a separate debug file,
//! corrupt `.eh_frame` bytes) checked against gimli as
//! [`super::build_and_compare`] does. Skipped without gcc.

use std::path::{Path, PathBuf};
use std::process::Command;

use object::{Object, ObjectSection, ObjectSymbol};

use super::build_and_compare;
use crate::sampling::unwind_row::CFA_OFFSET_SCALED;
use crate::unwind::cfi::{
    build_table, build_table_from_path, build_table_with_debug_file, BuildError,
};
use crate::unwind::rule::{Fp, Rule};
use crate::unwind::table::CfiSource;

/// A scratch directory with C sources compiled by gcc; `None` without gcc.
struct Compiled {
    dir: tempfile::TempDir,
}

impl Compiled {
    fn new() -> Option<Compiled> {
        let gcc = Command::new("gcc").arg("--version").output();
        if !gcc.is_ok_and(|o| o.status.success()) {
            eprintln!("skipped: no gcc");
            return None;
        }
        Some(Compiled {
            dir: tempfile::tempdir().expect("tempdir"),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Compiles `source` with `flags` into `name`.
    fn gcc(&self, name: &str, source: &str, flags: &[&str]) -> PathBuf {
        let src = self.path(&format!("{name}.c"));
        std::fs::write(&src, source).expect("write source");
        let out = self.path(name);
        run(Command::new("gcc")
            .args(flags)
            .arg("-o")
            .arg(&out)
            .arg(&src));
        out
    }
}

fn run(command: &mut Command) {
    let output = command.output().expect("spawn");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Address range of function `name` in the object at `path`.
fn function(path: &Path, name: &str) -> (u64, u64) {
    let bytes = std::fs::read(path).expect("read");
    let file = object::File::parse(&*bytes).expect("ELF");
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (sym.address(), sym.address() + sym.size())
}

const BIG_FRAME: &str = r#"
#include <stdio.h>
__attribute__((noinline)) int big(int n) {
    volatile char buf[102400];
    for (int i = 0; i < n; i++) buf[(i * 97) % 102400] = (char)i;
    return buf[n % 102400];
}
__attribute__((noinline)) int framed(int n) {
    volatile int a[4];
    a[n & 3] = n;
    return big(n) + a[0] + puts("x");
}
int main(int argc, char **argv) { (void)argv; return framed(argc * 1000); }
"#;

#[test]
fn hundred_kib_frame_is_a_scaled_rsp_offset() {
    let Some(c) = Compiled::new() else { return };
    let exe = c.gcc("big", BIG_FRAME, &["-O2", "-fomit-frame-pointer"]);
    let bytes = std::fs::read(&exe).expect("read");
    let (table, report) = build_and_compare(&bytes, None);
    report.assert_good("big", 0.05);
    let (start, end) = function(&exe, "big");
    let big_rows: Vec<Rule> = table
        .iter_rows()
        .filter(|r| r.start >= start && r.start < end)
        .map(|r| r.rule)
        .collect();
    let largest = big_rows
        .iter()
        .filter_map(|r| match r {
            Rule::RspOffset { cfa, .. } => Some(cfa.bytes()),
            _ => None,
        })
        .max()
        .expect("rsp rows in big");
    // The red zone lets gcc allocate up to 128 bytes less than the array.
    assert!(
        (102400 - 256..102400 + 256).contains(&largest),
        "{big_rows:?}"
    );
    let raw = table
        .rows()
        .iter()
        .find(|r| r.cfa_type & CFA_OFFSET_SCALED != 0 && u32::from(r.cfa_offset) * 8 == largest);
    assert!(raw.is_some(), "the 100 KiB offset is stored scaled");
    // `_start` marks the outermost frame; the .plt uses the PLT expression.
    let (start, _) = function(&exe, "_start");
    assert!(table
        .iter_rows()
        .any(|r| r.rule == Rule::Outermost && r.start >= start));
    assert!(table
        .iter_rows()
        .any(|r| matches!(r.rule, Rule::Plt { threshold: 11, .. })));
}

#[test]
fn frame_pointer_functions_use_rbp_rules() {
    let Some(c) = Compiled::new() else { return };
    let exe = c.gcc("fp", BIG_FRAME, &["-O2", "-fno-omit-frame-pointer"]);
    let bytes = std::fs::read(&exe).expect("read");
    let (table, report) = build_and_compare(&bytes, None);
    report.assert_good("fp", 0.05);
    let (start, end) = function(&exe, "framed");
    let rules: Vec<Rule> = table
        .iter_rows()
        .filter(|r| r.start >= start && r.start < end)
        .map(|r| r.rule)
        .collect();
    let framed = rules.iter().any(
        |r| matches!(r, Rule::RbpOffset { cfa, fp: Fp::AtCfaOffset(-2), .. } if cfa.bytes() == 16),
    );
    assert!(framed, "{rules:?}");
}

#[test]
fn debug_frame_and_separate_debug_file() {
    let Some(c) = Compiled::new() else { return };
    // Enough functions that zstd shrinks .debug_frame (objcopy leaves a
    // section uncompressed when compressing would not make it smaller).
    let callers: String = (0..64)
        .map(|i| {
            format!(
                "int f{i}(int x) {{ volatile char b[{}]; b[x & 7] = 1; return mid(x + {i}) + b[1]; }}\n",
                i * 8 + 16
            )
        })
        .collect();
    let lib = c.gcc(
        "libdf.so",
        &format!(
            "int leaf(int x) {{ return x * 3; }}\n\
             int mid(int x) {{ volatile char b[300]; b[x & 255] = 1; return leaf(x) + b[0]; }}\n\
             {callers}"
        ),
        &[
            "-shared",
            "-nostdlib",
            "-fPIC",
            "-O2",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let bytes = std::fs::read(&lib).expect("read");
    let (table, report) = build_and_compare(&bytes, None);
    report.assert_good("debug_frame", 0.0);
    assert_eq!(table.stats().source, CfiSource::DebugFrame);

    // Split the debug info off, as distributions do.
    if !Command::new("objcopy")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped the debug-file part: no objcopy");
        return;
    }
    let debug = c.path("libdf.debug");
    let stripped_dir = c.path("stripped");
    std::fs::create_dir(&stripped_dir).expect("mkdir");
    let stripped = stripped_dir.join("libdf.so");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&lib)
        .arg(&debug));
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&lib)
        .arg(&stripped));
    let stripped_bytes = std::fs::read(&stripped).expect("read");
    assert!(matches!(
        build_table(&stripped_bytes),
        Err(BuildError::NoCfi)
    ));
    let debug_bytes = std::fs::read(&debug).expect("read");
    let (from_debug, report) = build_and_compare(&stripped_bytes, Some(&debug_bytes));
    report.assert_good("debug file", 0.0);
    assert_eq!(from_debug, table);

    // The debuglink is found next to the object (`.debug/`), CRC-checked.
    std::fs::create_dir(stripped_dir.join(".debug")).expect("mkdir");
    std::fs::copy(&debug, stripped_dir.join(".debug/libdf.debug")).expect("copy");
    assert_eq!(
        build_table_from_path(&stripped, &[]).expect("via debuglink"),
        table
    );

    // A zlib- or zstd-compressed .debug_frame gives the same table.
    for format in ["zlib", "zstd"] {
        let compressed = c.path(&format!("libdf.{format}.debug"));
        run(Command::new("objcopy")
            .arg(format!("--compress-debug-sections={format}"))
            .arg(&debug)
            .arg(&compressed));
        let compressed_bytes = std::fs::read(&compressed).expect("read");
        let file = object::File::parse(&*compressed_bytes).expect("parses");
        let section = file.section_by_name(".debug_frame").expect(".debug_frame");
        let expected = match format {
            "zlib" => object::CompressionFormat::Zlib,
            _ => object::CompressionFormat::Zstandard,
        };
        assert_eq!(section.compressed_data().expect("data").format, expected);
        assert_eq!(
            build_table_with_debug_file(&stripped_bytes, Some(&compressed_bytes)).expect(format),
            table
        );
    }
}

#[test]
fn corrupt_eh_frame_bytes_never_panic() {
    let Some(c) = Compiled::new() else { return };
    let exe = c.gcc("small", "int main(void) { return 0; }\n", &["-O2"]);
    let bytes = std::fs::read(&exe).expect("read");
    let file = object::File::parse(&*bytes).expect("ELF");
    let (offset, size) = file
        .section_by_name(".eh_frame")
        .and_then(|s| s.file_range())
        .expect(".eh_frame in the file");
    drop(file);
    let mut outcomes = [0u32; 2];
    for i in offset..offset + size {
        for value in [0x00, 0xff, 0x41] {
            let mut corrupt = bytes.clone();
            corrupt[i as usize] = value;
            outcomes[usize::from(build_table(&corrupt).is_ok())] += 1;
        }
    }
    eprintln!(
        "corrupted .eh_frame: {} errors, {} tables",
        outcomes[0], outcomes[1]
    );
    assert!(outcomes[0] > 0);
}
