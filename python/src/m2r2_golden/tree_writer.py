"""Writing a token-tree speculative golden (format version 4, or 5 when the rounds' trees change:
grown per branch, a prompt-lookup branch) from any engine's tree decode, with the drafting recipe
of a reference golden, so `m2r2 golden compare` compares the two round by round and node by node.
"""

from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Sequence, Union

import numpy as np

from .golden import Golden
from .reader import PathLike
from .tree import (
    GROWN_TREE_FORMAT_VERSION,
    TREE_FORMAT_VERSION,
    Tree,
    from_parents,
    from_widths,
    proposing,
)
from .writer import _M2R2_KEYS, _copied, _like, _metadata, _no_rtol
from .writer_file import _save
from .writer_rounds import _all_emitted, _round_emits, _round_has_room
from .writer_values import (
    _array,
    _decode,
    _float_rows,
    _ids,
    _ints,
    _model_config,
    _stops_and_pins,
)

# The metadata of a tree golden's recipe, copied from `like`: the weights and drafting settings,
# and the tree's own.
_TREE_KEYS = _M2R2_KEYS + ("draft_tree", "tree_threshold", "prompt_lookup", "prompt_lookup_ngram")


def _padded(rows: Sequence[Sequence], width: int, pad, dtype) -> np.ndarray:
    out = np.full((len(rows), width), pad, dtype=dtype)
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return out


