#!/usr/bin/env python3
"""Decode greedily from a static export (`m2r2 export --static-cache L`) with ONNX Runtime and
IoBinding, the KV cache updated in place, and print the generated token ids as a JSON list on the
last stdout line.

    m2r2 export --model tiny --out tiny-static --static-cache 64
    python onnxruntime_static.py tiny-static --tokens 1,2,3 --max-new-tokens 12

The static model.onnx (docs/STATIC.md), B = 1 here:
  in   input_ids, position_ids         int64 [B, T]
       attn_mask                       f32   [B, 1, T, L]  additive: 0 where a row sees a key
       write_indices                   int64 [B]           buffer position of the step's first row
       past_key_values.{i}.key/.value  f32   [B, Hkv, L, Dh]
  out  logits                          f32   [B, T, V]
       present.{i}.key/.value          f32   [B, Hkv, L, Dh]  the buffers with the step's rows
Each layer's key and value buffer is allocated once and bound as both its past input and its
present output, so the graph's TensorScatter writes the new rows into the buffer it reads: no
per-step copy of the cache (fed as plain inputs, ONNX Runtime warns "in-place optimization not
activated" and copies every buffer each step). The prompt runs as one prefill, then one token per
step, until --max-new-tokens or the export's end-of-turn tokens (unless --ignore-eos).
Needs numpy and onnxruntime only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

import numpy as np
import onnxruntime as ort

# The value of a hidden key in attn_mask (the exporter's HIDDEN: f32::MIN, finite so that a fully
# masked row stays finite).
HIDDEN = np.finfo(np.float32).min

# End-of-turn tokens of common chat formats, stopped on when the vocabulary has them (as the
# reference's tokenizer does: reference/src/io/tokenizer.rs, END_OF_TURN).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def read_json(path: Path) -> dict:
    """The JSON object at ``path``, or {} when the file does not exist."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def stop_tokens(folder: Path, config: dict) -> List[int]:
    """The ids the decode stops at, as onnxruntime_greedy.py chooses them: the manifest's
    ``stop_token_ids``; in older exports, the config's ``eos_token_ids``, then the tokenizer's EOS
    and the end-of-turn tokens in its vocabulary (a static folder has no genai_config.json)."""
    recorded = read_json(folder / "m2r2_export.json").get("stop_token_ids")
    if isinstance(recorded, list):
        return [t for t in recorded if isinstance(t, int)]
    stops: List[int] = []

    def add(ids) -> None:
        for t in ids if isinstance(ids, list) else [ids]:
            if isinstance(t, int) and t not in stops:
                stops.append(t)

    add(config.get("eos_token_ids") or [])
    tokenizer = read_json(folder / "tokenizer.json")
    ids = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
    vocab = tokenizer.get("model", {}).get("vocab")
    if isinstance(vocab, dict):
        ids = {**vocab, **ids}
    eos = read_json(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):  # {"content": "</s>", ...} in some tokenizer configs
        eos = eos.get("content")
    for text in (eos, *END_OF_TURN):
        if text in ids:
            add(ids[text])
    return stops


def attn_mask(pos0: int, rows: int, l_max: int, window) -> np.ndarray:
    """Rows at positions pos0..pos0 + rows see keys 0..=p (the last ``window`` of them when the
    config has a sliding window); every other key, filled or not, is hidden. [1, 1, rows, L]"""
    p = np.arange(pos0, pos0 + rows)[:, None]  # [rows, 1]
    j = np.arange(l_max)[None, :]  # [1, L]
    visible = (j <= p) & ((p - j < window) if window else True)
    return np.where(visible, 0.0, HIDDEN).astype(np.float32)[None, None]


def load_session(model: Path, provider: str) -> ort.InferenceSession:
    """``model`` in ONNX Runtime on ``provider``; a file it cannot load (truncated, not ONNX) or a
    session that fell back to another provider is a one-line error naming the file."""
    try:
        session = ort.InferenceSession(str(model), providers=[provider])
    except Exception as e:  # InvalidProtobuf, InvalidGraph, Fail, ...: one per cause
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SystemExit(
            f"{model}: ONNX Runtime cannot load this graph ({reason}): is the file complete? "
            "export the folder again"
        ) from None
    if session.get_providers()[0] != provider:  # registered, but the session fell back
        raise SystemExit(
            f"{model}: ONNX Runtime could not run the session on {provider} (it fell back to "
            f"{session.get_providers()[0]}; its log above says why)"
        )
    return session


