# What one opset-24 `Attention` node costs ONNX Runtime's CPU provider for a decode row, by buffer
# length L: SmolLM2's shape (9 query heads, 3 KV heads, head size 64, one query row, an additive
# mask), as the static graphs run it (docs/STATIC.md, "Speed"). Times one session run of the
# lone node, Python's per-run overhead included.
#
#   python3 scripts/attention_cost.py [--lengths 64,256,1024] [--threads 2] [--runs 2000] [--filled F]
#
# --filled F: only the first F positions are filled (the mask hides the rest), timed with and
# without opset 24's `nonpad_kv_seqlen` = F, to see whether the kernel then skips the padding.
#
# Needs onnx and onnxruntime (scripts/onnx-check/requirements.txt).
import argparse

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from ort_timing import time_us


def model(length, heads, kv_heads, dh, nonpad=False):
    io = lambda name, shape, t=TensorProto.FLOAT: helper.make_tensor_value_info(name, t, shape)
    inputs = ["q", "k", "v", "mask"] + (["", "", "nonpad"] if nonpad else [])
    node = helper.make_node("Attention", inputs, ["y"], q_num_heads=heads, kv_num_heads=kv_heads)
    graph = helper.make_graph(
        [node], "attention",
        [io("q", [1, heads, 1, dh]), io("k", [1, kv_heads, length, dh]), io("v", [1, kv_heads, length, dh]),
         io("mask", [1, 1, 1, length])] + ([io("nonpad", [1], TensorProto.INT64)] if nonpad else []),
        [io("y", None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="64,256,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--filled", type=int, help="filled positions (at most each length)")
    a = ap.parse_args()
    heads, kv_heads, dh = 9, 3, 64
    print(f"onnxruntime {ort.__version__}, {a.threads} threads, {a.runs} runs each")
    rng = np.random.default_rng(0)
    for length in map(int, a.lengths.split(",")):
        filled = min(a.filled or length, length)
        mask = np.full((1, 1, 1, length), np.finfo(np.float32).min, np.float32)
        mask[..., :filled] = 0.0
        feeds = {
            "q": rng.random((1, heads, 1, dh), dtype=np.float32),
            "k": rng.random((1, kv_heads, length, dh), dtype=np.float32),
            "v": rng.random((1, kv_heads, length, dh), dtype=np.float32),
            "mask": mask,
        }
        us, want = time_us(model(length, heads, kv_heads, dh), feeds, a.threads, a.runs, warmup=50)
        line = f"L = {length:5}: {us:7.1f} us per run"
        if a.filled:
            feeds["nonpad"] = np.array([filled], np.int64)
            with_nonpad, got = time_us(model(length, heads, kv_heads, dh, True), feeds, a.threads, a.runs, warmup=50)
            assert np.allclose(got, want, atol=1e-5), "nonpad_kv_seqlen changed the result"
            line += f" ({filled} filled); with nonpad_kv_seqlen = {filled}: {with_nonpad:7.1f} us"
        print(line)


if __name__ == "__main__":
    main()
