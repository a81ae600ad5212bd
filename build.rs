//! Build script: compiles the BPF program with clang and generates its libbpf-rs
//! skeleton (libbpf-cargo), and generates with prost the pprof message
//! types from `proto/profile.proto`, Pyroscope's push API types from
//! `proto/pyroscope/` and the OpenTelemetry profiles types from
//! `proto/otlp/` (module tree in `otlp.rs`, see `src/profile/format/otlp/mod.rs`).

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const BPF_SRC: &str = "src/sampling/bpf/profiler.bpf.c";

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

    // pprof (`perftools.profiles`), and Pyroscope's push API (`push.v1`,
    // `types.v1`; its imports are relative to `proto/pyroscope`).
    prost_build::Config::new()
        .compile_protos(
            &["proto/profile.proto", "proto/pyroscope/push/v1/push.proto"],
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
