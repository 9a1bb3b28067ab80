//! Goldens of token trees that change from round to round (format version 5): trees grown per
//! branch by the draft gate's score and rounds with a prompt-lookup branch round-trip and check
//! themselves bit for bit, record greedy decoding's tokens, report a tampered tree, token or
//! score where it differs, and a reader refuses a file that does not agree with itself.

use super::tests::{RawGolden, refused_after, rewrite, round_trip, set_i64, set_meta, setup};
use super::tree::TreeRecipe;
use super::*;
use crate::decode::prompt_lookup::LookupConfig;
use crate::golden::{
    DEFAULT_ATOL, GROWN_TREE_FORMAT_VERSION, Golden, TREE_FORMAT_VERSION, TensorCheck, Tolerance,
};
use crate::io::builtin;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;

/// A prompt that repeats itself, so lookup finds branches.
const PROMPT: [u32; 7] = [1, 2, 3, 4, 1, 2, 3];

fn record(m2r2: M2r2<'_>, recipe: &TreeRecipe, steps: usize) -> Golden {
    Golden::record_tree_drafting(m2r2, "tiny", &PROMPT, steps, recipe, &[]).unwrap()
}

fn rounds_of(g: &Golden) -> &TreeRounds {
    match g.m2r2.as_ref().map(|m| &m.record) {
        Some(M2r2Record::SpeculativeTree { rounds, .. }) => rounds,
        other => panic!("not a tree golden: {other:?}"),
    }
}

fn rounds_mut(g: &mut Golden) -> &mut TreeRounds {
    match g.m2r2.as_mut().map(|m| &mut m.record) {
        Some(M2r2Record::SpeculativeTree { rounds, .. }) => rounds,
        _ => panic!("not a tree golden"),
    }
}

/// 20 tokens grown with a lookup branch (the third of [`recipes`]), and its first round that
/// verified a branch.
fn grown_with_lookup(m2r2: M2r2<'_>) -> (Golden, usize) {
    let g = record(m2r2, &recipes(m2r2)[2], 20);
    let r = lookup_round(rounds_of(&g));
    (g, r)
}

/// The first round that verified a lookup branch.
fn lookup_round(rounds: &TreeRounds) -> usize {
    (0..rounds.len())
        .find(|&r| !rounds.lookup[r].is_empty())
        .expect("a lookup round")
}

/// A threshold that grows some nodes and not others: the median of the confidence gate's scores
/// when every node grows.
fn median_threshold(m2r2: M2r2<'_>, widths: &[usize]) -> f32 {
    let recipe = TreeRecipe {
        grown: Some((GateKind::Confidence, 0.0)),
        ..TreeRecipe::fixed(1, widths)
    };
    let g = record(m2r2, &recipe, 16);
    let mut scores: Vec<f32> = rounds_of(&g)
        .scores
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .collect();
    scores.sort_by(f32::total_cmp);
    scores[scores.len() / 2]
}

/// The recipes of these tests on one model: grown, with a lookup branch, both.
fn recipes(m2r2: M2r2<'_>) -> Vec<TreeRecipe> {
    let grown = Some((GateKind::Confidence, median_threshold(m2r2, &[2, 1, 1])));
    let lookup = Some(LookupConfig::new(3));
    vec![
        TreeRecipe {
            grown,
            ..TreeRecipe::fixed(1, &[2, 1, 1])
        },
        TreeRecipe {
            lookup,
            ..TreeRecipe::fixed(1, &[2, 1])
        },
        TreeRecipe {
            grown,
            lookup,
            ..TreeRecipe::fixed(1, &[2, 1, 1])
        },
    ]
}

