"""What a golden says about itself, checked as the reference's reader checks it
(reference/src/golden/metadata.rs and m2r2/rounds.rs; its tests in
reference/src/golden/m2r2/metadata_tests.rs): a `config` edited under its `config_hash`, tensors
and metadata keys a golden of its kind does not record, an rtol pinned in an M2R2 golden, and
rounds whose own token tensors are off, named before the rows they imply. Run with
test_golden.py (the same reference goldens, by environment variable)."""

import json

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

import m2r2_golden
from test_golden import TempDir, arrays, reference_golden, rehashed

# The reference goldens test_golden.py reads, and how a refusal names their kind.
KINDS = {
    "M2R2_GOLDEN_GREEDY": "greedy golden",
    "M2R2_GOLDEN_EARLY_EXIT": "early-exit golden",
    "M2R2_GOLDEN_SPECULATIVE": "speculative golden",
    "M2R2_GOLDEN_TREE": "token-tree golden (a fixed tree)",
    "M2R2_GOLDEN_GROWN_TREE": "token-tree golden (trees that change from round to round)",
}


class Metadata(TempDir):
    def save(self, var: str, tensors=None, **metadata) -> str:
        """The reference golden of ``var`` with some tensors and metadata replaced (None removes
        one)."""
        path = reference_golden(var)
        with safe_open(path, framework="np") as f:
            meta = {**dict(f.metadata()), **metadata}
        t = {**load_file(path), **(tensors or {})}
        return self.saved("edited.golden.safetensors", t, meta)

    def test_a_config_edited_under_its_hash(self):
        """A check compares `config_hash` alone: a `config` edited under it (another
        architecture, other sizes), or a hash edited over the config, is refused naming both."""
        for var in KINDS:
            g = m2r2_golden.read(reference_golden(var))
            self.assertEqual(g.config_hash, rehashed(g.config_json)["config_hash"])
            bigger = {**g.config, "num_hidden_layers": 4, "hidden_size": 32}
            for edited in ('{"architecture":"llama"}', json.dumps(bigger)):
                with self.subTest(golden=var, config=edited[:30]):
                    self.assertRefused(
                        self.save(var, config=edited),
                        f"metadata `config` does not hash to `config_hash` = `{g.config_hash}`",
                    )
            self.assertRefused(
                self.save(var, config_hash="0123456789abcdef"),
                "does not hash to `config_hash` = `0123456789abcdef`",
            )
        # a writer given a config and a hash that is not its own refuses them
        ref = m2r2_golden.read(reference_golden("M2R2_GOLDEN_GREEDY"))
        good = arrays(ref, ("prompt_tokens", "tokens", "logits"))
        out = self.path("mine.golden.safetensors")
        with self.assertRaisesRegex(ValueError, "is not the hash of `config_json`"):
            m2r2_golden.write_greedy(
                out, model="m", config_json=ref.config_json + " ", config_hash=ref.config_hash,
                **good,
            )

    def test_unknown_tensors_and_metadata_keys(self):
        """Every kind reads as written; a tensor or key it does not record is refused, every one
        named, and so is one that another kind (or a later version) records."""
        others = {
            "M2R2_GOLDEN_GREEDY": "exit_gate",
            "M2R2_GOLDEN_EARLY_EXIT": "round_drafted",
            "M2R2_GOLDEN_SPECULATIVE": "draft_rows",
            "M2R2_GOLDEN_TREE": "round_lookup",
            "M2R2_GOLDEN_GROWN_TREE": "round_drafted",
        }
        for var, kind in KINDS.items():
            with self.subTest(golden=var):
                m2r2_golden.read(self.save(var))
                junk = {"junk": np.zeros(1, np.float32)}
                self.assertRefused(
                    self.save(var, junk, foo="bar"),
                    f"holds metadata `foo`, tensor `junk`, which no {kind} of format version",
                )
                other = {others[var]: np.zeros(0, np.int64)}
                self.assertRefused(self.save(var, other), f"holds tensor `{others[var]}`")
        self.assertRefused(
            self.save("M2R2_GOLDEN_GREEDY", tree_threshold="0.5"),
            "holds metadata `tree_threshold`, which no greedy golden of format version 3",
        )

    def test_an_rtol_pinned_in_an_m2r2_golden(self):
        """`golden check` takes an M2R2 golden's tolerance as atol alone: a file that pins an
        rtol is refused by name, and the speculative writers refuse the argument; a greedy golden
        pins one."""
        for var in list(KINDS)[1:]:
            mode = m2r2_golden.read(reference_golden(var)).mode
            with self.subTest(golden=var):
                self.assertRefused(
                    self.save(var, rtol="0.1"),
                    f"metadata `rtol` = `0.1` is pinned in an M2R2 golden (mode `{mode}`)",
                )
        greedy = m2r2_golden.read(self.save("M2R2_GOLDEN_GREEDY", rtol="0.1"))
        self.assertEqual(greedy.rtol, 0.1)
        spec = m2r2_golden.read(reference_golden("M2R2_GOLDEN_SPECULATIVE"))
        rounds = arrays(
            spec,
            ("prompt_tokens", "tokens", "logits", "round_drafted", "round_accepted")
            + ("round_base_token", "round_scores", "verify_logits", "draft_logits"),
        )
        out = self.path("spec.golden.safetensors")
        with self.assertRaisesRegex(ValueError, "`rtol` is for greedy goldens"):
            m2r2_golden.write_speculative(out, like=spec, rtol=0.1, **rounds)
        tree = m2r2_golden.read(reference_golden("M2R2_GOLDEN_TREE"))
        with self.assertRaisesRegex(ValueError, "`rtol` is for greedy goldens"):
            m2r2_golden.write_tree(
                out, like=tree, rtol=0.1, prompt_tokens=tree.prompt_tokens, tokens=tree.tokens,
                logits=tree.logits, round_trees=[t.parents for t in tree.round_trees],
                round_tree_tokens=tree.round_tree_tokens, round_node=tree.round_node,
                round_accepted=tree.round_accepted, round_base_token=tree.round_base_token,
                verify_logits=tree.verify_logits, draft_logits=tree.draft_logits,
            )

    def test_round_tokens_before_the_rows_they_imply(self):
        """A chain round's drafts (token ids below the vocabulary, then -1 padding, all
        `draft_max` of them when the draft length is fixed) and base token, and a tree round's
        node and base tokens, are refused by their tensor and round, before the rows of
        `verify_logits` they imply are compared."""
        var = "M2R2_GOLDEN_SPECULATIVE"
        spec = m2r2_golden.read(reference_golden(var))
        self.assertEqual(spec.round_drafted.shape, (2, 2))
        for (r, j, value), needle in [
            ((1, 1, -1), "round 1 drafted 1 tokens, but a fixed draft length drafts `draft_max` = 2"),
            ((1, 0, -1), "round 1 holds 3 at draft 1, after its 0 drafts"),
            ((1, 0, -2), "round 1 holds -2 at draft 0, after its 0 drafts"),
            ((1, 0, 320), "round 1 holds token id 320 at draft 0, outside the vocabulary of 320"),
        ]:
            drafted = spec.round_drafted.copy()
            drafted[r, j] = value
            with self.subTest(drafted=drafted.tolist()):
                self.assertRefused(
                    self.save(var, {"round_drafted": drafted}), f"tensor `round_drafted`: {needle}"
                )
        for var in ("M2R2_GOLDEN_SPECULATIVE", "M2R2_GOLDEN_TREE", "M2R2_GOLDEN_GROWN_TREE"):
            g = m2r2_golden.read(reference_golden(var))
            for value, why in ((320, ", outside the vocabulary of 320 tokens"), (-1, "")):
                base = g.round_base_token.copy()
                base[0] = value
                with self.subTest(golden=var, base=value):
                    self.assertRefused(
                        self.save(var, {"round_base_token": base}),
                        f"tensor `round_base_token`: round 0 holds token id {value}{why}",
                    )
            if g.round_tree_tokens is not None:
                tokens = g.round_tree_tokens.copy()
                tokens[0, 1] = 320
                self.assertRefused(
                    self.save(var, {"round_tree_tokens": tokens}),
                    "tensor `round_tree_tokens`: round 0 node 1 holds token id 320, outside the "
                    "vocabulary of 320 tokens",
                )
