# What one opset-24 `Attention` node costs ONNX Runtime's CPU provider for a decode row, by buffer
# length L: SmolLM2's shape (9 query heads, 3 KV heads, head size 64, one query row, an additive
# mask), as the static graphs run it (docs/STATIC.md, "Speed"). Times one session run of the
# lone node, Python's per-run overhead included.
#
#   python3 scripts/attention_cost.py [--lengths 64,256,1024] [--threads 2] [--runs 2000]
#
# Needs onnx and onnxruntime (scripts/onnx-check/requirements.txt).
import argparse, time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def model(length, heads, kv_heads, dh):
    io = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], q_num_heads=heads, kv_num_heads=kv_heads)
    graph = helper.make_graph(
        [node], "attention",
        [io("q", [1, heads, 1, dh]), io("k", [1, kv_heads, length, dh]), io("v", [1, kv_heads, length, dh]),
         io("mask", [1, 1, 1, length])],
        [io("y", None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="64,256,1024")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2000)
    a = ap.parse_args()
    heads, kv_heads, dh = 9, 3, 64
    print(f"onnxruntime {ort.__version__}, {a.threads} threads, {a.runs} runs each")
    rng = np.random.default_rng(0)
    for length in map(int, a.lengths.split(",")):
        options = ort.SessionOptions()
        options.intra_op_num_threads = a.threads
        session = ort.InferenceSession(model(length, heads, kv_heads, dh).SerializeToString(), options)
        feeds = {
            "q": rng.random((1, heads, 1, dh), dtype=np.float32),
            "k": rng.random((1, kv_heads, length, dh), dtype=np.float32),
            "v": rng.random((1, kv_heads, length, dh), dtype=np.float32),
            "mask": np.zeros((1, 1, 1, length), np.float32),
        }
        for _ in range(50):
            session.run(None, feeds)
        start = time.perf_counter()
        for _ in range(a.runs):
            session.run(None, feeds)
        print(f"L = {length:5}: {(time.perf_counter() - start) / a.runs * 1e6:7.1f} us per run")


if __name__ == "__main__":
    main()
