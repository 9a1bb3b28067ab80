//! Token-tree goldens: round trips, self-checks, every node's row and every proposal checked,
//! tampering reported at its round and node, inconsistent files refused, a chain-shaped tree
//! recording what the chain golden records.

use super::check::DraftTies;
use super::tests::{RawGolden, refused_after, round_trip, set_i64, set_meta, setup, spec_options};
use super::tree::{TreeEngine, TreeRounds, proposing_nodes};
use super::*;
use crate::base::generate::ReferenceGreedy;
use crate::base::tree::TokenTree;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::golden::{DEFAULT_ATOL, Golden, TREE_FORMAT_VERSION, TensorCheck, Tolerance};
use crate::io::builtin;
use crate::m2r2::fast_stream::M2r2;

fn tree_golden(m2r2: M2r2<'_>, widths: &[usize], steps: usize) -> Golden {
    Golden::record_tree_speculative(m2r2, "tiny", &[1, 2, 3], steps, 1, widths, &[]).unwrap()
}

fn parts(g: &Golden) -> (&[usize], &TreeRounds, &GraphOutputs) {
    match g.m2r2.as_ref().map(|m| &m.record) {
        Some(M2r2Record::SpeculativeTree {
            recipe,
            rounds,
            graphs,
        }) => (&recipe.widths, rounds, graphs),
        other => panic!("not a tree golden: {other:?}"),
    }
}

fn parts_mut(g: &mut Golden) -> (&mut TreeRounds, &mut GraphOutputs) {
    match g.m2r2.as_mut().map(|m| &mut m.record) {
        Some(M2r2Record::SpeculativeTree { rounds, graphs, .. }) => (rounds, graphs),
        _ => panic!("not a tree golden"),
    }
}

/// Written as version 4, read back equal, greedy decoding's tokens and logits bit for bit, and
/// checked by the reference with no difference at all; the tensors have the documented shapes.
#[test]
fn tree_round_trip_and_self_check() {
    for name in builtin::BUILTIN_NAMES {
        let (model, weights) = setup(name);
        let m2r2 = M2r2::new(&model, &weights);
        let greedy = Golden::record_greedy(&model, name, &[1, 2, 3], 14).unwrap();
        for widths in [&[2, 1, 1][..], &[3, 2], &[1, 1, 1], &[4]] {
            let g = tree_golden(m2r2, widths, 14);
            assert_eq!(g.format_version(), TREE_FORMAT_VERSION);
            assert_eq!(g.draft_tree(), Some(widths));
            let back = round_trip(&g);
            assert_eq!(back.tokens, greedy.tokens, "{name} {widths:?}");
            assert!(
                back.logits
                    .iter()
                    .zip(&greedy.logits)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} {widths:?}"
            );
            let (_, rounds, graphs) = parts(&back);
            let tree = TokenTree::from_widths(widths).unwrap();
            let (r, t) = (rounds.len(), tree.nodes());
            assert_eq!(rounds.tokens.dim(), (r, t));
            assert_eq!(graphs.verify_logits.nrows(), 1 + r * t);
            assert_eq!(
                graphs.draft_logits.nrows(),
                r * proposing_nodes(&tree).len()
            );
            assert_eq!(graphs.verify_logits.row(0), back.logits.row(0));
            let report = back.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
            assert!(report.ok(), "{report:?}");
            assert!(
                report
                    .entries
                    .iter()
                    .all(|e| e.max_abs == 0.0 && e.skipped.is_none())
            );
            let names: Vec<&str> = report.entries.iter().map(|e| e.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "tokens",
                    "rounds",
                    "logits",
                    "verify_logits",
                    "draft_logits"
                ]
            );
        }
    }
}