/// Written as version 5, read back equal, greedy decoding's tokens and logits bit for bit, and
/// checked by the reference with no difference at all, the grown recipes' scores included;
/// rounds of more than one tree, and lookup branches, were recorded.
#[test]
fn varying_trees_round_trip_and_self_check() {
    for name in builtin::BUILTIN_NAMES {
        let (model, weights) = setup(name);
        let m2r2 = M2r2::new(&model, &weights);
        let greedy = Golden::record_greedy(&model, name, &PROMPT, 20).unwrap();
        for recipe in recipes(m2r2) {
            let g = record(m2r2, &recipe, 20);
            assert_eq!(g.format_version(), GROWN_TREE_FORMAT_VERSION);
            let back = round_trip(&g);
            assert_eq!(back.tokens, greedy.tokens, "{name} {recipe:?}");
            assert!(
                back.logits
                    .iter()
                    .zip(&greedy.logits)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} {recipe:?}"
            );
            let rounds = rounds_of(&back);
            if recipe.grown.is_some() {
                let first = &rounds.trees[0];
                assert!(
                    rounds.trees.iter().any(|t| t != first),
                    "{name} {recipe:?}: every round grew the same tree"
                );
            }
            if recipe.lookup.is_some() {
                assert!(
                    rounds.lookup.iter().any(|l| !l.is_empty()),
                    "{name} {recipe:?}: no round with a lookup branch"
                );
            }
            let report = back.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
            assert!(report.ok(), "{report:?}");
            assert!(
                report
                    .entries
                    .iter()
                    .all(|e| e.max_abs == 0.0 && e.skipped.is_none()),
                "{report:?}"
            );
            let names: Vec<&str> = report.entries.iter().map(|e| e.name.as_str()).collect();
            let mut want = vec![
                "tokens",
                "rounds",
                "logits",
                "verify_logits",
                "draft_logits",
            ];
            if recipe.grown.is_some() {
                want.push("round_scores");
            }
            assert_eq!(names, want);
        }
    }
}

/// A fixed tree is still written as version 4, without the per-round tensors.
#[test]
fn a_fixed_recipe_stays_version_4() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let g = record(m2r2, &TreeRecipe::fixed(1, &[2, 1]), 8);
    assert_eq!(g.format_version(), TREE_FORMAT_VERSION);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    g.write(&path).unwrap();
    rewrite(&path, |(tensors, meta): &mut RawGolden| {
        for name in ["round_tree_parents", "round_lookup", "round_scores"] {
            assert!(tensors.iter().all(|t| t.0 != name), "{name}");
        }
        assert!(!meta.contains_key("tree_threshold") && !meta.contains_key("prompt_lookup"));
    });
}

/// A tampered tree, lookup token or score is reported at its round: the tree by the node whose
/// parent differs, the token by its node and depth, the score on `draft.onnx`'s `round_scores`.
#[test]
fn tampered_trees_tokens_and_scores_are_reported() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let (g, r) = grown_with_lookup(m2r2);
    let rounds = rounds_of(&g);
    let branch = rounds.lookup[r][0];

    let mut tampered = g.clone();
    rounds_mut(&mut tampered).tokens[[r, branch]] += 1;
    let report = tampered.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    let e = report.entries.iter().find(|e| e.name == "rounds").unwrap();
    let d = e.divergence.as_ref().unwrap();
    assert_eq!(
        (d.row, d.what.clone()),
        (r, format!("node {branch} (depth 1) token"))
    );

    // the round's tree with its last node dropped: the rounds compared name the node
    let mut other = rounds.clone();
    let last = rounds.trees[r].nodes() - 1;
    let parents: Vec<usize> = (1..last)
        .map(|i| rounds.trees[r].parent(i).unwrap())
        .collect();
    other.trees[r] = crate::base::tree::TokenTree::from_parents(&parents).unwrap();
    let e = super::compare_tree_rounds("engine", rounds, &other, None, Against::Recomputed);
    let d = e.divergence.as_ref().unwrap();
    assert_eq!(
        (d.row, d.what.clone(), d.recomputed.clone()),
        (r, format!("tree: node {last}'s parent"), vec![])
    );

    // a score moved: the draft's line alone
    let mut tampered = g.clone();
    rounds_mut(&mut tampered).scores[[r, 0]] += 0.25;
    let report = tampered.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    let bad: Vec<&TensorCheck> = report.entries.iter().filter(|e| !e.ok).collect();
    assert_eq!(bad.len(), 1, "{report:?}");
    assert_eq!(
        (bad[0].name.as_str(), bad[0].first_row),
        ("round_scores", Some(r))
    );
}

