"""A chain's rounds as a writer takes them: the round tensors checked for shape, padding and ids,
and against the tokens they emit (each round its accepted drafts and a base token, cut where the
decode stopped).

Apart from :mod:`m2r2_golden.writer` so that the tree's writer (:mod:`m2r2_golden.tree_writer`)
checks its rounds' tokens the same way (:func:`_round_has_room`, :func:`_round_emits`,
:func:`_all_emitted`)."""

from __future__ import annotations

from typing import Dict

import numpy as np

from .golden import drafted_in
from .writer_values import _array, _ids, _ints


def _rounds(
    label: str,
    tokens: np.ndarray,
    m: int,
    v: int,
    round_drafted,
    round_accepted,
    round_base_token,
    round_scores,
) -> Dict[str, np.ndarray]:
    """The round tensors, checked for shape (``R`` rounds, ``M = m``), padding and ids ``< v``,
    and against the tokens they emit."""
    accepted = _ints(label, "round_accepted", round_accepted, 1)  # [R]
    r = accepted.shape[0]
    base = _ids(label, "round_base_token", round_base_token)  # [R]
    drafted = _ints(label, "round_drafted", round_drafted, 2)  # [R, M]
    scores = _array(label, "round_scores", round_scores)
    if not (scores.ndim == 2 and np.issubdtype(scores.dtype, np.floating)):
        raise ValueError(
            f"{label}: `round_scores` must be 2-D floats [R, M + 1], got {scores.dtype} "
            f"of shape {list(scores.shape)}"
        )
    scores = np.ascontiguousarray(scores, dtype=np.float32)  # [R, M + 1]
    for name, array, shape in (
        ("round_base_token", base, (r,)),
        ("round_drafted", drafted, (r, m)),
        ("round_scores", scores, (r, m + 1)),
    ):
        if array.shape != shape:
            raise ValueError(
                f"{label}: `{name}` has shape {list(array.shape)}, expected {list(shape)} "
                f"(R = {r} rounds, M = draft_max = {m})"
            )
    for i in range(r):
        row = drafted[i]
        d = len(drafted_in(drafted, i))
        if (row[:d] < 0).any() or (row[d:] != -1).any():
            raise ValueError(
                f"{label}: `round_drafted` row {i} is {row.tolist()}: drafted token ids, then -1 "
                "padding"
            )
        if not 0 <= accepted[i] <= d:
            raise ValueError(
                f"{label}: `round_accepted` of round {i} is {int(accepted[i])}, the round "
                f"drafted {d} tokens"
            )
    for name, ids in (("round_drafted", drafted), ("round_base_token", base)):
        if ids.size and int(ids.max()) >= v:
            raise ValueError(f"{label}: `{name}` holds token id {int(ids.max())} >= V = {v}")
    # tokens[0] from the prompt, then per round its accepted drafts and base token, cut at n
    pos = 1
    for i in range(r):
        _round_has_room(label, i, r, pos, len(tokens))
        emitted = [*drafted_in(drafted, i)[: accepted[i]].tolist(), int(base[i])]
        pos = _round_emits(label, tokens, i, pos, emitted)
    _all_emitted(label, pos, len(tokens))
    return {
        "round_drafted": drafted,
        "round_accepted": accepted,
        "round_base_token": base,
        "round_scores": scores,
    }


def _round_has_room(label: str, k: int, r: int, pos: int, n: int) -> None:
    """Round ``k`` of ``r`` starts at step ``pos`` of the ``n`` tokens: it must emit one."""
    if pos >= n:
        raise ValueError(
            f"{label}: round {k} of {r} emits no token: the rounds before it emit all {n}"
        )


def _round_emits(label: str, tokens, k: int, pos: int, emitted: list, what: str = "") -> int:
    """Round ``k``'s ``emitted`` tokens, cut where the decode stopped, must be ``tokens`` from step
    ``pos`` (``what`` says what they are); the step after them."""
    emitted = emitted[: len(tokens) - pos]
    if tokens[pos : pos + len(emitted)].tolist() != emitted:
        raise ValueError(
            f"{label}: round {k} emits {emitted} at steps {pos}..{what}, `tokens` holds "
            f"{tokens[pos:pos + len(emitted)].tolist()} there"
        )
    return pos + len(emitted)


def _all_emitted(label: str, pos: int, n: int) -> None:
    """The rounds emitted ``pos`` of the ``n`` tokens (the first from the prompt): all of them."""
    if pos < n:
        raise ValueError(
            f"{label}: the rounds emit {pos} tokens (the first from the prompt), `tokens` holds {n}"
        )
