"""The golden file's contents (docs/GOLDEN.md): tensors, metadata and the format's constants.

Dimensions: P prompt tokens, n emitted tokens, V vocabulary, J gates, R speculative rounds,
M = draft_max, T verified rows, Q draft proposals.

Format versions (the reference's reader, reference/src/golden/file.rs, reads them all):
1 greedy only; 2 adds the M2R2 modes (early-exit, speculative); 3, written for every mode now, adds
the metadata `stop_tokens` and `max_steps`, the optional pins `atol`, `rtol`, `expect_dtype`, and
the speculative tensors `verify_logits` and `draft_logits`; 4, speculative goldens of a fixed token
tree; 5, token trees that change from round to round (`tree.py`). This package reads 1 to 5 and
writes 3 (a speculative golden without the graphs' logits: 2), and with `write_tree` 4 (a fixed
token tree) or 5 (trees that change).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

FORMAT = "m2r2-golden"
# The version greedy, early-exit and chain speculative goldens are written as. Token trees are
# newer (TREE_FORMAT_VERSION, GROWN_TREE_FORMAT_VERSION); READ_VERSIONS ends with the newest read.
FORMAT_VERSION = 3
# The version of files before the M2R2 modes: greedy only.
GREEDY_FORMAT_VERSION = 1
# The version that introduced the M2R2 modes; a speculative golden without the graphs' logits is
# still written as this one (writer.write_speculative).
M2R2_FORMAT_VERSION = 2
# Token-tree speculative goldens (read, and written by tree_writer.write_tree): a fixed tree, and
# trees that change from round to round.
TREE_FORMAT_VERSION = 4
GROWN_TREE_FORMAT_VERSION = 5
READ_VERSIONS = (
    GREEDY_FORMAT_VERSION,
    M2R2_FORMAT_VERSION,
    FORMAT_VERSION,
    TREE_FORMAT_VERSION,
    GROWN_TREE_FORMAT_VERSION,
)
MODES = ("greedy", "early-exit", "speculative")
# The export precisions a golden can pin (metadata `expect_dtype`).
DTYPES = ("f32", "f16")

# The extra tensors of each M2R2 mode since version 2, in the order docs/GOLDEN.md lists them.
M2R2_TENSORS = {
    "early-exit": ("exit_gate", "gate_scores"),
    "speculative": ("round_drafted", "round_accepted", "round_base_token", "round_scores"),
}
# What each graph of a speculative deployment produced along the rounds (version 3).
GRAPH_TENSORS = {"speculative": ("verify_logits", "draft_logits")}

# The metadata keys each kind of golden records; the reader refuses any other, naming it, as the
# reference's does (reference/src/golden/metadata.rs): every golden's, version 3's, the M2R2
# modes', then each kind's own (a speculative golden drafts a chain or a token tree).
COMMON_KEYS = ("format", "format_version", "model", "config_hash", "config", "mode", "m2r2_version")
VERSION_3_KEYS = ("stop_tokens", "max_steps", "atol", "rtol", "expect_dtype")
M2R2_KEYS = ("m2r2_config", "m2r2_hash", "m2r2_weights_hash")
KIND_KEYS = {
    "early-exit": ("gate", "threshold", "kv_policy"),
    "chain": ("draft_gate", "gate", "draft_length", "draft_max", "draft_threshold"),
    "tree": (
        "draft_gate",
        "gate",
        "draft_length",
        "draft_max",
        "draft_tree",
        "tree_threshold",
        "prompt_lookup",
        "prompt_lookup_ngram",
    ),
}


def drafted_in(round_drafted: np.ndarray, r: int) -> np.ndarray:
    """The tokens round ``r`` drafted: its row of ``round_drafted`` [R, M] without the -1 pad."""
    row = np.asarray(round_drafted)[r]
    return row[row >= 0]


def proposals(round_drafted: np.ndarray, round_scores: np.ndarray, r: int) -> int:
    """Proposals the draft made in round ``r``: its drafts, or one more where a dynamic draft
    stopped at a score under the threshold (the non-NaN entries of ``round_scores`` [R, M + 1])."""
    scored = int(np.count_nonzero(~np.isnan(np.asarray(round_scores)[r])))
    return max(len(drafted_in(round_drafted, r)), scored)


def verify_rounds(round_drafted: np.ndarray) -> List[Optional[int]]:
    """The round of each row of ``verify_logits``: ``None`` for the prompt's last row, then round
    ``r`` once for its first token and once per drafted token (``T = 1 + sum_r (d_r + 1)`` rows)."""
    rows: List[Optional[int]] = [None]
    for r in range(np.asarray(round_drafted).shape[0]):
        rows.extend([r] * (len(drafted_in(round_drafted, r)) + 1))
    return rows


def proposal_rounds(round_drafted: np.ndarray, round_scores: np.ndarray) -> List[int]:
    """The round of each row of ``draft_logits``: round ``r`` once per proposal
    (``Q = sum_r p_r`` rows, :func:`proposals`)."""
    rounds = range(np.asarray(round_drafted).shape[0])
    return [r for r in rounds for _ in range(proposals(round_drafted, round_scores, r))]


@dataclass(eq=False)
class Golden:
    """One golden file: what an engine decoded for a prompt, and for which model.

    ``metadata`` holds the file's metadata strings unchanged (``config`` is the reference's own JSON
    text; ``config_hash`` is computed over exactly that text, so both are copied, never rebuilt).
    Arrays are compared with numpy, not ``==`` (``eq=False``).
    """

    prompt_tokens: np.ndarray  # int64 [P]
    tokens: np.ndarray  # int64 [n]
    logits: np.ndarray  # float32 [n, V]: row i, the logits token i was chosen from
    metadata: Dict[str, str]
    # early-exit (format version 2)
    exit_gate: Optional[np.ndarray] = None  # int64 [n]: 1-based gate, 0 = ran all layers
    gate_scores: Optional[np.ndarray] = None  # float32 [n, J]: NaN where not evaluated
    # speculative (format version 2)
    round_drafted: Optional[np.ndarray] = None  # int64 [R, M]: padded with -1
    round_accepted: Optional[np.ndarray] = None  # int64 [R]
    round_base_token: Optional[np.ndarray] = None  # int64 [R]: correction or bonus token
    round_scores: Optional[np.ndarray] = None  # float32 [R, M + 1]: NaN padded
    # speculative (format version 3): rows in the order of verify_rounds / proposal_rounds
    verify_logits: Optional[np.ndarray] = None  # float32 [T, V]: the prompt's row, verified rows
    draft_logits: Optional[np.ndarray] = None  # float32 [Q, V]: the draft's, at every proposal
    # token tree (format versions 4 and 5; tree.py, tree_writer.py): per round every node's token
    # (-1 past the round's tree), the accepted node, `(round, node)` of each draft_logits row;
    # version 5 also each round's tree, lookup nodes and gate scores (round_scores [R, S], NaN
    # padded)
    round_tree_tokens: Optional[np.ndarray] = None  # int64 [R, T]
    round_node: Optional[np.ndarray] = None  # int64 [R]
    draft_rows: Optional[np.ndarray] = None  # int64 [sum P_r, 2]
    round_tree_parents: Optional[np.ndarray] = None  # int64 [R, T - 1]: -1 padded
    round_lookup: Optional[np.ndarray] = None  # int64 [R, L]: -1 padded
    # every round's tree (tree.Tree), for a token-tree golden
    round_trees: Optional[list] = None
    # the file it was read from or written to, for messages
    path: Optional[str] = None

    @property
    def format_version(self) -> int:
        return int(self.metadata["format_version"])

    @property
    def model(self) -> str:
        """The model as named on the recording command line (``tiny``, ``smollm2``, a path)."""
        return self.metadata["model"]

    @property
    def mode(self) -> str:
        """``greedy``, ``early-exit`` or ``speculative``."""
        return self.metadata["mode"]

    @property
    def config_json(self) -> str:
        """The reference's ``ModelConfig`` as the JSON text recorded in the file."""
        return self.metadata["config"]

    @property
    def config(self) -> Dict[str, Any]:
        """The recorded ``ModelConfig``, parsed (for reading; write with ``config_json``)."""
        return json.loads(self.config_json)

    @property
    def config_hash(self) -> str:
        """First 16 hex digits of SHA-256 over ``config_json``, as the reference computed them."""
        return self.metadata["config_hash"]

    @property
    def m2r2_config(self) -> Optional[Dict[str, Any]]:
        """The M2R2 settings of an early-exit or speculative golden, parsed; ``None`` for greedy.
        (The reference writes a JSON object; its reader also takes the fields as an array, in the
        order of its ``M2r2Config``, which this then returns as a list.)"""
        text = self.metadata.get("m2r2_config")
        return None if text is None else json.loads(text)

    @property
    def m2r2_hash(self) -> Optional[str]:
        """The M2R2 weights and settings the golden was recorded with (a hash)."""
        return self.metadata.get("m2r2_hash")

    @property
    def m2r2_weights_hash(self) -> Optional[str]:
        """The same weights' hash without the decoding defaults (``draft_len``,
        ``prompt_lookup``, ...), which the reference checks by when both sides have one; ``None``
        in goldens written before it."""
        return self.metadata.get("m2r2_weights_hash")

    @property
    def stop_tokens(self) -> Optional[List[int]]:
        """The end-of-turn ids the decode stops at (after the first one it emits; the set, whether
        one was reached or not): ``[]`` when it decoded without stopping, the whole ``max_steps``
        budget; ``None`` for files before version 3, which ran the whole budget."""
        if self.format_version < 3:
            return None
        return [int(t) for t in json.loads(self.metadata["stop_tokens"])]

    @property
    def max_steps(self) -> Optional[int]:
        """The token budget of the decode (``len(tokens)`` or more when it stopped at a stop
        token); ``None`` for files before version 3."""
        return None if self.format_version < 3 else int(self.metadata["max_steps"])

    @property
    def atol(self) -> Optional[float]:
        """The absolute tolerance the suite pins (version 3), or ``None``."""
        return _pin(self, "atol")

    @property
    def rtol(self) -> Optional[float]:
        """The relative tolerance the suite pins (version 3), or ``None``."""
        return _pin(self, "rtol")

    @property
    def expect_dtype(self) -> Optional[str]:
        """The export precision the suite pins (``f32`` or ``f16``; version 3), or ``None``."""
        return self.metadata.get("expect_dtype") if self.format_version >= 3 else None

    @property
    def vocab_size(self) -> int:
        return int(self.logits.shape[1])

    @property
    def draft_tree(self) -> Optional[List[int]]:
        """A token-tree golden's shape ``[W1, W2, ...]`` (metadata ``draft_tree``), else ``None``."""
        if self.metadata.get("draft_length") != "tree":
            return None
        return [int(w) for w in self.metadata["draft_tree"].split(",")]

    def m2r2_tensors(self) -> Dict[str, np.ndarray]:
        """The mode's tensors this golden holds, by name: version 2's, for a version-3
        speculative golden ``verify_logits`` and ``draft_logits``, and a token tree's (empty for
        greedy)."""
        names = M2R2_TENSORS.get(self.mode, ()) + GRAPH_TENSORS.get(self.mode, ())
        if self.draft_tree is not None:
            from .tree import TREE_TENSORS, VARYING_TREE_TENSORS

            names = TREE_TENSORS + VARYING_TREE_TENSORS
        tensors = {name: getattr(self, name) for name in names}
        return {name: t for name, t in tensors.items() if t is not None}


def _pin(golden: Golden, key: str) -> Optional[float]:
    text = golden.metadata.get(key)
    return None if text is None or golden.format_version < 3 else float(text)
