"""JSON metadata as the reference reads it: :func:`parse` parses as serde_json does (strict JSON,
serde_json's numbers, no lone surrogates, its nesting limit), and :func:`check_struct` checks a
parsed value against the reference's M2R2 settings as serde deserialises them
(reference/src/m2r2/config.rs and bridge_config.rs, `deny_unknown_fields`). The golden reader
(:mod:`m2r2_golden.reader`) refuses what these refuse, as the reference's reader does."""

from __future__ import annotations

import json
from typing import Dict, List, Optional, Tuple

import numpy as np

_USIZE_MAX = 2**64 - 1
# the values of the M2R2 metadata keys that name something (reference: GateKind, KvPolicy)
GATES = ("arla", "confidence", "entropy")
KV_POLICIES = ("exact", "fast-kv")

class JsonError(ValueError):
    """Text serde_json refuses (the reason, without the file or key)."""


class _Object(dict):
    """A JSON object: its keys and values (the last of a repeated key wins, as in serde_json's
    ``Value``), and ``pairs``, every key and value in order (a struct refuses a repeated field)."""

    pairs: List[Tuple[str, object]]

    @classmethod
    def of(cls, pairs: List[Tuple[str, object]]) -> "_Object":
        obj = cls(pairs)
        obj.pairs = pairs
        return obj


# serde_json nests at most this many arrays and objects (its recursion limit, 128, less one)
_JSON_DEPTH = 127
_I64_MIN = -(2**63)


def _json_int(text: str):
    """An integer literal as serde_json reads it: u64 or i64 where it fits (``-0`` does not: it
    is the float -0.0), else an f64, which may be out of range."""
    try:
        value = int(text)
    except ValueError:  # more digits than Python converts: far beyond any f64
        raise JsonError("number out of range") from None
    if text.startswith("-"):
        if _I64_MIN <= value < 0:
            return value
    elif value <= _USIZE_MAX:
        return value
    try:
        return -0.0 if text == "-0" else float(value)
    except OverflowError:
        raise JsonError("number out of range") from None


def _json_float(text: str) -> float:
    value = float(text)
    if not np.isfinite(value):
        raise JsonError("number out of range")
    return value


def _json_constant(text: str):
    raise JsonError(f"`{text}` is not a JSON value")


def parse(text: str):
    """``text`` parsed as serde_json parses it: strict JSON (no NaN or Infinity), numbers as
    serde_json holds them (:func:`_json_int`; a float beyond f64 refused), no lone surrogate
    (``\\ud800``), at most 127 levels of nesting. Objects are :class:`_Object`.

    Raises:
        JsonError: the text is not JSON to serde_json.
    """
    try:
        value = json.loads(
            text,
            parse_int=_json_int,
            parse_float=_json_float,
            parse_constant=_json_constant,
            object_pairs_hook=_Object.of,
        )
    except json.JSONDecodeError as e:
        raise JsonError(str(e)) from None
    except RecursionError:
        raise JsonError(f"nested more than {_JSON_DEPTH} levels deep") from None
    # depth-first, without recursion: (value, its depth)
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise JsonError(
                    "a string holds a lone surrogate (`\\uD800` to `\\uDFFF` unpaired)"
                ) from None
        elif isinstance(item, (list, dict)):
            if depth > _JSON_DEPTH:
                raise JsonError(f"nested more than {_JSON_DEPTH} levels deep")
            children = item if isinstance(item, list) else [v for kv in item.pairs for v in kv]
            stack.extend((child, depth + 1) for child in children)
    return value


# The M2R2 settings (`m2r2_config`) as the reference deserialises them (serde, with
# `deny_unknown_fields`; reference/src/m2r2/config.rs and bridge_config.rs): per struct its fields
# in order, each `(name, kind, optional)`; an optional field may be missing (and, where its kind
# is an Option, null).
_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_BRIDGE_SITES = ("entry", "gate")
_OPTION, _DEFAULT = "option", "default"
_STRUCTS: Dict[str, List[Tuple[str, object, Optional[str]]]] = {
    "ArlaConfig": [("latent", "usize", None), ("threshold", "f32", None)],
    "EarlyExitConfig": [("gate", "gate", None), ("thresholds", ("vec", "f32"), None)],
    "DynamicDraftConfig": [("gate", "gate", None), ("threshold", "f32", None)],
    "DraftTreeConfig": [
        ("draft_gate", "usize", None),
        ("widths", ("vec", "usize"), None),
        ("dynamic", "DynamicDraftConfig", _OPTION),
    ],
    "EngineDrafting": [
        ("draft_gate", "usize", None),
        ("draft_len", "usize", None),
        ("dynamic_draft", "DynamicDraftConfig", _OPTION),
        ("draft_tree", "DraftTreeConfig", _OPTION),
        ("prompt_lookup", "usize", _OPTION),
    ],
    "BridgeConfig": [
        ("gate", "usize", None),
        ("rank", "usize", None),
        ("sites", ("vec", "site"), None),
        ("scales", "site_scales", _DEFAULT),
    ],
    "M2r2Config": [
        ("num_layers", "usize", None),
        ("gates", ("vec", "usize"), None),
        ("draft_gate", "usize", None),
        ("draft_len", "usize", None),
        ("rank", "usize", None),
        ("alpha", "f32", None),
        ("targets", ("vec", "target"), None),
        ("arla", "ArlaConfig", None),
        ("early_exit", "EarlyExitConfig", _OPTION),
        ("dynamic_draft", "DynamicDraftConfig", _OPTION),
        ("draft_tree", "DraftTreeConfig", _OPTION),
        ("prompt_lookup", "usize", _OPTION),
        ("bridge", "BridgeConfig", _OPTION),
        ("onnx_drafting", "EngineDrafting", _OPTION),
        ("seed", "u64", _OPTION),
    ],
}


