"""m2r2-golden: read and write m2r2 golden files (docs/GOLDEN.md) from any engine.

    import m2r2_golden
    ref = m2r2_golden.read("ref.golden.safetensors")       # written by `m2r2 golden write`
    tokens, logits = my_engine_greedy(ref.prompt_tokens, steps=len(ref.tokens))
    m2r2_golden.write("mine.golden.safetensors", prompt_tokens=ref.prompt_tokens,
                      tokens=tokens, logits=logits, like=ref)
    # then: m2r2 golden compare ref.golden.safetensors mine.golden.safetensors --atol 2e-4
"""

__version__ = "0.1.0"

from .golden import FORMAT, FORMAT_VERSION, GREEDY_FORMAT_VERSION, MODES, Golden
from .reader import read
from .writer import WRITER, write, write_greedy

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "GREEDY_FORMAT_VERSION",
    "MODES",
    "WRITER",
    "Golden",
    "read",
    "write",
    "write_greedy",
]
