"""Reading a golden file of format version 1 to 5, validated as docs/GOLDEN.md specifies and as
the reference's reader does (reference/src/golden/file.rs, reference/src/golden/m2r2/mod.rs): every
error is a ValueError naming the file and the tensor or metadata key."""

from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Tuple, Union

import numpy as np
from safetensors import SafetensorError, safe_open

from .golden import (
    DTYPES,
    FORMAT,
    GREEDY_FORMAT_VERSION,
    READ_VERSIONS,
    TREE_FORMAT_VERSION,
    Golden,
    proposal_rounds,
    verify_rounds,
)

PathLike = Union[str, "os.PathLike[str]"]

# safetensors dtype name -> numpy dtype, for the two dtypes a golden holds
_DTYPES = {"I64": np.int64, "F32": np.float32}
_U32_MAX = 2**32 - 1
# the values of the M2R2 metadata keys that name something (reference: GateKind, KvPolicy)
_GATES = ("arla", "confidence", "entropy")
_KV_POLICIES = ("exact", "fast-kv")
# A decimal number as Rust's `f32::from_str` reads it (no spaces or `_`, which Python's float takes)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def read(path: PathLike) -> Golden:
    """Read and validate the golden file at ``path``.

    Raises:
        FileNotFoundError / OSError: the file cannot be opened.
        ValueError: not a golden file, an unsupported format version or mode, a missing tensor or
            metadata key, a wrong dtype or shape; the message names the file and what is wrong.
    """
    label = os.fspath(path)
    os.stat(label)  # a missing file is an OSError naming it, not a format error
    try:
        with safe_open(label, framework="np") as handle:
            return _read(_File(label, handle))
    except SafetensorError as e:
        raise ValueError(f"{label}: corrupt or unsupported file: {e}") from None


