#!/usr/bin/env bash
# Pack what the GPU checks need (docs/GPU.md) into chunks that a machine without network can be
# sent one at a time: the release binary, the CUDA equivalence, static-cache and tree tests, the onnxruntime-gpu libraries
# and the SmolLM2 GGUF, as `c0 c1 ...` (44 MiB each, or CHUNK) plus `manifest` in OUT (default .gpu, which
# .gitignore keeps out of commits).
#
#   scripts/gpu/pack.sh [OUT [BASELINE]]
#
# BASELINE: another build of the m2r2 binary; device.sh then also exports SmolLM2 with it and
# measures both exports' cost shape side by side (an export change measured on the GPU).
#
# On the GPU machine, with the chunks and scripts/gpu/device.sh next to each other in OUT:
#   bash scripts/gpu/device.sh OUT RESULTS
set -euo pipefail
OUT=${1:-.gpu}
BASELINE=${2:-}
ORT_GPU_VERSION=1.31.1
CACHE=${M2R2_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/m2r2}
WORK=$CACHE/gpu-pack
mkdir -p "$OUT" "$WORK"

echo "building the release binary and the GPU tests" >&2
cargo build --release -p m2r2 >&2
# test_binary NAME: the release executable of onnx-runner's integration test NAME
test_binary() {
  cargo test --release -p m2r2-onnx-runner --test "$1" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1"
}
TESTS="equivalence static_cache trees"
for t in $TESTS; do
  [ -n "$(test_binary $t)" ] || { echo "error: no $t test executable" >&2; exit 1; }
done

WHEEL=$(ls "$WORK"/onnxruntime_gpu-$ORT_GPU_VERSION-*.whl 2>/dev/null | head -1 || true)
if [ -z "$WHEEL" ]; then
  echo "downloading onnxruntime-gpu $ORT_GPU_VERSION (about 256 MB)" >&2
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$WORK" "onnxruntime-gpu==$ORT_GPU_VERSION" >&2
  WHEEL=$(ls "$WORK"/onnxruntime_gpu-$ORT_GPU_VERSION-*.whl | head -1)
fi
if [ ! -f "$WORK/cuda-$ORT_GPU_VERSION.xz" ]; then
  echo "compressing the CUDA provider (284 MB; xz -9e takes a few minutes)" >&2
  unzip -p "$WHEEL" onnxruntime/capi/libonnxruntime_providers_cuda.so | xz -9e -T0 > "$WORK/cuda.tmp"
  mv "$WORK/cuda.tmp" "$WORK/cuda-$ORT_GPU_VERSION.xz"
fi
GGUF=$CACHE/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$GGUF" ] || { echo "error: $GGUF missing; run \`m2r2 fetch smollm2\` first" >&2; exit 1; }

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/cache/smollm2"
unzip -j -q "$WHEEL" "onnxruntime/capi/libonnxruntime.so.$ORT_GPU_VERSION" \
  onnxruntime/capi/libonnxruntime_providers_shared.so onnxruntime/capi/libonnxruntime_providers_tensorrt.so -d "$STAGE"
cp target/release/m2r2 "$STAGE/m2r2"
strip "$STAGE/m2r2"
for t in $TESTS; do cp "$(test_binary $t)" "$STAGE/$t" && strip "$STAGE/$t"; done
if [ -n "$BASELINE" ]; then cp "$BASELINE" "$STAGE/m2r2-baseline" && strip "$STAGE/m2r2-baseline"; fi
cp "$GGUF" "$STAGE/cache/smollm2/"
(cd "$STAGE" && tar cf - .) | xz -9 -T0 > "$WORK/a.tar.xz"
cat "$WORK/a.tar.xz" "$WORK/cuda-$ORT_GPU_VERSION.xz" > "$WORK/all.bin"
rm -f "$OUT"/c[0-9]*
split -b ${CHUNK:-44M} -d -a 1 "$WORK/all.bin" "$OUT/c"
{
  echo "ORT_GPU_VERSION=$ORT_GPU_VERSION"
  echo "TAR_BYTES=$(stat -c %s "$WORK/a.tar.xz")"
  echo "SHA256=$(sha256sum "$WORK/all.bin" | cut -d' ' -f1)"
  echo "CHUNKS=\"$(cd "$OUT" && ls c[0-9]* | tr '\n' ' ')\""
  echo "COMMIT=$(git describe --always --dirty)"
} > "$OUT/manifest"
rm -f "$WORK/all.bin"
cat "$OUT/manifest"
ls -la "$OUT" >&2
