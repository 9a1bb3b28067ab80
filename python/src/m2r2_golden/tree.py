"""Token trees of speculative goldens (format versions 4 and 5; docs/GOLDEN.md, the reference's
reference/src/golden/m2r2/tree.rs and tree_file.rs): the trees, the rows of ``verify_logits`` and
``draft_logits`` they imply, and the reading of a tree record, validated as the reference's reader
validates it.

Version 4 drafts one fixed shape ``W1,W2,...`` every round. Version 5 records trees that change
from round to round (grown per branch by the draft gate's score, with a prompt-lookup branch):
each round's tree (``round_tree_parents``), its lookup nodes (``round_lookup``) and its gate
scores (``round_scores``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

# The most nodes a tree may have, the root included (the reference's MAX_TREE_NODES).
MAX_TREE_NODES = 64
TREE_FORMAT_VERSION = 4
GROWN_TREE_FORMAT_VERSION = 5
# The tensors of a tree record, in the order docs/GOLDEN.md lists them (version 5 adds the last 3).
TREE_TENSORS = (
    "round_tree_tokens",
    "round_node",
    "round_accepted",
    "round_base_token",
    "verify_logits",
    "draft_logits",
    "draft_rows",
)
VARYING_TREE_TENSORS = ("round_tree_parents", "round_lookup", "round_scores")


class Tree:
    """A token tree in breadth-first order: ``parents[i - 1]`` is node ``i``'s parent."""

    def __init__(self, parents: Sequence[int]) -> None:
        self.parents = [int(p) for p in parents]
        self.depths = [0]
        for p in self.parents:
            self.depths.append(self.depths[p] + 1)

    @property
    def nodes(self) -> int:
        return len(self.parents) + 1

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def parent(self, i: int) -> Optional[int]:
        return None if i == 0 else self.parents[i - 1]

    def children(self, i: int) -> List[int]:
        return [c for c in range(1, self.nodes) if self.parents[c - 1] == i]

    def __eq__(self, other) -> bool:
        return isinstance(other, Tree) and self.parents == other.parents

    def __repr__(self) -> str:
        return f"Tree({self.parents})"


def from_widths(widths: Sequence[int]) -> Tree:
    """The tree of shape ``W1,W2,...``: each node at depth ``d`` has ``widths[d]`` children.

    Raises:
        ValueError: a width of 0, or more than MAX_TREE_NODES nodes.
    """
    if any(w < 1 for w in widths):
        raise ValueError(f"token tree {','.join(map(str, widths))}: a width is 0")
    parents: List[int] = []
    level = [0]
    total = 1
    for w in widths:
        total += len(level) * w
        if total > MAX_TREE_NODES:
            raise ValueError(f"token tree {','.join(map(str, widths))}: more than {MAX_TREE_NODES} nodes")
        first = len(parents) + 1
        for p in level:
            parents.extend([p] * w)
        level = list(range(first, len(parents) + 1))
    return Tree(parents)


def from_parents(parents: Sequence[int]) -> Tree:
    """The tree whose node ``i >= 1`` has parent ``parents[i - 1]``.

    Raises:
        ValueError: parents not in breadth-first order (each before its child, never decreasing),
            or more than MAX_TREE_NODES nodes.
    """
    if len(parents) + 1 > MAX_TREE_NODES:
        raise ValueError(f"a token tree of {len(parents) + 1} nodes (at most {MAX_TREE_NODES})")
    previous = 0
    for i, p in enumerate(parents):
        node = i + 1
        if p >= node or p < previous:
            raise ValueError(
                f"node {node} has parent {p}, but nodes are in breadth-first order (each parent "
                f"before its child, parents never decreasing)"
            )
        previous = p
    return Tree(parents)


