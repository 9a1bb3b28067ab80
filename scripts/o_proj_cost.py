# What the two forms of a static layer's `o_proj` cost ONNX Runtime's CPU provider, by rows T:
# the head-broadcast product and its sum (`MatMul(y, Wo_heads)`, `ReduceSum` over the heads: what
# model.onnx writes) against one GEMM of the rows (`Transpose`, `Reshape`, `MatMul(., Wo^T)`: what
# verifier.onnx writes), at SmolLM2's shape (9 heads, head size 64, hidden size 576). Times one
# session run of the lone subgraph, Python's per-run overhead included; best of 3 rounds.
#
#   python3 scripts/o_proj_cost.py [--rows 1,2,5,16] [--threads 2] [--runs 3000]
#
# Needs onnx and onnxruntime (scripts/onnx-check/requirements.txt).
import argparse

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ort_timing import time_us

HEADS, DH, D = 9, 64, 576


def model(nodes, weights, rows):
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, HEADS, rows, DH])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in weights.items()]
    graph = helper.make_graph(nodes, "o_proj", [y], [out], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)


def head_broadcast(w, rows):
    nodes = [helper.make_node("MatMul", ["y", "w"], ["p"]),
             helper.make_node("ReduceSum", ["p", "axis"], ["out"], keepdims=1)]
    return model(nodes, {"w": w.reshape(HEADS, DH, D), "axis": np.array([1], np.int64)}, rows)


def row_gemm(w, rows):
    nodes = [helper.make_node("Transpose", ["y"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["out"])]
    return model(nodes, {"w": w, "shape": np.array([0, 1, -1, HEADS * DH], np.int64)}, rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,5,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((HEADS * DH, D)) * 0.05).astype(np.float32)  # Wo^T
    print(f"onnxruntime {ort.__version__}, {a.threads} threads, {a.runs} runs a round")
    for rows in map(int, a.rows.split(",")):
        feeds = {"y": rng.standard_normal((1, HEADS, rows, DH)).astype(np.float32)}
        broadcast, want = time_us(head_broadcast(w, rows), feeds, a.threads, a.runs, warmup=200, rounds=3)
        gemm, got = time_us(row_gemm(w, rows), feeds, a.threads, a.runs, warmup=200, rounds=3)
        assert np.allclose(got.reshape(-1), want.reshape(-1), atol=1e-4), "the two forms differ"
        print(f"T = {rows:3}: head-broadcast + ReduceSum {broadcast:7.1f} us, row GEMM {gemm:7.1f} us")


if __name__ == "__main__":
    main()
