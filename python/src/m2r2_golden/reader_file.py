"""The raw side of reading a golden: the open file (:class:`_File`: its metadata keys and tensors,
every error a ValueError naming the file) and the numbers, counts and token ids in it, parsed as
the reference's Rust reader parses them (``f32::from_str``, ``usize::from_str``, ``str::trim``).

Apart from :mod:`m2r2_golden.reader` (the whole-file checks) and :mod:`m2r2_golden.reader_modes`
(each mode's record), which both read through it, as does :mod:`m2r2_golden.tree`."""

from __future__ import annotations

import re
import unicodedata
from typing import Dict, List, Optional, Tuple

import numpy as np

from .reference_json import JsonError, check_struct, parse


# safetensors dtype name -> numpy dtype, for the two dtypes a golden holds
_DTYPES = {"I64": np.int64, "F32": np.float32}
_U32_MAX = 2**32 - 1
# Rust's usize::MAX and isize::MAX (64-bit), which bound the reference's counts and sizes
_USIZE_MAX = 2**64 - 1
_ISIZE_MAX = 2**63 - 1
# `m2r2_weights_hash` as the reference reads it (reference/src/golden/m2r2/mode_file.rs)
_WEIGHTS_HASH = re.compile(r"[0-9a-fA-F]{16}")
# A number as Rust's `f32::from_str` reads it: decimal, or inf / infinity / nan in any case, each
# with an optional sign (no spaces or `_`, which Python's float takes)
_FLOAT = re.compile(
    r"[+-]?(?:inf|infinity|nan|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)", re.IGNORECASE
)
# What Rust's `str::trim` removes (Unicode White_Space), for the values the reference trims
_RUST_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
    "\u200a\u2028\u2029\u202f\u205f\u3000"
)


