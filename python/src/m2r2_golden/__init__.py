"""m2r2-golden: read and write m2r2 golden files (docs/GOLDEN.md) from any engine.

    import m2r2_golden
    ref = m2r2_golden.read("ref.golden.safetensors")       # written by `m2r2 golden write`
    steps = ref.max_steps or len(ref.tokens)    # the budget (files before version 3: the tokens)
    tokens, logits = my_engine_greedy(ref.prompt_tokens, steps=steps, stop=EOS_IDS)
    m2r2_golden.write("mine.golden.safetensors", prompt_tokens=ref.prompt_tokens,
                      tokens=tokens, logits=logits, like=ref,
                      stop_tokens=EOS_IDS, max_steps=steps)
    # then: m2r2 golden compare ref.golden.safetensors mine.golden.safetensors --atol 2e-4

Reads format versions 1 to 5 (4 and 5: token-tree speculative goldens, `m2r2_golden.tree`);
writes version 3 (a speculative golden without the graphs' logits: version 2; a token tree with
`write_tree`: 4, or 5 when the rounds' trees change).
"""

__version__ = "0.3.2"

from .golden import (
    FORMAT,
    FORMAT_VERSION,
    GREEDY_FORMAT_VERSION,
    M2R2_FORMAT_VERSION,
    MODES,
    Golden,
    proposal_rounds,
    verify_rounds,
)
from . import tree
from .reader import read
from .tree_writer import write_tree
from .writer import WRITER, write, write_greedy, write_speculative

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "GREEDY_FORMAT_VERSION",
    "M2R2_FORMAT_VERSION",
    "MODES",
    "WRITER",
    "Golden",
    "proposal_rounds",
    "read",
    "tree",
    "verify_rounds",
    "write",
    "write_greedy",
    "write_speculative",
    "write_tree",
]
