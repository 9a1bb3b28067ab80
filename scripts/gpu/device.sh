#!/usr/bin/env bash
# The GPU checks of docs/GPU.md, on a machine with an NVIDIA GPU, CUDA 13 libraries in the Python
# environment (torch's nvidia-* wheels) and no network. PACK holds what scripts/gpu/pack.sh wrote.
#
#   bash scripts/gpu/device.sh stash PACK          # keep the chunks present in PACK (one call each)
#   bash scripts/gpu/device.sh run PACK RESULTS    # unpack, then run every check; logs in RESULTS
#   bash scripts/gpu/device.sh quick PACK RESULTS  # the CUDA checks only, and the baseline comparison
#   bash scripts/gpu/device.sh static PACK RESULTS # static-cache exports only, CUDA graphs off and on
#                                                  # (docs/STATIC.md; about 4 minutes)
#   bash scripts/gpu/device.sh spec PACK RESULTS   # speculative chains and token trees on static exports
#                                                  # with CUDA graphs; starts nothing new past BUDGET seconds (360)
#   bash scripts/gpu/device.sh merged PACK RESULTS # the same on a static export with --merge-adapters, beside
#                                                  # a plain static one (BUDGET 300)
#   bash scripts/gpu/device.sh verify PACK RESULTS # short: trees on CUDA, the merged export's cost shape and
#                                                  # 3 dev prompts (about 100 s; run 9)
#   bash scripts/gpu/device.sh tune PACK RESULTS   # run 10: HEAD's CUDA checks, greedy against today's export
#                                                  # and onnxruntime-genai's builder graph (wheels in .whl),
#                                                  # tune-drafting priced on CUDA, dev prompts, an Nsight Compute
#                                                  # kernel profile; starts no step past what BUDGET (500 s) leaves it
set -uo pipefail
ACTION=$1
PACK=$(cd "$2" && pwd)
G=/tmp/m2r2-gpu
mkdir -p $G/parts
for c in "$PACK"/c[0-9]*; do [ -f "$c" ] && cp "$c" $G/parts/; done
ls $G/parts
[ "$ACTION" = stash ] && exit 0
case "$ACTION" in run | quick | static | spec | merged | verify | tune) ;; *) echo "usage: device.sh stash|run|quick|static|spec|merged|verify|tune PACK [RESULTS]" >&2; exit 2 ;; esac
full() { [ "$ACTION" = run ]; }
RESULTS=$3
R=$(pwd)
mkdir -p "$RESULTS"
exec > >(tee -a "$RESULTS/gpu.log") 2>&1
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
# more N: true while fewer than N seconds of this action have passed (SECONDS is reset per action)
more() { [ $SECONDS -lt "$1" ] || { echo "(skipped: ${SECONDS}s used)"; false; }; }
# oks LOG EXIT: a test binary's exit status, its OK lines and its first failures
# `bench --onnx`'s tables without the loading lines (their length grows with the engines)
table() { grep -vE '^(loaded |ONNX Runtime [0-9])' | tail -40; }
oks() { echo "exit $2; OK lines $(grep -cE '^OK ' "$1")"; grep -E 'NOT OK|test result|panicked|error' "$1" | head -4 | cut -c1-400; }
source "$PACK/manifest"
if [ ! -f $G/m2r2 ]; then
  step unpack
  for c in $CHUNKS; do [ -f $G/parts/$c ] || { echo "chunk $c missing: send it with 'stash' first"; exit 1; }; done
  (cd $G/parts && cat $CHUNKS) > $G/all.bin
  echo "$SHA256  $G/all.bin" | sha256sum -c || exit 1
  UNXZ='import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1<<22)'
  (cd $G && head -c "$TAR_BYTES" all.bin | python3 -c "$UNXZ" | tar x) || exit 1
  tail -c +"$((TAR_BYTES + 1))" $G/all.bin | python3 -c "$UNXZ" > $G/libonnxruntime_providers_cuda.so || exit 1
  rm -f $G/all.bin
fi

step environment
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)'
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$G:$(find "$SP/nvidia" -maxdepth 3 -type d -name lib | tr '\n' ':')${LD_LIBRARY_PATH:-}
ldd $G/libonnxruntime_providers_cuda.so | grep -E 'not found|cublas|cudnn|cudart|libcuda'
export ORT_DYLIB_PATH=$G/libonnxruntime.so.$ORT_GPU_VERSION M2R2_CACHE=$G/cache
M=$G/m2r2
P="Explain how a refrigerator works."

