"""Reading a golden file of format version 1 to 5, validated as docs/GOLDEN.md specifies and as
the reference's reader does (reference/src/golden/file.rs; the M2R2 modes' mode_file.rs, rounds.rs
and tree_file.rs in reference/src/golden/m2r2/): every error is a ValueError naming the file and
the tensor or metadata key. JSON metadata is read as the reference reads it
(:mod:`m2r2_golden.reference_json`)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
from safetensors import SafetensorError, safe_open

from .reference_json import GATES, KV_POLICIES, JsonError, check_struct, parse
from .golden import (
    COMMON_KEYS,
    DTYPES,
    FORMAT,
    GRAPH_TENSORS,
    GREEDY_FORMAT_VERSION,
    KIND_KEYS,
    M2R2_KEYS,
    M2R2_TENSORS,
    READ_VERSIONS,
    TREE_FORMAT_VERSION,
    VERSION_3_KEYS,
    Golden,
    drafted_in,
    proposal_rounds,
    verify_rounds,
)

PathLike = Union[str, "os.PathLike[str]"]

# safetensors dtype name -> numpy dtype, for the two dtypes a golden holds
_DTYPES = {"I64": np.int64, "F32": np.float32}
_U32_MAX = 2**32 - 1
# Rust's usize::MAX and isize::MAX (64-bit), which bound the reference's counts and sizes
_USIZE_MAX = 2**64 - 1
_ISIZE_MAX = 2**63 - 1
# `m2r2_weights_hash` as the reference reads it (reference/src/golden/m2r2/mode_file.rs)
_WEIGHTS_HASH = re.compile(r"[0-9a-fA-F]{16}")
# A number as Rust's `f32::from_str` reads it: decimal, or inf / infinity / nan in any case, each
# with an optional sign (no spaces or `_`, which Python's float takes)
_FLOAT = re.compile(
    r"[+-]?(?:inf|infinity|nan|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)", re.IGNORECASE
)
# What Rust's `str::trim` removes (Unicode White_Space), for the values the reference trims
_RUST_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)



def _f32(text: str) -> Optional[float]:
    """``text`` as Rust's ``f32::from_str`` reads it (too large for an f32: inf), or None where it
    refuses it."""
    if _FLOAT.fullmatch(text) is None:
        return None
    with np.errstate(over="ignore"):
        return float(np.float32(float(text)))


def _usize(text: str, plus: bool = True) -> Optional[int]:
    """``text`` as Rust's ``usize::from_str`` reads it (ASCII digits after an optional ``+``, at
    most usize::MAX; ``plus=False``: digits only, as the reference reads a count), or None where
    it refuses it."""
    digits = text[1:] if plus and text.startswith("+") else text
    # usize::MAX has 20 digits (and int() refuses thousands of them)
    if not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > 20:
        return None
    value = int(digits)
    return value if value <= _USIZE_MAX else None


def read(path: PathLike) -> Golden:
    """Read and validate the golden file at ``path``.

    Raises:
        FileNotFoundError / OSError: the file cannot be opened.
        ValueError: not a golden file, an unsupported format version or mode, a missing tensor or
            metadata key, a wrong dtype or shape; the message names the file and what is wrong.
    """
    label = os.fspath(path)
    os.stat(label)  # a missing file is an OSError naming it, not a format error
    if os.path.isdir(label):
        raise IsADirectoryError(errno.EISDIR, "a folder, not a golden file", label)
    try:
        with safe_open(label, framework="np") as handle:
            return _read(_File(label, handle))
    except SafetensorError as e:
        raise ValueError(f"{label}: corrupt or unsupported file: {e}") from None
    except OSError as e:
        # safetensors' own OSErrors do not name the file
        if e.filename is not None:
            raise
        raise OSError(e.errno or errno.EIO, f"cannot read it: {e.strerror or e}", label) from None


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

    def integer(self, key: str, plus: bool = False, limit: int = _USIZE_MAX) -> int:
        """A non-negative integer up to ``limit``: decimal digits, as the reference reads a count,
        or (``plus``) as it reads a ``usize``, which may start with ``+``."""
        value = self.field(key)
        parsed = _usize(value, plus)
        if parsed is None or parsed > limit:
            raise self.error(
                f"metadata `{key}` = `{value}` is not valid (a non-negative integer, at most "
                f"{limit})"
            )
        return parsed

    def choice(self, key: str, options: Tuple[str, ...]) -> str:
        value = self.field(key)
        if value not in options:
            raise self.error(f"metadata `{key}` = `{value}` is not valid ({', '.join(options)})")
        return value

    def number(self, key: str, finite: bool = False) -> float:
        """A number, read as an f32 (one too large for it: inf); ``finite``: inf and NaN refused."""
        value = self.field(key)
        x = _f32(value)
        if x is None or (finite and not np.isfinite(x)):
            what = "a finite number" if finite else "a number"
            raise self.error(f"metadata `{key}` = `{value}` is not valid ({what})")
        return x

    def numbers(self, key: str) -> List[float]:
        """One finite number, or a comma-separated list of them (early exit's per-gate
        thresholds; the reference trims the spaces around each)."""
        value = self.field(key)
        parsed = [_f32(part.strip(_RUST_SPACE)) for part in value.split(",")]
        if not all(x is not None and np.isfinite(x) for x in parsed):
            raise self.error(
                f"metadata `{key}` = `{value}` is not valid (a finite number, or one per gate "
                "separated by commas)"
            )
        return parsed

    def id_list(self, key: str) -> List[int]:
        """A JSON list of token ids (each in ``0..=u32::MAX``), as ``stop_tokens`` holds (read as
        serde_json reads a ``Vec<u32>``: ``-0`` and ``1e2`` are floats, no id)."""
        value = self.field(key)
        try:
            parsed = parse(value)
        except JsonError:
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
        x = _f32(value)
        if x is None or not (np.isfinite(x) and x >= 0):
            raise self.error(f"metadata `{key}` = `{value}` is not valid (a finite number >= 0)")

    def json_value(self, key: str):
        """Metadata ``key`` parsed as serde_json parses it (:func:`_json`)."""
        value = self.field(key)
        try:
            return parse(value)
        except JsonError as e:
            raise self.error(f"metadata `{key}` is not valid JSON: {e}") from None

    def json_object(self, key: str) -> dict:
        parsed = self.json_value(key)
        if not isinstance(parsed, dict):
            raise self.error(f"metadata `{key}` is not a JSON object")
        return parsed

    def m2r2_config(self) -> int:
        """Metadata ``m2r2_config``: the M2R2 settings, which must deserialise as the reference's
        ``M2r2Config`` (:data:`_STRUCTS`); returns their number of exit gates."""
        config = self.json_value("m2r2_config")
        try:
            check_struct(config, "M2r2Config", "")
        except JsonError as e:
            raise self.error(f"metadata `m2r2_config`: {e}") from None
        return len(config[1] if isinstance(config, list) else config["gates"])

    def check_emitted(self, accepted: np.ndarray, n: int) -> None:
        """Rounds accepting ``accepted`` drafts (each >= 0) must emit the ``n`` tokens, as the
        reference's reader requires (``check_emitted``, reference/src/golden/m2r2/rounds.rs): the
        first token comes from the prompt's row and each round emits its accepted drafts and a
        base token, so every round but the last emits all of them and the last at least one
        (fewer than all only where the budget or a stop token cut it, which the stop check
        covers). No rounds: the caller's to check."""
        counts = [abs(int(a)) + 1 for a in accepted]
        if not counts:
            return
        before = 1 + sum(counts[:-1])
        everything = before + counts[-1]
        if before < n <= everything:
            return
        raise self.error(
            f"tensor `round_accepted` does not agree with `tokens`: the prompt's token and "
            f"{len(counts)} rounds of accepted drafts and a base token each make {before} tokens "
            f"before the last round and {everything} with it, but `tokens` holds {n} (the last "
            "round emits at least one, and fewer than all only where the budget or a stop token "
            "cut it)"
        )

    def weights_hash(self) -> None:
        """Optional metadata ``m2r2_weights_hash``: 16 hex digits (either case), as the reference
        reads it; ``m2r2_hash`` must be there, in any form."""
        self.field("m2r2_hash")
        value = self.metadata.get("m2r2_weights_hash")
        if value is not None and not _WEIGHTS_HASH.fullmatch(value):
            raise self.error(
                f"metadata `m2r2_weights_hash` = `{value}` is not valid (16 hex digits)"
            )

    def tensor(self, name: str, dtype: str) -> np.ndarray:
        """The tensor ``name``, which must be stored as ``dtype`` (``I64`` or ``F32``)."""
        if name not in self.names:
            raise self.error(f"tensor `{name}` is missing")
        stored = self.handle.get_slice(name).get_dtype()
        if stored != dtype:
            raise self.error(f"tensor `{name}` has unsupported dtype {stored} (expected {dtype})")
        try:
            values = self.handle.get_tensor(name)
        except ValueError as e:
            # a shape numpy has no array of (no bytes, so the file holds it: [0, 2^63])
            shape = _shape(self.handle.get_slice(name).get_shape())
            raise self.error(f"tensor `{name}` of shape {shape}: {e}") from None
        return np.ascontiguousarray(values, dtype=_DTYPES[dtype])

    def expect_shape(self, name: str, array: np.ndarray, expected: Tuple[int, ...]) -> None:
        if tuple(array.shape) != tuple(expected):
            raise self.error(
                f"tensor `{name}` has shape {_shape(array.shape)}, expected {_shape(expected)}"
            )

    def ids(self, name: str, row: str = "index", vocab: Optional[int] = None) -> np.ndarray:
        """A 1-D I64 tensor of token ids, each in ``0..=u32::MAX`` and below ``vocab`` when it is
        known, as the reference requires; ``row`` names an index in errors (step, position)."""
        values = self.tensor(name, "I64")
        if values.ndim != 1:
            raise self.error(f"tensor `{name}` has shape {_shape(values.shape)}, expected [n]")
        limit = _U32_MAX if vocab is None else min(_U32_MAX, vocab - 1)
        bad = np.flatnonzero((values < 0) | (values > limit))
        if bad.size:
            i = int(bad[0])
            v = int(values[i])
            outside = (
                f", outside the vocabulary of {vocab} tokens (metadata `config`)"
                if vocab is not None and v >= vocab
                else ""
            )
            raise self.error(f"`{name}` holds token id {v} at {row} {i}{outside}")
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
    config = file.json_object("config")
    check_config_hash(file.label, file.metadata["config"], file.metadata["config_hash"])
    # the vocabulary the token ids and the logits' rows index (a config without one bounds
    # nothing; one that is not a count is refused, as the reference refuses it)
    vocab = config.get("vocab_size")
    if "vocab_size" in config and not (
        isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0
    ):
        raise file.error(
            f"metadata `config`: vocab_size {json.dumps(vocab)} is not a count of tokens"
        )
    if v >= 3:
        # stop_tokens (the end-of-turn ids it stops at, [] for none), max_steps, optional pins
        stops = file.id_list("stop_tokens")
        steps = file.integer("max_steps")
        file.tolerance("atol")
        file.tolerance("rtol")
        if "expect_dtype" in file.metadata:
            file.choice("expect_dtype", DTYPES)

    # prompt_tokens [P], tokens [n], logits [n, V]
    prompt_tokens = file.ids("prompt_tokens", "position", vocab)
    tokens = file.ids("tokens", "step", vocab)
    logits = file.tensor("logits", "F32")
    n = len(tokens)
    if logits.ndim != 2:
        shape = _shape(logits.shape)
        raise file.error(f"tensor `logits` has shape {shape}, expected [n, V] with n = {n}")
    file.expect_shape("logits", logits, (n, logits.shape[1] if vocab is None else vocab))

    extra: Dict[str, np.ndarray] = {}
    if mode == "early-exit":
        extra = _early_exit(file, n)
    elif mode == "speculative":
        extra = _speculative(file, n, v, vocab)
    elif mode != "greedy":
        raise file.error(f"unknown golden mode `{mode}` (greedy, early-exit, speculative)")
    if v >= 3:
        _check_stop(file, tokens.tolist(), stops, steps)
        # `golden check` takes an M2R2 golden's tolerance as atol alone, `compare` would apply a
        # pinned rtol: refused, as the reference's reader refuses it
        if mode != "greedy" and "rtol" in file.metadata:
            raise file.error(
                f"metadata `rtol` = `{file.metadata['rtol']}` is pinned in an M2R2 golden (mode "
                f"`{mode}`): M2R2 goldens are checked with atol alone (a relative tolerance is "
                "for greedy goldens); pin `atol` instead"
            )
    _check_known(file, v, mode)
    return Golden(
        prompt_tokens=prompt_tokens,
        tokens=tokens,
        logits=logits,
        metadata=dict(file.metadata),
        path=file.label,
        **extra,
    )