/// A tree of one branch per depth is a chain: its golden records the chain golden's rounds,
/// verified rows and proposals (the same rows in the same order), bit for bit.
#[test]
fn a_chain_shaped_tree_records_the_chain_golden() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let tree = tree_golden(m2r2, &[1, 1, 1], 13);
    let options = spec_options(DraftLength::Fixed(3));
    let chain =
        Golden::record_speculative(m2r2, "tiny", &[1, 2, 3], 13, 1, None, &options).unwrap();
    assert_eq!(tree.tokens, chain.tokens);
    let (_, t, tg) = parts(&tree);
    let Some(M2r2Record::Speculative { rounds, graphs, .. }) =
        chain.m2r2.as_ref().map(|m| &m.record)
    else {
        unreachable!()
    };
    let cg = graphs.as_ref().unwrap();
    assert_eq!(t.len(), rounds.len());
    for r in 0..t.len() {
        assert_eq!(
            t.tokens.row(r).slice(ndarray::s![1..]).to_vec(),
            rounds.drafted_in(r)
        );
        assert_eq!(
            (t.accepted[r], t.base_token[r]),
            (rounds.accepted[r], rounds.base_token[r])
        );
    }
    let bits = |x: &ndarray::Array2<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&tg.verify_logits), bits(&cg.verify_logits));
    assert_eq!(bits(&tg.draft_logits), bits(&cg.draft_logits));
}

/// Every node's verified row and every proposal's logits are checked, accepted or not: a value
/// moved in a row of a node off the accepted path fails its tensor alone, at that row, round and
/// node.
#[test]
fn every_node_and_proposal_is_checked() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let g = tree_golden(m2r2, &[2, 2, 1], 14);
    let (widths, rounds, _) = parts(&g);
    let tree = TokenTree::from_widths(widths).unwrap();
    assert!(rounds.len() >= 2, "{rounds:?}");
    let r = 1;
    // a node of round 1 off its accepted path (the last node is a leaf of the last branch)
    let path = tree.path(rounds.node[r] as usize);
    let off = (0..tree.nodes()).rev().find(|i| !path.contains(i)).unwrap();
    let proposing = proposing_nodes(&tree);
    let off_proposer = *proposing.iter().rev().find(|i| !path.contains(i)).unwrap();
    let cases = [
        ("verify_logits", 1 + r * tree.nodes() + off, off),
        (
            "draft_logits",
            r * proposing.len() + proposing.iter().position(|&i| i == off_proposer).unwrap(),
            off_proposer,
        ),
    ];
    for (name, row, node) in cases {
        let mut tampered = g.clone();
        let (_, graphs) = parts_mut(&mut tampered);
        let target = match name {
            "verify_logits" => &mut graphs.verify_logits,
            _ => &mut graphs.draft_logits,
        };
        target[[row, 5]] += 0.5;
        let report = tampered.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
        let bad: Vec<&TensorCheck> = report.entries.iter().filter(|e| !e.ok).collect();
        assert_eq!(bad.len(), 1, "{report:?}");
        let e = bad[0];
        assert_eq!(
            (e.name.as_str(), e.first_row, e.first_round, e.first_node),
            (name, Some(row), Some(r), Some(node))
        );
        let row_name = if name == "verify_logits" {
            "verified row"
        } else {
            "proposal"
        };
        assert_eq!(
            e.first_failure().unwrap(),
            format!("{row_name} {row} (round {r}, node {node})")
        );
    }
}

/// An edited round is reported once, at its round, naming what differs: a node's token (with its
/// depth), the accepted node, the base token.
#[test]
fn tampered_rounds_are_reported_at_their_round_and_node() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let g = tree_golden(m2r2, &[2, 1, 1], 14);
    let tree = TokenTree::parse("2,1,1").unwrap();
    type Edit<'a> = (&'a str, &'a dyn Fn(&mut TreeRounds));
    let edits: [Edit; 2] = [
        ("node 6 (depth 3) token", &|r| r.tokens[[2, 6]] += 1),
        ("base token", &|r| r.base_token[2] += 1),
    ];
    for (what, edit) in edits {
        let mut tampered = g.clone();
        edit(parts_mut(&mut tampered).0);
        let report = tampered.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
        let rounds = report.entries.iter().find(|e| e.name == "rounds").unwrap();
        let d = rounds.divergence.as_ref().unwrap();
        assert!(!rounds.ok && d.row == 2 && d.what == what, "{rounds:?}");
        assert_eq!(d.golden, vec![d.recomputed[0] + 1]);
        assert_eq!(rounds.first_round, Some(2));
        let tokens = report.entries.iter().find(|e| e.name == "tokens").unwrap();
        assert!(tokens.ok, "{report:?}");
    }
    // the accepted node, moved to its sibling at the same depth (the file stays consistent)
    let mut tampered = g.clone();
    let rounds = parts_mut(&mut tampered).0;
    let r = (0..rounds.len())
        .find(|&r| rounds.accepted[r] > 0)
        .expect("a round that accepted a draft");
    let node = rounds.node[r] as usize;
    let level = tree.level(tree.depth(node));
    let sibling = if node + 1 < level.end {
        node + 1
    } else {
        node - 1
    };
    rounds.node[r] = sibling as i64;
    let report = round_trip(&tampered)
        .check_m2r2(m2r2, DEFAULT_ATOL)
        .unwrap();
    let e = report.entries.iter().find(|e| e.name == "rounds").unwrap();
    let d = e.divergence.as_ref().unwrap();
    assert_eq!(
        (
            d.row,
            d.what.as_str(),
            d.golden.clone(),
            d.recomputed.clone()
        ),
        (r, "accepted node", vec![sibling as i64], vec![node as i64])
    );
}

