"""Writing a token-tree speculative golden (format version 4, or 5 when the rounds' trees change:
grown per branch, a prompt-lookup branch) from any engine's tree decode, with the drafting recipe
of a reference golden, so `m2r2 golden compare` compares the two round by round and node by node.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Sequence, Union

import numpy as np
from safetensors.numpy import save_file

from .golden import Golden
from .reader import PathLike, read
from .tree import (
    GROWN_TREE_FORMAT_VERSION,
    TREE_FORMAT_VERSION,
    Tree,
    from_parents,
    from_widths,
    proposing,
)
from .writer import _M2R2_KEYS, _decode, _metadata, _model_config, _stops_and_pins

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

    The file is validated by reading it back (:func:`m2r2_golden.read`) before it takes ``path``:
    inputs that do not fit the recipe or each other raise ValueError and leave nothing there.
    Returns the written golden.
    """
    label = os.fspath(path)
    ref = like if isinstance(like, Golden) else read(like)
    if ref.draft_tree is None:
        where = ref.path or "like"
        raise ValueError(
            f"{label}: `like` ({where}) is not a token-tree golden: a tree golden copies the "
            "recipe of one"
        )
    config = _model_config(label, ref.model, ref.config_json, ref.config_hash)
    prompt, toks, rows = _decode(label, prompt_tokens, tokens, logits, config)
    grown = "tree_threshold" in ref.metadata
    varies = grown or "prompt_lookup" in ref.metadata
    trees = [t if isinstance(t, Tree) else _tree(label, r, t) for r, t in enumerate(round_trees)]
    r = len(trees)
    lookup = [list(x) for x in (round_lookup or [[] for _ in range(r)])]
    scores = [list(x) for x in (round_scores or [[] for _ in range(r)])]
    if len(round_tree_tokens) != r or len(lookup) != r or len(scores) != r:
        raise ValueError(f"{label}: the per-round inputs are not all {r} rounds long")
    # as wide as the largest round's tree, and at least the shape's nodes (as the reference writes)
    width = max([t.nodes for t in trees] + [from_widths(ref.draft_tree).nodes])
    depth = len(ref.draft_tree) if grown else None
    draft_rows = [
        [k, i] for k, (t, b) in enumerate(zip(trees, lookup)) for i in proposing(t, b, depth)
    ]
    tensors: Dict[str, np.ndarray] = {
        "prompt_tokens": prompt,
        "tokens": toks,
        "logits": rows,
        "round_tree_tokens": _padded(round_tree_tokens, width, -1, np.int64),
        "round_node": np.asarray(round_node, dtype=np.int64).reshape(-1),
        "round_accepted": np.asarray(round_accepted, dtype=np.int64).reshape(-1),
        "round_base_token": np.asarray(round_base_token, dtype=np.int64).reshape(-1),
        "verify_logits": np.ascontiguousarray(verify_logits, dtype=np.float32),
        "draft_logits": np.ascontiguousarray(draft_logits, dtype=np.float32),
        "draft_rows": np.asarray(draft_rows, dtype=np.int64).reshape(-1, 2),
    }
    if varies:
        tensors["round_tree_parents"] = _padded(
            [t.parents for t in trees], max(width - 1, 0), -1, np.int64
        )
        branch = max([len(x) for x in lookup] + [0])
        tensors["round_lookup"] = _padded(lookup, branch, -1, np.int64)
        tensors["round_scores"] = _padded(
            scores, max([len(x) for x in scores] + [0]), np.nan, np.float32
        )
    version = GROWN_TREE_FORMAT_VERSION if varies else TREE_FORMAT_VERSION
    extra = _stops_and_pins(label, toks, stop_tokens, max_steps, atol, rtol, expect_dtype)
    metadata = _metadata(ref.model, ref.config_json, ref.config_hash, "speculative", version)
    metadata.update({k: ref.metadata[k] for k in _TREE_KEYS if k in ref.metadata})
    metadata.update(extra)
    partial = label + ".partial"
    save_file(tensors, partial, metadata=metadata)
    try:
        written = read(partial)
    except ValueError as e:
        os.remove(partial)
        raise ValueError(str(e).replace(partial, label)) from None
    os.replace(partial, label)
    written.path = label
    return written


def _tree(label: str, r: int, parents: Sequence[int]) -> Tree:
    try:
        return from_parents([int(p) for p in parents])
    except ValueError as e:
        raise ValueError(f"{label}: round {r}'s tree: {e}") from None
