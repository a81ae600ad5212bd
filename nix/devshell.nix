# The same build inputs scripts/setup.sh installs on Debian: clang for the BPF
# program, libelf + zlib + pkg-config for libbpf, protoc for the pprof types,
# Go for `go tool pprof` in the tests, util-linux for setpriv/unshare, man-db
# for the man page test.
{ pkgs }:
pkgs.mkShell {
  packages = with pkgs; [
    cargo
    rustc
    rustfmt
    clippy
    gcc
    gnumake
    pkg-config
    elfutils
    zlib
    protobuf
    go
    util-linux
    man-db
  ];
  nativeBuildInputs = [ pkgs.llvmPackages.clang-unwrapped ];
  # The BPF target needs an unwrapped clang (the cc-wrapper adds host flags).
  CLANG = "${pkgs.llvmPackages.clang-unwrapped}/bin/clang";
  # Vendored libbpf is built with -Werror-free flags; hardening adds flags clang
  # rejects for the BPF target.
  hardeningDisable = [ "all" ];
}