def write_tree(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    round_trees: Sequence[Union[Tree, Sequence[int]]],
    round_tree_tokens: Sequence[Sequence[int]],
    round_node,
    round_accepted,
    round_base_token,
    verify_logits,
    draft_logits,
    like: Union[PathLike, Golden],
    round_lookup: Optional[Sequence[Sequence[int]]] = None,
    round_scores: Optional[Sequence[Sequence[float]]] = None,
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """Write a greedy token-tree golden with the model, M2R2 weights and drafting recipe of
    ``like`` (a token-tree golden file or :class:`Golden`: ``draft_gate``, ``draft_tree``, and
    ``gate`` / ``tree_threshold`` / ``prompt_lookup`` / ``prompt_lookup_ngram`` where it has them,
    copied verbatim).

    Args (besides :func:`m2r2_golden.write`'s ``prompt_tokens``, ``tokens``, ``logits``, stops and
    pins; ``logits`` row ``i`` the verifier's row token ``i`` was emitted from):
        round_trees: per round its tree, a :class:`m2r2_golden.tree.Tree` or the parents of its
            nodes ``1..`` in breadth-first order (``[]``: the root alone).
        round_tree_tokens: per round every node's token, breadth-first (node 0: the root, the
            last emitted token).
        round_node, round_accepted, round_base_token: ``[R]`` ints: the accepted node, its depth,
            the verifier's token after it.
        verify_logits: the prompt's last row, then every node's verified row, round by round.
        draft_logits: the draft's logits of each proposing node, round by round, breadth-first
            (:func:`m2r2_golden.tree.proposing`).
        round_lookup: per round the lookup branch's nodes by depth (a recipe with a branch).
        round_scores: per round the draft gate's score of each proposing node (a grown recipe).

    The rounds must emit the tokens: ``tokens[0]`` from the prompt, then per round the tokens of
    its accepted node's path and its base token (cut where the decode stopped), each round's root
    the last token emitted before it. ``round_lookup`` is for a recipe with a lookup branch and
    ``round_scores`` for a grown one only. ``rtol`` is refused, as by
    :func:`m2r2_golden.write_speculative`.

    The file is written beside ``path`` and validated by reading it back
    (:func:`m2r2_golden.read`) before it takes ``path``: inputs that do not fit the recipe or
    each other raise ValueError naming the argument, and leave ``path`` as it was. Returns the
    written golden, read back.
    """
    label = os.fspath(path)
    _no_rtol(label, rtol)
    ref = _like(label, like)
    if ref.draft_tree is None:
        where = ref.path or "like"
        raise ValueError(
            f"{label}: `like` ({where}) is not a token-tree golden: a tree golden copies the "
            "recipe of one"
        )
    recipe = _copied(label, ref, _TREE_KEYS)
    config = _model_config(label, ref.model, ref.config_json, ref.config_hash)
    prompt, toks, rows = _decode(label, prompt_tokens, tokens, logits, config)
    v = rows.shape[1]
    grown = "tree_threshold" in ref.metadata
    branched = "prompt_lookup" in ref.metadata
    # what the recipe records, and nothing it does not
    for name, given, recorded, what in (
        ("round_lookup", round_lookup, branched, "a lookup branch"),
        ("round_scores", round_scores, grown, "a tree grown per branch"),
    ):
        if given is not None and not recorded:
            raise ValueError(
                f"{label}: `{name}` given, but the recipe of `like` has no {what} to record it"
            )
    trees = [
        _tree(label, r, t.parents if isinstance(t, Tree) else t)
        for r, t in enumerate(_per_round(label, "round_trees", round_trees))
    ]
    r = len(trees)
    shape = from_widths(ref.draft_tree)
    if not (grown or branched):
        # a fixed tree drafts its shape every round (the file records the shape, not the trees)
        for k, t in enumerate(trees):
            if t != shape:
                raise ValueError(
                    f"{label}: `round_trees`: round {k}'s tree {t.parents} is not the recipe's "
                    f"{ref.metadata['draft_tree']} ({shape.parents}), which a fixed tree drafts "
                    "every round"
                )
    node = _ints(label, "round_node", round_node, 1)
    accepted = _ints(label, "round_accepted", round_accepted, 1)
    base = _ids(label, "round_base_token", round_base_token)
    per_round = {
        "round_tree_tokens": [
            _ids(label, f"round_tree_tokens[{k}]", x)
            for k, x in enumerate(_per_round(label, "round_tree_tokens", round_tree_tokens))
        ],
        "round_node": node,
        "round_accepted": accepted,
        "round_base_token": base,
        "round_lookup": [
            _ints(label, f"round_lookup[{k}]", x, 1).tolist()
            for k, x in enumerate(_per_round(label, "round_lookup", round_lookup, r))
        ],
        "round_scores": [
            _floats(label, f"round_scores[{k}]", x)
            for k, x in enumerate(_per_round(label, "round_scores", round_scores, r))
        ],
    }
    for name, values in per_round.items():
        if len(values) != r:
            raise ValueError(
                f"{label}: `{name}` has {len(values)} entries for the {r} rounds of `round_trees`"
            )
    tree_tokens, lookup, scores = (
        per_round[name] for name in ("round_tree_tokens", "round_lookup", "round_scores")
    )
    _emits(label, toks, trees, tree_tokens, node, base, v)
    # as wide as the largest round's tree, and at least the shape's nodes (as the reference writes)
    width = max([t.nodes for t in trees] + [shape.nodes])
    depth = len(ref.draft_tree) if grown else None
    draft_rows = [
        [k, i] for k, (t, b) in enumerate(zip(trees, lookup)) for i in proposing(t, b, depth)
    ]
    verify_rows = 1 + sum(t.nodes for t in trees)
    tensors: Dict[str, np.ndarray] = {
        "prompt_tokens": prompt,
        "tokens": toks,
        "logits": rows,
        "round_tree_tokens": _padded(tree_tokens, width, -1, np.int64),
        "round_node": node,
        "round_accepted": accepted,
        "round_base_token": base,
        "verify_logits": _float_rows(
            label, "verify_logits", verify_logits, verify_rows, v, "the prompt's row, every node's"
        ),
        "draft_logits": _float_rows(
            label, "draft_logits", draft_logits, len(draft_rows), v, "each proposing node's"
        ),
        "draft_rows": np.asarray(draft_rows, dtype=np.int64).reshape(-1, 2),
    }
    if grown or branched:
        tensors["round_tree_parents"] = _padded(
            [t.parents for t in trees], max(width - 1, 0), -1, np.int64
        )
        branch = max([len(x) for x in lookup] + [0])
        tensors["round_lookup"] = _padded(lookup, branch, -1, np.int64)
        tensors["round_scores"] = _padded(
            scores, max([len(x) for x in scores] + [0]), np.nan, np.float32
        )
    version = GROWN_TREE_FORMAT_VERSION if grown or branched else TREE_FORMAT_VERSION
    extra = _stops_and_pins(label, toks, stop_tokens, max_steps, atol, rtol, expect_dtype)
    metadata = _metadata(ref.model, ref.config_json, ref.config_hash, "speculative", version)
    metadata.update(recipe)
    metadata.update(extra)
    return _save(tensors, label, metadata)


def _per_round(label: str, name: str, values, rounds: Optional[int] = None) -> list:
    """``values`` as a list of one entry per round; ``None`` where optional (``rounds`` given):
    every round empty."""
    if values is None and rounds is not None:
        return [[] for _ in range(rounds)]
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{label}: `{name}` must hold one entry per round, got {values!r}")
    return list(values)


def _floats(label: str, name: str, values) -> list:
    array = _array(label, name, values)
    if array.size == 0:
        return []
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_:
        raise ValueError(f"{label}: `{name}` must be 1-D floats, got shape {list(array.shape)}")
    return array.astype(np.float32).tolist()


def _emits(label: str, tokens, trees, tree_tokens, node, base, v: int) -> None:
    """The rounds emit ``tokens`` (``tokens[0]`` from the prompt, then per round the accepted
    path's tokens and the base token, cut where the decode stopped), each round's root being the
    last token emitted before it; every node's token and base token an id below ``v``."""
    n, pos = len(tokens), 1
    for k, t in enumerate(trees):
        ids = tree_tokens[k]
        if len(ids) != t.nodes:
            raise ValueError(
                f"{label}: `round_tree_tokens` of round {k} has {len(ids)} tokens, its tree "
                f"{t.nodes} nodes"
            )
        for name, values in (("round_tree_tokens", ids), ("round_base_token", base[k : k + 1])):
            if values.size and int(values.max()) >= v:
                raise ValueError(
                    f"{label}: `{name}` of round {k} holds token id {int(values.max())} >= V = {v}"
                )
        i = int(node[k])
        if not 0 <= i < t.nodes:
            raise ValueError(
                f"{label}: `round_node` of round {k} is {i}, its tree has nodes 0..{t.nodes - 1}"
            )
        _round_has_room(label, k, len(trees), pos, n)
        if int(ids[0]) != int(tokens[pos - 1]):
            raise ValueError(
                f"{label}: `round_tree_tokens` of round {k}: the root (node 0) is "
                f"{int(ids[0])}, the last token emitted before the round {int(tokens[pos - 1])}"
            )
        path = []
        while i:
            path.append(int(ids[i]))
            i = t.parent(i)
        emitted = [*reversed(path), int(base[k])]
        pos = _round_emits(label, tokens, k, pos, emitted, " (its accepted path and base token)")
    _all_emitted(label, pos, n)


def _tree(label: str, r: int, parents: Sequence[int]) -> Tree:
    parents = _ints(label, f"round_trees[{r}]", parents, 1).tolist()
    try:
        return from_parents(parents)
    except ValueError as e:
        raise ValueError(f"{label}: `round_trees`: round {r}'s tree: {e}") from None