def config_hash(config_json: str) -> str:
    """``config_hash`` of a golden whose ``config`` is ``config_json``: the first 16 hex digits of
    SHA-256 over the text as stored (the reference's own serialisation, which it hashes; never a
    re-serialisation, which Python's ``json`` would not reproduce byte for byte)."""
    return hashlib.sha256(config_json.encode("utf-8")).hexdigest()[:16]


def check_config_hash(label: str, config_json: str, recorded: str) -> None:
    """Refuse a ``config`` that does not hash to the recorded ``config_hash`` (edited after
    recording: a check compares the hash alone, and would take the edited config for the model
    the golden is of)."""
    got = config_hash(config_json)
    if got != recorded:
        raise ValueError(
            f"{label}: metadata `config` does not hash to `config_hash` = `{recorded}` (it hashes "
            f"to `{got}`): the config was edited after recording, or the hash was; record the "
            "golden again"
        )


def _check_known(file: _File, version: int, mode: str) -> None:
    """Refuse a tensor or metadata key that a golden of this kind (mode, format ``version``,
    chain or tree) does not record, naming every one, as the reference's reader does."""
    from .tree import TREE_TENSORS, VARYING_TREE_TENSORS

    keys = list(COMMON_KEYS) + (list(VERSION_3_KEYS) if version >= 3 else [])
    tensors = ["prompt_tokens", "tokens", "logits"]
    kind = "greedy golden"
    if mode == "early-exit":
        keys += M2R2_KEYS + KIND_KEYS["early-exit"]
        tensors += M2R2_TENSORS["early-exit"]
        kind = "early-exit golden"
    elif mode == "speculative" and file.metadata.get("draft_length") == "tree":
        keys += M2R2_KEYS + KIND_KEYS["tree"]
        tensors += TREE_TENSORS
        kind = "token-tree golden (a fixed tree)"
        if "tree_threshold" in file.metadata or "prompt_lookup" in file.metadata:
            tensors += VARYING_TREE_TENSORS
            kind = "token-tree golden (trees that change from round to round)"
    elif mode == "speculative":
        keys += M2R2_KEYS + KIND_KEYS["chain"]
        tensors += M2R2_TENSORS["speculative"]
        if version >= 3:
            tensors += GRAPH_TENSORS["speculative"]
        kind = "speculative golden"
    unknown = [f"metadata `{k}`" for k in sorted(file.metadata) if k not in keys]
    unknown += [f"tensor `{t}`" for t in sorted(file.names) if t not in tensors]
    if unknown:
        raise file.error(
            f"holds {', '.join(unknown)}, which no {kind} of format version {version} records "
            "(edited after recording, or written by another tool?)"
        )


