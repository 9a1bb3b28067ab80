"""Tests of m2r2_golden (stdlib unittest), run by tests/cli/golden_python.rs.

Goldens written by the reference come in by environment variable (the Rust test writes them with
`m2r2 golden write`): M2R2_GOLDEN_GREEDY (tiny, greedy), M2R2_GOLDEN_SPECULATIVE (tiny, the same
prompt and steps, `--mode speculative --draft-len 2`) and M2R2_GOLDEN_EARLY_EXIT (the same,
`--mode early-exit`). A missing variable fails the tests that need it; nothing is skipped.
"""

import json
import os
import tempfile
import unittest
from pathlib import Path

import numpy as np
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


class ReadReferenceGoldens(unittest.TestCase):
    def test_greedy(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        self.assertEqual((g.format_version, g.mode, g.model), (1, "greedy", "tiny"))
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

    def test_speculative(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        self.assertEqual((g.format_version, g.mode), (2, "speculative"))
        self.assertEqual(g.metadata["draft_max"], "2")
        self.assertRegex(g.m2r2_hash, r"^[0-9a-f]{16}$")
        self.assertIn("gates", g.m2r2_config)
        r = g.round_accepted.shape[0]
        self.assertGreater(r, 0)
        self.assertEqual(g.round_drafted.shape, (r, 2))
        self.assertEqual(g.round_base_token.shape, (r,))
        self.assertEqual(g.round_scores.shape, (r, 3))
        self.assertEqual(g.round_scores.dtype, np.float32)
        names = m2r2_golden.golden.M2R2_TENSORS["speculative"]
        self.assertEqual(sorted(g.m2r2_tensors()), sorted(names))
        # every round emits its accepted drafts and one base token; the last may be cut at n
        self.assertGreaterEqual(int((g.round_accepted + 1).sum()), len(g.tokens))
        # lossless: self-speculative decoding emits the greedy tokens
        greedy = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        self.assertEqual(g.tokens.tolist(), greedy.tokens.tolist())
        self.assertEqual(g.config_hash, greedy.config_hash)

    def test_early_exit(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_EARLY_EXIT"))
        self.assertEqual((g.format_version, g.mode), (2, "early-exit"))
        n, j = len(g.tokens), len(g.m2r2_config["gates"])
        self.assertEqual(g.exit_gate.shape, (n,))
        self.assertEqual(g.gate_scores.shape, (n, j))
        self.assertTrue(((g.exit_gate >= 0) & (g.exit_gate <= j)).all())
        self.assertIn(g.metadata["kv_policy"], ("exact", "fast-kv"))
        self.assertIsNone(g.round_drafted)


class Write(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name: str) -> str:
        return str(Path(self.dir.name) / name)

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
            self.assertEqual((g.format_version, g.mode, g.model), (1, "greedy", ref.model))
            # copied verbatim, never re-serialised
            self.assertEqual(g.config_json, ref.config_json)
            self.assertEqual(g.config_hash, ref.config_hash)
            self.assertTrue(g.metadata["m2r2_version"].startswith("m2r2-golden-python "))
            np.testing.assert_array_equal(g.prompt_tokens, ref.prompt_tokens)
            np.testing.assert_array_equal(g.tokens, ref.tokens)
            np.testing.assert_array_equal(g.logits, logits.astype(np.float32))
            self.assertEqual(g.logits.dtype, np.float32)
            self.assertTrue(g.logits.flags.c_contiguous)
        self.assertEqual(back.metadata, written.metadata)

    def test_like_a_speculative_golden_writes_greedy(self):
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        out = self.path("mine.golden.safetensors")
        m2r2_golden.write(
            out, prompt_tokens=spec.prompt_tokens, tokens=spec.tokens, logits=spec.logits, like=spec
        )
        back = m2r2_golden.read(out)
        self.assertEqual((back.format_version, back.mode), (1, "greedy"))
        self.assertNotIn("m2r2_hash", back.metadata)
        self.assertIsNone(back.round_drafted)

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
            config_hash="0123456789abcdef",
        )
        back = m2r2_golden.read(out)
        self.assertEqual(back.config_json, config)
        self.assertEqual(back.config, {"vocab_size": 4, "rms_norm_eps": 1e-5})
        self.assertEqual(back.prompt_tokens.dtype, np.int64)
        self.assertEqual(back.logits.shape, (1, 4))

    def test_refuses_inputs_that_do_not_fit(self):
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        out = self.path("bad.safetensors")
        good = dict(prompt_tokens=ref.prompt_tokens, tokens=ref.tokens, logits=ref.logits)
        cases = [
            (dict(tokens=ref.tokens[None]), "`tokens` must be 1-D"),
            (dict(tokens=ref.tokens.astype(np.float32)), "`tokens` must hold integers"),
            (dict(prompt_tokens=[1, -2]), "`prompt_tokens` holds token id -2"),
            (dict(logits=ref.logits[:-1]), "`logits` has 5 rows but there are 6 tokens"),
            (dict(logits=ref.logits[0]), "`logits` must be 2-D"),
            (dict(logits=ref.logits.astype(np.int64)), "`logits` must hold floats"),
            (dict(logits=np.pad(ref.logits, ((0, 0), (0, 64)))), "vocab_size"),
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


class ReadRefusals(unittest.TestCase):
    """Files that are not valid goldens: a ValueError naming the file and the tensor or key."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))

    def save(self, tensors=None, **metadata) -> str:
        """The reference golden with some tensors and metadata replaced (None removes one)."""
        t = {
            "prompt_tokens": self.ref.prompt_tokens,
            "tokens": self.ref.tokens,
            "logits": self.ref.logits,
        }
        t.update(tensors or {})
        m = {**self.ref.metadata, **metadata}
        path = str(Path(self.dir.name) / "bad.golden.safetensors")
        save_file(
            {k: v for k, v in t.items() if v is not None},
            path,
            metadata={k: v for k, v in m.items() if v is not None},
        )
        return path

    def assertRefused(self, path: str, *needles: str):
        with self.assertRaises(ValueError) as e:
            m2r2_golden.read(path)
        for needle in (path, *needles):
            self.assertIn(needle, str(e.exception))

    def test_wrong_format_key(self):
        self.assertRefused(self.save(format="m2r2-goldn"), "not a golden file", "`format`")
        self.assertRefused(self.save(format=None), "metadata `format` is missing")
        self.assertRefused(self.save(config_hash=None), "metadata `config_hash` is missing")
        self.assertRefused(self.save(config="{oops"), "metadata `config` is not valid JSON")

    def test_unsupported_versions_and_modes(self):
        self.assertRefused(self.save(format_version="3"), "format version 3 is not supported")
        self.assertRefused(self.save(mode="speculative"), "version 1 has no mode `speculative`")
        self.assertRefused(
            self.save(format_version="2", mode="sampled"), "unknown golden mode `sampled`"
        )

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

    def test_metadata_is_kept_verbatim(self):
        g = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        # the reference's JSON text: 1e-5 as serde_json writes it, not as Python would
        self.assertIn('"rms_norm_eps":0.00001', g.config_json)
        self.assertNotEqual(json.dumps(g.config, separators=(",", ":")), g.config_json)


if __name__ == "__main__":
    unittest.main()
