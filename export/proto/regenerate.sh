#!/usr/bin/env bash
# Regenerate export/src/proto/onnx.rs from export/proto/onnx.proto with prost-build 0.14 and the
# protoc shipped in protoc-bin-vendored (no system protoc needed). Normal builds never run this:
# the generated file is committed, so the crate depends on `prost` alone.
#
# onnx.proto is copied verbatim from the pip package onnx==1.23.2 (site-packages/onnx/onnx.proto,
# IR_VERSION 14). To update: pip install onnx==X, copy its onnx.proto here, run this script, and
# record the version in export/src/proto/mod.rs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src" "$work/gen"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "gen-onnx"
version = "0.1.0"
edition = "2021"
[dependencies]
prost = "0.14"
[build-dependencies]
prost-build = "0.14"
protoc-bin-vendored = "3"
TOML
cat > "$work/build.rs" <<RS
fn main() {
    unsafe { std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path().unwrap()); }
    prost_build::Config::new()
        .out_dir("gen")
        .compile_protos(&["$here/onnx.proto"], &["$here/"])
        .unwrap();
}
RS
echo 'fn main() {}' > "$work/src/main.rs"
(cd "$work" && cargo build --quiet)
cp "$work/gen/onnx.rs" "$here/../src/proto/onnx.rs"
echo "wrote $here/../src/proto/onnx.rs"
