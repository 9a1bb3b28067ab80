# Which kernels make a verify chunk of 2-16 rows cost more than one row on a GPU (docs/GPU.md,
# runs 7-8: 5.0 ms against 2.9 ms for SmolLM2's static verifier with CUDA graphs)? This times, with
# torch's cuBLAS (the library ONNX Runtime's CUDA MatMul calls) and a CUDA graph per shape, the
# f32 projections of 23 SmolLM2 layers in the static export's layouts, for T = 1, 2, 5, 16 rows:
#   heads  q/k/v as [1, 1, T, D] @ [n, D, Dh] (broadcast over heads), o as [1, H, T, Dh] @
#          [H, Dh, D] then a sum over heads, the MLP as [1, 1, T, D] @ [D, I] (static_layer.rs)
#   plain  the same products as 2-D [T, D] @ [D, n Dh] (no broadcast), for comparison
# and torch's scaled-dot-product attention over a 256-position buffer with an additive mask
# (not ONNX Runtime's Attention kernel: a hint only). TF32 off, as ONNX Runtime's default fp32.
# Usage: python3 scripts/gpu/gemm_shapes.py   (needs torch with CUDA; prints one table)
import torch

D, H, HKV, DH, I, LAYERS, L = 576, 9, 3, 64, 1536, 23, 256
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, device=dev, generator=g) * 0.02


def time_graph(fn, replays=200):
    """Milliseconds per replay of fn captured as one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


W = {
    "q": [rand(H, D, DH) for _ in range(LAYERS)],
    "k": [rand(HKV, D, DH) for _ in range(LAYERS)],
    "v": [rand(HKV, D, DH) for _ in range(LAYERS)],
    "o": [rand(H, DH, D) for _ in range(LAYERS)],
    "gate": [rand(D, I) for _ in range(LAYERS)],
    "up": [rand(D, I) for _ in range(LAYERS)],
    "down": [rand(I, D) for _ in range(LAYERS)],
}
P = {k: [w.permute(1, 0, 2).reshape(D, -1).contiguous() if k in "qkv" else w for w in ws]
     for k, ws in W.items() if k in ("q", "k", "v")}

rows = [1, 2, 5, 16]
print(f"ms per replay of {LAYERS} layers' products (one CUDA graph each), TF32 off, {torch.cuda.get_device_name()}")
print("| kind | " + " | ".join(f"T={t}" for t in rows) + " |")
print("|---|" + "---|" * len(rows))
results = {}
for t in rows:
    x4 = rand(1, 1, t, D)
    y4 = rand(1, H, t, DH)
    h4 = rand(1, 1, t, I)
    x2 = rand(t, D)
    kinds = {
        "q/k/v heads": lambda: [x4 @ W[k][l] for l in range(LAYERS) for k in "qkv"],
        "q/k/v plain": lambda: [x2 @ P[k][l] for l in range(LAYERS) for k in "qkv"],
        "o heads + sum": lambda: [(y4 @ W["o"][l]).sum(1) for l in range(LAYERS)],
        "gate/up/down": lambda: [(x4 @ W["gate"][l], x4 @ W["up"][l], h4 @ W["down"][l]) for l in range(LAYERS)],
    }
    q = rand(1, H, t, DH)
    kb, vb = rand(1, H, L, DH), rand(1, H, L, DH)
    mask = torch.zeros(1, 1, t, L, device=dev)
    kinds["attention (sdpa, L=256)"] = lambda: [
        torch.nn.functional.scaled_dot_product_attention(q, kb, vb, attn_mask=mask) for _ in range(LAYERS)]
    for name, fn in kinds.items():
        results.setdefault(name, []).append(time_graph(fn))
for name, ms in results.items():
    print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in ms) + " |")
