# Timing of one ONNX model on ONNX Runtime's CPU provider, shared by the cost scripts
# (attention_cost.py, o_proj_cost.py): microseconds a session run, Python's per-run overhead
# included. Needs onnxruntime (scripts/onnx-check/requirements.txt).
import time

import onnxruntime as ort


def time_us(model, feeds, threads, runs, warmup, rounds=1):
    """The best of `rounds` rounds of `runs` runs after `warmup` runs, in us a run, and the first
    output of the last run (for the callers' equality checks)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options)
    for _ in range(warmup):
        out = session.run(None, feeds)[0]
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(runs):
            session.run(None, feeds)
        best = min(best, (time.perf_counter() - start) / runs * 1e6)
    return best, out