if [ "$ACTION" = tune ]; then
  SECONDS=0
  # each step starts only while its expected length still fits (seconds: about 150 for the first
  # four, then genai 100, tune 70, dev prompts 75, ncu 60 and 20); the worst case ends near
  # BUDGET + 60 s, so a run call of 600 s holds BUDGET = 500
  BUDGET=${BUDGET:-500}
  step "static graphs on CUDA against the reference: greedy (graphs on and off), speculative every step shape captured (static_cache.rs)"
  timeout 90 $G/static_cache --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/static_cuda.log" 2>&1
  oks "$RESULTS/static_cuda.log" $?
  step "token trees on CUDA against the reference: dynamic, static, merged; graphs on and off (trees.rs)"
  timeout 60 $G/trees --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/trees_cuda.log" 2>&1
  oks "$RESULTS/trees_cuda.log" $?
  step "export SmolLM2: today's export, and static (L = 256) with --merge-adapters"
  timeout 60 $M export --model smollm2 --out $G/exp > /dev/null && echo "dynamic written"
  timeout 60 $M export --model smollm2 --out $G/exp-merged --static-cache 256 --merge-adapters > /dev/null && echo "merged written"
  base=()
  if [ -x $G/m2r2-baseline ]; then
    timeout 60 $G/m2r2-baseline export --model smollm2 --out $G/exp-merged-base --static-cache 256 --merge-adapters \
      > /dev/null && echo "the baseline build's merged static export written" && base=(--onnx $G/exp-merged-base)
  fi
  step "bench: greedy and speculative tok/s, today's export against the merged static one (and the baseline build's), CUDA graphs off and on (alternating)"
  timeout 120 $M bench --model smollm2 --onnx $G/exp --onnx $G/exp-merged "${base[@]}" --ep cuda --cuda-graph both \
    --repeats 3 --decode-tokens 64 2>&1 | table
  step "bench --cost-shape: merged static, CUDA graphs on"
  timeout 60 $M bench --model smollm2 --cost-shape --onnx $G/exp-merged --ep cuda --repeats 3 --decode-tokens 16 \
    2>&1 | grep -E 'engine|onnxruntime|bandwidth'
  if more $((BUDGET - 120)); then
    step "onnxruntime-genai's builder graph of SmolLM2 (fp32, CUDA) beside m2r2's exports: greedy, 3 dev prompts, 128 tokens"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $G/site "$R"/.whl/*.whl > /dev/null 2>&1 \
      && echo "onnxruntime-genai-cuda and gguf installed"
    PYTHONPATH=$G/site timeout 200 python3 "$R/scripts/gpu/genai_builder.py" --gguf $G/cache/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
      --work $G/genai --ort-gpu-dir $G --bin $M --cuda-graph --prompts 3 --new-tokens 128 \
      --row "today's export: --onnx $G/exp --ep cuda" --row "static, graphs off: --onnx $G/exp-merged --ep cuda --cuda-graph off" \
      --row "static, CUDA graphs: --onnx $G/exp-merged --ep cuda" 2>&1 | tee "$RESULTS/genai.txt" | tail -12 | cut -c1-400
  fi
  if more $((BUDGET - 90)); then
    step "tune-drafting priced on CUDA (12 validation samples, 128 tokens; gate 1, the merged export's), written to a copy"
    cp -r "$R/reference/assets/smollm2-m2r2" $G/tuned
    timeout 150 $M tune-drafting --model smollm2 --m2r2 $G/tuned --data "$R/data/distill/smollm2-magpie-val" --limit 12 \
      --max-new-tokens 128 --draft-gates 1 --max-draft 4 --tree 2 --tree 3 --tree 4 --tree 2,1 --tree 3,1 --tree 2,1,1 \
      --tree 4,1,1 --onnx $G/exp-merged --ep cuda --repeats 3 --top 12 \
      --write $G/tuned > "$RESULTS/tune_cuda.txt" 2>&1
    echo "exit $?"; tail -45 "$RESULTS/tune_cuda.txt" | cut -c1-200
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get("onnx_drafting")))' $G/tuned/m2r2_config.json
    timeout 60 $M export --model smollm2 --m2r2 $G/tuned --out $G/exp-tuned --static-cache 256 --merge-adapters > /dev/null \
      && echo "tuned merged written" && $M info --onnx $G/exp-tuned 2>&1 | grep -iE 'draft' | head -3
  fi
  if more $((BUDGET - 90)); then
    step "5 dev prompts, 128 tokens, merged static export on CUDA: greedy, shipped default, CUDA-tuned default, fixed rows"
    extra=(); [ -d $G/exp-tuned ] && extra=(--onnx-extra "default tuned on CUDA: $G/exp-tuned")
    timeout 200 python3 "$R/scripts/bench_speculative.py" --bin $M --no-reference --ep cuda --onnx-pruned $G/exp-merged \
      --prompts 5 --new-tokens 128 --onnx-row 'tree 3: --draft-tree 3' --onnx-row 'tree 4: --draft-tree 4' "${extra[@]}" \
      2>&1 | tail -8
  fi
  if more $((BUDGET - 70)); then
    step "Nsight Compute: every kernel of a 12-token greedy decode on the merged static export, CUDA graphs off"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    N="$NCU --csv --metrics gpu__time_duration.sum --clock-control none --cache-control none"
    timeout 90 $N --log-file $G/ncu.csv $M run --onnx $G/exp-merged --ep cuda --cuda-graph off \
      --tokens 1,2,3 --max-new-tokens 12 > /dev/null 2> "$RESULTS/ncu.err"
    echo "exit $?"; tail -2 "$RESULTS/ncu.err" | cut -c1-300
    python3 "$R/scripts/gpu/ncu_kernels.py" $G/ncu.csv --steps 12 --top 30 | tee "$RESULTS/ncu_kernels.txt"
    if more $((BUDGET - 25)); then
      step "Nsight Compute, CUDA graphs on, each replayed graph one result: the GPU time of a whole decode step"
      timeout 60 $N --log-file $G/ncu_graph.csv --graph-profiling graph $M run --onnx $G/exp-merged --ep cuda \
        --tokens 1,2,3 --max-new-tokens 12 > /dev/null 2> "$RESULTS/ncu_graph.err"
      echo "exit $?"; python3 "$R/scripts/gpu/ncu_kernels.py" $G/ncu_graph.csv --top 5 --last 12 | tee "$RESULTS/ncu_graph.txt"
    fi
  fi
  step end
  exit 0
fi

if [ "$ACTION" = verify ]; then
  step "token trees on CUDA against the reference (trees.rs: dynamic, static, merged; graphs on and off)"
  timeout 60 $G/trees --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/trees_cuda.log" 2>&1
  echo "exit $?; OK lines $(grep -cE '^OK ' "$RESULTS/trees_cuda.log")"
  grep -E 'NOT OK|test result|panicked' "$RESULTS/trees_cuda.log" | head -3 | cut -c1-300
  step "export SmolLM2 static (L = 256) with --merge-adapters"
  timeout 60 $M export --model smollm2 --out $G/exp-merged --static-cache 256 --merge-adapters > /dev/null && echo "merged written"
  $M info --onnx $G/exp-merged | tail -4
  step "bench --cost-shape: merged, CUDA graphs on"
  timeout 60 $M bench --model smollm2 --cost-shape --onnx $G/exp-merged --ep cuda --repeats 3 --decode-tokens 16 \
    2>&1 | grep -E 'engine|onnxruntime|bandwidth'
  step "3 dev prompts, 128 tokens, merged static export on CUDA"
  timeout 90 python3 "$R/scripts/bench_speculative.py" --bin $M --no-reference --ep cuda --onnx-pruned $G/exp-merged \
    --prompts 3 --new-tokens 128 --onnx-row 'chain 2: --draft-len 2' --onnx-row 'tree 2,1: --draft-tree 2,1' 2>&1 | tail -6
  step end
  exit 0
fi

if [ "$ACTION" = merged ]; then
  SECONDS=0
  BUDGET=${BUDGET:-300}
  step "token trees on CUDA against the reference: dynamic, static and static with merged adapters, graphs on and off (trees.rs)"
  timeout 150 $G/trees --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/trees_cuda.log" 2>&1
  echo "exit $?; OK lines $(grep -cE '^OK ' "$RESULTS/trees_cuda.log")"
  grep -E 'NOT OK|test result|panicked|error' "$RESULTS/trees_cuda.log" | head -4 | cut -c1-400
  grep -E '^OK .*merged.*uncaptured' "$RESULTS/trees_cuda.log" | head -3 | cut -c1-300
  step "export SmolLM2: static (L = 256) and static with --merge-adapters"
  timeout 120 $M export --model smollm2 --out $G/exp-static --static-cache 256 > /dev/null && echo "static written"
  timeout 120 $M export --model smollm2 --out $G/exp-merged --static-cache 256 --merge-adapters > /dev/null && echo "merged written"
  step "bench --cost-shape: merged, CUDA graphs on and off"
  timeout 90 $M bench --model smollm2 --cost-shape --onnx $G/exp-merged --ep cuda --repeats 3 --decode-tokens 16 \
    --ort-compare "graph-off:cuda-graph=off" 2>&1 | grep -E 'engine|onnxruntime|bandwidth'
  step "bench --cost-shape: plain static, CUDA graphs on (same machine, for the ratio)"
  timeout 90 $M bench --model smollm2 --cost-shape --onnx $G/exp-static --ep cuda --repeats 3 --decode-tokens 16 \
    2>&1 | grep -E 'engine|onnxruntime'
  if more $((BUDGET - 150)); then
    step "dev prompts on the merged static export, CUDA graphs on: greedy, chains and trees (5 prompts, 128 tokens)"
    timeout 200 python3 "$R/scripts/bench_speculative.py" --bin $M --no-reference --ep cuda --onnx-pruned $G/exp-merged \
      --prompts 5 --new-tokens 128 --onnx-row 'chain 1: --draft-len 1' --onnx-row 'chain 2: --draft-len 2' \
      --onnx-row 'tree 2: --draft-tree 2' --onnx-row 'tree 2,1: --draft-tree 2,1' --onnx-row 'tree 2,1,1: --draft-tree 2,1,1' \
      --onnx-extra "plain static, default: $G/exp-static" 2>&1 | tail -10
  fi
  if more $((BUDGET - 40)); then
    step "per-node host time, graphs off: verifier chunks (draft-len 3) against model.onnx's one-row steps"
    rm -rf $G/prof && mkdir -p $G/prof
    timeout 60 $M run --onnx $G/exp-static --ep cuda --cuda-graph off --chat --prompt "$P" --max-new-tokens 24 --ort-profile $G/prof/greedy > /dev/null 2>&1
    timeout 60 $M run --onnx $G/exp-static --ep cuda --cuda-graph off --mode speculative --draft-len 3 --chat --prompt "$P" --max-new-tokens 24 --ort-profile $G/prof/spec > /dev/null 2>&1
    python3 "$R/scripts/gpu/ort_profile_summary.py" $G/prof/greedy 2>&1 | head -8
    echo "(speculative: the sessions in order draft, verifier, feed)"
    python3 "$R/scripts/gpu/ort_profile_summary.py" $G/prof/spec 2>&1 | head -28
  fi
  if more $BUDGET; then
    step "goldens written by the reference here (chain, tree, the default with its lookup branch), checked on the merged export on CUDA"
    timeout 60 $M golden write --model smollm2 --chat --prompt "$P" --steps 32 --mode speculative --out $G/spec.golden.safetensors > /dev/null 2>&1
    timeout 60 $M golden write --model smollm2 --chat --prompt "$P" --steps 32 --mode speculative --draft-tree 2,1,1 --out $G/tree.golden.safetensors > /dev/null 2>&1
    timeout 60 $M golden write --model smollm2 --chat --prompt "Repeat exactly: the quick brown fox jumps over the lazy dog." --steps 24 --mode speculative --prompt-lookup 4 --out $G/lookup.golden.safetensors > /dev/null 2>&1
    for g in spec tree lookup; do echo "--- $g"; timeout 60 $M golden check $G/$g.golden.safetensors --onnx $G/exp-merged --ep cuda 2>&1 | tail -4; done
  fi
  step end
  exit 0
fi

if [ "$ACTION" = spec ]; then
  SECONDS=0
  BUDGET=${BUDGET:-360}
  step "static speculative graphs on CUDA, every step shape captured, against graphs off (static_cache.rs)"
  timeout 120 $G/static_cache --ignored --nocapture --test-threads 1 ort_cuda_graph_speculative > "$RESULTS/static_spec_cuda.log" 2>&1
  oks "$RESULTS/static_spec_cuda.log" $?
  grep -E '^OK ' "$RESULTS/static_spec_cuda.log" | head -4 | cut -c1-300
  step "token trees on CUDA against the reference: dynamic, static with graphs (default) and off (trees.rs)"
  timeout 150 $G/trees --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/trees_cuda.log" 2>&1
  oks "$RESULTS/trees_cuda.log" $?
  grep -E '^OK .*(uncaptured)' "$RESULTS/trees_cuda.log" | head -6 | cut -c1-300
  step "export SmolLM2 (shipped weights): today's export and a static one (L = 256)"
  timeout 120 $M export --model smollm2 --out $G/exp > /dev/null && echo "dynamic written"
  timeout 120 $M export --model smollm2 --out $G/exp-static --static-cache 256 > /dev/null && echo "static written"
  if more $((BUDGET - 180)); then
    step "dev prompts on the static export, CUDA graphs on: greedy, chains and trees (5 prompts, 128 tokens)"
    timeout 200 python3 "$R/scripts/bench_speculative.py" --bin $M --no-reference --ep cuda --onnx-pruned $G/exp-static \
      --prompts 5 --new-tokens 128 --onnx-row 'chain 1: --draft-len 1' --onnx-row 'chain 3: --draft-len 3' \
      --onnx-row 'tree 2,1,1: --draft-tree 2,1,1' --onnx-row 'tree 3,2,1: --draft-tree 3,2,1' 2>&1 | tail -9
  fi
  if more $((BUDGET - 90)); then
    step "bench --cost-shape of the static export: CUDA graphs on (default) and off"
    timeout 90 $M bench --model smollm2 --cost-shape --onnx $G/exp-static --ep cuda --repeats 3 --decode-tokens 16 \
      --ort-compare "graph-off:cuda-graph=off" 2>&1 | tail -9
  fi
  if more $((BUDGET - 60)); then
    step "bench: today's export, static without and with CUDA graphs (greedy and speculative tok/s, alternating)"
    timeout 120 $M bench --model smollm2 --onnx $G/exp --onnx $G/exp-static --ep cuda --cuda-graph both --repeats 3 \
      --decode-tokens 64 2>&1 | table
  fi
  if more $((BUDGET - 30)); then
    step "equivalence of today's export (tree_mask input) on CUDA: 6 random tiny models (equivalence.rs)"
    timeout 90 $G/equivalence --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/equivalence_cuda.log" 2>&1
    echo "exit $?"; tail -3 "$RESULTS/equivalence_cuda.log"
  fi
  if more $BUDGET; then
    step "goldens written by the reference here (chain, tree, the default with its lookup branch), checked on the static export on CUDA"
    timeout 60 $M golden write --model smollm2 --chat --prompt "$P" --steps 32 --mode speculative --out $G/spec.golden.safetensors
    timeout 60 $M golden write --model smollm2 --chat --prompt "$P" --steps 32 --mode speculative --draft-tree 2,1,1 --out $G/tree.golden.safetensors
    timeout 60 $M golden write --model smollm2 --chat --prompt "Repeat exactly: the quick brown fox jumps over the lazy dog." --steps 24 --mode speculative --prompt-lookup 4 --out $G/lookup.golden.safetensors
    for g in spec tree lookup; do echo "--- $g"; timeout 60 $M golden check $G/$g.golden.safetensors --onnx $G/exp-static --ep cuda 2>&1 | tail -4; done
  fi
  step end
  exit 0
fi

if [ "$ACTION" = static ]; then
  SECONDS=0
  # ORT_LOG=info: ONNX Runtime logs its CUDA graph capture and every replay; the lines counted
  # below are its own, the runner's counts (graph_runs) only say which gpu_graph_id each run set.
  graphlog() { echo "ORT log lines: capture $(grep -ciE 'captur' "$1"), replay $(grep -ciE 'replay' "$1")"
    grep -iE 'captur|replay|cuda graph|graph capture' "$1" | sort | uniq -c | sort -rn | head -6 | cut -c1-220; }
  step "static exports on CUDA, graphs off: buffers in GPU memory, written in place (onnx-runner/tests/static_cache.rs)"
  timeout 120 $G/static_cache --ignored --nocapture --test-threads 1 ort_cuda_static > "$RESULTS/static_cuda.log" 2>&1
  echo "static cuda exit $?"; grep -cE '^OK ' "$RESULTS/static_cuda.log"
  grep -E 'NOT OK|test result|panicked|error' "$RESULTS/static_cuda.log" | head -5
  grep -E '^OK ' "$RESULTS/static_cuda.log" | sort -t= -k2 -g | tail -2
  step "static exports on CUDA, decode step as a CUDA graph: against the reference and graphs off"
  ORT_LOG=info timeout 120 $G/static_cache --ignored --nocapture --test-threads 1 ort_cuda_graph > "$RESULTS/static_cuda_graph.log" 2>&1
  echo "static cuda graph exit $?"; grep -cE '^OK ' "$RESULTS/static_cuda_graph.log"
  grep -E 'NOT OK|test result|panicked|cuda-graph|refused' "$RESULTS/static_cuda_graph.log" | head -6 | cut -c1-400
  grep -E '^OK .*(decode steps|greedy tokens)' "$RESULTS/static_cuda_graph.log" | head -6
  grep -E '^OK ' "$RESULTS/static_cuda_graph.log" | sort -t= -k2 -g | tail -2
  graphlog "$RESULTS/static_cuda_graph.log"
  step "SmolLM2: today's export and a static one (L=256), greedy on CUDA, graphs off and on"
  timeout 120 $M export --model smollm2 --out $G/exp > /dev/null && echo "dynamic written"
  timeout 120 $M export --model smollm2 --out $G/exp-static --static-cache 256 > /dev/null && echo "static written"
  for r in "exp" "exp-static off" "exp-static on"; do
    set -- $r; e=$1; cg=${2:+--cuda-graph $2}; tag=$e${2:+-$2}
    ORT_LOG=${2:+info} timeout 60 $M run --onnx $G/$e --ep cuda $cg --chat --prompt "$P" --max-new-tokens 24 --json \
      > "$RESULTS/$tag.json" 2> "$RESULTS/$tag.err"
    echo "$tag exit $?: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["ep_used"], "cuda_graph", r.get("cuda_graph"), r["tokens"])' "$RESULTS/$tag.json" 2>&1 | cut -c1-260)"
    grep -iE 'error|refused' "$RESULTS/$tag.err" | head -3 | cut -c1-400
  done
  echo "graphs off (expect no capture, no replay):"; graphlog "$RESULTS/exp-static-off.err"
  echo "graphs on (expect about 20-23 replay lines for 23 decode steps):"; graphlog "$RESULTS/exp-static-on.err"
  python3 -c 'import json,sys; t=[json.load(open(f))["tokens"] for f in sys.argv[1:]]; print("tokens dynamic = static off = static on:", t[0] == t[1] == t[2])' \
    "$RESULTS/exp.json" "$RESULTS/exp-static-off.json" "$RESULTS/exp-static-on.json" 2>&1 | tail -1
  step "SmolLM2 speculative on the static export: every step shape a CUDA graph (on) against off"
  for cg in off on; do
    ORT_LOG=info timeout 60 $M run --onnx $G/exp-static --ep cuda --cuda-graph $cg --mode speculative --chat \
      --prompt "$P" --max-new-tokens 24 --json > "$RESULTS/spec-static-$cg.json" 2> "$RESULTS/spec-static-$cg.err"
    echo "spec static $cg exit $?: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["ep_used"], "cuda_graph", r.get("cuda_graph"), r["tokens"])' "$RESULTS/spec-static-$cg.json" 2>&1 | cut -c1-260)"
    grep -iE 'error|refused' "$RESULTS/spec-static-$cg.err" | head -3 | cut -c1-400
    graphlog "$RESULTS/spec-static-$cg.err"
  done
  python3 -c 'import json,sys; t=[json.load(open(f))["tokens"] for f in sys.argv[1:]]; print("tokens greedy = spec off = spec on:", t[0] == t[1] == t[2])' \
    "$RESULTS/exp.json" "$RESULTS/spec-static-off.json" "$RESULTS/spec-static-on.json" 2>&1 | tail -1
  step "bench: dynamic, static without and with CUDA graphs (greedy tok/s, alternating)"
  timeout 180 $M bench --model smollm2 --onnx $G/exp --onnx $G/exp-static --ep cuda --cuda-graph both --repeats 3 \
    --decode-tokens 64 2>&1 | table
  if [ $SECONDS -lt 170 ]; then
    step "bench --cost-shape of the static export: CUDA graphs on (default) and off"
    timeout 60 $M bench --model smollm2 --cost-shape --onnx $G/exp-static --ep cuda --repeats 3 --decode-tokens 16 \
      --ort-compare "graph-off:cuda-graph=off" 2>&1 | tail -9
  else
    echo "(cost shape skipped: ${SECONDS}s used)"
  fi
  step end
  exit 0
fi

step "equivalence: random tiny models, reference against CUDA and TensorRT (6 cases each)"
timeout 240 $G/equivalence --ignored --nocapture --test-threads 1 ort_cuda > "$RESULTS/equivalence_cuda.log" 2>&1
echo "cuda exit $?"; tail -3 "$RESULTS/equivalence_cuda.log"
if full; then
  timeout 240 $G/equivalence --ignored --nocapture --test-threads 1 ort_tensorrt > "$RESULTS/equivalence_tensorrt.log" 2>&1
  echo "tensorrt exit $?"; grep -m1 -o 'reason: .*' "$RESULTS/equivalence_tensorrt.log" | cut -c1-300
fi

step "export SmolLM2 (shipped M2R2 weights), f32 and f16"
timeout 120 $M export --model smollm2 --out $G/exp > /dev/null && echo "f32 written"
full && timeout 120 $M export --model smollm2 --weights-dtype f16 --out $G/exp16 > /dev/null && echo "f16 written"

step "goldens: written by the reference here, checked on CUDA (f32 and f16 exports)"
timeout 60 $M golden write --model smollm2 --chat --prompt "$P" --steps 16 --out $G/greedy.golden.safetensors
timeout 60 $M golden write --model smollm2 --chat --prompt "$P" --steps 32 --mode speculative --out $G/spec.golden.safetensors
for g in greedy spec; do for e in exp exp16; do
  [ -d $G/$e ] || continue
  echo "--- $g on $e"
  timeout 90 $M golden check $G/$g.golden.safetensors --onnx $G/$e --ep cuda 2>&1 | tail -8
done; done
for g in "$PACK"/*.golden.safetensors; do
  [ -f "$g" ] || continue
  echo "--- $(basename "$g") (written on the development machine), recomputed by the reference here"
  timeout 60 $M golden check "$g" 2>&1 | tail -3
done

if full; then
  step "TensorRT from the CLI (must fail fast when libnvinfer is missing)"
  timeout 60 $M run --onnx $G/exp --ep tensorrt --prompt Hi --max-new-tokens 4 2>&1 | tail -2
  echo "exit ${PIPESTATUS[0]}"
fi

step "per-node profiles on CUDA (greedy, speculative; 24 tokens)"
rm -rf $G/prof && mkdir -p $G/prof
timeout 90 $M run --onnx $G/exp --ep cuda --chat --prompt "$P" --max-new-tokens 24 --ort-profile $G/prof/greedy > /dev/null 2>&1
full && timeout 90 $M run --onnx $G/exp --ep cuda --mode speculative --chat --prompt "$P" --max-new-tokens 24 --ort-profile $G/prof/spec > /dev/null 2>&1
python3 "$R/scripts/gpu/ort_profile_summary.py" $G/prof/greedy
full && python3 "$R/scripts/gpu/ort_profile_summary.py" $G/prof/spec

step "bench: greedy against speculative, reference and CUDA"
timeout 150 $M bench --model smollm2 --onnx $G/exp --ep cuda 2>&1 | table
if full && [ ! -x $G/m2r2-baseline ]; then
  step "bench --cost-shape on CUDA, by graph optimisation level"
  timeout 300 $M bench --model smollm2 --cost-shape --onnx $G/exp --ep cuda --repeats 3 --decode-tokens 16 \
    --ort-compare "opt-basic:opt=basic;opt-disable:opt=disable" 2>&1 | tail -9
fi
if [ -x $G/m2r2-baseline ]; then
  step "cost shape on CUDA: this export against the baseline binary's, alternating"
  timeout 120 $G/m2r2-baseline export --model smollm2 --out $G/exp-baseline > /dev/null && echo "baseline written"
  for round in 1 2; do for e in exp-baseline exp; do
    echo "--- $e, round $round"
    timeout 150 $M bench --model smollm2 --cost-shape --onnx $G/$e --ep cuda --repeats 3 --decode-tokens 16 2>&1 |
      grep -E 'engine|onnxruntime'
  done; done
fi
step end