/// A reader refuses a tree file that does not agree with itself, naming the file and what.
#[test]
fn inconsistent_tree_files_are_refused() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let g = tree_golden(m2r2, &[2, 1, 1], 10);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let refused =
        |edit: &dyn Fn(&mut RawGolden), needle: &str| refused_after(&g, &path, edit, needle);
    refused(
        &set_i64("round_node", 0, 7),
        "round 0 accepts node 7, the tree has nodes 0..7",
    );
    refused(&set_i64("round_node", 0, -1), "round 0 accepts node -1");
    let (_, rounds, _) = parts(&g);
    let depth = rounds.accepted[0];
    refused(
        &set_i64("round_accepted", 0, depth + 1),
        &format!("round 0 accepted {} drafts", depth + 1),
    );
    refused(
        &set_i64("round_tree_tokens", 3, -5),
        "round 0 node 3 holds token id -5",
    );
    refused(
        &set_i64("draft_rows", 1, 4),
        "tensor `draft_rows`: row 0 is (round 0, node 4)",
    );
    refused(
        &set_meta("draft_tree", "2,0"),
        "metadata `draft_tree` = `2,0`",
    );
    refused(&set_meta("draft_tree", "3,1,1"), "round_tree_tokens");
    refused(&set_meta("draft_max", "2"), "metadata `draft_max` = `2`");
    refused(&set_meta("gate", "arla"), "metadata `gate` = `arla`");
    refused(
        &set_meta("format_version", "3"),
        "token-tree goldens are format version 4, this file says 3",
    );
    // a tree golden is never written below version 4
    let mut old = g.clone();
    old.version = 3;
    let err = old.write(&path).unwrap_err().to_string();
    assert!(err.contains("format version 4 at least"), "{err}");
}

/// Two tree goldens compare file to file (rounds, then the graphs' rows up to the first round
/// that differs); other trees, or a chain against a tree, are refused by name.
#[test]
fn tree_goldens_compare_file_to_file() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let tol = Tolerance::absolute(DEFAULT_ATOL);
    let g = tree_golden(m2r2, &[2, 1, 1], 12);
    let report = g.compare_to(&g, tol, &|_| None).unwrap();
    assert!(report.ok(), "{report:?}");
    let names: Vec<&str> = report.entries.iter().map(|e| e.name.as_str()).collect();
    assert!(
        names.ends_with(&["rounds", "verify_logits", "draft_logits"]),
        "{names:?}"
    );
    let mut other = g.clone();
    parts_mut(&mut other).1.draft_logits[[0, 3]] += 1.0;
    let report = g.compare_to(&other, tol, &|_| None).unwrap();
    let e = report.entries.iter().find(|e| !e.ok).unwrap();
    assert_eq!(
        (e.name.as_str(), e.first_failure().unwrap().as_str()),
        ("draft_logits", "proposal 0 (round 0, node 0)")
    );
    let wide = tree_golden(m2r2, &[3, 1], 12);
    let err = g.compare_to(&wide, tol, &|_| None).unwrap_err().to_string();
    assert!(
        err.contains("different token trees (2,1,1 vs 3,1)"),
        "{err}"
    );
    let mut elsewhere = g.clone();
    match elsewhere.m2r2.as_mut().map(|m| &mut m.record) {
        Some(M2r2Record::SpeculativeTree { recipe, .. }) => recipe.draft_gate = 2,
        _ => unreachable!("a tree golden"),
    }
    let err = g.compare_to(&elsewhere, tol, &|_| None).unwrap_err();
    assert!(
        err.to_string()
            .contains("draft at different gates (1 vs 2)"),
        "{err}"
    );
    let chain = Golden::record_speculative(
        m2r2,
        "tiny",
        &[1, 2, 3],
        12,
        1,
        None,
        &spec_options(DraftLength::Fixed(3)),
    )
    .unwrap();
    let err = g
        .compare_to(&chain, tol, &|_| None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("one golden drafts a token tree, the other a chain"),
        "{err}"
    );
}

