"""The checks of what a writer is given: the model metadata, the token ids and logits (lists or
arrays, made the int64 and float32 arrays a golden holds), the stop, the budget and the pinned
tolerances, each error a ValueError naming the argument.

Apart from :mod:`m2r2_golden.writer` so that the chain's writer, its rounds
(:mod:`m2r2_golden.writer_rounds`) and the tree's writer (:mod:`m2r2_golden.tree_writer`) share
them."""

from __future__ import annotations

import json
import numbers
import re
from typing import Dict, Iterable

import numpy as np

from .golden import DTYPES
from .reader import config_hash as _config_hash

_HASH = re.compile(r"[0-9a-f]{16}")
_U32_MAX = 2**32 - 1


def _model_config(label: str, model: str, config_json: str, config_hash: str) -> dict:
    """The model metadata checked for its form; returns ``config_json`` parsed."""
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
    if _config_hash(config_json) != config_hash:
        raise ValueError(
            f"{label}: `config_hash` = {config_hash!r} is not the hash of `config_json` (it "
            f"hashes to {_config_hash(config_json)!r}): pass the reference's config text and its "
            "hash together, as its golden records them"
        )
    return config


def _decode(label: str, prompt_tokens, tokens, logits, config: dict):
    """prompt_tokens [P], tokens [n] (int64) and logits [n, V] (float32), V the config's; neither
    empty, as the reference writes no such golden (``the prompt encodes to no tokens``, ``--steps
    0 records nothing to check``) and `golden check` refuses one as NOT CHECKED."""
    prompt = _ids(label, "prompt_tokens", prompt_tokens)
    if prompt.size == 0:
        raise ValueError(
            f"{label}: `prompt_tokens` is empty: a decode starts from a prompt of 1 token or more"
        )
    toks = _ids(label, "tokens", tokens)
    if toks.size == 0:
        raise ValueError(
            f"{label}: `tokens` and `logits` record no step: there is nothing to check (record 1 "
            "step or more)"
        )
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
    return prompt, toks, rows


def _stops_and_pins(
    label: str,
    tokens: np.ndarray,
    stop_tokens,
    max_steps,
    atol,
    rtol,
    expect_dtype,
) -> Dict[str, str]:
    """The version-3 metadata: ``stop_tokens``, ``max_steps`` and the pins given, checked against
    the tokens: a decode stops after the first stop token it emits, else runs its budget."""
    if stop_tokens is None:
        stop_tokens = []
    elif isinstance(stop_tokens, Iterable) and not isinstance(stop_tokens, (str, np.ndarray)):
        stop_tokens = list(stop_tokens)  # a set, a generator: an int is refused as not 1-D
    stops = _ids(label, "stop_tokens", stop_tokens)
    n = len(tokens)
    if max_steps is None:
        max_steps = n
    if not isinstance(max_steps, numbers.Integral) or isinstance(max_steps, bool):
        raise ValueError(f"{label}: `max_steps` must be an integer, got {max_steps!r}")
    max_steps = int(max_steps)
    if max_steps < n:
        raise ValueError(f"{label}: `max_steps` = {max_steps} is less than the {n} tokens")
    early = np.flatnonzero(np.isin(tokens[:-1], stops))
    if early.size:
        i = int(early[0])
        raise ValueError(
            f"{label}: `tokens` holds stop token {int(tokens[i])} at step {i} of {n}: a decode "
            "stops after the first stop token it emits"
        )
    if n < max_steps and not (n and np.isin(tokens[-1], stops)):
        end = f"ends at {int(tokens[-1])}" if n else "is empty"
        raise ValueError(
            f"{label}: `tokens` has {n} of max_steps = {max_steps} steps and {end}, not a stop "
            f"token (stop_tokens = {stops.tolist()}): a decode runs its whole budget unless it "
            "stops at one"
        )
    metadata = {
        # as the reference writes it (Rust's `{:?}` of the ids): [256, 258]
        "stop_tokens": "[" + ", ".join(str(int(t)) for t in stops) + "]",
        "max_steps": str(max_steps),
    }
    for key, value in (("atol", atol), ("rtol", rtol)):
        if value is not None:
            metadata[key] = _tolerance(label, key, value)
    if expect_dtype is not None:
        if expect_dtype not in DTYPES:
            raise ValueError(
                f"{label}: `expect_dtype` = {expect_dtype!r} is not valid ({', '.join(DTYPES)})"
            )
        metadata["expect_dtype"] = expect_dtype
    return metadata


def _tolerance(label: str, key: str, value) -> str:
    """A pinned tolerance as the reference writes it: the shortest text of the f32 value."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        with np.errstate(over="ignore"):
            x = np.float32(value)
        ok = bool(np.isfinite(x)) and x >= 0
    if not ok:
        raise ValueError(f"{label}: `{key}` must be a finite number >= 0 (an f32), got {value!r}")
    return np.format_float_positional(x, unique=True, trim="-")


def _array(label: str, name: str, values) -> np.ndarray:
    """``np.asarray(values)``, with rows of different lengths (and other values numpy cannot make
    an array of) a ValueError naming the argument."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):
        array = None
    if array is None or array.dtype == object:
        raise ValueError(
            f"{label}: `{name}` is not an array of numbers (rows of different lengths?)"
        )
    return array


def _ints(label: str, name: str, values, ndim: int) -> np.ndarray:
    """``values`` as a C-contiguous int64 array of ``ndim`` dimensions."""
    array = _array(label, name, values)
    if array.ndim != ndim:
        raise ValueError(f"{label}: `{name}` must be {ndim}-D, got shape {list(array.shape)}")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{label}: `{name}` must hold integers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _ids(label: str, name: str, values) -> np.ndarray:
    """``values`` as a C-contiguous int64 ``[n]`` array of token ids in ``0..=u32::MAX``."""
    array = _array(label, name, values)
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
    array = _array(label, "logits", values)
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


def _float_rows(label: str, name: str, values, rows: int, v: int, why: str) -> np.ndarray:
    """``values`` as a C-contiguous float32 ``[rows, v]`` array (a graph's logits)."""
    array = _array(label, name, values)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"{label}: `{name}` must be 2-D floats [{rows}, {v}], got {array.dtype} of shape "
            f"{list(array.shape)}"
        )
    if array.shape != (rows, v):
        raise ValueError(
            f"{label}: `{name}` has shape {list(array.shape)}, the rounds give [{rows}, {v}] "
            f"({why})"
        )
    return np.ascontiguousarray(array, dtype=np.float32)
