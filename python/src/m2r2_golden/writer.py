"""Writing goldens (docs/GOLDEN.md) from any engine's tokens and logits: greedy ones, and
speculative ones with the rounds and what each graph produced, as format version 3 (a speculative
golden without the graphs' logits as version 2, see :func:`write_speculative`).

The model metadata is copied from the reference's golden, never rebuilt: ``config_hash`` is the
first 16 hex digits of SHA-256 over the reference's own JSON text of its config (Rust serde_json),
which Python's ``json`` does not reproduce byte for byte (``1e-5`` vs ``1e-05``), so the ``config``
string and its hash travel together, verbatim; so do a speculative golden's M2R2 settings.
"""

from __future__ import annotations

import errno
import json
import numbers
import os
import re
import tempfile
from typing import Dict, Iterable, Optional, Sequence, Union

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from .golden import (
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    M2R2_FORMAT_VERSION,
    Golden,
    drafted_in,
    proposal_rounds,
    verify_rounds,
)
from .reader import _WEIGHTS_HASH, PathLike, config_hash as _config_hash, read

# what the file records as its writer (`m2r2_version`; the reference writes its crate version)
WRITER = "m2r2-golden-python"
_HASH = re.compile(r"[0-9a-f]{16}")
_U32_MAX = 2**32 - 1
# The M2R2 weights and drafting settings every speculative golden, chain or tree, copies from
# the one it is written like.
_M2R2_KEYS = (
    "m2r2_config",
    "m2r2_hash",
    "m2r2_weights_hash",
    "draft_gate",
    "gate",
    "draft_max",
    "draft_length",
)
# A chain's: those and its dynamic drafting's threshold.
_SPECULATIVE_KEYS = _M2R2_KEYS + ("draft_threshold",)


def _copied(label: str, ref: Golden, keys: Sequence[str]) -> Dict[str, str]:
    """The metadata ``keys`` that ``ref`` (``like``) has, to copy verbatim: each a string, and
    ``m2r2_weights_hash`` 16 hex digits, as the reference reads it. (The file written is read back
    before it is kept, which refuses what the reference refuses; this names ``like`` as where a
    value came from, and refuses what is no string before safetensors does.)"""
    where = f"`like` ({ref.path})" if ref.path else "`like`"
    copied = {}
    for key in keys:
        if key not in ref.metadata:
            continue
        value = ref.metadata[key]
        if not isinstance(value, str):
            raise ValueError(
                f"{label}: {where}: metadata `{key}` = {value!r} is not a string (golden "
                "metadata values are strings)"
            )
        if key == "m2r2_weights_hash" and not _WEIGHTS_HASH.fullmatch(value):
            raise ValueError(
                f"{label}: {where}: metadata `{key}` = {value!r} is not valid: the reference "
                "reads 16 hex digits there, and refuses a golden with anything else"
            )
        copied[key] = value
    return copied


def _save(tensors: Dict[str, np.ndarray], path: str, metadata: Dict[str, str]) -> Golden:
    """Write the golden to ``path`` through a temporary file beside it (named by ``tempfile``, so
    it never takes another file's name), read it back (:func:`read`: a file that does not
    validate raises ValueError and leaves ``path`` as it was), then move it to ``path``. Returns
    the golden read back.

    The file gets the mode a plain ``open(path, "w")`` gives: an existing file's, else 0666 less
    the umask (safetensors and ``tempfile`` create files 0600, which would leave goldens readable
    by their writer only). The mode is taken from a placeholder created at ``path`` (``O_EXCL``),
    removed again if the write fails."""
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "a folder, not a file to write the golden to", path)
    placeholder = False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        placeholder = True
        mode = os.fstat(fd).st_mode
        os.close(fd)
    except FileExistsError:
        mode = os.stat(path).st_mode
    temp = None
    try:
        folder, name = os.path.split(path)
        # a hidden name beside it, as short as names must be
        fd, temp = tempfile.mkstemp(prefix=f".{name[:64]}.", suffix=".partial", dir=folder or ".")
        os.close(fd)
        try:
            save_file(tensors, temp, metadata=metadata)
        except SafetensorError as e:
            raise OSError(errno.EIO, f"cannot write the golden: {e}", path) from None
        try:
            written = read(temp)
        except ValueError as e:
            raise ValueError(str(e).replace(temp, path)) from None
        os.replace(temp, path)
        temp = None
    except BaseException:
        for leftover in [temp] + ([path] if placeholder else []):
            if leftover is not None:
                try:
                    os.remove(leftover)
                except OSError:
                    pass
        raise
    os.chmod(path, mode & 0o7777)
    written.path = path
    return written


