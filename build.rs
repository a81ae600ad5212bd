//! Build script: compiles the BPF program with clang and generates its libbpf-rs
//! skeleton (libbpf-cargo), and generates the pprof message types from
//! `proto/profile.proto` and Pyroscope's push API types from
//! `proto/pyroscope/` with prost.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const BPF_SRC: &str = "src/bpf/profiler.bpf.c";

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
        .clang_args(["-Isrc/bpf", "-Wall", "-Wno-unused-function"])
        .build_and_generate(out.join("profiler.skel.rs"))
        .expect("compiling the BPF program (is clang installed? see scripts/setup.sh)");
    println!("cargo:rerun-if-changed=src/bpf");

    // pprof (`perftools.profiles`), and Pyroscope's push API (`push.v1`,
    // `types.v1`; its imports are relative to `proto/pyroscope`).
    prost_build::Config::new()
        .compile_protos(
            &["proto/profile.proto", "proto/pyroscope/push/v1/push.proto"],
            &["proto", "proto/pyroscope"],
        )
        .expect("generating the protobuf types (is protoc installed? see scripts/setup.sh)");
    println!("cargo:rerun-if-changed=proto");
}
