# What ONNX Runtime's CPU provider takes for a run of a static decoder stack in two layouts, by
# rows T, at SmolLM2's shape (30 layers, hidden 576, 9 query and 3 KV heads of 64, MLP 1536),
# random weights, the KV buffers bound in place with IoBinding:
#
#   4-D (what `m2r2 export --static-cache` writes, TensorRT's form of Attention): the residual
#       `[B, 1, T, D]`, q/k/v one product broadcast over head-major weights `[H, D, Dh]`, buffers
#       `[B, Hkv, L, Dh]`, o a head-broadcast product and a `ReduceSum` over the heads: 19 nodes.
#   3-D: the residual `[B, T, D]`, q/k/v one GEMM of the rows, `RotaryEmbedding` and `Attention`
#       on `[B, T, H * Dh]` (`num_heads`, `q_num_heads` / `kv_num_heads`), buffers
#       `[B, L, Hkv * Dh]` written by `TensorScatter` along axis 1, o one GEMM: 18 nodes.
#
# Both compute the same function (checked on the last run's output). Prints the median of --runs
# timed runs after 3 warm-ups per T, the two layouts alternating (their pools do not spin).
#
#   python3 scripts/static_layout_cost.py [--rows 1,8,64] [--l-max 256] [--runs 15] [--threads 2]
#
# Needs onnx and onnxruntime (scripts/onnx-check/requirements.txt).
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

LAYERS, D, H, HKV, DH, F = 30, 576, 9, 3, 64, 1536
THETA, EPS = 100000.0, 1e-5


def weights(seed):
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * 0.02).astype(np.float32)  # noqa: E731
    return [dict(q=w(H * DH, D), k=w(HKV * DH, D), v=w(HKV * DH, D), o=w(D, H * DH),
                 gate=w(F, D), up=w(F, D), down=w(D, F),
                 n1=(1 + w(D)).astype(np.float32), n2=(1 + w(D)).astype(np.float32))
            for _ in range(LAYERS)]