def _json_kind(value) -> str:
    """What a JSON value is, in serde's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value!r}`"
    if isinstance(value, str):
        return f"string {json.dumps(value)}"
    return "sequence" if isinstance(value, list) else "map"


def _serde(value, kind, where: str) -> None:
    """``value`` (parsed by :func:`parse`) must deserialise as ``kind``; ``where`` names it.

    Raises:
        JsonError: naming ``where`` and what was expected.
    """

    def expected(what: str):
        return JsonError(f"`{where}`: {_json_kind(value)}, expected {what}")

    if isinstance(kind, tuple):  # ("vec", element kind)
        if not isinstance(value, list):
            raise expected("a sequence")
        for i, item in enumerate(value):
            _serde(item, kind[1], f"{where}[{i}]")
    elif kind in ("usize", "u64"):
        # serde_json: an integer in 0..=u64::MAX (-0, 1.0, 1e1 are floats)
        if type(value) is not int or value < 0:
            raise expected(kind)
    elif kind == "f32":
        if type(value) not in (int, float):
            raise expected("f32")
    elif kind in ("gate", "target"):
        names = GATES if kind == "gate" else _TARGETS
        if not isinstance(value, str) or value not in names:
            raise expected(f"one of {', '.join(names)}")
    elif kind == "site":
        # a unit variant: its name, or (serde_json) an object of its name alone, holding null
        named = isinstance(value, str) and value in _BRIDGE_SITES
        tagged = (
            isinstance(value, _Object)
            and len(value.pairs) == 1
            and value.pairs[0][0] in _BRIDGE_SITES
            and value.pairs[0][1] is None
        )
        if not (named or tagged):
            raise expected(f"a bridge site ({', '.join(_BRIDGE_SITES)})")
    elif kind == "site_scales":
        if not isinstance(value, _Object):
            raise expected("a map")
        for key, scale in value.pairs:
            if key not in _BRIDGE_SITES:
                raise JsonError(
                    f"`{where}`: unknown bridge site `{key}` (expected {', '.join(_BRIDGE_SITES)})"
                )
            _serde(scale, "f32", f"{where}.{key}")
    else:
        check_struct(value, kind, where)


def check_struct(value, name: str, where: str) -> None:
    """A struct: an object of its fields (each once, none unknown, the required ones present),
    or, as serde_json also takes one, an array of them in order (the optional ones may be left
    off the end)."""
    fields = _STRUCTS[name]

    def field(value, kind, optional, at: str) -> None:
        if not (optional == _OPTION and value is None):
            _serde(value, kind, at)

    # errors name the struct's place (none for the whole settings); its fields' places below it
    at, prefix = (f"`{where}`: ", f"{where}.") if where else ("", "")
    if isinstance(value, list):
        if len(value) > len(fields):
            raise JsonError(
                f"{at}{len(value)} values, more than the {len(fields)} fields of struct {name}"
            )
        for i, (key, kind, optional) in enumerate(fields):
            if i < len(value):
                field(value[i], kind, optional, prefix + key)
            elif optional is None:
                raise JsonError(
                    f"{at}invalid length {len(value)}, expected struct {name} with "
                    f"{len(fields)} elements"
                )
        return
    if not isinstance(value, _Object):
        raise JsonError(f"{at}{_json_kind(value)}, expected struct {name}")
    kinds = {key: (kind, optional) for key, kind, optional in fields}
    seen = set()
    for key, item in value.pairs:
        if key not in kinds:
            raise JsonError(
                f"{at}unknown field `{key}`, expected one of "
                + ", ".join(f"`{k}`" for k, _, _ in fields)
            )
        if key in seen:
            raise JsonError(f"{at}duplicate field `{key}`")
        seen.add(key)
        field(item, *kinds[key], prefix + key)
    for key, _, optional in fields:
        if optional is None and key not in seen:
            raise JsonError(f"{at}missing field `{key}`")

