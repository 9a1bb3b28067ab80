"""Writing goldens (docs/GOLDEN.md) from any engine's tokens and logits: greedy ones, and
speculative ones with the rounds and what each graph produced, as format version 3 (a speculative
golden without the graphs' logits as version 2, see :func:`write_speculative`).

The model metadata is copied from the reference's golden, never rebuilt: ``config_hash`` is the
first 16 hex digits of SHA-256 over the reference's own JSON text of its config (Rust serde_json),
which Python's ``json`` does not reproduce byte for byte (``1e-5`` vs ``1e-05``), so the ``config``
string and its hash travel together, verbatim; so do a speculative golden's M2R2 settings.

The value checks are in :mod:`m2r2_golden.writer_values`, the rounds' in
:mod:`m2r2_golden.writer_rounds`, and the write to disk in :mod:`m2r2_golden.writer_file`.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Union

import numpy as np

from .golden import (
    FORMAT,
    FORMAT_VERSION,
    M2R2_FORMAT_VERSION,
    Golden,
    proposal_rounds,
    verify_rounds,
)
from .reader import PathLike, read
from .reader_file import _WEIGHTS_HASH
from .writer_file import _save
from .writer_rounds import _rounds
from .writer_values import _decode, _float_rows, _model_config, _stops_and_pins

# what the file records as its writer (`m2r2_version`; the reference writes its crate version)
WRITER = "m2r2-golden-python"
# The M2R2 weights and drafting settings every speculative golden, chain or tree, copies from
# the one it is written like.
_M2R2_KEYS = (
    "m2r2_config",
    "m2r2_hash",
    "m2r2_weights_hash",
    "draft_gate",
    "gate",
    "draft_max",
    "draft_length",
)
# A chain's: those and its dynamic drafting's threshold.
_SPECULATIVE_KEYS = _M2R2_KEYS + ("draft_threshold",)


def _copied(label: str, ref: Golden, keys: Sequence[str]) -> Dict[str, str]:
    """The metadata ``keys`` that ``ref`` (``like``) has, to copy verbatim: each a string, and
    ``m2r2_weights_hash`` 16 hex digits, as the reference reads it. (The file written is read back
    before it is kept, which refuses what the reference refuses; this names ``like`` as where a
    value came from, and refuses what is no string before safetensors does.)"""
    where = f"`like` ({ref.path})" if ref.path else "`like`"
    copied = {}
    for key in keys:
        if key not in ref.metadata:
            continue
        value = ref.metadata[key]
        if not isinstance(value, str):
            raise ValueError(
                f"{label}: {where}: metadata `{key}` = {value!r} is not a string (golden "
                "metadata values are strings)"
            )
        if key == "m2r2_weights_hash" and not _WEIGHTS_HASH.fullmatch(value):
            raise ValueError(
                f"{label}: {where}: metadata `{key}` = {value!r} is not valid: the reference "
                "reads 16 hex digits there, and refuses a golden with anything else"
            )
        copied[key] = value
    return copied


def write(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    like: Union[PathLike, Golden],
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """Write a greedy golden (format version 3) of the model that ``like`` (a golden file or a read
    :class:`Golden`, of any mode) records: its ``model``, ``config`` and ``config_hash`` are copied
    verbatim.

    The usual ``like`` is the reference golden being replayed: read its ``prompt_tokens``, run
    your engine greedily for up to ``like.max_steps`` steps (``len(like.tokens)`` for a file
    before version 3), stopping after the first of your end-of-turn tokens, and write the result
    like it.

    Args:
        prompt_tokens: ``[P]`` integer token ids, ``P >= 1``.
        tokens: ``[n]`` integer token ids, the greedy tokens, ``n >= 1`` (a golden of no step
            has nothing to check: `golden check` refuses it).
        logits: ``[n, V]`` floats (written as float32): row ``i`` holds the logits token ``i`` was
            chosen from (row 0: the last prompt position).
        stop_tokens: the end-of-turn ids the decode stops at (after the first one it emits,
            which ``tokens`` then ends with), reached or not; ``[]`` or ``None`` (the default):
            it decoded without stopping, the whole budget.
        max_steps: the token budget (default: ``n``); ``n < max_steps`` only when the decode
            stopped at a stop token.
        atol, rtol: tolerances to pin in the golden (finite, >= 0): `golden check` uses them
            unless its own ``--atol`` / ``--rtol`` say otherwise.
        expect_dtype: the export precision to pin (``f32`` or ``f16``): `golden check --onnx`
            refuses an export of other weights.

    Returns the written golden, read back. Raises ValueError on inputs that do not fit the format
    (naming the argument), OSError where ``path`` cannot be written.
    """
    ref = _like(os.fspath(path), like)
    return write_greedy(
        path,
        prompt_tokens=prompt_tokens,
        tokens=tokens,
        logits=logits,
        model=ref.model,
        config_json=ref.config_json,
        config_hash=ref.config_hash,
        stop_tokens=stop_tokens,
        max_steps=max_steps,
        atol=atol,
        rtol=rtol,
        expect_dtype=expect_dtype,
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
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """:func:`write` with the model metadata given explicitly.

    ``config_json`` and ``config_hash`` must be the reference's own (a golden's ``config`` and
    ``config_hash`` metadata, or ``m2r2 golden write``'s): ``golden compare`` refuses files whose
    hashes differ, and every reader a ``config`` that does not hash to its ``config_hash``
    (SHA-256 over the text, :func:`m2r2_golden.reader.config_hash`), so both are checked here.
    """
    label = os.fspath(path)
    config = _model_config(label, model, config_json, config_hash)
    prompt, toks, rows = _decode(label, prompt_tokens, tokens, logits, config)
    metadata = _metadata(model, config_json, config_hash, "greedy", FORMAT_VERSION)
    metadata.update(_stops_and_pins(label, toks, stop_tokens, max_steps, atol, rtol, expect_dtype))
    tensors = {"prompt_tokens": prompt, "tokens": toks, "logits": rows}
    return _save(tensors, label, metadata)


def write_speculative(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    round_drafted,
    round_accepted,
    round_base_token,
    round_scores,
    like: Union[PathLike, Golden],
    verify_logits=None,
    draft_logits=None,
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """Write a greedy self-speculative golden of the model and M2R2 settings that ``like`` (a
    speculative golden file or :class:`Golden`) records: ``model``, ``config``, ``config_hash``,
    ``m2r2_config``, ``m2r2_hash`` and the drafting settings (``draft_gate``, ``gate``,
    ``draft_max`` = M, ``draft_length``, ``draft_threshold``) are copied verbatim, so that
    ``m2r2 golden compare`` compares the two round by round (and ``m2r2_weights_hash`` where it
    has one, which must be 16 hex digits, as the reference reads it).

    Args (besides :func:`write`'s ``prompt_tokens``, ``tokens``, ``logits`` and the stop and pin
    arguments; ``logits`` row ``i`` is the verifier's row token ``i`` was emitted from):
        round_drafted: ``[R, M]`` ints, round ``r``'s drafted tokens then -1 padding.
        round_accepted: ``[R]`` ints, the drafts each round accepted (``0..=d_r``).
        round_base_token: ``[R]`` ints, the verifier's token after them (correction or bonus).
        round_scores: ``[R, M + 1]`` floats, the draft gate's score at each proposal of a dynamic
            draft, NaN elsewhere.
        verify_logits: ``[T, V]`` floats: the prompt's last row, then round by round the
            verifier's row of the round's first token and of each drafted one, accepted or not
            (``T = 1 + sum_r (d_r + 1)``, :func:`m2r2_golden.verify_rounds`).
        draft_logits: ``[Q, V]`` floats: the draft's logits at each proposal, round by round
            (``Q = sum_r max(d_r, scored_r)``, :func:`m2r2_golden.proposal_rounds`).

    The tokens must be the ones the rounds emit: ``tokens[0]`` from the prompt, then per round
    its accepted drafts and its base token, cut where the decode stopped.

    With both ``verify_logits`` and ``draft_logits`` the file is format version 3. A harness that
    records only the rounds passes neither: the file is then written as format version 2 (rounds,
    no graph tensors, no version-3 metadata), which `golden compare` reads and reports the graphs'
    lines of as skipped, rather than holding made-up tensors; version 2 cannot record a stop, a
    budget or pins, so ``stop_tokens``, a ``max_steps`` other than ``n`` and the pins are refused
    there. Passing only one of the two is refused.

    ``like`` must be a chain's golden: one of a token tree (``draft_length`` = ``tree``) is
    written with :func:`m2r2_golden.write_tree`. ``rtol`` is refused: `golden check` takes an M2R2
    golden's tolerance as atol alone, and readers refuse one that pins an rtol.

    Returns the written golden, read back before it takes ``path``. Raises ValueError on inputs
    that do not fit the format (naming the argument), OSError where ``path`` cannot be written.
    """
    label = os.fspath(path)
    _no_rtol(label, rtol)
    ref = _like(label, like)
    where = ref.path or "like"
    if ref.mode != "speculative":
        raise ValueError(
            f"{label}: `like` ({where}) records mode `{ref.mode}`: a speculative golden copies "
            "the M2R2 settings of a speculative one"
        )
    if ref.draft_tree is not None:
        raise ValueError(
            f"{label}: `like` ({where}) is a token-tree golden (draft_tree "
            f"{ref.metadata['draft_tree']}): write a tree decode with m2r2_golden.write_tree"
        )
    settings = _copied(label, ref, _SPECULATIVE_KEYS)
    config = _model_config(label, ref.model, ref.config_json, ref.config_hash)
    prompt, toks, rows = _decode(label, prompt_tokens, tokens, logits, config)
    v = rows.shape[1]
    rounds = _rounds(
        label,
        toks,
        int(ref.metadata["draft_max"]),
        v,
        round_drafted,
        round_accepted,
        round_base_token,
        round_scores,
    )
    tensors: Dict[str, np.ndarray] = {"prompt_tokens": prompt, "tokens": toks, "logits": rows}
    tensors.update(rounds)
    graphs = {"verify_logits": verify_logits, "draft_logits": draft_logits}
    given = [name for name, x in graphs.items() if x is not None]
    if len(given) == 1:
        missing = ({"verify_logits", "draft_logits"} - set(given)).pop()
        raise ValueError(
            f"{label}: `{given[0]}` without `{missing}`: a version-3 speculative golden holds "
            "both (pass neither for a version-2 file of the rounds alone)"
        )
    if given:
        drafted, scores = rounds["round_drafted"], rounds["round_scores"]
        counts = {
            "verify_logits": (
                len(verify_rounds(drafted)),
                "1 for the prompt's last position, then per round its first token and each "
                "drafted one",
            ),
            "draft_logits": (len(proposal_rounds(drafted, scores)), "one per proposal"),
        }
        for name, (count, why) in counts.items():
            tensors[name] = _float_rows(label, name, graphs[name], count, v, why)
        version = FORMAT_VERSION
        extra = _stops_and_pins(label, toks, stop_tokens, max_steps, atol, rtol, expect_dtype)
    else:
        version = M2R2_FORMAT_VERSION
        lost = [
            what
            for what, set_ in (
                ("stop_tokens", stop_tokens is not None and len(stop_tokens) > 0),
                ("max_steps", max_steps is not None and max_steps != len(toks)),
                ("atol", atol is not None),
                ("expect_dtype", expect_dtype is not None),
            )
            if set_
        ]
        if lost:
            raise ValueError(
                f"{label}: without `verify_logits` and `draft_logits` this is a format version 2 "
                f"file, which cannot record {', '.join(f'`{w}`' for w in lost)} (version 3): "
                "pass the graphs' logits, or leave those out"
            )
        extra = {}
    metadata = _metadata(ref.model, ref.config_json, ref.config_hash, "speculative", version)
    metadata.update(settings)
    metadata.update(extra)
    return _save(tensors, label, metadata)


def _no_rtol(label: str, rtol) -> None:
    """An M2R2 golden pins no rtol: `golden check` takes its tolerance as atol alone, and every
    reader refuses a speculative golden that pins one."""
    if rtol is not None:
        raise ValueError(
            f"{label}: `rtol` is for greedy goldens: a speculative golden is checked with atol "
            "alone (pin `atol`)"
        )


def _like(label: str, like) -> Golden:
    """The golden ``like`` names: a read :class:`Golden`, or the path of one to read."""
    if isinstance(like, Golden):
        return like
    if not isinstance(like, (str, os.PathLike)):
        raise ValueError(
            f"{label}: `like` must be a golden file's path or an m2r2_golden.Golden, got "
            f"{type(like).__name__}"
        )
    return read(like)


def _writer_version() -> str:
    from . import __version__

    return f"{WRITER} {__version__}"


def _metadata(
    model: str, config_json: str, config_hash: str, mode: str, version: int
) -> Dict[str, str]:
    return {
        "format": FORMAT,
        "format_version": str(version),
        "model": model,
        "config_hash": config_hash,
        "config": config_json,
        "mode": mode,
        "m2r2_version": _writer_version(),
    }