/// The tree engine is checked against the golden before it runs (draft gate, weights), and a
/// chain check refuses a tree golden (and the tree check a chain golden) by name.
#[test]
fn tree_engine_refusals() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let g = tree_golden(m2r2, &[2, 1], 6);
    let hash = WeightsId::of(&weights);
    let check = |golden: &Golden, draft_gate: usize, hash: Option<&WeightsId>| {
        let mut speculation = ReferenceTreeSpeculation::new(m2r2, draft_gate, 32).unwrap();
        let engine = TreeEngine {
            speculation: &mut speculation,
            greedy: &mut ReferenceGreedy::new(&model),
            config: &model.config,
            weights: hash,
            draft_gate,
            graphs: EngineGraphs::REFERENCE,
        };
        golden.check_tree_on(engine, Tolerance::absolute(DEFAULT_ATOL))
    };
    assert!(check(&g, 1, Some(&hash)).unwrap().ok());
    let err = check(&g, 2, Some(&hash)).unwrap_err().to_string();
    assert!(
        err.contains("drafts at gate 1, the engine at gate 2"),
        "{err}"
    );
    let err = check(&g, 1, None).unwrap_err().to_string();
    assert!(err.contains("does not say which M2R2 weights"), "{err}");
    let chain = Golden::record_speculative(
        m2r2,
        "tiny",
        &[1, 2],
        6,
        1,
        None,
        &spec_options(DraftLength::Fixed(2)),
    )
    .unwrap();
    let err = check(&chain, 1, Some(&hash)).unwrap_err().to_string();
    assert!(err.contains("without a token tree"), "{err}");
    let mut speculation =
        crate::decode::draft_verify::ReferenceSpeculation::new(m2r2, 1, None, 32).unwrap();
    let engine = SpeculativeEngine {
        speculation: &mut speculation,
        greedy: &mut ReferenceGreedy::new(&model),
        config: &model.config,
        weights: Some(&hash),
        draft_gate: 1,
        graphs: EngineGraphs::REFERENCE,
    };
    let err = g
        .check_speculative_on(engine, Tolerance::absolute(DEFAULT_ATOL))
        .unwrap_err()
        .to_string();
    assert!(err.contains("records a token tree"), "{err}");
}

/// Stop tokens: a tree golden stops after the first, inside a round, and checks along it.
#[test]
fn tree_goldens_stop_at_end_of_turn() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let free = Golden::record_greedy(&model, "tiny", &[1, 2, 3], 16).unwrap();
    let stop = free.tokens[6];
    let first = free.tokens.iter().position(|&t| t == stop).unwrap();
    let g = Golden::record_tree_speculative(m2r2, "tiny", &[1, 2, 3], 16, 1, &[2, 1, 1], &[stop])
        .unwrap();
    assert_eq!(g.tokens, free.tokens[..=first]);
    let back = round_trip(&g);
    assert_eq!(back.max_steps, Some(16));
    let report = back.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
    assert!(report.ok(), "{report:?}");
}