def write(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    like: Union[PathLike, Golden],
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """Write a greedy golden (format version 3) of the model that ``like`` (a golden file or a read
    :class:`Golden`, of any mode) records: its ``model``, ``config`` and ``config_hash`` are copied
    verbatim.

    The usual ``like`` is the reference golden being replayed: read its ``prompt_tokens``, run
    your engine greedily for up to ``like.max_steps`` steps (``len(like.tokens)`` for a file
    before version 3), stopping after the first of your end-of-turn tokens, and write the result
    like it.

    Args:
        prompt_tokens: ``[P]`` integer token ids.
        tokens: ``[n]`` integer token ids, the greedy tokens.
        logits: ``[n, V]`` floats (written as float32): row ``i`` holds the logits token ``i`` was
            chosen from (row 0: the last prompt position).
        stop_tokens: the end-of-turn ids the decode stops at (after the first one it emits,
            which ``tokens`` then ends with), reached or not; ``[]`` or ``None`` (the default):
            it decoded without stopping, the whole budget.
        max_steps: the token budget (default: ``n``); ``n < max_steps`` only when the decode
            stopped at a stop token.
        atol, rtol: tolerances to pin in the golden (finite, >= 0): `golden check` uses them
            unless its own ``--atol`` / ``--rtol`` say otherwise.
        expect_dtype: the export precision to pin (``f32`` or ``f16``): `golden check --onnx`
            refuses an export of other weights.

    Returns the written golden, read back. Raises ValueError on inputs that do not fit the format
    (naming the argument), OSError where ``path`` cannot be written.
    """
    ref = _like(os.fspath(path), like)
    return write_greedy(
        path,
        prompt_tokens=prompt_tokens,
        tokens=tokens,
        logits=logits,
        model=ref.model,
        config_json=ref.config_json,
        config_hash=ref.config_hash,
        stop_tokens=stop_tokens,
        max_steps=max_steps,
        atol=atol,
        rtol=rtol,
        expect_dtype=expect_dtype,
    )


def write_greedy(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    model: str,
    config_json: str,
    config_hash: str,
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """:func:`write` with the model metadata given explicitly.

    ``config_json`` and ``config_hash`` must be the reference's own (a golden's ``config`` and
    ``config_hash`` metadata, or ``m2r2 golden write``'s): ``golden compare`` refuses files whose
    hashes differ, and every reader a ``config`` that does not hash to its ``config_hash``
    (SHA-256 over the text, :func:`m2r2_golden.reader.config_hash`), so both are checked here.
    """
    label = os.fspath(path)
    config = _model_config(label, model, config_json, config_hash)
    prompt, toks, rows = _decode(label, prompt_tokens, tokens, logits, config)
    metadata = _metadata(model, config_json, config_hash, "greedy", FORMAT_VERSION)
    metadata.update(_stops_and_pins(label, toks, stop_tokens, max_steps, atol, rtol, expect_dtype))
    tensors = {"prompt_tokens": prompt, "tokens": toks, "logits": rows}
    return _save(tensors, label, metadata)


def write_speculative(
    path: PathLike,
    *,
    prompt_tokens,
    tokens,
    logits,
    round_drafted,
    round_accepted,
    round_base_token,
    round_scores,
    like: Union[PathLike, Golden],
    verify_logits=None,
    draft_logits=None,
    stop_tokens: Optional[Sequence[int]] = (),
    max_steps: Optional[int] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    expect_dtype: Optional[str] = None,
) -> Golden:
    """Write a greedy self-speculative golden of the model and M2R2 settings that ``like`` (a
    speculative golden file or :class:`Golden`) records: ``model``, ``config``, ``config_hash``,
    ``m2r2_config``, ``m2r2_hash`` and the drafting settings (``draft_gate``, ``gate``,
    ``draft_max`` = M, ``draft_length``, ``draft_threshold``) are copied verbatim, so that
    ``m2r2 golden compare`` compares the two round by round (and ``m2r2_weights_hash`` where it
    has one, which must be 16 hex digits, as the reference reads it).

    Args (besides :func:`write`'s ``prompt_tokens``, ``tokens``, ``logits`` and the stop and pin
    arguments; ``logits`` row ``i`` is the verifier's row token ``i`` was emitted from):
        round_drafted: ``[R, M]`` ints, round ``r``'s drafted tokens then -1 padding.
        round_accepted: ``[R]`` ints, the drafts each round accepted (``0..=d_r``).
        round_base_token: ``[R]`` ints, the verifier's token after them (correction or bonus).
        round_scores: ``[R, M + 1]`` floats, the draft gate's score at each proposal of a dynamic
            draft, NaN elsewhere.
        verify_logits: ``[T, V]`` floats: the prompt's last row, then round by round the
            verifier's row of the round's first token and of each drafted one, accepted or not
            (``T = 1 + sum_r (d_r + 1)``, :func:`m2r2_golden.verify_rounds`).
        draft_logits: ``[Q, V]`` floats: the draft's logits at each proposal, round by round
            (``Q = sum_r max(d_r, scored_r)``, :func:`m2r2_golden.proposal_rounds`).

    The tokens must be the ones the rounds emit: ``tokens[0]`` from the prompt, then per round
    its accepted drafts and its base token, cut where the decode stopped.

    With both ``verify_logits`` and ``draft_logits`` the file is format version 3. A harness that
    records only the rounds passes neither: the file is then written as format version 2 (rounds,
    no graph tensors, no version-3 metadata), which `golden compare` reads and reports the graphs'
    lines of as skipped, rather than holding made-up tensors; version 2 cannot record a stop, a
    budget or pins, so ``stop_tokens``, a ``max_steps`` other than ``n`` and the pins are refused
    there. Passing only one of the two is refused.

    ``like`` must be a chain's golden: one of a token tree (``draft_length`` = ``tree``) is
    written with :func:`m2r2_golden.write_tree`. ``rtol`` is refused: `golden check` takes an M2R2
    golden's tolerance as atol alone, and readers refuse one that pins an rtol.

    Returns the written golden, read back before it takes ``path``. Raises ValueError on inputs
    that do not fit the format (naming the argument), OSError where ``path`` cannot be written.
    """
    label = os.fspath(path)
    _no_rtol(label, rtol)
    ref = _like(label, like)
    where = ref.path or "like"
    if ref.mode != "speculative":
        raise ValueError(
            f"{label}: `like` ({where}) records mode `{ref.mode}`: a speculative golden copies "
            "the M2R2 settings of a speculative one"
        )
    if ref.draft_tree is not None:
        raise ValueError(
            f"{label}: `like` ({where}) is a token-tree golden (draft_tree "
            f"{ref.metadata['draft_tree']}): write a tree decode with m2r2_golden.write_tree"
        )
    settings = _copied(label, ref, _SPECULATIVE_KEYS)
    config = _model_config(label, ref.model, ref.config_json, ref.config_hash)
    prompt, toks, rows = _decode(label, prompt_tokens, tokens, logits, config)
    v = rows.shape[1]
    rounds = _rounds(
        label,
        toks,
        int(ref.metadata["draft_max"]),
        v,
        round_drafted,
        round_accepted,
        round_base_token,
        round_scores,
    )
    tensors: Dict[str, np.ndarray] = {"prompt_tokens": prompt, "tokens": toks, "logits": rows}
    tensors.update(rounds)
    graphs = {"verify_logits": verify_logits, "draft_logits": draft_logits}
    given = [name for name, x in graphs.items() if x is not None]
    if len(given) == 1:
        missing = ({"verify_logits", "draft_logits"} - set(given)).pop()
        raise ValueError(
            f"{label}: `{given[0]}` without `{missing}`: a version-3 speculative golden holds "
            "both (pass neither for a version-2 file of the rounds alone)"
        )
    if given:
        drafted, scores = rounds["round_drafted"], rounds["round_scores"]
        counts = {
            "verify_logits": (
                len(verify_rounds(drafted)),
                "1 for the prompt's last position, then per round its first token and each "
                "drafted one",
            ),
            "draft_logits": (len(proposal_rounds(drafted, scores)), "one per proposal"),
        }
        for name, (count, why) in counts.items():
            tensors[name] = _float_rows(label, name, graphs[name], count, v, why)
        version = FORMAT_VERSION
        extra = _stops_and_pins(label, toks, stop_tokens, max_steps, atol, rtol, expect_dtype)
    else:
        version = M2R2_FORMAT_VERSION
        lost = [
            what
            for what, set_ in (
                ("stop_tokens", stop_tokens is not None and len(stop_tokens) > 0),
                ("max_steps", max_steps is not None and max_steps != len(toks)),
                ("atol", atol is not None),
                ("expect_dtype", expect_dtype is not None),
            )
            if set_
        ]
        if lost:
            raise ValueError(
                f"{label}: without `verify_logits` and `draft_logits` this is a format version 2 "
                f"file, which cannot record {', '.join(f'`{w}`' for w in lost)} (version 3): "
                "pass the graphs' logits, or leave those out"
            )
        extra = {}
    metadata = _metadata(ref.model, ref.config_json, ref.config_hash, "speculative", version)
    metadata.update(settings)
    metadata.update(extra)
    return _save(tensors, label, metadata)


def _no_rtol(label: str, rtol) -> None:
    """An M2R2 golden pins no rtol: `golden check` takes its tolerance as atol alone, and every
    reader refuses a speculative golden that pins one."""
    if rtol is not None:
        raise ValueError(
            f"{label}: `rtol` is for greedy goldens: a speculative golden is checked with atol "
            "alone (pin `atol`)"
        )


def _like(label: str, like) -> Golden:
    """The golden ``like`` names: a read :class:`Golden`, or the path of one to read."""
    if isinstance(like, Golden):
        return like
    if not isinstance(like, (str, os.PathLike)):
        raise ValueError(
            f"{label}: `like` must be a golden file's path or an m2r2_golden.Golden, got "
            f"{type(like).__name__}"
        )
    return read(like)


def _writer_version() -> str:
    from . import __version__

    return f"{WRITER} {__version__}"


def _metadata(
    model: str, config_json: str, config_hash: str, mode: str, version: int
) -> Dict[str, str]:
    return {
        "format": FORMAT,
        "format_version": str(version),
        "model": model,
        "config_hash": config_hash,
        "config": config_json,
        "mode": mode,
        "m2r2_version": _writer_version(),
    }


def _model_config(label: str, model: str, config_json: str, config_hash: str) -> dict:
    """The model metadata checked for its form; returns ``config_json`` parsed."""
    if not isinstance(model, str) or not model:
        raise ValueError(f"{label}: `model` must be a non-empty string")
    if not isinstance(config_hash, str) or not _HASH.fullmatch(config_hash):
        raise ValueError(
            f"{label}: `config_hash` must be 16 lowercase hex digits as the reference writes it "
            f"(copy it from the reference's golden), got {config_hash!r}"
        )
    if not isinstance(config_json, str):
        raise ValueError(f"{label}: `config_json` must be the reference's config JSON text (a str)")
    try:
        config = json.loads(config_json)
    except json.JSONDecodeError as e:
        raise ValueError(f"{label}: `config_json` is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{label}: `config_json` is not a JSON object")
    if _config_hash(config_json) != config_hash:
        raise ValueError(
            f"{label}: `config_hash` = {config_hash!r} is not the hash of `config_json` (it "
            f"hashes to {_config_hash(config_json)!r}): pass the reference's config text and its "
            "hash together, as its golden records them"
        )
    return config


def _decode(label: str, prompt_tokens, tokens, logits, config: dict):
    """prompt_tokens [P], tokens [n] (int64) and logits [n, V] (float32), V the config's."""
    prompt = _ids(label, "prompt_tokens", prompt_tokens)
    toks = _ids(label, "tokens", tokens)
    rows = _logits(label, logits, len(toks))  # [n, V]
    v = rows.shape[1]
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and v != vocab:
        raise ValueError(
            f"{label}: `logits` has {v} columns but the config's vocab_size is {vocab} "
            "(an engine that pads its vocabulary must cut the rows to vocab_size)"
        )
    for name, ids in (("prompt_tokens", prompt), ("tokens", toks)):
        if ids.size and int(ids.max()) >= v:
            raise ValueError(f"{label}: `{name}` holds token id {int(ids.max())} >= V = {v}")
    return prompt, toks, rows


def _stops_and_pins(
    label: str,
    tokens: np.ndarray,
    stop_tokens,
    max_steps,
    atol,
    rtol,
    expect_dtype,
) -> Dict[str, str]:
    """The version-3 metadata: ``stop_tokens``, ``max_steps`` and the pins given, checked against
    the tokens: a decode stops after the first stop token it emits, else runs its budget."""
    if stop_tokens is None:
        stop_tokens = []
    elif isinstance(stop_tokens, Iterable) and not isinstance(stop_tokens, (str, np.ndarray)):
        stop_tokens = list(stop_tokens)  # a set, a generator: an int is refused as not 1-D
    stops = _ids(label, "stop_tokens", stop_tokens)
    n = len(tokens)
    if max_steps is None:
        max_steps = n
    if not isinstance(max_steps, numbers.Integral) or isinstance(max_steps, bool):
        raise ValueError(f"{label}: `max_steps` must be an integer, got {max_steps!r}")
    max_steps = int(max_steps)
    if max_steps < n:
        raise ValueError(f"{label}: `max_steps` = {max_steps} is less than the {n} tokens")
    early = np.flatnonzero(np.isin(tokens[:-1], stops))
    if early.size:
        i = int(early[0])
        raise ValueError(
            f"{label}: `tokens` holds stop token {int(tokens[i])} at step {i} of {n}: a decode "
            "stops after the first stop token it emits"
        )
    if n < max_steps and not (n and np.isin(tokens[-1], stops)):
        end = f"ends at {int(tokens[-1])}" if n else "is empty"
        raise ValueError(
            f"{label}: `tokens` has {n} of max_steps = {max_steps} steps and {end}, not a stop "
            f"token (stop_tokens = {stops.tolist()}): a decode runs its whole budget unless it "
            "stops at one"
        )
    metadata = {
        # as the reference writes it (Rust's `{:?}` of the ids): [256, 258]
        "stop_tokens": "[" + ", ".join(str(int(t)) for t in stops) + "]",
        "max_steps": str(max_steps),
    }
    for key, value in (("atol", atol), ("rtol", rtol)):
        if value is not None:
            metadata[key] = _tolerance(label, key, value)
    if expect_dtype is not None:
        if expect_dtype not in DTYPES:
            raise ValueError(
                f"{label}: `expect_dtype` = {expect_dtype!r} is not valid ({', '.join(DTYPES)})"
            )
        metadata["expect_dtype"] = expect_dtype
    return metadata


def _tolerance(label: str, key: str, value) -> str:
    """A pinned tolerance as the reference writes it: the shortest text of the f32 value."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        with np.errstate(over="ignore"):
            x = np.float32(value)
        ok = bool(np.isfinite(x)) and x >= 0
    if not ok:
        raise ValueError(f"{label}: `{key}` must be a finite number >= 0 (an f32), got {value!r}")
    return np.format_float_positional(x, unique=True, trim="-")


def _rounds(
    label: str,
    tokens: np.ndarray,
    m: int,
    v: int,
    round_drafted,
    round_accepted,
    round_base_token,
    round_scores,
) -> Dict[str, np.ndarray]:
    """The round tensors, checked for shape (``R`` rounds, ``M = m``), padding and ids ``< v``,
    and against the tokens they emit."""
    accepted = _ints(label, "round_accepted", round_accepted, 1)  # [R]
    r = accepted.shape[0]
    base = _ids(label, "round_base_token", round_base_token)  # [R]
    drafted = _ints(label, "round_drafted", round_drafted, 2)  # [R, M]
    scores = _array(label, "round_scores", round_scores)
    if not (scores.ndim == 2 and np.issubdtype(scores.dtype, np.floating)):
        raise ValueError(
            f"{label}: `round_scores` must be 2-D floats [R, M + 1], got {scores.dtype} "
            f"of shape {list(scores.shape)}"
        )
    scores = np.ascontiguousarray(scores, dtype=np.float32)  # [R, M + 1]
    for name, array, shape in (
        ("round_base_token", base, (r,)),
        ("round_drafted", drafted, (r, m)),
        ("round_scores", scores, (r, m + 1)),
    ):
        if array.shape != shape:
            raise ValueError(
                f"{label}: `{name}` has shape {list(array.shape)}, expected {list(shape)} "
                f"(R = {r} rounds, M = draft_max = {m})"
            )
    for i in range(r):
        row = drafted[i]
        d = len(drafted_in(drafted, i))
        if (row[:d] < 0).any() or (row[d:] != -1).any():
            raise ValueError(
                f"{label}: `round_drafted` row {i} is {row.tolist()}: drafted token ids, then -1 "
                "padding"
            )
        if not 0 <= accepted[i] <= d:
            raise ValueError(
                f"{label}: `round_accepted` of round {i} is {int(accepted[i])}, the round "
                f"drafted {d} tokens"
            )
    for name, ids in (("round_drafted", drafted), ("round_base_token", base)):
        if ids.size and int(ids.max()) >= v:
            raise ValueError(f"{label}: `{name}` holds token id {int(ids.max())} >= V = {v}")
    # tokens[0] from the prompt, then per round its accepted drafts and base token, cut at n
    pos = 1
    for i in range(r):
        _round_has_room(label, i, r, pos, len(tokens))
        emitted = [*drafted_in(drafted, i)[: accepted[i]].tolist(), int(base[i])]
        pos = _round_emits(label, tokens, i, pos, emitted)
    _all_emitted(label, pos, len(tokens))
    return {
        "round_drafted": drafted,
        "round_accepted": accepted,
        "round_base_token": base,
        "round_scores": scores,
    }


def _round_has_room(label: str, k: int, r: int, pos: int, n: int) -> None:
    """Round ``k`` of ``r`` starts at step ``pos`` of the ``n`` tokens: it must emit one."""
    if pos >= n:
        raise ValueError(
            f"{label}: round {k} of {r} emits no token: the rounds before it emit all {n}"
        )


def _round_emits(label: str, tokens, k: int, pos: int, emitted: list, what: str = "") -> int:
    """Round ``k``'s ``emitted`` tokens, cut where the decode stopped, must be ``tokens`` from step
    ``pos`` (``what`` says what they are); the step after them."""
    emitted = emitted[: len(tokens) - pos]
    if tokens[pos : pos + len(emitted)].tolist() != emitted:
        raise ValueError(
            f"{label}: round {k} emits {emitted} at steps {pos}..{what}, `tokens` holds "
            f"{tokens[pos:pos + len(emitted)].tolist()} there"
        )
    return pos + len(emitted)


def _all_emitted(label: str, pos: int, n: int) -> None:
    """The rounds emitted ``pos`` of the ``n`` tokens (the first from the prompt): all of them."""
    if pos < n:
        raise ValueError(
            f"{label}: the rounds emit {pos} tokens (the first from the prompt), `tokens` holds {n}"
        )


def _array(label: str, name: str, values) -> np.ndarray:
    """``np.asarray(values)``, with rows of different lengths (and other values numpy cannot make
    an array of) a ValueError naming the argument."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):
        array = None
    if array is None or array.dtype == object:
        raise ValueError(
            f"{label}: `{name}` is not an array of numbers (rows of different lengths?)"
        )
    return array


def _ints(label: str, name: str, values, ndim: int) -> np.ndarray:
    """``values`` as a C-contiguous int64 array of ``ndim`` dimensions."""
    array = _array(label, name, values)
    if array.ndim != ndim:
        raise ValueError(f"{label}: `{name}` must be {ndim}-D, got shape {list(array.shape)}")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{label}: `{name}` must hold integers, got dtype {array.dtype}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _ids(label: str, name: str, values) -> np.ndarray:
    """``values`` as a C-contiguous int64 ``[n]`` array of token ids in ``0..=u32::MAX``."""
    array = _array(label, name, values)
    if array.ndim != 1:
        raise ValueError(f"{label}: `{name}` must be 1-D token ids, got shape {list(array.shape)}")
    if array.size == 0:
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{label}: `{name}` must hold integers, got dtype {array.dtype}")
    if array.size and (int(array.min()) < 0 or int(array.max()) > _U32_MAX):
        bad = int(array.min()) if int(array.min()) < 0 else int(array.max())
        raise ValueError(f"{label}: `{name}` holds token id {bad} (ids are 0..=2^32-1)")
    return np.ascontiguousarray(array, dtype=np.int64)


def _logits(label: str, values, n: int) -> np.ndarray:
    """``values`` as a C-contiguous float32 ``[n, V]`` array."""
    array = _array(label, "logits", values)
    if array.ndim != 2:
        raise ValueError(
            f"{label}: `logits` must be 2-D [n, V] (one row per token), got shape "
            f"{list(array.shape)}"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{label}: `logits` must hold floats, got dtype {array.dtype}")
    if array.shape[0] != n:
        raise ValueError(
            f"{label}: `logits` has {array.shape[0]} rows but there are {n} tokens "
            "(row i: the logits token i was chosen from)"
        )
    if array.shape[1] == 0:
        raise ValueError(f"{label}: `logits` has no columns (V = 0)")
    return np.ascontiguousarray(array, dtype=np.float32)


def _float_rows(label: str, name: str, values, rows: int, v: int, why: str) -> np.ndarray:
    """``values`` as a C-contiguous float32 ``[rows, v]`` array (a graph's logits)."""
    array = _array(label, name, values)
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"{label}: `{name}` must be 2-D floats [{rows}, {v}], got {array.dtype} of shape "
            f"{list(array.shape)}"
        )
    if array.shape != (rows, v):
        raise ValueError(
            f"{label}: `{name}` has shape {list(array.shape)}, the rounds give [{rows}, {v}] "
            f"({why})"
        )
    return np.ascontiguousarray(array, dtype=np.float32)