/// A reader refuses a varying-tree file that does not agree with itself, naming the file and
/// what; such a golden is never written below version 5.
#[test]
fn inconsistent_varying_tree_files_are_refused() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let (g, r) = grown_with_lookup(m2r2);
    let rounds = rounds_of(&g);
    let (width, branch_width) = (
        rounds.tokens.ncols() - 1,
        rounds.lookup.iter().map(Vec::len).max().unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let refused =
        |edit: &dyn Fn(&mut RawGolden), needle: &str| refused_after(&g, &path, edit, needle);
    // node 1's parent cannot be itself
    refused(
        &set_i64("round_tree_parents", r * width, 1),
        &format!("tensor `round_tree_parents`: round {r}"),
    );
    refused(
        &set_i64("round_lookup", r * branch_width, 0),
        &format!("tensor `round_lookup`: round {r}: node 0 is not the branch's node of depth 1"),
    );
    refused(
        &|(tensors, _): &mut RawGolden| {
            let t = tensors.iter_mut().find(|t| t.0 == "round_scores").unwrap();
            let s = t.2[1];
            let at = 4 * (r * s);
            t.3[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        },
        &format!("tensor `round_scores`: round {r} holds 0 scores"),
    );
    refused(
        &set_meta("tree_threshold", "inf"),
        "metadata `tree_threshold` = `inf`",
    );
    refused(&set_meta("gate", "none"), "metadata `gate` = `none`");
    refused(
        &set_meta("prompt_lookup_ngram", "3,2"),
        "metadata `prompt_lookup_ngram` = `3,2`",
    );
    refused(
        &set_meta("format_version", "4"),
        "trees that change from round to round are format version 5, this file says 4",
    );
    let mut old = g.clone();
    old.version = TREE_FORMAT_VERSION;
    let err = old.write(&path).unwrap_err().to_string();
    assert!(err.contains("format version 5 at least"), "{err}");
}

/// Two varying-tree goldens compare file to file (the scores that grew the trees too); other
/// recipes are refused by name.
#[test]
fn varying_tree_goldens_compare_file_to_file() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let tol = Tolerance::absolute(DEFAULT_ATOL);
    let all = recipes(m2r2);
    let g = record(m2r2, &all[2], 12);
    let report = g.compare_to(&g, tol, &|_| None).unwrap();
    assert!(report.ok(), "{report:?}");
    let names: Vec<&str> = report.entries.iter().map(|e| e.name.as_str()).collect();
    assert!(
        names.ends_with(&["draft_logits", "round_scores"]),
        "{names:?}"
    );
    // a moved score fails round_scores alone, at its round
    let mut moved = g.clone();
    rounds_mut(&mut moved).scores[[1, 0]] += 0.25;
    let report = g.compare_to(&moved, tol, &|_| None).unwrap();
    let bad: Vec<&TensorCheck> = report.entries.iter().filter(|e| !e.ok).collect();
    assert_eq!(bad.len(), 1, "{report:?}");
    assert_eq!(
        (bad[0].name.as_str(), bad[0].first_row),
        ("round_scores", Some(1))
    );
    let other = record(m2r2, &all[0], 12);
    let err = g
        .compare_to(&other, tol, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("different token trees") && err.contains("a lookup branch of up to 3"),
        "{err}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// Any edit of one integer of a varying-tree file (its trees, branches, tokens, accepted
    /// nodes, draft rows) is read and checked without a panic: refused by the reader, or read
    /// and checked (OK or NOT OK), or refused by the check.
    #[test]
    fn edited_varying_tree_files_never_panic(
        tensor in 0usize..6,
        index in 0usize..1000,
        value in -3i64..70,
    ) {
        use std::sync::OnceLock;
        static GOLDEN: OnceLock<Vec<u8>> = OnceLock::new();
        let (model, weights) = setup("tiny");
        let m2r2 = M2r2::new(&model, &weights);
        let bytes = GOLDEN.get_or_init(|| {
            let recipe = TreeRecipe {
                grown: Some((GateKind::Confidence, 0.5)),
                lookup: Some(LookupConfig::new(3)),
                ..TreeRecipe::fixed(1, &[2, 1, 1])
            };
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("g.safetensors");
            record(m2r2, &recipe, 16).write(&path).unwrap();
            std::fs::read(&path).unwrap()
        });
        let name = [
            "round_tree_parents",
            "round_lookup",
            "round_tree_tokens",
            "round_node",
            "round_accepted",
            "draft_rows",
        ][tensor];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        std::fs::write(&path, bytes).unwrap();
        rewrite(&path, |(tensors, _): &mut RawGolden| {
            let t = tensors.iter_mut().find(|t| t.0 == name).unwrap();
            let n = t.3.len() / 8;
            if n > 0 {
                let at = 8 * (index % n);
                t.3[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
        });
        if let Ok(golden) = Golden::read(&path) {
            let _ = golden.check_m2r2(m2r2, DEFAULT_ATOL);
        }
    }
}