def stack(ws, l_max, layout):
    """The decoder stack as an ONNX model; `layout` is "4d" or "3d"."""
    four = layout == "4d"
    nodes, inits, inputs, outputs = [], {}, [], []
    f32 = TensorProto.FLOAT

    def node(op, ins, outs, **attrs):
        nodes.append(helper.make_node(op, ins, outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    inv = 1.0 / THETA ** (np.arange(0, DH, 2, dtype=np.float64) / DH)
    angles = np.arange(l_max)[:, None] * inv[None, :]
    inits["cos"], inits["sin"] = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    if four:
        inits["axis1"] = np.array([1], np.int64)  # ReduceSum over the heads
    s_shape = [1, 1, "T", D] if four else [1, "T", D]
    inputs += [helper.make_tensor_value_info("s", f32, s_shape),
               helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "T"]),
               helper.make_tensor_value_info("attn_mask", f32, [1, 1, "T", l_max]),
               helper.make_tensor_value_info("write_indices", TensorProto.INT64, [1])]
    buf_shape = [1, HKV, l_max, DH] if four else [1, l_max, HKV * DH]
    s = "s"
    for i, w in enumerate(ws):
        p = f"l{i}."
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past.{i}.{kv}", f32, buf_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", f32, buf_shape))
        inits[p + "n1"], inits[p + "n2"] = w["n1"], w["n2"]
        h = node("RMSNormalization", [s, p + "n1"], [p + "h"], axis=-1, epsilon=EPS)
        qkv = np.concatenate([w["q"], w["k"], w["v"]])  # [(H + 2 Hkv) Dh, D]
        if four:
            inits[p + "qkv"] = qkv.reshape(H + 2 * HKV, DH, D).transpose(0, 2, 1).copy()
            y = node("MatMul", [h, p + "qkv"], [p + "y"])  # [1, H + 2 Hkv, T, Dh]
            inits[p + "split"] = np.array([H, HKV, HKV], np.int64)
            q, k, v = node("Split", [y, p + "split"], [p + "q", p + "k", p + "v"], axis=1)
            q = node("RotaryEmbedding", [q, "cos", "sin", "position_ids"], [p + "qr"])
            k = node("RotaryEmbedding", [k, "cos", "sin", "position_ids"], [p + "kr"])
            axis, heads = {"axis": -2}, {}
        else:
            inits[p + "qkv"] = qkv.T.copy()  # [D, (H + 2 Hkv) Dh]
            y = node("MatMul", [h, p + "qkv"], [p + "y"])  # [1, T, (H + 2 Hkv) Dh]
            inits[p + "split"] = np.array([H * DH, HKV * DH, HKV * DH], np.int64)
            q, k, v = node("Split", [y, p + "split"], [p + "q", p + "k", p + "v"], axis=-1)
            q = node("RotaryEmbedding", [q, "cos", "sin", "position_ids"], [p + "qr"], num_heads=H)
            k = node("RotaryEmbedding", [k, "cos", "sin", "position_ids"], [p + "kr"], num_heads=HKV)
            axis, heads = {"axis": 1}, {"q_num_heads": H, "kv_num_heads": HKV}
        kb = node("TensorScatter", [f"past.{i}.key", k, "write_indices"], [f"present.{i}.key"], **axis)
        vb = node("TensorScatter", [f"past.{i}.value", v, "write_indices"], [f"present.{i}.value"],
                  **axis)
        a = node("Attention", [q, kb, vb, "attn_mask"], [p + "a"], **heads)
        if four:
            inits[p + "o"] = w["o"].T.reshape(H, DH, D).copy()  # [H, Dh, D]
            o = node("MatMul", [a, p + "o"], [p + "oh"])  # [1, H, T, D]
            o = node("ReduceSum", [o, "axis1"], [p + "o_sum"], keepdims=1)
        else:
            inits[p + "o"] = w["o"].T.copy()
            o = node("MatMul", [a, p + "o"], [p + "o_rows"])
        s = node("Add", [s, o], [p + "s1"])
        h = node("RMSNormalization", [s, p + "n2"], [p + "h2"], axis=-1, epsilon=EPS)
        for name in ("gate", "up", "down"):
            inits[p + name] = w[name].T.copy()
        g = node("MatMul", [h, p + "gate"], [p + "g"])
        u = node("MatMul", [h, p + "up"], [p + "u"])
        act = node("Mul", [g, node("Sigmoid", [g], [p + "sg"])], [p + "silu"])
        m = node("MatMul", [node("Mul", [act, u], [p + "gu"]), p + "down"], [p + "m"])
        s = node("Add", [s, m], [p + "s2"])
    outputs.insert(0, helper.make_tensor_value_info(s, f32, None))
    graph = helper.make_graph(nodes, layout, inputs, outputs,
                              initializer=[numpy_helper.from_array(a, n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)
    return model.SerializeToString(), len(nodes) / LAYERS


class Engine:
    def __init__(self, ws, l_max, layout, threads):
        blob, self.nodes_per_layer = stack(ws, l_max, layout)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # two sessions alternate: idle workers that spin would take the cores from the other one
        # (the runner shares one pool instead, onnx-runner/src/runtime.rs)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
        self.four, self.l_max = layout == "4d", l_max
        shape = (1, HKV, l_max, DH) if self.four else (1, l_max, HKV * DH)
        self.binding = self.session.io_binding()
        self.out = self.session.get_outputs()[0].name
        self.binding.bind_output(self.out, "cpu")  # bound first: get_outputs()[0]
        self.buffers = []
        for i in range(LAYERS):
            for kv in ("key", "value"):
                b = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                self.buffers.append(b)
                self.binding.bind_ortvalue_input(f"past.{i}.{kv}", b)
                self.binding.bind_ortvalue_output(f"present.{i}.{kv}", b)

    def run(self, s, pos0):
        t = s.shape[1]
        self.binding.bind_cpu_input("s", s[:, None] if self.four else s)
        self.binding.bind_cpu_input("position_ids", np.arange(pos0, pos0 + t, dtype=np.int64)[None])
        self.binding.bind_cpu_input("write_indices", np.array([pos0], np.int64))
        p, j = np.arange(pos0, pos0 + t)[:, None], np.arange(self.l_max)[None, :]
        mask = np.where(j <= p, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]
        self.binding.bind_cpu_input("attn_mask", mask)
        self.binding.bind_output(self.out, "cpu")  # unallocated again: T changes
        self.session.run_with_iobinding(self.binding)
        return self.binding.get_outputs()[0].numpy().reshape(1, t, D)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1,8,64")
    parser.add_argument("--l-max", type=int, default=256)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ws = weights(0)
    engines = {lay: Engine(ws, args.l_max, lay, args.threads) for lay in ("4d", "3d")}
    for lay, e in engines.items():
        print(f"{lay}: {e.nodes_per_layer:.1f} nodes per layer")
    rng = np.random.default_rng(1)
    print(f"{'rows':>5} {'4-D ms':>9} {'3-D ms':>9} {'3-D / 4-D':>10}")
    for t in [int(r) for r in args.rows.split(",")]:
        s = rng.standard_normal((1, t, D)).astype(np.float32)
        pos0 = 0 if t > 1 else 100  # a prefill from 0, or one decode row at position 100
        times = {lay: [] for lay in engines}
        for i in range(3 + args.runs):
            for lay, e in engines.items():
                start = time.perf_counter()
                out = e.run(s, pos0)
                if i >= 3:
                    times[lay].append(time.perf_counter() - start)
                e.last = out
        diff = np.abs(engines["4d"].last - engines["3d"].last).max()
        assert diff < 1e-3, f"the layouts differ by {diff}"
        m = {lay: 1000 * float(np.median(v)) for lay, v in times.items()}
        print(f"{t:>5} {m['4d']:>9.2f} {m['3d']:>9.2f} {m['3d'] / m['4d']:>9.2f}x")


if __name__ == "__main__":
    main()
