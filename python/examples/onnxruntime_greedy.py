#!/usr/bin/env python3
"""Decode a reference golden's prompt greedily with ONNX Runtime on an `m2r2 export` folder and
write the result as a golden file, to compare with `m2r2 golden compare`.

Like `m2r2 golden write`, the decode stops after the first end-of-turn token (the export's EOS and
end-of-turn ids, recorded in the golden's `stop_tokens`) unless `--ignore-eos`, within the
reference golden's budget (its `max_steps`; its token count for files before format version 3).

    m2r2 export --model tiny --out tiny-onnx
    m2r2 golden write --model tiny --tokens 1,2,3 --steps 6 --out ref.golden.safetensors
    python onnxruntime_greedy.py --export tiny-onnx --like ref.golden.safetensors \\
        --out actual.golden.safetensors
    m2r2 golden compare ref.golden.safetensors actual.golden.safetensors --atol 2e-4

The export's model.onnx (docs/ONNX.md): inputs input_ids, attention_mask, position_ids (int64,
[1, T] / [1, past + T]) and past_key_values.{i}.key / .value (float32 [1, Hkv, past, Dh]); outputs
logits [1, T, V] and present.{i}.key / .value [1, Hkv, past + T, Dh]. The layer count, Hkv and Dh
come from the export's m2r2_export.json; the stop tokens from its config's `eos_token_ids` and
its tokenizer files (tokenizer_config.json's `eos_token`, genai_config.json's `eos_token_id`, and
the end-of-turn tokens of common chat formats in tokenizer.json), as the reference chooses them.
Needs onnxruntime, numpy and m2r2_golden.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnxruntime as ort

import m2r2_golden


# End-of-turn tokens of common chat formats, stopped on when the vocabulary has them (as the
# reference's tokenizer does: reference/src/io/tokenizer.rs, END_OF_TURN).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def load_export(folder: Path, provider: str) -> Tuple[ort.InferenceSession, dict]:
    """The export's model.onnx session and its manifest's model config."""
    manifest_path = folder / "m2r2_export.json"
    if not manifest_path.is_file():
        raise SystemExit(f"{folder}: not an m2r2 export (no m2r2_export.json)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("static_cache") is not None:
        raise SystemExit(
            f"{folder}: a static export (--static-cache): its model.onnx takes attn_mask and "
            "write_indices and fixed KV buffers, which this example does not drive; use an export "
            "without --static-cache"
        )
    graph = manifest.get("graphs", {}).get("model")
    if graph is None:
        raise SystemExit(f"{folder}: the export has no model.onnx (export it with --graphs model)")
    available = ort.get_available_providers()
    if provider not in available:  # ONNX Runtime would warn and run on the CPU instead
        raise SystemExit(
            f"--provider {provider}: this onnxruntime build offers {', '.join(available)}"
        )
    session = ort.InferenceSession(str(folder / graph), providers=[provider])
    if session.get_providers()[0] != provider:  # registered, but the session fell back
        raise SystemExit(
            f"{folder / graph}: ONNX Runtime could not run the session on {provider} (it fell "
            f"back to {session.get_providers()[0]}; its log above says why)"
        )
    return session, manifest["config"]


def read_json(path: Path) -> Optional[dict]:
    """The JSON object at ``path``, or None when the file does not exist."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not valid JSON: {e}") from None


def stop_tokens(folder: Path, config: dict) -> List[int]:
    """The ids a decode of this export stops at, as `m2r2 golden write` chooses them: the
    manifest's ``stop_token_ids``; in older exports, the config's ``eos_token_ids``, then the
    tokenizer's EOS and the end-of-turn tokens in its vocabulary."""
    recorded = (read_json(folder / "m2r2_export.json") or {}).get("stop_token_ids")
    if isinstance(recorded, list):
        return [t for t in recorded if isinstance(t, int)]
    stops: List[int] = []

    def add(ids) -> None:
        for t in ids if isinstance(ids, list) else [ids]:
            if isinstance(t, int) and t not in stops:
                stops.append(t)

    add(config.get("eos_token_ids") or [])
    genai = read_json(folder / "genai_config.json") or {}
    add(genai.get("model", {}).get("eos_token_id"))
    tokenizer = read_json(folder / "tokenizer.json")
    if tokenizer is not None:
        # token text -> id: the added (special) tokens, and the model's vocabulary when a map
        ids = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
        vocab = tokenizer.get("model", {}).get("vocab")
        if isinstance(vocab, dict):
            ids = {**vocab, **ids}
        eos = (read_json(folder / "tokenizer_config.json") or {}).get("eos_token")
        if isinstance(eos, dict):  # {"content": "</s>", ...} in some tokenizer configs
            eos = eos.get("content")
        for text in (eos, *END_OF_TURN):
            if text in ids:
                add(ids[text])
    return stops


def empty_past(config: dict) -> Dict[str, np.ndarray]:
    """past_key_values.{i}.key / .value with past_sequence_length = 0: [1, Hkv, 0, Dh] each."""
    hkv = config["num_key_value_heads"]
    dh = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    empty = np.zeros((1, hkv, 0, dh), dtype=np.float32)
    return {
        f"past_key_values.{i}.{kv}": empty
        for i in range(config["num_hidden_layers"])
        for kv in ("key", "value")
    }


