"""What each M2R2 mode records besides the greedy tensors, read and validated as the reference's
reader does (reference/src/golden/m2r2/mode_file.rs, rounds.rs and tree_file.rs): early exit's
gates, a chain's speculative rounds and the graphs' logits, a token tree's recipe (its rounds are
read by :func:`m2r2_golden.tree.read_tree_record`).

Apart from :mod:`m2r2_golden.reader`, which checks the whole file and calls these by ``mode``."""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .reference_json import GATES, KV_POLICIES
from .golden import TREE_FORMAT_VERSION, drafted_in, proposal_rounds, verify_rounds
from .reader_file import _ISIZE_MAX, _RUST_SPACE, _File, _outside, _shape, _usize


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
        raise file.bad("draft_length", length, "fixed, dynamic, tree")
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
        raise file.bad("draft_tree", spec, "widths W1,W2,...")
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
        raise file.bad("gate", gate, "a tree drafted whole")
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
            raise file.bad("prompt_lookup_ngram", ngram, "MIN,MAX")
    fields, trees = tree.read_tree_record(file, n, version, widths, grown, branch, vocab)
    fields["round_trees"] = trees
    return fields