def _check_stop(file: _File, tokens: List[int], stops: List[int], steps: int) -> None:
    """The tokens agree with where the decode stops, as the reference's reader checks it: within
    the budget, no stop token before the last, and fewer tokens than the budget only when the
    last is a stop token."""
    n = len(tokens)
    early = [i for i, t in enumerate(tokens[:-1]) if t in stops]
    if n > steps:
        problem = f"{n} tokens for `max_steps` = {steps}"
    elif early:
        problem = f"stop token {tokens[early[0]]} at step {early[0]}, before the last"
    elif n < steps and not (n and tokens[-1] in stops):
        problem = f"{n} tokens for `max_steps` = {steps}, the last not a stop token"
    else:
        return
    raise file.error(f"`tokens` do not agree with `stop_tokens` and `max_steps`: {problem}")


def _early_exit(file: _File, n: int) -> Dict[str, np.ndarray]:
    """exit_gate [n], gate_scores [n, J] with J the number of gates of ``m2r2_config``."""
    j = file.m2r2_config()
    file.choice("gate", GATES)
    thresholds = file.numbers("threshold")
    if len(thresholds) > 1 and len(thresholds) != j:
        raise file.error(
            f"metadata `threshold` has {len(thresholds)} per-gate thresholds for {j} gates"
        )
    file.choice("kv_policy", KV_POLICIES)
    exit_gate = file.tensor("exit_gate", "I64")
    file.expect_shape("exit_gate", exit_gate, (n,))
    gate_scores = file.tensor("gate_scores", "F32")
    file.expect_shape("gate_scores", gate_scores, (n, j))
    file.weights_hash()
    return {"exit_gate": exit_gate, "gate_scores": gate_scores}