def decode_greedy(
    session: ort.InferenceSession,
    config: dict,
    prompt: List[int],
    steps: int,
    stops: Sequence[int] = (),
) -> Tuple[List[int], np.ndarray]:
    """Prefill ``prompt``, then feed each chosen token with the KV cache, up to ``steps`` tokens,
    stopping after the first token in ``stops``.

    Returns the tokens [n] and the logits [n, V] each was chosen from (row 0: the last prompt
    position).
    """
    if not prompt:
        raise SystemExit("the golden's prompt is empty: nothing to prefill")
    inputs = {i.name for i in session.get_inputs()}
    past = empty_past(config)
    missing = sorted(set(past) - inputs)
    if missing:
        raise SystemExit(f"model.onnx has no input {missing[0]} (is this an m2r2 export?)")
    outputs = [o.name for o in session.get_outputs()]
    ids = list(prompt)  # the rows fed in this run
    pos = 0  # cache position of ids[0]
    tokens: List[int] = []
    rows: List[np.ndarray] = []  # [V] each
    while len(tokens) < steps:
        t = len(ids)
        feeds = {
            "input_ids": np.array([ids], dtype=np.int64),  # [1, T]
            "attention_mask": np.ones((1, pos + t), dtype=np.int64),  # [1, past + T]
            "position_ids": np.arange(pos, pos + t, dtype=np.int64)[None],  # [1, T]
            **past,
        }
        out = dict(zip(outputs, session.run(None, feeds)))
        row = out["logits"][0, -1]  # [V]
        token = int(np.argmax(row))
        rows.append(row)
        tokens.append(token)
        if token in stops:
            break
        # present.{i}.* [1, Hkv, past + T, Dh] become the next run's past
        past = {name: out[name.replace("past_key_values.", "present.")] for name in past}
        pos += t
        ids = [token]
    vocab = config["vocab_size"]
    logits = np.stack(rows) if rows else np.zeros((0, vocab), dtype=np.float32)  # [n, V]
    return tokens, logits


def parse_perturb(text: str) -> Tuple[int, int, float]:
    try:
        step, token, delta = text.split(",")
        return int(step), int(token), float(delta)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEP,TOKEN,DELTA, got {text!r}") from None


def user_error(e: Exception) -> str:
    """One line for an error reading or writing a golden: m2r2_golden's ValueErrors name the file
    already; an OSError as `PATH: what went wrong`."""
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    return str(e)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", type=Path, required=True, help="an `m2r2 export` folder")
    parser.add_argument(
        "--like",
        required=True,
        help="the reference golden: its prompt, step count and model metadata are used",
    )
    parser.add_argument("--out", required=True, help="the golden file to write")
    parser.add_argument(
        "--perturb",
        type=parse_perturb,
        metavar="STEP,TOKEN,DELTA",
        help="add DELTA to logits[STEP, TOKEN] before writing (to see a failing compare)",
    )
    parser.add_argument("--provider", default="CPUExecutionProvider", help="ONNX Runtime EP")
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="keep decoding past the end-of-turn tokens (by default the decode stops after the "
        "first one, as deployments and `m2r2 golden write` do)",
    )
    args = parser.parse_args(argv)

    try:
        ref = m2r2_golden.read(args.like)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--like: {user_error(e)}") from None
    if ref.mode != "greedy":
        print(
            f"note: {args.like} records mode {ref.mode}; this writes a greedy golden, which "
            "`m2r2 golden compare` compares only with a greedy one",
            file=sys.stderr,
        )
    session, config = load_export(args.export, args.provider)
    if config != ref.config:
        raise SystemExit(f"{args.export} exports another model config than {args.like} records")
    steps = ref.max_steps if ref.max_steps is not None else len(ref.tokens)
    stops = [] if args.ignore_eos else stop_tokens(args.export, config)
    if ref.stop_tokens and stops and set(stops) != set(ref.stop_tokens):
        print(
            f"note: {args.like} stops at {ref.stop_tokens}, this export's tokenizer at {stops}",
            file=sys.stderr,
        )
    prompt = ref.prompt_tokens.tolist()
    tokens, logits = decode_greedy(session, config, prompt, steps, stops)
    if args.perturb is not None:
        step, token, delta = args.perturb
        if not (0 <= step < logits.shape[0] and 0 <= token < logits.shape[1]):
            raise SystemExit(f"--perturb {step},{token}: outside logits {list(logits.shape)}")
        logits[step, token] += delta
    try:
        m2r2_golden.write(
            args.out,
            prompt_tokens=ref.prompt_tokens,
            tokens=tokens,
            logits=logits,
            like=ref,
            stop_tokens=stops,
            max_steps=steps,
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"--out: {user_error(e)}") from None
    if args.ignore_eos:
        ending = "recorded without stopping (--ignore-eos)"
    elif tokens and tokens[-1] in stops:
        ending = f"stopped at end of turn, token {tokens[-1]}"
    else:
        ending = f"did not reach end of turn (stop tokens {stops})"
    print(
        f"wrote {args.out}: {len(tokens)} of {steps} greedy steps on ONNX Runtime "
        f"({args.provider}; {ending})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
