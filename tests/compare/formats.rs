//! One real run written in every format `diff` reads diffs to nothing
//! across each pair, a function whose name holds a `;` (which folded
//! stacks write as `:`) included.

use crate::common::*;
use crate::lightswitch;

/// A Rust program whose hot function's name has a `;` in it (`<[u8; 4] as
/// Spin>::spin`, which folded stacks write with `:`), beside a plain one;
/// each spins for 300 ms of CPU time.
const SEMICOLON_SOURCE: &str = r#"
use std::hint::black_box;
use std::time::{Duration, Instant};
trait Spin {
    fn spin(&self, ms: u64) -> u64;
}
impl Spin for [u8; 4] {
    #[inline(never)]
    fn spin(&self, ms: u64) -> u64 {
        let end = Instant::now() + Duration::from_millis(ms);
        let mut n = 0u64;
        while Instant::now() < end {
            n = black_box(n + self[0] as u64);
        }
        n
    }
}
#[inline(never)]
fn plain(ms: u64) -> u64 {
    let end = Instant::now() + Duration::from_millis(ms);
    let mut n = 0u64;
    while Instant::now() < end {
        n = black_box(n + 1);
    }
    n
}
fn main() {
    println!("{}", black_box([1u8; 4]).spin(300) + plain(300));
}
"#;

/// One real run written in every format `diff` reads (folded stacks,
/// pprof, a Firefox timeline, OTLP, a Perfetto trace), with a function whose name holds a
/// `;`: every pair of them diffs to nothing, in both directions.
#[test]
fn one_run_in_every_format_diffs_to_nothing() {
    let _serial = serial();
    let dir = tempdir();
    let src = dir.path().join("main.rs");
    std::fs::write(&src, SEMICOLON_SOURCE).unwrap();
    let bin = dir.path().join("cmp_semicolon");
    let built = std::process::Command::new("rustc")
        .args(["--edition", "2021", "-C", "opt-level=2", "-g", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("running rustc");
    assert!(
        built.status.success(),
        "rustc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = lightswitch(&[
        "record",
        "--sample-freq",
        "499",
        "--profile-path",
        s(dir.path()),
        "--profile-format",
        "folded,pprof,firefox,otlp,perfetto",
        "--",
        s(&bin),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    let folded = std::fs::read_to_string(dir.path().join("folded.txt")).unwrap();
    assert!(
        folded.contains("[u8: 4] as "),
        "no sample of the name with a ';':\n{folded}"
    );
    let files = [
        "folded.txt",
        "profile.pb",
        "profile.json.gz",
        "profile.otlp.pb",
        "profile.perfetto-trace",
    ]
    .map(|name| dir.path().join(name));
    for base in &files {
        for new in &files {
            let out = lightswitch(&["diff", "--output", "json", "--top", "0", s(base), s(new)]);
            assert_eq!(out.status.code(), Some(0), "{out}");
            let value: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
            assert_eq!(
                value["functions"],
                serde_json::json!([]),
                "{} against {}",
                base.display(),
                new.display()
            );
            assert_eq!(value["base"]["samples"], value["new"]["samples"], "{value}");
        }
    }
}
