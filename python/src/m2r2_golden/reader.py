"""Reading a golden file of format version 1 to 5, validated as docs/GOLDEN.md specifies and as
the reference's reader does (reference/src/golden/file.rs; the M2R2 modes' mode_file.rs, rounds.rs
and tree_file.rs in reference/src/golden/m2r2/): every error is a ValueError naming the file and
the tensor or metadata key. JSON metadata is read as the reference reads it
(:mod:`m2r2_golden.reference_json`).

This module holds :func:`read` and the checks of the whole file (format and version, the config
against its hash, the stop, the keys and tensors it may hold); the open file and the parsing of its
fields are in :mod:`m2r2_golden.reader_file`, each M2R2 mode's record in
:mod:`m2r2_golden.reader_modes`."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from typing import Dict, List, Union

import numpy as np
from safetensors import SafetensorError, safe_open

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
    VERSION_3_KEYS,
    Golden,
)
from .reader_file import _File, _shape, _shown
from .reader_modes import _early_exit, _speculative

PathLike = Union[str, "os.PathLike[str]"]


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


def _read(file: _File) -> Golden:
    if file.field("format") != FORMAT:
        raise file.error(f"not a golden file (metadata `format` is not {FORMAT})")
    version = file.field("format_version")
    mode = file.field("mode")
    if version == str(GREEDY_FORMAT_VERSION):
        if mode != "greedy":
            raise file.error(
                f"golden format version 1 has no mode `{_shown(mode)}` (only greedy; metadata "
                "`mode`)"
            )
    elif version not in [str(v) for v in READ_VERSIONS]:
        raise file.error(
            f"golden format version {_shown(version)} is not supported (metadata `format_version`; "
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
        raise file.error(
            f"unknown mode `{_shown(mode)}` (expected greedy, early-exit or speculative)"
        )
    if v >= 3:
        _check_stop(file, tokens.tolist(), stops, steps)
        # `golden check` takes an M2R2 golden's tolerance as atol alone, `compare` would apply a
        # pinned rtol: refused, as the reference's reader refuses it
        if mode != "greedy" and "rtol" in file.metadata:
            raise file.error(
                f"metadata `rtol` = `{_shown(file.metadata['rtol'])}` is pinned in an M2R2 golden "
                f"(mode "
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
            f"{label}: metadata `config` does not hash to `config_hash` = `{_shown(recorded)}` (it "
            f"hashes "
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
    unknown = [f"metadata `{_shown(k)}`" for k in sorted(file.metadata) if k not in keys]
    unknown += [f"tensor `{_shown(t)}`" for t in sorted(file.names) if t not in tensors]
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