def check_buffers(session: ort.InferenceSession, model: Path, l_max: int) -> None:
    """The manifest's ``static_cache.l_max`` must be the length the graph declares for its KV
    buffers (``past_key_values.0.key`` [B, Hkv, L, Dh]): the masks and buffers are sized by it,
    and ONNX Runtime would refuse them on the first run with a raw error."""
    name = "past_key_values.0.key"
    shape = next((i.shape for i in session.get_inputs() if i.name == name), None)
    if shape is None:
        raise SystemExit(
            f"{model}: the graph has no input {name}: not the model.onnx of an m2r2 export; "
            "export the folder again"
        )
    declared = shape[2] if len(shape) == 4 else None
    if declared != l_max:
        held = (
            f"holds {declared} positions"
            if isinstance(declared, int)
            else f"has no fixed positions axis (shape {shape})"
        )
        raise SystemExit(
            f"{model}: m2r2_export.json says static_cache.l_max = {l_max}, but the graph's "
            f"{name} {held} (the manifest and the graph disagree: export the folder again)"
        )


def decode(folder: Path, prompt: List[int], max_new: int, ignore_eos: bool, provider: str):
    """Greedy tokens after ``prompt``: at most ``max_new``, ending after the first stop token."""
    manifest_path = folder / "m2r2_export.json"
    if not manifest_path.is_file():
        raise SystemExit(f"{folder}: not an m2r2 export (no m2r2_export.json)")
    manifest = json.loads(manifest_path.read_text())
    static = manifest.get("static_cache")
    if static is None:
        raise SystemExit(
            f"{folder}: not a static export (m2r2_export.json has no static_cache): export with "
            "--static-cache L, or decode this folder with onnxruntime_greedy.py"
        )
    config, l_max = manifest["config"], static["l_max"]
    graph = manifest.get("graphs", {}).get("model")
    if graph is None:
        raise SystemExit(f"{folder}: the export has no model.onnx (export it with --graphs model)")
    model = folder / graph
    available = ort.get_available_providers()
    if provider not in available:  # ONNX Runtime would warn and run on the CPU instead
        raise SystemExit(
            f"--provider {provider}: this onnxruntime build offers {', '.join(available)}"
        )
    session = load_session(model, provider)
    check_buffers(session, model, l_max)
    needed = len(prompt) + max_new - 1  # the last token is chosen, never fed
    if needed > l_max:
        raise SystemExit(
            f"{model}: the static cache holds {l_max} positions and this decode needs {needed}; "
            "export with a larger --static-cache"
        )
    vocab = config["vocab_size"]
    for i, t in enumerate(prompt):
        # ONNX Gather takes -V..V-1: a negative id would silently read a row from the end
        if not 0 <= t < vocab:
            raise SystemExit(
                f"--tokens: token id {t} at position {i} is out of range: the vocabulary of "
                f"{model} has {vocab} tokens"
            )
    stops = [] if ignore_eos else stop_tokens(folder, config)
    device = "cuda" if provider.startswith("CUDA") else "cpu"
    binding = session.io_binding()
    binding.bind_output("logits", "cpu")  # bound first: get_outputs()[0]
    # one zeroed key and value buffer per layer (uninitialised memory could hold NaN, which a
    # hidden key's zero weight does not cancel), bound once as past input and present output
    shape = (1, config["num_key_value_heads"], l_max, config["head_dim"])  # [1, Hkv, L, Dh]
    buffers = []  # OrtValues held for the whole decode (on the CPU each wraps its numpy array)
    for i in range(config["num_hidden_layers"]):
        for kv in ("key", "value"):
            buffer = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32), device, 0)
            buffers.append(buffer)
            binding.bind_ortvalue_input(f"past_key_values.{i}.{kv}", buffer)
            binding.bind_ortvalue_output(f"present.{i}.{kv}", buffer)

    ids, pos, tokens = list(prompt), 0, []  # ids: the rows fed this run, from position pos
    while True:
        t = len(ids)
        binding.bind_cpu_input("input_ids", np.array([ids], dtype=np.int64))  # [1, T]
        binding.bind_cpu_input("position_ids", np.arange(pos, pos + t, dtype=np.int64)[None])
        binding.bind_cpu_input("write_indices", np.array([pos], dtype=np.int64))  # [1]
        binding.bind_cpu_input("attn_mask", attn_mask(pos, t, l_max, config.get("sliding_window")))
        binding.bind_output("logits", "cpu")  # [1, T, V], unallocated again: T changes
        session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()  # [1, T, V]
        token = int(np.argmax(logits[0, -1]))
        tokens.append(token)
        if len(tokens) == max_new or token in stops:
            return tokens
        pos, ids = pos + t, [token]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="an `m2r2 export --static-cache L` folder")
    parser.add_argument("--tokens", required=True, help="prompt token ids, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--ignore-eos", action="store_true", help="do not stop at the end-of-turn tokens"
    )
    parser.add_argument("--provider", default="CPUExecutionProvider", help="ONNX Runtime EP")
    args = parser.parse_args(argv)
    try:
        prompt = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        raise SystemExit(f"--tokens {args.tokens!r}: expected ids like 1,2,3") from None
    if args.max_new_tokens < 1:
        raise SystemExit("--max-new-tokens must be at least 1")
    tokens = decode(args.folder, prompt, args.max_new_tokens, args.ignore_eos, args.provider)
    print(json.dumps(tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
