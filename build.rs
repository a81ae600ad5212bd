//! Build script: compiles the BPF program with clang and generates its libbpf-rs
//! skeleton (libbpf-cargo), the Rust constants of the numbers the BPF
//! headers `#define` for both sides (`bpf_defines.rs`, see [`defines`]),
//! and generates with prost the pprof message
//! types from `proto/profile.proto`, Pyroscope's push API types from
//! `proto/pyroscope/`, Perfetto's trace packets from `proto/perfetto/` and
//! the OpenTelemetry profiles types from
//! `proto/otlp/` (module tree in `otlp.rs`, see `src/profile/format/otlp/mod.rs`).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use libbpf_cargo::SkeletonBuilder;

const BPF_SRC: &str = "src/sampling/bpf/profiler.bpf.c";

/// The BPF headers whose numeric `#define`s user space reads too: the
/// records and tables (`profiler.h`), the architecture's registers and
/// address limits (`arch_x86_64.h`) and the Python walker's program slot,
/// missing-offset value and frame flags (`python.h`).
const SHARED_HEADERS: [&str; 3] = [
    "src/sampling/bpf/profiler.h",
    "src/sampling/bpf/arch_x86_64.h",
    "src/sampling/bpf/python.h",
];

/// One `pub const NAME: u64 = VALUE;` for each object-like `#define NAME
/// VALUE` of `header` whose value is an integer expression: numbers (C
/// suffixes `U`, `L`, `ULL` dropped), names defined above it, parentheses and
/// `+ - * << >> | &`. Function-like macros, header guards and any other
/// value are not numbers both sides share, and are left out. Each constant
/// carries its C comment's line for its docstring.
fn defines(header: &Path) -> String {
    let text = std::fs::read_to_string(header)
        .unwrap_or_else(|e| panic!("reading {}: {e}", header.display()));
    let mut out = String::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("#define") else {
            continue;
        };
        let rest = rest.trim_start();
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (name, value) = rest.split_at(name_len);
        // `NAME(` is a function-like macro.
        if name.is_empty() || value.starts_with('(') {
            continue;
        }
        let value = value.split("/*").next().unwrap_or("").trim();
        let Some(expr) = rust_expression(value) else {
            continue;
        };
        let _ = writeln!(
            out,
            "/// `{name}` in `{}`: `{value}`.\n#[allow(unused_parens)]\npub const {name}: u64 = {expr};",
            header.display()
        );
    }
    out
}

/// `value`, a C integer expression, as a Rust one of `u64`s; `None` when it
/// is not one (empty, a string, a cast, a call).
fn rust_expression(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    let mut out = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            let mut number = String::from(c);
            while let Some(&d) = chars.peek() {
                if d.is_ascii_hexdigit() || d == 'x' || d == 'X' {
                    number.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            while let Some(&d) = chars.peek() {
                if matches!(d, 'u' | 'U' | 'l' | 'L') {
                    chars.next();
                } else {
                    break;
                }
            }
            out.push_str(&number);
        } else if c.is_ascii_alphabetic() || c == '_' {
            let mut ident = String::from(c);
            while let Some(&d) = chars.peek() {
                if d.is_ascii_alphanumeric() || d == '_' {
                    ident.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            // Only names of constants (a lower-case word is a type or a call).
            if !ident
                .chars()
                .all(|d| d.is_ascii_uppercase() || d.is_ascii_digit() || d == '_')
            {
                return None;
            }
            out.push_str(&ident);
        } else if "()+-*<>|& ".contains(c) {
            out.push(c);
        } else {
            return None;
        }
    }
    Some(out)
}

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut builder = SkeletonBuilder::new();
    // `CLANG` selects the compiler (the nix dev shell points it at an unwrapped clang).
    if let Some(clang) = env::var_os("CLANG") {
        builder.clang(clang);
    }
    println!("cargo:rerun-if-env-changed=CLANG");
    builder
        .source(BPF_SRC)
        .clang_args(["-Isrc/sampling/bpf", "-Wall", "-Wno-unused-function"])
        .build_and_generate(out.join("profiler.skel.rs"))
        .expect("compiling the BPF program (is clang installed? see scripts/setup.sh)");
    println!("cargo:rerun-if-changed=src/sampling/bpf");
    let consts = SHARED_HEADERS
        .iter()
        .map(|h| defines(Path::new(h)))
        .collect::<Vec<_>>()
        .concat();
    std::fs::write(out.join("bpf_defines.rs"), consts).expect("writing bpf_defines.rs");

    // pprof (`perftools.profiles`), Pyroscope's push API (`push.v1`,
    // `types.v1`; its imports are relative to `proto/pyroscope`) and
    // Perfetto's trace packets (`perfetto.protos`).
    prost_build::Config::new()
        .compile_protos(
            &[
                "proto/profile.proto",
                "proto/pyroscope/push/v1/push.proto",
                "proto/perfetto/perfetto_trace.proto",
            ],
            &["proto", "proto/pyroscope"],
        )
        .expect("generating the protobuf types (is protoc installed? see scripts/setup.sh)");
    // OpenTelemetry profiles: the export request and what it imports; one
    // file nests the generated packages as modules (`opentelemetry::proto::…`).
    prost_build::Config::new()
        .include_file("otlp.rs")
        .compile_protos(
            &["proto/otlp/opentelemetry/proto/collector/profiles/v1development/profiles_service.proto"],
            &["proto/otlp"],
        )
        .expect("generating the OTLP protobuf types (is protoc installed? see scripts/setup.sh)");
    println!("cargo:rerun-if-changed=proto");
}