class _File:
    """An open golden file: metadata and tensors, with errors naming the file."""

    def __init__(self, label: str, handle) -> None:
        self.label = label
        self.handle = handle
        self.metadata: Dict[str, str] = dict(handle.metadata() or {})
        self.names = set(handle.keys())

    def error(self, msg: str) -> ValueError:
        return ValueError(f"{self.label}: {msg}")

    def field(self, key: str) -> str:
        if key not in self.metadata:
            raise self.error(f"not a golden file: metadata `{key}` is missing")
        return self.metadata[key]

    def integer(self, key: str) -> int:
        value = self.field(key)
        if not (value.isascii() and value.isdigit()):
            raise self.error(f"metadata `{key}` = `{value}` is not valid (a non-negative integer)")
        return int(value)

    def choice(self, key: str, options: Tuple[str, ...]) -> str:
        value = self.field(key)
        if value not in options:
            raise self.error(f"metadata `{key}` = `{value}` is not valid ({', '.join(options)})")
        return value

    def number(self, key: str) -> float:
        value = self.field(key)
        try:
            return float(value)
        except ValueError:
            raise self.error(f"metadata `{key}` = `{value}` is not valid (a number)") from None

    def numbers(self, key: str) -> List[float]:
        """One number, or a comma-separated list of them (early exit's per-gate thresholds)."""
        value = self.field(key)
        try:
            return [float(part) for part in value.split(",")]
        except ValueError:
            raise self.error(
                f"metadata `{key}` = `{value}` is not valid (a number, or one per gate separated "
                "by commas)"
            ) from None

    def id_list(self, key: str) -> List[int]:
        """A JSON list of token ids (each in ``0..=u32::MAX``), as ``stop_tokens`` holds."""
        value = self.field(key)
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, list) or not all(
            type(t) is int and 0 <= t <= _U32_MAX for t in parsed
        ):
            raise self.error(
                f"metadata `{key}` = `{value}` is not valid (a JSON list of token ids)"
            )
        return parsed

    def tolerance(self, key: str) -> None:
        """Optional ``key``: a finite number >= 0 that fits an f32, as the reference reads a pin."""
        value = self.metadata.get(key)
        if value is None:
            return
        ok = _DECIMAL.fullmatch(value) is not None
        if ok:
            with np.errstate(over="ignore"):
                x = np.float32(float(value))
            ok = bool(np.isfinite(x)) and x >= 0
        if not ok:
            raise self.error(f"metadata `{key}` = `{value}` is not valid (a finite number >= 0)")

    def json_object(self, key: str) -> dict:
        value = self.field(key)
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise self.error(f"metadata `{key}` is not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise self.error(f"metadata `{key}` is not a JSON object")
        return parsed

    def tensor(self, name: str, dtype: str) -> np.ndarray:
        """The tensor ``name``, which must be stored as ``dtype`` (``I64`` or ``F32``)."""
        if name not in self.names:
            raise self.error(f"tensor `{name}` is missing")
        stored = self.handle.get_slice(name).get_dtype()
        if stored != dtype:
            raise self.error(f"tensor `{name}` has unsupported dtype {stored} (expected {dtype})")
        return np.ascontiguousarray(self.handle.get_tensor(name), dtype=_DTYPES[dtype])

    def expect_shape(self, name: str, array: np.ndarray, expected: Tuple[int, ...]) -> None:
        if tuple(array.shape) != tuple(expected):
            raise self.error(
                f"tensor `{name}` has shape {_shape(array.shape)}, expected {_shape(expected)}"
            )

    def ids(self, name: str) -> np.ndarray:
        """A 1-D I64 tensor of token ids, each in ``0..=u32::MAX`` as the reference requires."""
        values = self.tensor(name, "I64")
        if values.ndim != 1:
            raise self.error(f"tensor `{name}` has shape {_shape(values.shape)}, expected [n]")
        bad = values[(values < 0) | (values > _U32_MAX)]
        if bad.size:
            raise self.error(f"`{name}` holds token id {int(bad[0])}")
        return values


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _read(file: _File) -> Golden:
    if file.field("format") != FORMAT:
        raise file.error(f"not a golden file (metadata `format` is not {FORMAT})")
    version = file.field("format_version")
    mode = file.field("mode")
    if version == str(GREEDY_FORMAT_VERSION):
        if mode != "greedy":
            raise file.error(
                f"golden format version 1 has no mode `{mode}` (only greedy; metadata `mode`)"
            )
    elif version not in [str(v) for v in READ_VERSIONS]:
        raise file.error(
            f"golden format version {version} is not supported (metadata `format_version`; "
            f"this reader reads {GREEDY_FORMAT_VERSION} to {READ_VERSIONS[-1]})"
        )
    v = int(version)
    for key in ("model", "config_hash"):
        file.field(key)
    file.json_object("config")
    if v >= 3:
        # stop_tokens (the end-of-turn ids it stops at, [] for none), max_steps, optional pins
        file.id_list("stop_tokens")
        file.integer("max_steps")
        file.tolerance("atol")
        file.tolerance("rtol")
        if "expect_dtype" in file.metadata:
            file.choice("expect_dtype", DTYPES)

    # prompt_tokens [P], tokens [n], logits [n, V]
    prompt_tokens = file.ids("prompt_tokens")
    tokens = file.ids("tokens")
    logits = file.tensor("logits", "F32")
    n = len(tokens)
    if logits.ndim != 2:
        shape = _shape(logits.shape)
        raise file.error(f"tensor `logits` has shape {shape}, expected [n, V] with n = {n}")
    file.expect_shape("logits", logits, (n, logits.shape[1]))

    extra: Dict[str, np.ndarray] = {}
    if mode == "early-exit":
        extra = _early_exit(file, n)
    elif mode == "speculative":
        extra = _speculative(file, n, v)
    elif mode != "greedy":
        raise file.error(f"unknown golden mode `{mode}` (greedy, early-exit, speculative)")
    return Golden(
        prompt_tokens=prompt_tokens,
        tokens=tokens,
        logits=logits,
        metadata=dict(file.metadata),
        path=file.label,
        **extra,
    )


def _m2r2_common(file: _File) -> dict:
    file.field("m2r2_hash")
    return file.json_object("m2r2_config")


def _early_exit(file: _File, n: int) -> Dict[str, np.ndarray]:
    """exit_gate [n], gate_scores [n, J] with J the number of gates of ``m2r2_config``."""
    config = _m2r2_common(file)
    gates: List = config.get("gates")
    if not isinstance(gates, list):
        raise file.error("metadata `m2r2_config` has no `gates` list")
    file.choice("gate", _GATES)
    thresholds = file.numbers("threshold")
    if len(thresholds) > 1 and len(thresholds) != len(gates):
        raise file.error(
            f"metadata `threshold` has {len(thresholds)} per-gate thresholds for {len(gates)} gates"
        )
    file.choice("kv_policy", _KV_POLICIES)
    exit_gate = file.tensor("exit_gate", "I64")
    file.expect_shape("exit_gate", exit_gate, (n,))
    gate_scores = file.tensor("gate_scores", "F32")
    file.expect_shape("gate_scores", gate_scores, (n, len(gates)))
    return {"exit_gate": exit_gate, "gate_scores": gate_scores}


def _speculative(file: _File, n: int, version: int) -> Dict[str, np.ndarray]:
    """round_drafted [R, M], round_accepted [R], round_base_token [R], round_scores [R, M + 1];
    from version 3 also verify_logits [T, V'] and draft_logits [Q, V'] with T and Q the rows the
    rounds imply (golden.verify_rounds, golden.proposal_rounds). As in the reference's reader,
    their width is not checked here: a comparison checks it against the other file's."""
    _m2r2_common(file)
    file.integer("draft_gate")
    gate = file.choice("gate", ("none",) + _GATES)
    m = file.integer("draft_max")
    length = file.field("draft_length")
    if length == "tree":
        return _tree(file, n, version, gate, m)
    if length == "dynamic":
        if gate == "none":
            raise file.error("metadata `gate` = `none` is not valid (dynamic draft length)")
        file.number("draft_threshold")
    elif length != "fixed":
        raise file.error(f"metadata `draft_length` = `{length}` is not valid (fixed, dynamic, tree)")
    accepted = file.tensor("round_accepted", "I64")
    if accepted.ndim != 1:
        shape = _shape(accepted.shape)
        raise file.error(f"tensor `round_accepted` has shape {shape}, expected [R]")
    r = accepted.shape[0]
    if r == 0 and n > 1:
        # every token after the first comes from a round
        raise file.error(f"tensor `round_accepted` has no rounds for {n} tokens")
    base_token = file.tensor("round_base_token", "I64")
    file.expect_shape("round_base_token", base_token, (r,))
    drafted = file.tensor("round_drafted", "I64")
    file.expect_shape("round_drafted", drafted, (r, m))
    scores = file.tensor("round_scores", "F32")
    file.expect_shape("round_scores", scores, (r, m + 1))
    tensors = {
        "round_drafted": drafted,
        "round_accepted": accepted,
        "round_base_token": base_token,
        "round_scores": scores,
    }
    if version >= 3:
        rows = {
            "verify_logits": (len(verify_rounds(drafted)), "the prompt's row, per round 1 + drafts"),
            "draft_logits": (len(proposal_rounds(drafted, scores)), "one per proposal"),
        }
        for name, (count, why) in rows.items():
            values = file.tensor(name, "F32")
            width = values.shape[1] if values.ndim == 2 else "V"
            if values.ndim != 2 or values.shape[0] != count:
                raise file.error(
                    f"tensor `{name}` has shape {_shape(values.shape)}, expected "
                    f"[{count}, {width}] ({why})"
                )
            tensors[name] = values
    else:
        # a file that holds them but says an older version (edited?) would have them skipped as
        # "not recorded"
        held = [name for name in ("verify_logits", "draft_logits") if name in file.names]
        if held:
            raise file.error(
                f"holds `{held[0]}`, which format version {version} does not record (version 3 "
                "does): is `format_version` edited?"
            )
    return tensors


def _tree(file: _File, n: int, version: int, gate: str, depth: int) -> dict:
    """A token-tree record (metadata ``draft_length`` = ``tree``; tree.py): version 4 drafts the
    shape ``draft_tree`` every round; version 5 may grow it per branch (``tree_threshold``, with
    ``gate`` the gate that scores) and hang a prompt-lookup branch at the root (``prompt_lookup``,
    ``prompt_lookup_ngram``)."""
    from . import tree

    if version < TREE_FORMAT_VERSION:
        raise file.error(
            f"metadata `draft_length` = `tree`: token-tree goldens are format version "
            f"{TREE_FORMAT_VERSION}, this file says {version}"
        )
    spec = file.field("draft_tree")
    try:
        widths = [int(w) for w in spec.split(",")]
        tree.from_widths(widths)
    except ValueError:
        raise file.error(f"metadata `draft_tree` = `{spec}` is not valid (widths W1,W2,...)") from None
    if depth != len(widths):
        raise file.error(f"metadata `draft_max` = `{depth}` is not valid (the tree's depth)")
    newer = tree.GROWN_TREE_FORMAT_VERSION
    grown = "tree_threshold" in file.metadata
    if grown:
        if version < newer:
            raise file.error(
                f"metadata `tree_threshold`: trees that change from round to round are format "
                f"version {newer}, this file says {version}"
            )
        if gate == "none":
            raise file.error("metadata `gate` = `none` is not valid (a tree grown per branch)")
        if not np.isfinite(file.number("tree_threshold")):
            raise file.error("metadata `tree_threshold` is not valid (a finite number)")
    elif gate != "none":
        raise file.error(f"metadata `gate` = `{gate}` is not valid (a tree drafted whole)")
    branch = 0
    if "prompt_lookup" in file.metadata:
        if version < newer:
            raise file.error(
                f"metadata `prompt_lookup`: trees that change from round to round are format "
                f"version {newer}, this file says {version}"
            )
        branch = file.integer("prompt_lookup")
        ngram = file.field("prompt_lookup_ngram")
        parts = ngram.split(",")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or not (
            1 <= int(parts[0]) <= int(parts[1])
        ) or branch == 0:
            raise file.error(f"metadata `prompt_lookup_ngram` = `{ngram}` is not valid (MIN,MAX)")
    fields, trees = tree.read_tree_record(file, n, version, widths, grown, branch)
    fields["round_trees"] = trees
    return fields