def _outside(t: int, vocab: Optional[int]) -> Optional[str]:
    """Why ``t`` is no token id (the reference's words): outside the config's vocabulary, or
    outside ``0..=u32::MAX`` (``""``); ``None`` for an id."""
    if vocab is not None and t >= vocab:
        return f", outside the vocabulary of {vocab} tokens (metadata `config`)"
    if not 0 <= t <= _U32_MAX:
        return ""
    return None


def _round_tokens(
    file: _File, drafted: np.ndarray, base_token: np.ndarray, fixed: bool, vocab: Optional[int]
) -> None:
    """A chain's rounds hold what a decode records, checked before anything that follows from
    them (the accepted counts' range, the rows of the graphs' logits), so the error names the
    tensor that is off, as the reference's reader does (``check_round_tokens``,
    reference/src/golden/m2r2/rounds.rs): each row of ``round_drafted`` its token ids (below
    ``vocab``), then -1 padding, and all ``draft_max`` of them under a fixed draft length;
    ``round_base_token`` token ids."""
    for r in range(drafted.shape[0]):
        row = [int(t) for t in drafted[r]]
        d = 0
        while d < len(row) and row[d] >= 0:
            d += 1
        after = [(j, t) for j, t in enumerate(row) if j >= d and t != -1]
        if after:
            j, t = after[0]
            raise file.error(
                f"tensor `round_drafted`: round {r} holds {t} at draft {j}, after its {d} drafts "
                "(drafted token ids, then -1 padding)"
            )
        bad = [(j, t) for j, t in enumerate(row[:d]) if _outside(t, vocab)]
        if bad:
            j, t = bad[0]
            raise file.error(
                f"tensor `round_drafted`: round {r} holds token id {t} at draft {j}"
                f"{_outside(t, vocab)}"
            )
        if fixed and d != len(row):
            raise file.error(
                f"tensor `round_drafted`: round {r} drafted {d} tokens, but a fixed draft length "
                f"drafts `draft_max` = {len(row)} every round"
            )
    for r, t in enumerate(int(t) for t in base_token):
        why = _outside(t, vocab)
        if why is not None:
            raise file.error(f"tensor `round_base_token`: round {r} holds token id {t}{why}")


