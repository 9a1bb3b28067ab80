"""Tests of m2r2_golden (stdlib unittest), run by tests/cli/golden_python.rs.

Goldens written by the reference come in by environment variable (the Rust test writes them with
`m2r2 golden write`, format version 3, stopping at end of turn): M2R2_GOLDEN_GREEDY (tiny, prompt
1,2,3, 6 steps, greedy), M2R2_GOLDEN_SPECULATIVE (the same prompt and steps, `--mode speculative
--draft-len 2`) and M2R2_GOLDEN_EARLY_EXIT (the same, `--mode early-exit`); M2R2_GOLDEN_TREE (the
same prompt and steps, `--draft-tree 2,1,1`: format version 4) and M2R2_GOLDEN_GROWN_TREE (prompt
1,2,3,4,1,2,3, 20 steps, `--draft-tree 2,1,1 --dynamic-draft --prompt-lookup 3`: version 5).
Files of versions 1 and 2 are made from them by dropping what those versions lack. A missing
variable fails the tests that need it; nothing is skipped.
"""

import hashlib
import json
import os
import tempfile
import unittest
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

import m2r2_golden


def reference_golden(var: str) -> str:
    path = os.environ.get(var)
    if not path:
        raise AssertionError(
            f"{var} is not set: run these tests through `cargo test -p m2r2 --test cli -- "
            "golden_python`, or set it to a golden written by `m2r2 golden write`"
        )
    return path


GREEDY_TENSORS = ("prompt_tokens", "tokens", "logits")
ROUNDS = m2r2_golden.golden.M2R2_TENSORS["speculative"]
GRAPHS = m2r2_golden.golden.GRAPH_TENSORS["speculative"]
V3_METADATA = ("stop_tokens", "max_steps", "atol", "rtol", "expect_dtype")


def arrays(g: m2r2_golden.Golden, names) -> dict:
    return {name: getattr(g, name) for name in names}


def rehashed(config: str) -> dict:
    """Metadata `config` with the `config_hash` it hashes to (SHA-256 over the text, the first 16
    hex digits): an edit of the config that readers take, to test what they check in it."""
    return {"config": config, "config_hash": hashlib.sha256(config.encode()).hexdigest()[:16]}