# Rust's `{:?}` escapes of these characters in a string (others it escapes are `\u{hex}`)
_RUST_ESCAPES = {"\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"', "\0": "\\0"}


def _shown(text: str) -> str:
    """``text`` (a value read from a file) as the reference's messages quote it: as Rust's
    ``{:?}`` writes it, without the quotes, so that control characters show as ``\\u{1}``
    instead of reaching a terminal raw (or an XML report dropping them, so that ``gr\\u{1}eedy``
    reads ``greedy``); what Rust escapes besides: the characters Python does not print (other
    spaces than ' ', format and unassigned ones) and combining marks."""
    out = []
    for c in text:
        if c in _RUST_ESCAPES:
            out.append(_RUST_ESCAPES[c])
        elif not c.isprintable() or unicodedata.category(c) in ("Mn", "Me"):
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return "".join(out)


def _f32(text: str) -> Optional[float]:
    """``text`` as Rust's ``f32::from_str`` reads it (too large for an f32: inf), or None where it
    refuses it."""
    if _FLOAT.fullmatch(text) is None:
        return None
    with np.errstate(over="ignore"):
        return float(np.float32(float(text)))


def _usize(text: str, plus: bool = True) -> Optional[int]:
    """``text`` as Rust's ``usize::from_str`` reads it (ASCII digits after an optional ``+``, at
    most usize::MAX; ``plus=False``: digits only, as the reference reads a count), or None where
    it refuses it."""
    digits = text[1:] if plus and text.startswith("+") else text
    # usize::MAX has 20 digits (and int() refuses thousands of them)
    if not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > 20:
        return None
    value = int(digits)
    return value if value <= _USIZE_MAX else None


class _File:
    """An open golden file: metadata and tensors, with errors naming the file."""

    def __init__(self, label: str, handle) -> None:
        self.label = label
        self.handle = handle
        self.metadata: Dict[str, str] = dict(handle.metadata() or {})
        self.names = set(handle.keys())

    def error(self, msg: str) -> ValueError:
        return ValueError(f"{self.label}: {msg}")

    def bad(self, key: str, value: str, why: str) -> ValueError:
        """Metadata ``key`` holds ``value``, which is not valid (``why``: what it must be), quoted
        escaped (:func:`_shown`), as the reference's reader says it."""
        return self.error(f"metadata `{key}` = `{_shown(value)}` is not valid ({why})")

    def field(self, key: str) -> str:
        if key not in self.metadata:
            raise self.error(f"not a golden file: metadata `{key}` is missing")
        return self.metadata[key]

    def integer(self, key: str, plus: bool = False, limit: int = _USIZE_MAX) -> int:
        """A non-negative integer up to ``limit``: decimal digits, as the reference reads a count,
        or (``plus``) as it reads a ``usize``, which may start with ``+``."""
        value = self.field(key)
        parsed = _usize(value, plus)
        if parsed is None or parsed > limit:
            raise self.bad(key, value, f"a non-negative integer, at most {limit}")
        return parsed

    def choice(self, key: str, options: Tuple[str, ...]) -> str:
        value = self.field(key)
        if value not in options:
            raise self.bad(key, value, ", ".join(options))
        return value

    def number(self, key: str, finite: bool = False) -> float:
        """A number, read as an f32 (one too large for it: inf); ``finite``: inf and NaN refused."""
        value = self.field(key)
        x = _f32(value)
        if x is None or (finite and not np.isfinite(x)):
            what = "a finite number" if finite else "a number"
            raise self.bad(key, value, what)
        return x

    def numbers(self, key: str) -> List[float]:
        """One finite number, or a comma-separated list of them (early exit's per-gate
        thresholds; the reference trims the spaces around each)."""
        value = self.field(key)
        parsed = [_f32(part.strip(_RUST_SPACE)) for part in value.split(",")]
        if not all(x is not None and np.isfinite(x) for x in parsed):
            raise self.bad(key, value, "a finite number, or one per gate separated by commas")
        return parsed

    def id_list(self, key: str) -> List[int]:
        """A JSON list of token ids (each in ``0..=u32::MAX``), as ``stop_tokens`` holds (read as
        serde_json reads a ``Vec<u32>``: ``-0`` and ``1e2`` are floats, no id)."""
        value = self.field(key)
        try:
            parsed = parse(value)
        except JsonError:
            parsed = None
        if not isinstance(parsed, list) or not all(
            type(t) is int and 0 <= t <= _U32_MAX for t in parsed
        ):
            raise self.bad(key, value, "a JSON list of token ids")
        return parsed

    def tolerance(self, key: str) -> None:
        """Optional ``key``: a finite number >= 0 that fits an f32, as the reference reads a pin."""
        value = self.metadata.get(key)
        if value is None:
            return
        x = _f32(value)
        if x is None or not (np.isfinite(x) and x >= 0):
            raise self.bad(key, value, "a finite number >= 0")

    def json_value(self, key: str):
        """Metadata ``key`` parsed as serde_json parses it (:func:`_json`)."""
        value = self.field(key)
        try:
            return parse(value)
        except JsonError as e:
            raise self.error(f"metadata `{key}` is not valid JSON: {e}") from None

    def json_object(self, key: str) -> dict:
        parsed = self.json_value(key)
        if not isinstance(parsed, dict):
            raise self.error(f"metadata `{key}` is not a JSON object")
        return parsed

    def m2r2_config(self) -> int:
        """Metadata ``m2r2_config``: the M2R2 settings, which must deserialise as the reference's
        ``M2r2Config`` (:data:`_STRUCTS`); returns their number of exit gates."""
        config = self.json_value("m2r2_config")
        try:
            check_struct(config, "M2r2Config", "")
        except JsonError as e:
            raise self.error(f"metadata `m2r2_config`: {e}") from None
        return len(config[1] if isinstance(config, list) else config["gates"])

    def check_emitted(self, accepted: np.ndarray, n: int) -> None:
        """Rounds accepting ``accepted`` drafts (each >= 0) must emit the ``n`` tokens, as the
        reference's reader requires (``check_emitted``, reference/src/golden/m2r2/rounds.rs): the
        first token comes from the prompt's row and each round emits its accepted drafts and a
        base token, so every round but the last emits all of them and the last at least one
        (fewer than all only where the budget or a stop token cut it, which the stop check
        covers). No rounds: the caller's to check."""
        counts = [abs(int(a)) + 1 for a in accepted]
        if not counts:
            return
        before = 1 + sum(counts[:-1])
        everything = before + counts[-1]
        if before < n <= everything:
            return
        raise self.error(
            f"tensor `round_accepted` does not agree with `tokens`: the prompt's token and "
            f"{len(counts)} rounds of accepted drafts and a base token each make {before} tokens "
            f"before the last round and {everything} with it, but `tokens` holds {n} (the last "
            "round emits at least one, and fewer than all only where the budget or a stop token "
            "cut it)"
        )

    def weights_hash(self) -> None:
        """Optional metadata ``m2r2_weights_hash``: 16 hex digits (either case), as the reference
        reads it; ``m2r2_hash`` must be there, in any form."""
        self.field("m2r2_hash")
        value = self.metadata.get("m2r2_weights_hash")
        if value is not None and not _WEIGHTS_HASH.fullmatch(value):
            raise self.bad("m2r2_weights_hash", value, "16 hex digits")

    def tensor(self, name: str, dtype: str) -> np.ndarray:
        """The tensor ``name``, which must be stored as ``dtype`` (``I64`` or ``F32``)."""
        if name not in self.names:
            raise self.error(f"tensor `{name}` is missing")
        stored = self.handle.get_slice(name).get_dtype()
        if stored != dtype:
            raise self.error(f"tensor `{name}` has unsupported dtype {stored} (expected {dtype})")
        try:
            values = self.handle.get_tensor(name)
        except ValueError as e:
            # a shape numpy has no array of (no bytes, so the file holds it: [0, 2^63])
            shape = _shape(self.handle.get_slice(name).get_shape())
            raise self.error(f"tensor `{name}` of shape {shape}: {e}") from None
        return np.ascontiguousarray(values, dtype=_DTYPES[dtype])

    def expect_shape(self, name: str, array: np.ndarray, expected: Tuple[int, ...]) -> None:
        if tuple(array.shape) != tuple(expected):
            raise self.error(
                f"tensor `{name}` has shape {_shape(array.shape)}, expected {_shape(expected)}"
            )

    def ids(self, name: str, row: str = "index", vocab: Optional[int] = None) -> np.ndarray:
        """A 1-D I64 tensor of token ids, each in ``0..=u32::MAX`` and below ``vocab`` when it is
        known, as the reference requires; ``row`` names an index in errors (step, position)."""
        values = self.tensor(name, "I64")
        if values.ndim != 1:
            raise self.error(f"tensor `{name}` has shape {_shape(values.shape)}, expected [n]")
        limit = _U32_MAX if vocab is None else min(_U32_MAX, vocab - 1)
        bad = np.flatnonzero((values < 0) | (values > limit))
        if bad.size:
            i = int(bad[0])
            v = int(values[i])
            outside = (
                f", outside the vocabulary of {vocab} tokens (metadata `config`)"
                if vocab is not None and v >= vocab
                else ""
            )
            raise self.error(f"`{name}` holds token id {v} at {row} {i}{outside}")
        return values


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _outside(t: int, vocab: Optional[int]) -> Optional[str]:
    """Why ``t`` is no token id (the reference's words): outside the config's vocabulary, or
    outside ``0..=u32::MAX`` (``""``); ``None`` for an id."""
    if vocab is not None and t >= vocab:
        return f", outside the vocabulary of {vocab} tokens (metadata `config`)"
    if not 0 <= t <= _U32_MAX:
        return ""
    return None
