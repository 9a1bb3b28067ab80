"""The golden file's contents (docs/GOLDEN.md): tensors, metadata and the format's constants.

Dimensions: P prompt tokens, n emitted tokens, V vocabulary, J gates, R speculative rounds,
M = draft_max.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Optional

import numpy as np

FORMAT = "m2r2-golden"
# Greedy files are version 1; the M2R2 modes (early-exit, speculative) are version 2.
GREEDY_FORMAT_VERSION = 1
FORMAT_VERSION = 2
MODES = ("greedy", "early-exit", "speculative")

# The extra tensors of each version-2 mode, in the order docs/GOLDEN.md lists them.
M2R2_TENSORS = {
    "early-exit": ("exit_gate", "gate_scores"),
    "speculative": ("round_drafted", "round_accepted", "round_base_token", "round_scores"),
}


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
        """The M2R2 settings of a version-2 golden, parsed; ``None`` for greedy."""
        text = self.metadata.get("m2r2_config")
        return None if text is None else json.loads(text)

    @property
    def m2r2_hash(self) -> Optional[str]:
        return self.metadata.get("m2r2_hash")

    @property
    def vocab_size(self) -> int:
        return int(self.logits.shape[1])

    def m2r2_tensors(self) -> Dict[str, np.ndarray]:
        """The version-2 tensors this golden holds, by name (empty for greedy)."""
        names = M2R2_TENSORS.get(self.mode, ())
        return {name: getattr(self, name) for name in names}
