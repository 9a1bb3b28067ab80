"""Writing a greedy golden (format version 1, docs/GOLDEN.md) from any engine's tokens and logits.

The model metadata is copied from the reference's golden, never rebuilt: ``config_hash`` is the
first 16 hex digits of SHA-256 over the reference's own JSON text of its config (Rust serde_json),
which Python's ``json`` does not reproduce byte for byte (``1e-5`` vs ``1e-05``), so the ``config``
string and its hash travel together, verbatim.
"""

from __future__ import annotations

import json
import os
import re
from typing import Union

import numpy as np
from safetensors.numpy import save_file

from .golden import FORMAT, GREEDY_FORMAT_VERSION, Golden
from .reader import PathLike, read

# what the file records as its writer (`m2r2_version`; the reference writes its crate version)
WRITER = "m2r2-golden-python"
_HASH = re.compile(r"[0-9a-f]{16}")
_U32_MAX = 2**32 - 1


def write(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    like: Union[PathLike, Golden],
) -> Golden:
    """Write a greedy golden of the model that ``like`` (a golden file or a read :class:`Golden`)
    records: its ``model``, ``config`` and ``config_hash`` are copied verbatim.

    The usual ``like`` is the reference golden being replayed: read its ``prompt_tokens``, run
    your engine greedily for ``len(like.tokens)`` steps, and write the result like it.

    Args:
        prompt_tokens: ``[P]`` integer token ids.
        tokens: ``[n]`` integer token ids, the greedy tokens.
        logits: ``[n, V]`` floats (written as float32): row ``i`` holds the logits token ``i`` was
            chosen from (row 0: the last prompt position).

    Returns the written golden. Raises ValueError on inputs that do not fit the format.
    """
    ref = like if isinstance(like, Golden) else read(like)
    return write_greedy(
        path,
        prompt_tokens=prompt_tokens,
        tokens=tokens,
        logits=logits,
        model=ref.model,
        config_json=ref.config_json,
        config_hash=ref.config_hash,
    )


def write_greedy(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    model: str,
    config_json: str,
    config_hash: str,
) -> Golden:
    """:func:`write` with the model metadata given explicitly.

    ``config_json`` and ``config_hash`` must be the reference's own (a golden's ``config`` and
    ``config_hash`` metadata, or ``m2r2 golden write``'s): ``golden compare`` refuses files whose
    hashes differ. The hash is checked for its form only; it is not recomputed here.
    """
    label = os.fspath(path)
    if not isinstance(model, str) or not model:
        raise ValueError(f"{label}: `model` must be a non-empty string")
    if not isinstance(config_hash, str) or not _HASH.fullmatch(config_hash):
        raise ValueError(
            f"{label}: `config_hash` must be 16 lowercase hex digits as the reference writes it "
            f"(copy it from the reference's golden), got {config_hash!r}"
        )
    if not isinstance(config_json, str):
        raise ValueError(f"{label}: `config_json` must be the reference's config JSON text (a str)")
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as e:
        raise ValueError(f"{label}: `config_json` is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{label}: `config_json` is not a JSON object")

    prompt = _ids(label, "prompt_tokens", prompt_tokens)
    toks = _ids(label, "tokens", tokens)
    rows = _logits(label, logits, len(toks))  # [n, V]
    v = rows.shape[1]
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and v != vocab:
        raise ValueError(
            f"{label}: `logits` has {v} columns but the config's vocab_size is {vocab} "
            "(an engine that pads its vocabulary must cut the rows to vocab_size)"
        )
    for name, ids in (("prompt_tokens", prompt), ("tokens", toks)):
        if ids.size and int(ids.max()) >= v:
            raise ValueError(f"{label}: `{name}` holds token id {int(ids.max())} >= V = {v}")

    metadata = {
        "format": FORMAT,
        "format_version": str(GREEDY_FORMAT_VERSION),
        "model": model,
        "config_hash": config_hash,
        "config": config_json,
        "mode": "greedy",
        "m2r2_version": _writer_version(),
    }
    tensors = {"prompt_tokens": prompt, "tokens": toks, "logits": rows}
    save_file(tensors, label, metadata=metadata)
    return Golden(prompt_tokens=prompt, tokens=toks, logits=rows, metadata=metadata, path=label)


def _writer_version() -> str:
    from . import __version__

    return f"{WRITER} {__version__}"


def _ids(label: str, name: str, values) -> np.ndarray:
    """``values`` as a C-contiguous int64 ``[n]`` array of token ids in ``0..=u32::MAX``."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{label}: `{name}` must be 1-D token ids, got shape {list(array.shape)}")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{label}: `{name}` must hold integers, got dtype {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) > _U32_MAX):
        bad = int(array.min()) if int(array.min()) < 0 else int(array.max())
        raise ValueError(f"{label}: `{name}` holds token id {bad} (ids are 0..=2^32-1)")
    return np.ascontiguousarray(array, dtype=np.int64)


def _logits(label: str, values, n: int) -> np.ndarray:
    """``values`` as a C-contiguous float32 ``[n, V]`` array."""
    array = np.asarray(values)
    if array.ndim != 2:
        raise ValueError(
            f"{label}: `logits` must be 2-D [n, V] (one row per token), got shape "
            f"{list(array.shape)}"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{label}: `logits` must hold floats, got dtype {array.dtype}")
    if array.shape[0] != n:
        raise ValueError(
            f"{label}: `logits` has {array.shape[0]} rows but there are {n} tokens "
            "(row i: the logits token i was chosen from)"
        )
    if array.shape[1] == 0:
        raise ValueError(f"{label}: `logits` has no columns (V = 0)")
    return np.ascontiguousarray(array, dtype=np.float32)