def with_lookup_branch(tree: Tree, branch: int) -> Tree:
    """``tree`` with a chain of ``branch`` nodes hung from its root (as many as fit in
    MAX_TREE_NODES), the branch's node last at each depth (the reference's
    ``prompt_lookup::with_lookup_branch``)."""
    branch = min(branch, MAX_TREE_NODES - tree.nodes)
    depth = max(tree.max_depth, branch)
    renumbered = {0: 0}
    parents: List[int] = []
    last_branch = 0
    for d in range(1, depth + 1):
        for i in (n for n in range(1, tree.nodes) if tree.depths[n] == d):
            parents.append(renumbered[tree.parent(i)])
            renumbered[i] = len(parents)
        if d <= branch:
            parents.append(last_branch)
            last_branch = len(parents)
    return Tree(parents)


def proposing(tree: Tree, lookup: Sequence[int], grown_depth: Optional[int]) -> List[int]:
    """The nodes of a round's tree the draft ran its logits for (its rows of ``draft_logits``),
    breadth-first: grown, every node above ``grown_depth`` off the lookup branch; else every node
    with a drafted (not looked-up) child."""
    lookup = set(lookup)
    if grown_depth is not None:
        return [i for i in range(tree.nodes) if tree.depths[i] < grown_depth and i not in lookup]
    return [i for i in range(tree.nodes) if any(c not in lookup for c in tree.children(i))]


def verify_rows(trees: Sequence[Tree]) -> List[Optional[Tuple[int, int]]]:
    """``(round, node)`` of each row of ``verify_logits``: ``None`` for the prompt's row."""
    return [None] + [(r, i) for r, t in enumerate(trees) for i in range(t.nodes)]


def _rows(values: np.ndarray, r: int) -> List[int]:
    """The leading non-negative entries of row ``r`` of a -1-padded tensor."""
    row = [int(x) for x in values[r]]
    k = 0
    while k < len(row) and row[k] >= 0:
        k += 1
    if any(x != -1 for x in row[k:]):
        raise ValueError("a value after the padding")
    return row[:k]