/// Budgets of no token and of one (no round: the first token comes from the prompt's row) write,
/// read back and check.
#[test]
fn tree_goldens_without_rounds() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    for steps in [0, 1] {
        let g = tree_golden(m2r2, &[2, 1], steps);
        let (_, rounds, graphs) = parts(&g);
        assert_eq!((g.tokens.len(), rounds.len()), (steps, 0));
        assert_eq!(graphs.verify_logits.nrows(), 1);
        let report = round_trip(&g).check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
        assert!(report.ok(), "{report:?}");
    }
}

/// A node token that differs where the golden's draft scored both candidates within the
/// tolerance is a near tie (an f16 export may swap them): off the emitted path the round is
/// equal, named in the note; on it, or farther apart, the round diverges, a tie said so.
#[test]
fn near_ties_of_the_draft_are_told_from_faults() {
    let (model, weights) = setup("tiny");
    let m2r2 = M2r2::new(&model, &weights);
    let g = tree_golden(m2r2, &[2, 1, 1], 14);
    let (_, rounds, graphs) = parts(&g);
    let tree = &rounds.trees[0];
    let on_path = |r: usize, i: usize| tree.path(rounds.node[r] as usize).contains(&i);
    // node 2, the root's second candidate, and its chain below: off the path of round `r`
    let r = (0..rounds.len()).find(|&r| !on_path(r, 2)).unwrap();
    let swapped = |i: usize, gap: f32| {
        let mut got = rounds.clone();
        let want = rounds.tokens[[r, i]];
        let other = (0..model.config.vocab_size as i64)
            .find(|&t| t != want && !rounds.tokens.row(r).iter().any(|&x| x == t))
            .unwrap();
        got.tokens[[r, i]] = other;
        for d in (i + 1..tree.nodes()).filter(|&d| tree.path(d).contains(&i)) {
            got.tokens[[r, d]] = -5; // below the tie: drafted from the other candidate
        }
        let mut logits = graphs.draft_logits.clone();
        let parent_row = rounds
            .draft_rows()
            .iter()
            .position(|&p| p == (r, tree.parent(i).unwrap()))
            .unwrap();
        logits[[parent_row, other as usize]] = logits[[parent_row, want as usize]] - gap;
        (got, logits)
    };
    let check = |got: &TreeRounds, logits: &ndarray::Array2<f32>| {
        let ties = DraftTies {
            draft_logits: logits,
            tol: Tolerance::absolute(1e-3),
        };
        compare_tree_rounds("engine", rounds, got, Some(&ties), Against::Recomputed)
    };
    let (got, logits) = swapped(2, 5e-4);
    let e = check(&got, &logits);
    assert!(e.ok, "{e:?}");
    assert!(e.note.contains("near ties of the draft"), "{}", e.note);
    assert!(
        e.note.contains(&format!("round {r} node 2 (5.0e-4 apart)")),
        "{}",
        e.note
    );
    // without the golden's logits, or farther apart than 2 x atol: a divergence
    assert!(!compare_tree_rounds("engine", rounds, &got, None, Against::Recomputed).ok);
    let (got, logits) = swapped(2, 3e-3);
    let e = check(&got, &logits);
    let d = e.divergence.as_ref().unwrap();
    assert_eq!((d.row, d.what.as_str()), (r, "node 2 (depth 1) token"));
    // on the emitted path: the round emitted another token, a divergence named as a tie
    let (r, i) = (0..rounds.len())
        .find_map(|r| (rounds.node[r] > 0).then(|| (r, tree.path(rounds.node[r] as usize)[1])))
        .unwrap();
    let (t, vocab) = (rounds.tokens[[r, i]] as usize, model.config.vocab_size);
    let mut got = rounds.clone();
    got.tokens[[r, i]] = ((t + 1) % vocab) as i64;
    let mut logits = graphs.draft_logits.clone();
    let parent_row = rounds
        .draft_rows()
        .iter()
        .position(|&p| p == (r, 0))
        .unwrap();
    logits[[parent_row, (t + 1) % vocab]] = logits[[parent_row, t]];
    let e = check(&got, &logits);
    let d = e.divergence.as_ref().unwrap();
    assert_eq!(d.row, r);
    assert!(
        d.what.contains("a near tie of the draft (0.0e0 apart"),
        "{}",
        d.what
    );
}