def _speculative(file: _File, n: int, version: int, vocab: Optional[int]) -> Dict[str, np.ndarray]:
    """round_drafted [R, M], round_accepted [R], round_base_token [R], round_scores [R, M + 1];
    from version 3 also verify_logits [T, V'] and draft_logits [Q, V'] with T and Q the rows the
    rounds imply (golden.verify_rounds, golden.proposal_rounds). As in the reference's reader,
    their width is not checked here: a comparison checks it against the other file's.

    Each round accepts 0 to its drafts, and the rounds emit the tokens
    (:meth:`_File.check_emitted`), as the reference's reader requires (its mode_file.rs)."""
    file.m2r2_config()
    file.integer("draft_gate", plus=True)
    gate = file.choice("gate", ("none",) + GATES)
    length = file.field("draft_length")
    if length == "tree":
        fields = _tree(file, n, version, gate, file.integer("draft_max"), vocab)
        file.weights_hash()
        return fields
    # `M + 1` columns of round_scores fit an array (the reference's bound)
    m = file.integer("draft_max", plus=True, limit=_ISIZE_MAX - 1)
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
    _round_tokens(file, drafted, base_token, length == "fixed", vocab)
    for k in range(r):
        drafts = len(drafted_in(drafted, k))
        if not 0 <= accepted[k] <= drafts:
            raise file.error(
                f"tensor `round_accepted`: round {k} accepted {int(accepted[k])} of its {drafts} "
                "drafts"
            )
    file.check_emitted(accepted, n)
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
    file.weights_hash()
    return tensors


def _tree(file: _File, n: int, version: int, gate: str, depth: int, vocab: Optional[int]) -> dict:
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
    # each width as the reference reads it: spaces around it trimmed, a usize
    widths = [_usize(w.strip(_RUST_SPACE)) for w in spec.split(",")]
    valid = None not in widths
    if valid:
        try:
            tree.from_widths(widths)
        except ValueError:
            valid = False
    if not valid:
        raise file.error(f"metadata `draft_tree` = `{spec}` is not valid (widths W1,W2,...)")
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
        file.number("tree_threshold", finite=True)
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
        parts = [_usize(p) for p in ngram.split(",")]
        if len(parts) != 2 or None in parts or not 1 <= parts[0] <= parts[1] or branch == 0:
            raise file.error(f"metadata `prompt_lookup_ngram` = `{ngram}` is not valid (MIN,MAX)")
    fields, trees = tree.read_tree_record(file, n, version, widths, grown, branch, vocab)
    fields["round_trees"] = trees
    return fields