def read_tree_record(
    file, n: int, version: int, widths: List[int], grown: bool, branch: int, vocab=None
):
    """The tensors of a tree record (``file``: the reader's open file), checked against the shape
    ``widths`` and, in version 5, the rounds' own trees; node and base tokens are ids below
    ``vocab`` (the config's, when it has one). Returns the Golden's tree fields."""
    shape = from_widths(widths)
    largest = with_lookup_branch(shape, branch)
    node = file.tensor("round_node", "I64")
    if node.ndim != 1:
        raise file.error(f"tensor `round_node` has shape {list(node.shape)}, expected [R]")
    r = node.shape[0]
    if r == 0 and n > 1:
        raise file.error(f"tensor `round_node` has no rounds for {n} tokens")
    accepted = file.tensor("round_accepted", "I64")
    file.expect_shape("round_accepted", accepted, (r,))
    base_token = file.tensor("round_base_token", "I64")
    file.expect_shape("round_base_token", base_token, (r,))
    tokens = file.tensor("round_tree_tokens", "I64")
    fields = {}
    if version >= GROWN_TREE_FORMAT_VERSION and (grown or branch):
        width = tokens.shape[1] if tokens.ndim == 2 else 0
        file.expect_shape("round_tree_tokens", tokens, (r, width))
        if r > 0 and width == 0:
            raise file.error("tensor `round_tree_tokens` has no column for the rounds' roots")
        parents = file.tensor("round_tree_parents", "I64")
        file.expect_shape("round_tree_parents", parents, (r, max(width - 1, 0)))
        lookup = file.tensor("round_lookup", "I64")
        file.expect_shape("round_lookup", lookup, (r, lookup.shape[1] if lookup.ndim == 2 else 0))
        scores = file.tensor("round_scores", "F32")
        file.expect_shape("round_scores", scores, (r, scores.shape[1] if scores.ndim == 2 else 0))
        trees, branches = [], []
        for k in range(r):
            try:
                tree = from_parents(_rows(parents, k))
            except ValueError as e:
                raise file.error(f"tensor `round_tree_parents`: round {k}: {e}") from None
            if tree.nodes > largest.nodes or tree.max_depth > largest.max_depth:
                raise file.error(
                    f"tensor `round_tree_parents`: round {k}: a tree of {tree.nodes} nodes and "
                    f"depth {tree.max_depth}, larger than the recipe's largest ({largest.nodes} "
                    f"nodes, depth {largest.max_depth})"
                )
            try:
                nodes = _rows(lookup, k)
            except ValueError as e:
                raise file.error(f"tensor `round_lookup`: round {k}: {e}") from None
            for d, i in enumerate(nodes):
                want = 0 if d == 0 else nodes[d - 1]
                if i >= tree.nodes or tree.parent(i) != want:
                    raise file.error(
                        f"tensor `round_lookup`: round {k}: node {i} is not the branch's node of "
                        f"depth {d + 1}"
                    )
            trees.append(tree)
            branches.append(nodes)
        fields.update(round_tree_parents=parents, round_lookup=lookup, round_scores=scores)
    else:
        file.expect_shape("round_tree_tokens", tokens, (r, shape.nodes))
        trees, branches = [shape] * r, [[] for _ in range(r)]
        width = shape.nodes
    for k in range(r):
        t = trees[k]
        i = int(node[k])
        if not 0 <= i < t.nodes:
            raise file.error(
                f"tensor `round_node`: round {k} accepts node {i}, the tree has nodes 0..{t.nodes}"
            )
        if int(accepted[k]) != t.depths[i]:
            raise file.error(
                f"tensor `round_accepted`: round {k} accepted {int(accepted[k])} drafts, but its "
                f"node {i} is at depth {t.depths[i]}"
            )
    # each round emits its accepted path and a base token (the reference's check_emitted)
    file.check_emitted(accepted, n)
    from .reader_file import _outside

    for k in range(r):
        t = trees[k]
        for j in range(width):
            v = int(tokens[k, j])
            why = _outside(v, vocab) if j < t.nodes else ("" if v != -1 else None)
            if why is not None:
                raise file.error(
                    f"tensor `round_tree_tokens`: round {k} node {j} holds token id {v}{why}"
                )
    for k in range(r):
        v = int(base_token[k])
        why = _outside(v, vocab)
        if why is not None:
            raise file.error(f"tensor `round_base_token`: round {k} holds token id {v}{why}")
    grown_depth = len(widths) if grown else None
    props = [proposing(t, b, grown_depth) for t, b in zip(trees, branches)]
    if grown:
        scores = fields["round_scores"]
        for k, p in enumerate(props):
            count = int(np.count_nonzero(~np.isnan(scores[k])))
            leading = 0
            while leading < scores.shape[1] and not np.isnan(scores[k, leading]):
                leading += 1
            if count != len(p) or leading != count:
                raise file.error(
                    f"tensor `round_scores`: round {k} holds {count} scores, its tree has "
                    f"{len(p)} proposing nodes"
                )
    want_rows = [[k, i] for k, p in enumerate(props) for i in p]
    rows = file.tensor("draft_rows", "I64")
    file.expect_shape("draft_rows", rows, (len(want_rows), 2))
    if rows.tolist() != want_rows:
        raise file.error("tensor `draft_rows` does not follow from the rounds' trees")
    counts = {"verify_logits": len(verify_rows(trees)), "draft_logits": len(want_rows)}
    for name, count in counts.items():
        values = file.tensor(name, "F32")
        if values.ndim != 2 or values.shape[0] != count:
            raise file.error(
                f"tensor `{name}` has shape {list(values.shape)}, expected [{count}, V] (the "
                "rows the rounds' trees imply)"
            )
        fields[name] = values
    fields.update(
        round_tree_tokens=tokens,
        round_node=node,
        round_accepted=accepted,
        round_base_token=base_token,
        draft_rows=rows,
    )
    return fields, trees