class ReadReferenceGoldens(unittest.TestCase):
    def test_greedy(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        self.assertEqual((g.format_version, g.mode, g.model), (3, "greedy", "tiny"))
        self.assertEqual(g.prompt_tokens.dtype, np.int64)
        self.assertEqual(g.prompt_tokens.tolist(), [1, 2, 3])
        self.assertEqual(g.tokens.dtype, np.int64)
        self.assertEqual(g.logits.dtype, np.float32)
        self.assertEqual(g.logits.shape, (6, g.config["vocab_size"]))
        self.assertEqual(g.vocab_size, g.config["vocab_size"])
        self.assertRegex(g.config_hash, r"^[0-9a-f]{16}$")
        # greedy: each token is the argmax of the row it was chosen from
        self.assertEqual(g.logits.argmax(axis=1).tolist(), g.tokens.tolist())
        self.assertIsNone(g.m2r2_config)
        self.assertEqual(g.m2r2_tensors(), {})
        # written stopping at the model's end-of-turn tokens (tiny has some), none reached in 6
        self.assertEqual(g.max_steps, 6)
        self.assertTrue(g.stop_tokens)
        self.assertTrue(all(type(t) is int and 0 <= t < g.vocab_size for t in g.stop_tokens))
        self.assertFalse(set(g.tokens.tolist()) & set(g.stop_tokens))
        self.assertEqual((g.atol, g.rtol, g.expect_dtype), (None, None, None))

    def test_speculative(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.assertEqual((g.format_version, g.mode), (3, "speculative"))
        self.assertEqual(g.metadata["draft_max"], "2")
        self.assertRegex(g.m2r2_hash, r"^[0-9a-f]{16}$")
        self.assertRegex(g.m2r2_weights_hash, r"^[0-9a-f]{16}$")
        self.assertIn("gates", g.m2r2_config)
        r = g.round_accepted.shape[0]
        self.assertGreater(r, 0)
        self.assertEqual(g.round_drafted.shape, (r, 2))
        self.assertEqual(g.round_base_token.shape, (r,))
        self.assertEqual(g.round_scores.shape, (r, 3))
        self.assertEqual(g.round_scores.dtype, np.float32)
        self.assertEqual(sorted(g.m2r2_tensors()), sorted(ROUNDS + GRAPHS))
        # every round emits its accepted drafts and one base token; the last may be cut at n
        self.assertGreaterEqual(int((g.round_accepted + 1).sum()), len(g.tokens))
        # lossless: self-speculative decoding emits the greedy tokens
        greedy = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        self.assertEqual(g.tokens.tolist(), greedy.tokens.tolist())
        self.assertEqual(g.config_hash, greedy.config_hash)
        self.assertEqual((g.stop_tokens, g.max_steps), (greedy.stop_tokens, 6))

    def test_speculative_graph_tensors(self):
        """verify_logits [T, V] and draft_logits [Q, V], row by row as the module docs say."""
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        v = g.vocab_size
        rows = m2r2_golden.verify_rounds(g.round_drafted)
        proposals = m2r2_golden.proposal_rounds(g.round_drafted, g.round_scores)
        drafts = [(g.round_drafted[r] >= 0).sum() for r in range(len(g.round_accepted))]
        self.assertEqual(len(rows), 1 + sum(d + 1 for d in drafts))
        self.assertEqual(g.verify_logits.shape, (len(rows), v))
        self.assertEqual(g.draft_logits.shape, (len(proposals), v))
        self.assertEqual(g.verify_logits.dtype, np.float32)
        # row 0: the prompt's last position, which token 0 was chosen from
        np.testing.assert_array_equal(g.verify_logits[0], g.logits[0])
        step = 1
        for r, accepted in enumerate(g.round_accepted.tolist()):
            first = rows.index(r)  # the round's first verified row
            emitted = min(accepted + 1, len(g.tokens) - step)
            # the tokens the round emitted were chosen from its first verified rows
            np.testing.assert_array_equal(
                g.logits[step : step + emitted], g.verify_logits[first : first + emitted]
            )
            # greedy: the base token is the verifier's argmax after the accepted drafts
            self.assertEqual(
                int(g.verify_logits[first + accepted].argmax()), int(g.round_base_token[r])
            )
            # greedy drafts: each drafted token is the argmax of the draft's logits
            mine = [k for k, q in enumerate(proposals) if q == r][: drafts[r]]
            self.assertEqual(
                g.draft_logits[mine].argmax(axis=1).tolist(),
                g.round_drafted[r, : drafts[r]].tolist(),
            )
            step += emitted
        self.assertEqual(step, len(g.tokens))

    def test_early_exit(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_EARLY_EXIT"))
        self.assertEqual((g.format_version, g.mode), (3, "early-exit"))
        n, j = len(g.tokens), len(g.m2r2_config["gates"])
        self.assertEqual(g.exit_gate.shape, (n,))
        self.assertEqual(g.gate_scores.shape, (n, j))
        self.assertTrue(((g.exit_gate >= 0) & (g.exit_gate <= j)).all())
        self.assertIn(g.metadata["kv_policy"], ("exact", "fast-kv"))
        self.assertIsNone(g.round_drafted)
        self.assertIsNone(g.verify_logits)
        self.assertEqual(g.max_steps, 6)


class TempDir(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name: str) -> str:
        return str(Path(self.dir.name) / name)

    def saved(self, name: str, tensors: dict, metadata: dict) -> str:
        """``tensors`` and ``metadata`` written as ``name`` in the temporary folder, the entries
        that are None left out (how the tests remove one)."""
        out = self.path(name)
        save_file(
            {k: v for k, v in tensors.items() if v is not None},
            out,
            metadata={k: v for k, v in metadata.items() if v is not None},
        )
        return out

    def assertRefused(self, path: str, *needles: str):
        """Reading ``path`` raises a ValueError naming the file and every needle."""
        with self.assertRaises(ValueError) as e:
            m2r2_golden.read(path)
        for needle in (path, *needles):
            self.assertIn(needle, str(e.exception))


class Write(TempDir):
    def test_round_trip_like_a_reference_golden(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        out = self.path("mine.golden.safetensors")
        logits = ref.logits.astype(np.float64) + 0.25  # converted to float32 on writing
        written = m2r2_golden.write(
            out,
            prompt_tokens=ref.prompt_tokens.tolist(),
            tokens=list(ref.tokens),
            logits=logits,
            like=reference_golden("M2R2_GOLDEN_GREEDY"),
        )
        back = m2r2_golden.read(out)
        for g in (written, back):
            self.assertEqual((g.format_version, g.mode, g.model), (3, "greedy", ref.model))
            # copied verbatim, never re-serialised
            self.assertEqual(g.config_json, ref.config_json)
            self.assertEqual(g.config_hash, ref.config_hash)
            self.assertTrue(g.metadata["m2r2_version"].startswith("m2r2-golden-python "))
            np.testing.assert_array_equal(g.prompt_tokens, ref.prompt_tokens)
            np.testing.assert_array_equal(g.tokens, ref.tokens)
            np.testing.assert_array_equal(g.logits, logits.astype(np.float32))
            self.assertEqual(g.logits.dtype, np.float32)
            self.assertTrue(g.logits.flags.c_contiguous)
            # defaults: no stop tokens, the budget is the tokens written, nothing pinned
            self.assertEqual((g.stop_tokens, g.max_steps), ([], 6))
            self.assertEqual(g.metadata["stop_tokens"], "[]")
            self.assertEqual((g.atol, g.rtol, g.expect_dtype), (None, None, None))
            self.assertFalse({"atol", "rtol", "expect_dtype"} & set(g.metadata))
        self.assertEqual(back.metadata, written.metadata)

    def test_stops_and_pins_round_trip(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        v = ref.vocab_size
        # three steps of a budget of 6, the last an end-of-turn token the first two are not
        stop = next(t for t in range(v - 1, 0, -1) if t not in ref.tokens[:2])
        tokens = [*ref.tokens[:2].tolist(), stop]
        out = self.path("stopped.golden.safetensors")
        written = m2r2_golden.write(
            out,
            prompt_tokens=ref.prompt_tokens,
            tokens=np.array(tokens, dtype=np.uint32),
            logits=ref.logits[:3],
            like=ref,
            stop_tokens=np.array([stop, 0]),
            max_steps=6,
            atol=np.float32(2e-4),
            rtol=0,
            expect_dtype="f16",
        )
        back = m2r2_golden.read(out)
        for g in (written, back):
            self.assertEqual(g.format_version, 3)
            self.assertEqual(g.tokens.tolist(), tokens)
            self.assertEqual((g.stop_tokens, g.max_steps), ([stop, 0], 6))
            self.assertEqual((g.atol, g.rtol, g.expect_dtype), (2e-4, 0.0, "f16"))
            # as the reference writes them: Rust's `{:?}` of the ids, f32 shortest text
            self.assertEqual(g.metadata["stop_tokens"], f"[{stop}, 0]")
            self.assertEqual((g.metadata["atol"], g.metadata["rtol"]), ("0.0002", "0"))
        self.assertEqual(back.metadata, written.metadata)

    def test_like_a_speculative_golden_writes_greedy(self):
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        out = self.path("mine.golden.safetensors")
        m2r2_golden.write(
            out, prompt_tokens=spec.prompt_tokens, tokens=spec.tokens, logits=spec.logits, like=spec
        )
        back = m2r2_golden.read(out)
        self.assertEqual((back.format_version, back.mode), (3, "greedy"))
        self.assertNotIn("m2r2_hash", back.metadata)
        self.assertIsNone(back.round_drafted)
        self.assertIsNone(back.verify_logits)

    def test_write_greedy_with_explicit_metadata(self):
        config = '{"vocab_size":4,"rms_norm_eps":0.00001}'
        out = self.path("explicit.safetensors")
        m2r2_golden.write_greedy(
            out,
            prompt_tokens=np.array([0, 1], dtype=np.int32),
            tokens=[3],
            logits=[[0.0, 1.0, 2.0, 3.0]],
            model="mine",
            config_json=config,
            config_hash=rehashed(config)["config_hash"],
            stop_tokens=[3],
            max_steps=10,
        )
        back = m2r2_golden.read(out)
        self.assertEqual(back.config_json, config)
        self.assertEqual(back.config, {"vocab_size": 4, "rms_norm_eps": 1e-5})
        self.assertEqual(back.prompt_tokens.dtype, np.int64)
        self.assertEqual(back.logits.shape, (1, 4))
        self.assertEqual((back.stop_tokens, back.max_steps), ([3], 10))

    @unittest.skipIf(os.name != "posix", "file modes are POSIX")
    def test_written_files_get_the_mode_of_a_plain_open(self):
        # safetensors 0.8 alone leaves 0600 (its temporary file's mode)
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        good = dict(prompt_tokens=ref.prompt_tokens, tokens=ref.tokens, logits=ref.logits)
        plain = self.path("plain")
        open(plain, "w").close()
        out = self.path("mode.safetensors")
        m2r2_golden.write(out, like=ref, **good)
        mode = lambda p: os.stat(p).st_mode & 0o777  # noqa: E731
        self.assertEqual(mode(out), mode(plain))
        os.chmod(out, 0o640)
        m2r2_golden.write(out, like=ref, **good)
        self.assertEqual(mode(out), 0o640)

    def test_refuses_inputs_that_do_not_fit(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        out = self.path("bad.safetensors")
        good = dict(prompt_tokens=ref.prompt_tokens, tokens=ref.tokens, logits=ref.logits)
        first = int(ref.tokens[0])
        cases = [
            (dict(tokens=ref.tokens[None]), "`tokens` must be 1-D"),
            (dict(tokens=ref.tokens.astype(np.float32)), "`tokens` must hold integers"),
            (dict(prompt_tokens=[1, -2]), "`prompt_tokens` holds token id -2"),
            (dict(logits=ref.logits[:-1]), "`logits` has 5 rows but there are 6 tokens"),
            (dict(logits=ref.logits[0]), "`logits` must be 2-D"),
            (dict(logits=ref.logits.astype(np.int64)), "`logits` must hold floats"),
            (dict(logits=np.pad(ref.logits, ((0, 0), (0, 64)))), "vocab_size"),
            # stops and budget
            (dict(stop_tokens=[-1]), "`stop_tokens` holds token id -1"),
            (dict(stop_tokens=[1.5]), "`stop_tokens` must hold integers"),
            (dict(stop_tokens=[[1]]), "`stop_tokens` must be 1-D"),
            (dict(stop_tokens=[first]), f"holds stop token {first} at step 0 of 6"),
            (dict(max_steps=5), "`max_steps` = 5 is less than the 6 tokens"),
            (dict(max_steps="6"), "`max_steps` must be an integer"),
            (dict(max_steps=True), "`max_steps` must be an integer"),
            (dict(max_steps=8), "6 of max_steps = 8 steps"),
            (dict(max_steps=8, stop_tokens=[0]), "not a stop token (stop_tokens = [0])"),
            # pins
            (dict(atol=-1e-4), "`atol` must be a finite number >= 0"),
            (dict(atol=float("inf")), "`atol` must be a finite number >= 0"),
            (dict(atol=1e39), "`atol` must be a finite number >= 0 (an f32)"),
            (dict(atol="1e-4"), "`atol` must be a finite number >= 0"),
            (dict(atol=True), "`atol` must be a finite number >= 0"),
            (dict(rtol=float("nan")), "`rtol` must be a finite number >= 0"),
            (dict(expect_dtype="bf16"), "`expect_dtype` = 'bf16' is not valid (f32, f16)"),
            # what the reference never writes and `golden check` refuses
            (dict(prompt_tokens=[]), "`prompt_tokens` is empty"),
            (
                dict(tokens=ref.tokens[:0], logits=ref.logits[:0], max_steps=0),
                "`tokens` and `logits` record no step: there is nothing to check",
            ),
        ]
        for change, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write(out, like=ref, **{**good, **change})
                self.assertIn(needle, str(e.exception))
                self.assertIn(out, str(e.exception))
        with self.assertRaisesRegex(ValueError, "config_hash"):
            m2r2_golden.write_greedy(
                out, model="m", config_json="{}", config_hash="E5E9", **good
            )
        with self.assertRaisesRegex(ValueError, "config_json"):
            m2r2_golden.write_greedy(
                out, model="m", config_json="{not json", config_hash=ref.config_hash, **good
            )
        self.assertFalse(Path(out).exists())

    def test_errors_name_the_argument_or_path(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        out = self.path("bad.safetensors")
        good = dict(prompt_tokens=ref.prompt_tokens, tokens=ref.tokens, logits=ref.logits, like=ref)
        ragged = [list(row) for row in ref.logits]
        ragged[1] = ragged[1][:-1]
        for change, needle in [
            (dict(like={}), "`like` must be a golden file's path or an m2r2_golden.Golden"),
            (dict(like=None), "`like` must be"),
            (dict(stop_tokens=256), "`stop_tokens` must be 1-D"),
            (dict(stop_tokens="256"), "`stop_tokens` must be 1-D"),
            (dict(prompt_tokens=[1, [2, 3]]), "`prompt_tokens` is not an array of numbers"),
            (dict(logits=ragged), "`logits` is not an array of numbers"),
            (dict(tokens=None), "`tokens`"),
        ]:
            with self.subTest(needle=needle):
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write(out, **{**good, **change})
                self.assertIn(needle, str(e.exception))
                self.assertIn(out, str(e.exception))
        # a set or a generator of ids is fine
        g = m2r2_golden.write(out, **good, stop_tokens=(t for t in (258, 256)))
        self.assertEqual(g.stop_tokens, [258, 256])
        # paths that cannot be written: an OSError naming them, nothing left behind
        folder = Path(self.dir.name) / "adir.gs"
        folder.mkdir()
        before = sorted(os.listdir(self.dir.name))
        for path in (str(folder), str(folder / "missing" / "x.safetensors")):
            with self.subTest(path=path):
                with self.assertRaises(OSError) as e:
                    m2r2_golden.write(path, **good)
                self.assertIn(path, str(e.exception))
        self.assertEqual(sorted(os.listdir(self.dir.name)), before)
        self.assertEqual(os.listdir(folder), [])


class WriteSpeculative(TempDir):
    def setUp(self):
        super().setUp()
        self.spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.rounds = arrays(self.spec, GREEDY_TENSORS + ROUNDS)
        self.graphs = arrays(self.spec, GRAPHS)

    def test_round_trip_of_a_reference_golden(self):
        spec = self.spec
        out = self.path("spec.golden.safetensors")
        written = m2r2_golden.write_speculative(
            out,
            like=reference_golden("M2R2_GOLDEN_SPECULATIVE"),
            stop_tokens=spec.stop_tokens,
            max_steps=spec.max_steps,
            **self.rounds,
            **{k: v.astype(np.float64) for k, v in self.graphs.items()},
        )
        back = m2r2_golden.read(out)
        for g in (written, back):
            self.assertEqual((g.format_version, g.mode), (3, "speculative"))
            # every metadata string as the reference wrote it, but the writer's
            mine = {k: v for k, v in g.metadata.items() if k != "m2r2_version"}
            self.assertEqual(mine, {k: v for k, v in spec.metadata.items() if k != "m2r2_version"})
            for name in GREEDY_TENSORS + ROUNDS + GRAPHS:
                want, got = getattr(spec, name), getattr(g, name)
                self.assertEqual(got.dtype, want.dtype, name)
                np.testing.assert_array_equal(got, want, err_msg=name)  # NaN equals NaN here
        self.assertEqual(back.metadata, written.metadata)

    def test_without_the_graphs_logits_writes_version_2(self):
        out = self.path("rounds-only.golden.safetensors")
        written = m2r2_golden.write_speculative(out, like=self.spec, **self.rounds)
        back = m2r2_golden.read(out)
        for g in (written, back):
            self.assertEqual((g.format_version, g.mode), (2, "speculative"))
            self.assertFalse(set(V3_METADATA) & set(g.metadata))
            self.assertEqual((g.stop_tokens, g.max_steps), (None, None))
            self.assertIsNone(g.verify_logits)
            self.assertEqual(sorted(g.m2r2_tensors()), sorted(ROUNDS))
        # version 2 records no stop, budget or pin: asking for one is refused, not dropped
        for change, needle in [
            (dict(stop_tokens=self.spec.stop_tokens), "cannot record `stop_tokens`"),
            (dict(max_steps=7), "cannot record `max_steps`"),
            (dict(atol=1e-4, expect_dtype="f32"), "cannot record `atol`, `expect_dtype`"),
        ]:
            with self.subTest(needle=needle):
                with self.assertRaisesRegex(ValueError, needle):
                    m2r2_golden.write_speculative(out, like=self.spec, **self.rounds, **change)
        # max_steps = n says nothing version 2 does not
        m2r2_golden.write_speculative(out, like=self.spec, max_steps=6, **self.rounds)

    def test_refuses_inputs_that_do_not_fit(self):
        spec = self.spec
        out = self.path("bad.golden.safetensors")
        t, q, v = spec.verify_logits.shape[0], spec.draft_logits.shape[0], spec.vocab_size
        r = spec.round_accepted.shape[0]
        base = spec.round_base_token.copy()
        base[0] = (base[0] + 1) % v
        padded = spec.round_drafted.copy()
        padded[0, 0] = -1
        too_many = spec.round_accepted.copy()
        too_many[0] = 3
        # round 0 emits its accepted drafts and a base token: the tokens of a decode that ended
        # there leave round 1 nothing to emit; without round 1, the tokens after round 0 none
        k, n = 1 + int(spec.round_accepted[0]) + 1, len(spec.tokens)
        self.assertEqual(r, 2)
        fewer = {name: getattr(spec, name)[:1] for name in ROUNDS}
        cases = [
            (dict(verify_logits=None), "`draft_logits` without `verify_logits`"),
            (dict(draft_logits=None), "`verify_logits` without `draft_logits`"),
            (
                dict(verify_logits=spec.verify_logits[:-1]),
                f"`verify_logits` has shape [{t - 1}, {v}], the rounds give [{t}, {v}]",
            ),
            (
                dict(draft_logits=spec.draft_logits[:, :-1]),
                f"`draft_logits` has shape [{q}, {v - 1}], the rounds give [{q}, {v}]",
            ),
            (dict(draft_logits=spec.draft_logits[0]), "`draft_logits` must be 2-D floats"),
            (dict(round_base_token=base), "round 0 emits"),
            (dict(round_drafted=padded), "`round_drafted` row 0 is [-1, "),
            (dict(round_accepted=too_many), "`round_accepted` of round 0 is 3"),
            (dict(round_accepted=spec.round_accepted[:-1]), f"`round_base_token` has shape [{r}]"),
            (dict(round_scores=spec.round_scores[:, :2]), "`round_scores` has shape"),
            (dict(round_drafted=spec.round_drafted.astype(np.float32)), "must hold integers"),
            (dict(tokens=spec.tokens[:k], logits=spec.logits[:k]), f"round 1 of {r} emits no"),
            (fewer, f"the rounds emit {k} tokens (the first from the prompt), `tokens` holds {n}"),
            (dict(stop_tokens=[int(spec.tokens[0])]), "holds stop token"),
            (dict(prompt_tokens=spec.prompt_tokens[:0]), "`prompt_tokens` is empty"),
            (
                dict(tokens=spec.tokens[:0], logits=spec.logits[:0]),
                "`tokens` and `logits` record no step",
            ),
        ]
        good = {**self.rounds, **self.graphs}
        for change, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write_speculative(out, like=spec, **{**good, **change})
                self.assertIn(needle, str(e.exception))
                self.assertIn(out, str(e.exception))
        greedy = reference_golden("M2R2_GOLDEN_GREEDY")
        with self.assertRaisesRegex(ValueError, "records mode `greedy`"):
            m2r2_golden.write_speculative(out, like=greedy, **good)
        self.assertFalse(Path(out).exists())

    def test_a_like_whose_weights_hash_the_reference_refuses(self):
        """`m2r2_weights_hash` is copied from `like` only as the reference reads it (16 hex
        digits): anything else is a ValueError naming the key, and nothing is written."""
        out = self.path("spec.golden.safetensors")
        for bad in ("not-a-hash", "", "0123456789abcdeg", -1, 0.5, [], None):
            with self.subTest(m2r2_weights_hash=bad):
                like = m2r2_golden.Golden(
                    **arrays(self.spec, GREEDY_TENSORS),
                    metadata={**self.spec.metadata, "m2r2_weights_hash": bad},
                )
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write_speculative(out, like=like, **self.rounds, **self.graphs)
                self.assertIn(out, str(e.exception))
                self.assertIn("`like`", str(e.exception))
                self.assertIn(f"metadata `m2r2_weights_hash` = {bad!r}", str(e.exception))
        self.assertEqual(os.listdir(self.dir.name), [])
        like = m2r2_golden.Golden(
            **arrays(self.spec, GREEDY_TENSORS),
            metadata={**self.spec.metadata, "m2r2_weights_hash": "ABCDEF0123456789"},
        )
        g = m2r2_golden.write_speculative(out, like=like, **self.rounds, **self.graphs)
        self.assertEqual(g.m2r2_weights_hash, "ABCDEF0123456789")

    def test_a_token_tree_like_is_refused(self):
        """A tree's recipe has no chain's `draft_threshold` or rounds: write_tree writes those."""
        out = self.path("tree-like.golden.safetensors")
        tree = reference_golden("M2R2_GOLDEN_TREE")
        with self.assertRaises(ValueError) as e:
            m2r2_golden.write_speculative(out, like=tree, **self.rounds, **self.graphs)
        self.assertIn(out, str(e.exception))
        self.assertIn("token-tree golden", str(e.exception))
        self.assertIn("write_tree", str(e.exception))
        self.assertFalse(Path(out).exists())

    def test_the_written_file_is_read_back(self):
        """Whatever `like` carries that no reader takes fails the write, not a later read."""
        out = self.path("spec.golden.safetensors")
        odd = m2r2_golden.Golden(
            **arrays(self.spec, GREEDY_TENSORS),
            metadata={**self.spec.metadata, "draft_length": "sometimes"},
        )
        with self.assertRaises(ValueError) as e:
            m2r2_golden.write_speculative(out, like=odd, **self.rounds, **self.graphs)
        self.assertIn(f"{out}: metadata `draft_length` = `sometimes`", str(e.exception))
        self.assertEqual(os.listdir(self.dir.name), [])
        g = m2r2_golden.write_speculative(out, like=self.spec, **self.rounds, **self.graphs)
        self.assertEqual(g.path, out)
        self.assertEqual(len(g.round_accepted), len(self.spec.round_accepted))


class ReadRefusals(TempDir):
    """Files that are not valid goldens: a ValueError naming the file and the tensor or key."""

    def setUp(self):
        super().setUp()
        self.ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))

    def save(self, tensors=None, **metadata) -> str:
        """The reference golden with some tensors and metadata replaced (None removes one)."""
        t = arrays(self.ref, GREEDY_TENSORS)
        t.update(tensors or {})
        m = {**self.ref.metadata, **metadata}
        return self.saved("bad.golden.safetensors", t, m)

    def test_wrong_format_key(self):
        self.assertRefused(self.save(format="m2r2-goldn"), "not a golden file", "`format`")
        self.assertRefused(self.save(format=None), "metadata `format` is missing")
        self.assertRefused(self.save(config_hash=None), "metadata `config_hash` is missing")
        self.assertRefused(self.save(config="{oops"), "metadata `config` is not valid JSON")

    def test_vocabulary_is_a_count_the_logits_cover(self):
        """As the reference's reader: a config's `vocab_size` is a count of tokens, and the
        logits have one column per token of it."""
        config = json.loads(self.ref.metadata["config"])
        for bad in (-1, 0, "320", 3.5, None, True):
            with self.subTest(vocab_size=bad):
                edited = json.dumps({**config, "vocab_size": bad})
                self.assertRefused(
                    self.save(**rehashed(edited)),
                    f"metadata `config`: vocab_size {json.dumps(bad)} is not a count of tokens",
                )
        n, v = self.ref.logits.shape
        self.assertRefused(
            self.save({"logits": self.ref.logits[:, : v - 1].copy()}),
            f"tensor `logits` has shape [{n}, {v - 1}], expected [{n}, {v}]",
        )

    def test_unsupported_versions_and_modes(self):
        self.assertRefused(self.save(format_version="6"), "format version 6 is not supported")
        self.assertRefused(self.save(format_version="03"), "format version 03 is not supported")
        self.assertRefused(
            self.save(format_version="1", mode="speculative"), "version 1 has no mode `speculative`"
        )
        self.assertRefused(
            self.save(mode="sampled"),
            "unknown mode `sampled` (expected greedy, early-exit or speculative)",
        )

    def test_values_from_the_file_are_quoted_escaped(self):
        """A metadata value or name is quoted in a message as the reference quotes it (Rust's
        `{:?}`, without the quotes): a control character shows as `\\u{1}` rather than reaching
        the terminal, or vanishing from an XML report so that `gr\\u{1}eedy` would read
        `greedy`."""
        cases = [
            (dict(mode="gr\x01eedy"), "unknown mode `gr\\u{1}eedy` (expected greedy,"),
            (dict(format_version="3\x1b[0m"), "golden format version 3\\u{1b}[0m is not"),
            (dict(expect_dtype='f3\t"2'), 'metadata `expect_dtype` = `f3\\t\\"2` is not valid'),
            (dict(max_steps="6\n"), "metadata `max_steps` = `6\\n` is not valid"),
            ({"ju\x7fnk": "1"}, "holds metadata `ju\\u{7f}nk`, which no greedy golden"),
        ]
        for metadata, needle in cases:
            with self.subTest(needle=needle):
                self.assertRefused(self.save(**metadata), needle)
        with self.assertRaises(ValueError) as e:
            m2r2_golden.read(self.save(mode="gr\x01eedy"))
        self.assertNotIn("\x01", str(e.exception))

    def test_ids_outside_the_vocabulary(self):
        # as the reference's reader: the step or position, and the config's vocabulary
        vocab = json.loads(self.ref.metadata["config"])["vocab_size"]
        tokens = self.ref.tokens.copy()
        tokens[1] = vocab
        self.assertRefused(
            self.save({"tokens": tokens}),
            f"`tokens` holds token id {vocab} at step 1, outside the vocabulary of {vocab} tokens",
        )
        prompt = self.ref.prompt_tokens.copy()
        prompt[0] = -1
        self.assertRefused(
            self.save({"prompt_tokens": prompt}), "`prompt_tokens` holds token id -1 at position 0"
        )

    def test_older_versions_still_read(self):
        # version 1: greedy, no stop tokens, budget or pins (a file that has them is refused by
        # name, as the reference refuses it: they would be ignored)
        old = {key: None for key in V3_METADATA}
        for version in ("1", "2"):
            with self.subTest(version=version):
                g = m2r2_golden.read(self.save(format_version=version, **old))
                self.assertEqual(g.format_version, int(version))
                self.assertEqual((g.stop_tokens, g.max_steps, g.atol), (None, None, None))
                np.testing.assert_array_equal(g.logits, self.ref.logits)
                self.assertRefused(
                    self.save(format_version=version, **{**old, "atol": "x", "stop_tokens": "x"}),
                    "holds metadata `atol`, metadata `stop_tokens`, which no greedy golden of "
                    f"format version {version} records",
                )
        # version 2 speculative: the rounds, without the graphs' logits
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.ref = spec
        g = m2r2_golden.read(self.save(arrays(spec, ROUNDS), format_version="2", **old))
        self.assertEqual((g.format_version, g.mode, g.stop_tokens), (2, "speculative", None))
        self.assertIsNone(g.verify_logits)
        self.assertEqual(sorted(g.m2r2_tensors()), sorted(ROUNDS))
        np.testing.assert_array_equal(g.round_drafted, spec.round_drafted)
        # a version-3 file edited down to 2 still holds the graphs' logits: refused, as a check
        # would skip them as "not recorded"
        self.assertRefused(
            self.save(arrays(spec, ROUNDS + GRAPHS), format_version="2", **old),
            "holds `verify_logits`, which format version 2 does not record",
        )

    def test_stops_budget_and_pins(self):
        self.assertRefused(self.save(stop_tokens=None), "metadata `stop_tokens` is missing")
        self.assertRefused(self.save(max_steps=None), "metadata `max_steps` is missing")
        for bad in ("[1, -2]", "256", "[1.0]", "[true]", "[4294967296]", "[1,", "null"):
            with self.subTest(stop_tokens=bad):
                self.assertRefused(
                    self.save(stop_tokens=bad),
                    f"metadata `stop_tokens` = `{bad}` is not valid (a JSON list of token ids)",
                )
        for bad in ("six", "-1", "6.0", ""):
            with self.subTest(max_steps=bad):
                self.assertRefused(self.save(max_steps=bad), f"metadata `max_steps` = `{bad}`")
        for key in ("atol", "rtol"):
            for bad in ("-1e-4", "nan", "inf", "1e39", " 1", "1_0", "0x1", ""):
                with self.subTest(key=key, value=bad):
                    self.assertRefused(
                        self.save(**{key: bad}),
                        f"metadata `{key}` = `{bad}` is not valid (a finite number >= 0)",
                    )
        self.assertRefused(self.save(expect_dtype="bf16"), "metadata `expect_dtype` = `bf16`")
        g = m2r2_golden.read(
            self.save(stop_tokens="[ 2,0 ]", atol="1e-4", rtol=".5", expect_dtype="f32")
        )
        pins = (g.stop_tokens, g.atol, g.rtol, g.expect_dtype)
        self.assertEqual(pins, ([2, 0], 1e-4, 0.5, "f32"))

    def test_tokens_that_disagree_with_the_stops_and_budget(self):
        """As the reference's reader: no stop token before the last, no more tokens than the
        budget, fewer only when the last is a stop token."""
        tokens, logits = self.ref.tokens, self.ref.logits
        first, n = int(tokens[0]), len(tokens)
        disagree = "`tokens` do not agree with `stop_tokens` and `max_steps`: "
        empty = {"tokens": tokens[:0], "logits": logits[:0]}
        for tensors, metadata, problem in [
            (None, dict(max_steps="2"), f"{n} tokens for `max_steps` = 2"),
            (None, dict(stop_tokens=f"[{first}]"), f"stop token {first} at step 0, before the"),
            (empty, dict(max_steps="6"), "0 tokens for `max_steps` = 6, the last not a stop token"),
            (None, dict(max_steps="9"), f"{n} tokens for `max_steps` = 9, the last not a stop"),
        ]:
            with self.subTest(metadata=metadata):
                self.assertRefused(self.save(tensors, **metadata), disagree + problem)
        # a decode that stopped at its stop token, before its budget; none with no budget
        one = {"tokens": tokens[:1], "logits": logits[:1]}
        stopped = m2r2_golden.read(self.save(one, stop_tokens=f"[{first}]", max_steps="9"))
        self.assertEqual((stopped.max_steps, stopped.stop_tokens), (9, [first]))
        self.assertEqual(len(m2r2_golden.read(self.save(empty, max_steps="0")).tokens), 0)
        # versions before 3 record neither: their tokens are the budget
        old = {key: None for key in V3_METADATA}
        old = m2r2_golden.read(self.save(format_version="1", **old))
        self.assertEqual((old.mode, old.max_steps), ("greedy", None))

    def test_numbers_and_counts_as_the_reference_parses_them(self):
        """Rust's f32 / usize parsing: no `_` or spaces (but where the reference trims them),
        nothing past usize::MAX; inf and NaN where it takes them."""
        big = str(2**64)
        for bad in ("99999999999999999999999", big, "1" * 5000, "+6", "６"):
            with self.subTest(max_steps=bad[:30]):
                self.assertRefused(self.save(max_steps=bad), f"metadata `max_steps` = `{bad}`")
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.ref = spec
        rounds = spec.m2r2_tensors()
        dynamic = dict(draft_length="dynamic", gate="arla")
        for bad in ("0_5", " 0.5", "0.5 ", ".", "0x1", "infinit"):
            with self.subTest(draft_threshold=bad):
                self.assertRefused(
                    self.save(rounds, **dynamic, draft_threshold=bad),
                    f"metadata `draft_threshold` = `{bad}` is not valid (a number)",
                )
        for good in ("0.5", "1.", ".5e1", "1e39", "inf", "-Infinity", "NaN"):
            with self.subTest(draft_threshold=good):
                m2r2_golden.read(self.save(rounds, **dynamic, draft_threshold=good))
        for key, bad in (("draft_gate", big), ("draft_max", str(2**63 - 1)), ("draft_max", "2_0")):
            with self.subTest(key=key, value=bad):
                self.assertRefused(self.save(rounds, **{key: bad}), f"metadata `{key}` = `{bad}`")
        plus = m2r2_golden.read(self.save(rounds, draft_gate="+1"))  # Rust's usize takes a `+`
        self.assertEqual(plus.metadata["draft_gate"], "+1")
        # early exit's thresholds: each trimmed, finite
        exits = m2r2_golden.read(reference_golden("M2R2_GOLDEN_EARLY_EXIT"))
        self.ref = exits
        tensors = exits.m2r2_tensors()
        for bad in ("0_5", "inf", "1e39", "nan", "0.5,"):
            with self.subTest(threshold=bad):
                self.assertRefused(
                    self.save(tensors, threshold=bad),
                    f"metadata `threshold` = `{bad}` is not valid",
                )
        j = exits.gate_scores.shape[1]
        m2r2_golden.read(self.save(tensors, threshold=" 0.5"))
        m2r2_golden.read(self.save(tensors, threshold=", ".join(["0.5"] * j)))

    def test_wrong_dtype(self):
        self.assertRefused(
            self.save({"tokens": self.ref.tokens.astype(np.int32)}), "`tokens`", "dtype I32", "I64"
        )
        wide = self.ref.logits.astype(np.float64)
        self.assertRefused(self.save({"logits": wide}), "`logits`", "dtype F64", "F32")

    def test_missing_tensor(self):
        self.assertRefused(self.save({"prompt_tokens": None}), "tensor `prompt_tokens` is missing")

    def test_mismatched_shapes(self):
        logits, tokens = self.ref.logits, self.ref.tokens
        self.assertRefused(
            self.save({"logits": logits[:4]}),
            "tensor `logits` has shape [4, 320], expected [6, 320]",
        )
        self.assertRefused(self.save({"logits": logits[0]}), "tensor `logits` has shape [320]")
        self.assertRefused(self.save({"tokens": tokens[None]}), "tensor `tokens` has shape [1, 6]")
        self.assertRefused(self.save({"tokens": -tokens - 1}), "`tokens` holds token id -")

    def test_speculative_shapes(self):
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        tensors = {**spec.m2r2_tensors(), "round_scores": spec.round_scores[:, :2]}
        self.ref = spec
        self.assertRefused(self.save(tensors), "tensor `round_scores` has shape", "expected")
        rounds = spec.m2r2_tensors()
        self.assertRefused(self.save(rounds, draft_max="x"), "metadata `draft_max` = `x`")
        self.assertRefused(
            self.save({**rounds, "round_accepted": None}), "tensor `round_accepted` is missing"
        )
        self.assertRefused(self.save(rounds, m2r2_hash=None), "metadata `m2r2_hash` is missing")
        self.assertRefused(self.save(rounds, gate="arl"), "metadata `gate` = `arl` is not valid")
        no_rounds = {name: rounds[name][:0] for name in ROUNDS}
        self.assertRefused(
            self.save({**rounds, **no_rounds}), "tensor `round_accepted` has no rounds for 6 tokens"
        )

    def test_speculative_graph_tensors(self):
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.ref = spec
        rounds = spec.m2r2_tensors()
        (t, v), q = spec.verify_logits.shape, spec.draft_logits.shape[0]
        for name in GRAPHS:
            with self.subTest(name=name):
                self.assertRefused(self.save({**rounds, name: None}), f"tensor `{name}` is missing")
                wide = getattr(spec, name).astype(np.float64)
                self.assertRefused(self.save({**rounds, name: wide}), f"`{name}`", "dtype F64")
        self.assertRefused(
            self.save({**rounds, "verify_logits": spec.verify_logits[1:]}),
            f"tensor `verify_logits` has shape [{t - 1}, {v}], expected [{t}, {v}]",
        )
        self.assertRefused(
            self.save({**rounds, "draft_logits": spec.draft_logits.reshape(-1)}),
            f"tensor `draft_logits` has shape [{q * v}], expected [{q}, V]",
        )
        # the rows follow the rounds: one draft fewer in round 0 of a dynamic draft (which may
        # stop early; round 0 accepts one fewer, to stay within its drafts) is one row fewer of
        # each; a fixed draft drafts in full, and one draft fewer is refused by that rule first
        drafted = spec.round_drafted.copy()
        drafted[0, -1] = -1
        accepted = spec.round_accepted.copy()
        accepted[0] = (drafted[0] >= 0).sum()
        fewer = {**rounds, "round_drafted": drafted, "round_accepted": accepted}
        dynamic = dict(draft_length="dynamic", gate="confidence", draft_threshold="0.5")
        self.assertRefused(
            self.save(fewer, **dynamic),
            f"tensor `verify_logits` has shape [{t}, {v}], expected [{t - 1}, {v}]",
        )
        self.assertRefused(
            self.save(fewer),
            "tensor `round_drafted`: round 0 drafted 1 tokens, but a fixed draft length drafts "
            "`draft_max` = 2 every round",
        )

    def test_early_exit_shapes(self):
        exits = m2r2_golden.read(reference_golden("M2R2_GOLDEN_EARLY_EXIT"))
        self.ref = exits
        tensors = exits.m2r2_tensors()
        self.assertRefused(
            self.save({**tensors, "gate_scores": exits.gate_scores[:, :1]}),
            "tensor `gate_scores` has shape",
        )
        self.assertRefused(
            self.save({**tensors, "exit_gate": exits.exit_gate.astype(np.float32)}),
            "tensor `exit_gate` has unsupported dtype F32",
        )
        self.assertRefused(self.save(tensors, kv_policy="fast"), "metadata `kv_policy` = `fast`")
        # early exit's thresholds: one number, or one per gate
        j = exits.gate_scores.shape[1]
        per_gate = ",".join(["1.01"] + ["0.5"] * (j - 1))
        read = m2r2_golden.read(self.save(tensors, threshold=per_gate))
        self.assertEqual(read.metadata["threshold"], per_gate)
        self.assertRefused(
            self.save(tensors, threshold=per_gate + ",0.5"),
            f"metadata `threshold` has {j + 1} per-gate thresholds for {j} gates",
        )
        self.assertRefused(
            self.save(tensors, threshold="high"), "metadata `threshold` = `high` is not valid"
        )

    def test_truncated_and_corrupt_files(self):
        src = Path(reference_golden("M2R2_GOLDEN_GREEDY")).read_bytes()
        path = Path(self.dir.name) / "truncated.golden.safetensors"
        path.write_bytes(src[: len(src) - 100])
        self.assertRefused(str(path), "corrupt or unsupported file")
        path.write_bytes(src[:5])
        self.assertRefused(str(path), "corrupt or unsupported file")
        path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
        self.assertRefused(str(path), "corrupt or unsupported file")
        with self.assertRaises(FileNotFoundError):
            m2r2_golden.read(Path(self.dir.name) / "missing.safetensors")
        # a folder: an OSError naming it, as for a missing file
        folder = Path(self.dir.name) / "adir.gs"
        folder.mkdir()
        for path in (str(folder), str(folder) + "/"):
            with self.subTest(path=path):
                with self.assertRaises(OSError) as e:
                    m2r2_golden.read(path)
                self.assertIn(path, str(e.exception))

    def test_metadata_is_kept_verbatim(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        # the reference's JSON text: 1e-5 as serde_json writes it, not as Python would
        self.assertIn('"rms_norm_eps":0.00001', g.config_json)
        self.assertNotEqual(json.dumps(g.config, separators=(",", ":")), g.config_json)

    def test_chain_rounds_accept_at_most_their_drafts(self):
        """As the reference's reader: a chain round accepts 0 to its drafts, named by round (even
        where the rows the rounds imply would be refused too: this is checked first)."""
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.ref = spec
        rounds = spec.m2r2_tensors()
        self.assertEqual(spec.round_drafted.tolist(), [[3, 3], [3, 3]])
        self.assertEqual(spec.round_accepted.tolist(), [2, 2])
        for k, a in ((0, -2), (0, 3), (0, 320), (1, 3), (1, -1)):
            with self.subTest(round=k, accepted=a):
                accepted = spec.round_accepted.copy()
                accepted[k] = a
                self.assertRefused(
                    self.save({**rounds, "round_accepted": accepted}),
                    f"tensor `round_accepted`: round {k} accepted {a} of its 2 drafts",
                )
        drafted = spec.round_drafted.copy()
        drafted[0, 1] = -1
        dynamic = dict(draft_length="dynamic", gate="confidence", draft_threshold="0.5")
        self.assertRefused(
            self.save({**rounds, "round_drafted": drafted}, **dynamic),
            "tensor `round_accepted`: round 0 accepted 2 of its 1 drafts",
        )

    def test_accepted_counts_must_emit_the_tokens(self):
        """As the reference's reader: the prompt's token, then per round its accepted drafts and
        its base token; every round but the last emits all of them, the last at least one, and
        fewer than all only where the budget (or a stop token) cut it."""
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.ref = spec
        rounds = spec.m2r2_tensors()
        self.assertEqual((spec.round_accepted.tolist(), len(spec.tokens)), ([2, 2], 6))

        def disagree(before: int, everything: int, n: int) -> str:
            return (
                "tensor `round_accepted` does not agree with `tokens`: the prompt's token and 2 "
                "rounds of accepted drafts and a base token each make "
                f"{before} tokens before the last round and {everything} with it, but `tokens` "
                f"holds {n} (the last round emits at least one, and fewer than all only where the "
                "budget or a stop token cut it)"
            )

        for accepted, before, everything in (
            ([0, 2], 2, 5),
            ([2, 0], 4, 5),
            ([1, 1], 3, 5),
            ([0, 0], 2, 3),
        ):
            with self.subTest(accepted=accepted):
                self.assertRefused(
                    self.save({**rounds, "round_accepted": np.array(accepted)}),
                    disagree(before, everything, 6),
                )
        # tokens that end before the last round emits one (its budget), or with none
        for n in (0, 1, 4):
            with self.subTest(tokens=n):
                cut = {"tokens": spec.tokens[:n], "logits": spec.logits[:n]}
                self.assertRefused(
                    self.save({**rounds, **cut}, max_steps=str(n)), disagree(4, 7, n)
                )
        # the budget cut the last round after its first token, or the rounds emit one more
        cut = {"tokens": spec.tokens[:5], "logits": spec.logits[:5]}
        back = m2r2_golden.read(self.save({**rounds, **cut}, max_steps="5"))
        self.assertEqual(len(back.tokens), 5)
        more = {"round_accepted": np.array([2, 1])}
        self.assertEqual(m2r2_golden.read(self.save({**rounds, **more})).round_accepted[1], 1)

    def test_m2r2_weights_hash_is_16_hex_digits(self):
        """As the reference's reader: `m2r2_weights_hash`, where a golden has one, is 16 hex
        digits (either case), in every M2R2 mode; `m2r2_hash` has no form (`config_hash` must be
        its config's hash: ReadRefusals.test_a_config_edited_under_its_hash)."""
        for var in ("M2R2_GOLDEN_SPECULATIVE", "M2R2_GOLDEN_EARLY_EXIT", "M2R2_GOLDEN_TREE"):
            g = m2r2_golden.read(reference_golden(var))
            self.ref = g
            tensors = g.m2r2_tensors()
            for bad in (
                "not-a-hash",
                "",
                "-1",
                "0.5",
                "[]",
                "0123456789abcde",
                "0123456789abcdef0",
                "0123456789abcdeg",
                " 0123456789abcdef",
                "0123456789abcdef\n",
                "０123456789abcde",
            ):
                # quoted escaped, as the reference quotes it (Rust's `{:?}`)
                quoted = bad.replace("\n", "\\n")
                with self.subTest(golden=var, m2r2_weights_hash=bad):
                    self.assertRefused(
                        self.save(tensors, m2r2_weights_hash=bad),
                        f"metadata `m2r2_weights_hash` = `{quoted}` is not valid",
                    )
            for good in ("ABCDEF0123456789", None):
                with self.subTest(golden=var, m2r2_weights_hash=good):
                    back = m2r2_golden.read(self.save(tensors, m2r2_weights_hash=good))
                    self.assertEqual(back.m2r2_weights_hash, good)
            back = m2r2_golden.read(self.save(tensors, m2r2_hash="zz"))
            self.assertEqual(back.m2r2_hash, "zz")

    def test_m2r2_config_as_the_reference_deserialises_it(self):
        """`m2r2_config` is refused where the reference cannot deserialise its M2R2 settings from
        it (serde: required fields, no unknown or repeated ones, counts that are non-negative
        integers, known gates, targets and bridge sites), and read where it can (structs also
        as arrays of their fields, `null` for what is optional)."""
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.ref = spec
        rounds = spec.m2r2_tensors()
        text = spec.metadata["m2r2_config"]
        config = json.loads(text)
        self.assertEqual(list(config)[:3], ["num_layers", "gates", "draft_gate"])

        def edit(**change) -> str:
            return json.dumps({**config, **change})

        arla = {"latent": 64, "threshold": 0.5}
        required = [8, [2, 4, 6], 1, 4, 16, 32.0, ["q_proj"], arla]
        bridge = {"gate": 1, "rank": 2, "sites": ["entry"]}
        refused = [
            ("{}", "metadata `m2r2_config`: missing field `num_layers`"),
            (edit(extra=1), "unknown field `extra`"),
            (text[:-1] + ',"rank":16}', "duplicate field `rank`"),
            (edit(num_layers=-1), "`num_layers`"),
            (text.replace('"num_layers":8', '"num_layers":-0'), "`num_layers`"),
            (edit(num_layers=8.0), "`num_layers`"),
            (text.replace('"num_layers":8', '"num_layers":1e1'), "`num_layers`"),
            (edit(gates=[2, "4"]), '`gates[1]`: string "4", expected usize'),
            (edit(draft_len=True), "`draft_len`"),
            (edit(alpha="1"), "`alpha`"),
            (text.replace("32.0", "NaN"), "not valid JSON"),
            (text.replace("32.0", "1e400"), "number out of range"),
            (edit(seed=2**64), "`seed`"),
            (edit(seed=-1), "`seed`"),
            (edit(arla=[64]), "`arla`: invalid length 1, expected struct ArlaConfig with 2"),
            (edit(arla=[64, 0.5, 1]), "`arla`"),
            (edit(arla={"latent": 64}), "missing field `threshold`"),
            (edit(targets=["x_proj"]), "`targets[0]`"),
            (edit(dynamic_draft={"gate": "arl", "threshold": 0.5}), "`dynamic_draft.gate`"),
            (
                edit(early_exit={"gate": "entropy", "thresholds": ["1"]}),
                "`early_exit.thresholds[0]`",
            ),
            (edit(bridge={**bridge, "sites": [{"entry": 1}]}), "`bridge.sites[0]`"),
            (edit(bridge={**bridge, "sites": [{"entry": None, "gate": None}]}), "`bridge.sites"),
            (edit(bridge={**bridge, "sites": ["middle"]}), "`bridge.sites[0]`"),
            (edit(bridge={**bridge, "scales": []}), "`bridge.scales`"),
            (edit(bridge={**bridge, "scales": None}), "`bridge.scales`"),
            (edit(bridge={**bridge, "scales": {"middle": 1}}), "`bridge.scales`"),
            (edit(onnx_drafting={"draft_gate": 2}), "missing field `draft_len`"),
            (
                edit(draft_tree={"draft_gate": 1, "widths": [2], "dynamic": {"gate": "entropy"}}),
                "missing field `threshold`",
            ),
            (json.dumps(required[:-1]), "invalid length 7"),
            (json.dumps(required + [None] * 7 + [1]), "more than the 15 fields"),
            ('"x"', "`m2r2_config`"),
            ("null", "`m2r2_config`"),
        ]
        for bad, needle in refused:
            with self.subTest(m2r2_config=bad):
                self.assertRefused(
                    self.save(rounds, m2r2_config=bad), "metadata `m2r2_config`", needle
                )
        read = [
            json.dumps(required),
            json.dumps(required[:7] + [[64, 0.5]] + [None] * 6 + [7]),
            edit(arla=[64, 0.5], early_exit=None, seed=None, bridge=None),
            edit(alpha=1e39, rank=2**64 - 1, seed=2**64 - 1),
            text.replace("32.0", "-0"),
            edit(bridge={**bridge, "sites": [{"entry": None}, "gate"], "scales": {"gate": 1}}),
            text[:-1] + ',"bridge":{"gate":1,"rank":2,"sites":[],"scales":{"gate":1,"gate":2}}}',
            edit(onnx_drafting={"draft_gate": 2, "draft_len": 2, "prompt_lookup": 3}),
            edit(draft_tree={"draft_gate": 1, "widths": [2, 1], "dynamic": None}),
            edit(early_exit={"gate": "confidence", "thresholds": [1, 0.5, 1]}),
        ]
        for good in read:
            with self.subTest(m2r2_config=good):
                self.assertEqual(
                    m2r2_golden.read(self.save(rounds, m2r2_config=good)).metadata["m2r2_config"],
                    good,
                )
        # early exit's gates from the settings in either form
        exits = m2r2_golden.read(reference_golden("M2R2_GOLDEN_EARLY_EXIT"))
        self.ref = exits
        tensors = exits.m2r2_tensors()
        m2r2_golden.read(self.save(tensors, m2r2_config=json.dumps(required)))
        fewer = [8, [2, 4]] + required[2:]
        self.assertRefused(
            self.save(tensors, m2r2_config=json.dumps(fewer)), "tensor `gate_scores` has shape"
        )

    def test_json_as_the_reference_parses_it(self):
        """`config`, `m2r2_config` and `stop_tokens` are JSON as serde_json reads it: no NaN or
        Infinity, no number beyond f64, no lone surrogate, at most 127 levels deep; `-0` is a
        float, integers past u64 too."""
        config = self.ref.metadata["config"]
        for bad in (
            "NaN",
            "-Infinity",
            "1e400",
            "-" + "1" * 400,
            "1" * 5000,
            '"\\ud800"',
            '"\\udc00x"',
            "[" * 127 + "]" * 127,
            '{"a":' * 127 + "1" + "}" * 127,
            "[" * 100000 + "]" * 100000,
        ):
            with self.subTest(value=bad[:20]):
                self.assertRefused(
                    self.save(config=config[:-1] + f',"x":{bad}}}'), "metadata `config`"
                )
        for good in ('"\\ud83d\\ude00"', "[" * 126 + "]" * 126, "1e-400", "1" * 300, "-0"):
            with self.subTest(value=good[:20]):
                m2r2_golden.read(self.save(**rehashed(config[:-1] + f',"x":{good}}}')))
        for bad in ("[-0]", "[1e2]", "[256.0]", "[4294967296]", "[NaN]"):
            with self.subTest(stop_tokens=bad):
                self.assertRefused(
                    self.save(stop_tokens=bad), f"metadata `stop_tokens` = `{bad}` is not valid"
                )
        # a vocabulary of `-0` tokens is a float to serde_json, not a count of tokens
        vocab = config.replace('"vocab_size":320', '"vocab_size":-0')
        self.assertNotEqual(vocab, config)
        self.assertRefused(
            self.save(**rehashed(vocab)), "vocab_size -0.0 is not a count of tokens"
        )

    def test_tensors_numpy_cannot_hold_are_errors_naming_them(self):
        """`logits` of no rows and 2^63 columns (no bytes, a shape no array has): refused, as
        the reference refuses it, by a ValueError naming the file and the tensor."""
        meta = {**self.ref.metadata, "max_steps": "0"}
        header = {"__metadata__": meta}
        tensors = [
            ("prompt_tokens", "I64", [1], np.array([1], np.int64).tobytes()),
            ("tokens", "I64", [0], b""),
            ("logits", "F32", [0, 2**63], b""),
        ]
        data = b""
        for name, dtype, shape, raw in tensors:
            offsets = [len(data), len(data) + len(raw)]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
            data += raw
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path = self.path("huge.golden.safetensors")
        Path(path).write_bytes(len(text).to_bytes(8, "little") + text + data)
        self.assertRefused(path, "tensor `logits` of shape [0, 9223372036854775808]")



class ReadTreeGoldens(TempDir):
    """Token-tree goldens (versions 4 and 5) read and validated: each round's tree, the rows of
    the graphs' logits they imply, and files that disagree with themselves refused by name."""

    def setUp(self):
        super().setUp()
        self.fixed = reference_golden("M2R2_GOLDEN_TREE")
        self.grown = reference_golden("M2R2_GOLDEN_GROWN_TREE")

    def test_fixed_and_varying_trees(self):
        greedy = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        for path, version in ((self.fixed, 4), (self.grown, 5)):
            with self.subTest(version=version):
                g = m2r2_golden.read(path)
                self.assertEqual(g.format_version, version)
                self.assertEqual(g.draft_tree, [2, 1, 1])
                trees = g.round_trees
                self.assertEqual(len(trees), g.round_node.shape[0])
                # the prompt's row, then every node of every round
                self.assertEqual(g.verify_logits.shape[0], 1 + sum(t.nodes for t in trees))
                self.assertEqual(g.draft_logits.shape[0], g.draft_rows.shape[0])
                for k, t in enumerate(trees):
                    self.assertEqual(int(g.round_accepted[k]), t.depths[int(g.round_node[k])])
                np.testing.assert_array_equal(g.verify_logits[0], g.logits[0])
        # a fixed tree: every round the shape; lossless: greedy's tokens
        g = m2r2_golden.read(self.fixed)
        self.assertTrue(all(t == m2r2_golden.tree.from_widths([2, 1, 1]) for t in g.round_trees))
        np.testing.assert_array_equal(g.tokens, greedy.tokens)
        self.assertIsNone(g.round_tree_parents)
        # grown with a lookup branch: rounds of more than one tree, and branches
        g = m2r2_golden.read(self.grown)
        self.assertGreater(len({tuple(t.parents) for t in g.round_trees}), 1)
        self.assertTrue((g.round_lookup > 0).any())
        self.assertIn("round_scores", g.m2r2_tensors())

    def rewrite(self, path: str, tensors=None, **metadata) -> str:
        """``path`` with some tensors and metadata replaced."""
        with safe_open(path, framework="np") as f:
            t = {k: f.get_tensor(k) for k in f.keys()}
            m = dict(f.metadata())
        t.update(tensors or {})
        m.update(metadata)
        out = self.path("bad.golden.safetensors")
        save_file(t, out, metadata=m)
        return out

    def test_inconsistent_tree_files_are_refused(self):
        g = m2r2_golden.read(self.grown)
        parents = g.round_tree_parents.copy()
        parents[0, 0] = 1  # node 1 its own parent
        self.assertRefused(
            self.rewrite(self.grown, {"round_tree_parents": parents}),
            "tensor `round_tree_parents`: round 0",
        )
        k = int(np.argmax((g.round_lookup >= 0).any(axis=1)))
        lookup = g.round_lookup.copy()
        lookup[k, 0] = 0
        self.assertRefused(
            self.rewrite(self.grown, {"round_lookup": lookup}),
            f"tensor `round_lookup`: round {k}: node 0",
        )
        rows = g.draft_rows.copy()
        rows[0, 1] += 1
        self.assertRefused(self.rewrite(self.grown, {"draft_rows": rows}), "`draft_rows`")
        node = g.round_node.copy()
        node[0] = 99
        self.assertRefused(self.rewrite(self.grown, {"round_node": node}), "accepts node 99")
        self.assertRefused(
            self.rewrite(self.grown, format_version="4"),
            "trees that change from round to round are format version 5",
        )
        self.assertRefused(
            self.rewrite(self.fixed, format_version="3"), "token-tree goldens are format version 4"
        )
        self.assertRefused(self.rewrite(self.fixed, draft_tree="2,0"), "metadata `draft_tree`")
        self.assertRefused(
            self.rewrite(self.grown, prompt_lookup_ngram="3,2"), "metadata `prompt_lookup_ngram`"
        )

    def test_a_tree_deeper_than_the_recipe_is_named_by_its_depth(self):
        """A round's tree within the recipe's largest node count but deeper than it: the message
        gives both counts and depths, as the reference's reader does."""
        g = m2r2_golden.read(self.grown)
        largest = m2r2_golden.tree.with_lookup_branch(m2r2_golden.tree.from_widths([2, 1, 1]), 3)
        k = next(k for k, t in enumerate(g.round_trees) if t.nodes > largest.max_depth + 1)
        nodes = g.round_trees[k].nodes
        parents = g.round_tree_parents.copy()
        parents[k, : nodes - 1] = np.arange(nodes - 1)  # the same nodes as one chain
        self.assertRefused(
            self.rewrite(self.grown, {"round_tree_parents": parents}),
            f"tensor `round_tree_parents`: round {k}: a tree of {nodes} nodes and depth "
            f"{nodes - 1}, larger than the recipe's largest ({largest.nodes} nodes, depth "
            f"{largest.max_depth})",
        )

    def test_accepted_nodes_must_emit_the_tokens(self):
        """As the reference's reader: each round emits its accepted node's path and a base token,
        all of them but in the last round, which the budget or a stop token may cut."""
        g = m2r2_golden.read(self.fixed)
        self.assertEqual((g.round_node.tolist(), len(g.tokens)), ([5, 5], 6))
        roots = {"round_node": np.array([0, 0]), "round_accepted": np.array([0, 0])}
        path = self.rewrite(self.fixed, roots)
        self.assertRefused(
            path,
            "tensor `round_accepted` does not agree with `tokens`: the prompt's token and 2 rounds "
            "of accepted drafts and a base token each make 2 tokens before the last round and 3 "
            "with it, but `tokens` holds 6",
        )
        # a node at depth 1 in round 0: 3 tokens before the last round, 7 with it
        shallow = {"round_node": np.array([1, 5]), "round_accepted": np.array([1, 3])}
        self.assertEqual(m2r2_golden.read(self.rewrite(self.fixed, shallow)).round_node[0], 1)

    def test_padding_errors_name_the_round_once(self):
        g = m2r2_golden.read(self.grown)
        parents = g.round_tree_parents.copy()
        parents[0, 0] = -1  # padding, then node 2's parent
        path = self.rewrite(self.grown, {"round_tree_parents": parents})
        self.assertRefused(path, "tensor `round_tree_parents`: round 0: a value after the padding")
        with self.assertRaises(ValueError) as e:
            m2r2_golden.read(path)
        self.assertNotIn("round 0: round 0", str(e.exception))
        k = int(np.argmax((g.round_lookup >= 0).all(axis=1)))
        lookup = g.round_lookup.copy()
        lookup[k, 0] = -1
        self.assertRefused(
            self.rewrite(self.grown, {"round_lookup": lookup}),
            f"tensor `round_lookup`: round {k}: a value after the padding",
        )

    def test_recipe_numbers_as_the_reference_parses_them(self):
        """draft_tree's widths and prompt_lookup_ngram as usize (trimmed for the widths),
        tree_threshold a finite f32, as the reference reads them."""
        for spec in ("2,1_0", "2,1,", "2,-1", "2,1,1.0", "２,1,1"):
            with self.subTest(draft_tree=spec):
                self.assertRefused(
                    self.rewrite(self.fixed, draft_tree=spec), f"metadata `draft_tree` = `{spec}`"
                )
        g = m2r2_golden.read(self.rewrite(self.fixed, draft_tree=" 2, 1,+1"))
        self.assertEqual(g.draft_tree, [2, 1, 1])
        for bad in ("0_5", " 0.5", "1e39", "inf", "nan"):
            with self.subTest(tree_threshold=bad):
                self.assertRefused(
                    self.rewrite(self.grown, tree_threshold=bad),
                    f"metadata `tree_threshold` = `{bad}` is not valid (a finite number)",
                )
        for bad in ("１,3", f"1,{2**64}", "1, 3", "0,3", "1,3,4"):
            with self.subTest(prompt_lookup_ngram=bad):
                self.assertRefused(
                    self.rewrite(self.grown, prompt_lookup_ngram=bad),
                    f"metadata `prompt_lookup_ngram` = `{bad}`",
                )
        m2r2_golden.read(self.rewrite(self.grown, prompt_lookup_ngram="+1,3"))
        self.assertRefused(
            self.rewrite(self.grown, prompt_lookup=str(2**64)),
            f"metadata `prompt_lookup` = `{2**64}`",
        )


def tree_inputs(g: m2r2_golden.Golden) -> dict:
    """The per-round inputs of write_tree, taken from a token-tree golden."""
    trees = g.round_trees
    inputs = dict(
        prompt_tokens=g.prompt_tokens,
        tokens=g.tokens,
        logits=g.logits,
        round_trees=[t.parents for t in trees],
        round_tree_tokens=[list(g.round_tree_tokens[k][: t.nodes]) for k, t in enumerate(trees)],
        round_node=g.round_node,
        round_accepted=g.round_accepted,
        round_base_token=g.round_base_token,
        verify_logits=g.verify_logits,
        draft_logits=g.draft_logits,
        stop_tokens=g.stop_tokens,
        max_steps=g.max_steps,
    )
    if g.round_lookup is not None:
        inputs["round_lookup"] = [[int(i) for i in row if i >= 0] for row in g.round_lookup]
        inputs["round_scores"] = [[float(x) for x in row if not np.isnan(x)] for row in g.round_scores]
    return inputs


class WriteTree(TempDir):
    """write_tree: a tree decode with a reference golden's recipe, validated by reading it back."""

    def test_round_trip_of_reference_tree_goldens(self):
        for var, version in (("M2R2_GOLDEN_TREE", 4), ("M2R2_GOLDEN_GROWN_TREE", 5)):
            with self.subTest(var=var):
                ref = m2r2_golden.read(reference_golden(var))
                out = self.path(f"{version}.golden.safetensors")
                g = m2r2_golden.write_tree(out, like=ref, **tree_inputs(ref))
                self.assertEqual(g.format_version, version)
                back = m2r2_golden.read(out)
                self.assertEqual(back.round_trees, ref.round_trees)
                for name, t in ref.m2r2_tensors().items():
                    np.testing.assert_array_equal(back.m2r2_tensors()[name], t, err_msg=name)
                for key in ("draft_tree", "gate", "tree_threshold", "prompt_lookup"):
                    self.assertEqual(back.metadata.get(key), ref.metadata.get(key), key)

    def test_refuses_inputs_that_do_not_fit(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GROWN_TREE"))
        out = self.path("bad.golden.safetensors")
        inputs = tree_inputs(ref)
        short = dict(inputs, draft_logits=ref.draft_logits[1:])
        with self.assertRaisesRegex(ValueError, "draft_logits"):
            m2r2_golden.write_tree(out, like=ref, **short)
        self.assertFalse(Path(out).exists())
        self.assertFalse(Path(out + ".partial").exists())
        scores = [row[1:] for row in inputs["round_scores"]]
        with self.assertRaisesRegex(ValueError, "round_scores"):
            m2r2_golden.write_tree(out, like=ref, **dict(inputs, round_scores=scores))
        with self.assertRaisesRegex(ValueError, "round 0's tree"):
            m2r2_golden.write_tree(out, like=ref, **dict(inputs, round_trees=[[1]] + inputs["round_trees"][1:]))
        greedy = reference_golden("M2R2_GOLDEN_GREEDY")
        with self.assertRaisesRegex(ValueError, "not a token-tree golden"):
            m2r2_golden.write_tree(out, like=greedy, **inputs)
        # an empty prompt, no step: what the reference never writes and `golden check` refuses
        for change, needle in (
            (dict(prompt_tokens=[]), "`prompt_tokens` is empty"),
            (dict(tokens=[], logits=ref.logits[:0]), "`tokens` and `logits` record no step"),
        ):
            with self.subTest(needle=needle):
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write_tree(out, like=ref, **dict(inputs, **change))
                self.assertIn(needle, str(e.exception))
                self.assertIn(out, str(e.exception))
        self.assertFalse(Path(out).exists())

    def test_a_like_whose_weights_hash_the_reference_refuses(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_TREE"))
        out = self.path("tree.golden.safetensors")
        for bad in ("not-a-hash", -1):
            with self.subTest(m2r2_weights_hash=bad):
                like = m2r2_golden.Golden(
                    **arrays(ref, GREEDY_TENSORS),
                    metadata={**ref.metadata, "m2r2_weights_hash": bad},
                )
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write_tree(out, like=like, **tree_inputs(ref))
                self.assertIn(out, str(e.exception))
                self.assertIn("`like`", str(e.exception))
                self.assertIn(f"metadata `m2r2_weights_hash` = {bad!r}", str(e.exception))
        self.assertEqual(os.listdir(self.dir.name), [])

    @unittest.skipIf(os.name != "posix", "file modes are POSIX")
    def test_the_mode_of_a_plain_open_and_no_other_file_touched(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_TREE"))
        plain = self.path("plain")
        open(plain, "w").close()
        out = self.path("tree.golden.safetensors")
        # a file of the user's that a fixed temporary name would take
        mine = Path(out + ".partial")
        mine.write_text("mine")
        m2r2_golden.write_tree(out, like=ref, **tree_inputs(ref))
        mode = lambda p: os.stat(p).st_mode & 0o777  # noqa: E731
        self.assertEqual(mode(out), mode(plain))
        self.assertEqual(mine.read_text(), "mine")
        with self.assertRaises(ValueError):
            m2r2_golden.write_tree(
                out, like=ref, **dict(tree_inputs(ref), draft_logits=ref.draft_logits[1:])
            )
        self.assertEqual(mine.read_text(), "mine")
        left = sorted(os.listdir(self.dir.name))
        self.assertEqual(left, sorted(["plain", Path(out).name, mine.name]))

    def test_refuses_what_does_not_fit_the_recipe_or_the_tokens(self):
        fixed = m2r2_golden.read(reference_golden("M2R2_GOLDEN_TREE"))
        out = self.path("bad.golden.safetensors")
        inputs = tree_inputs(fixed)
        v = fixed.vocab_size
        tokens = fixed.tokens.copy()
        tokens[2] = (tokens[2] + 1) % v  # round 0 emits tokens 1..4: one differs
        tree_tokens = [list(row) for row in inputs["round_tree_tokens"]]
        tree_tokens[0][6] = v
        roots = [list(row) for row in inputs["round_tree_tokens"]]
        roots[1][0] = (roots[1][0] + 1) % v
        node = fixed.round_node.astype(np.float64) + 0.7
        r = len(fixed.round_trees)
        cases = [
            (dict(tokens=tokens), "round 0 emits"),
            (dict(round_tree_tokens=tree_tokens), f"round 0 holds token id {v} >= V = {v}"),
            (dict(round_tree_tokens=roots), "`round_tree_tokens` of round 1: the root (node 0)"),
            (dict(verify_logits=fixed.verify_logits[:, :-1]), "`verify_logits` has shape"),
            (dict(draft_logits=fixed.draft_logits[:, :-1]), "`draft_logits` has shape"),
            (dict(round_node=node), "`round_node` must hold integers"),
            (dict(round_node=[99] * r), "`round_node` of round 0 is 99"),
            (dict(round_node=fixed.round_node[:1]), f"`round_node` has 1 entries for the {r}"),
            (dict(round_lookup=[[] for _ in range(r)]), "`round_lookup` given, but the recipe"),
            (dict(round_scores=[[] for _ in range(r)]), "`round_scores` given, but the recipe"),
            (dict(round_trees=None), "`round_trees` must hold one entry per round"),
            (dict(round_node=None), "`round_node`"),
            (dict(round_tree_tokens=None), "`round_tree_tokens` must hold one entry per round"),
            (dict(round_trees=[[0, "x"]] * r), "`round_trees[0]` must hold integers"),
            (
                dict(round_trees=[[0, 0, 1, 1, 3, 4]] * r),
                "`round_trees`: round 0's tree [0, 0, 1, 1, 3, 4] is not the recipe's 2,1,1",
            ),
        ]
        for change, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(ValueError) as e:
                    m2r2_golden.write_tree(out, like=fixed, **{**inputs, **change})
                self.assertIn(needle, str(e.exception))
                self.assertIn(out, str(e.exception))
        self.assertEqual(os.listdir(self.dir.name), [])
        # a grown recipe with a branch takes both, and trees of their own
        grown = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GROWN_TREE"))
        inputs = tree_inputs(grown)
        m2r2_golden.write_tree(out, like=grown, **inputs)
        trees = [[0, 0, 1, 2, 3, 4, 5]] + inputs["round_trees"][1:]
        with self.assertRaises(ValueError) as e:
            m2r2_golden.write_tree(out, like=grown, **dict(inputs, round_trees=trees))
        self.assertIn("`round_tree_tokens` of round 0 has 5 tokens, its tree 8", str(e.exception))


if __name__ == "__main__":
    unittest.main()
