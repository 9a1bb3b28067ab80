//! Prompt-lookup branches in the simulator: hand-computed rounds and costs, and the rounds of
//! `tree_speculative_generate_drafting` with a branch beside fixed and grown trees predicted.

use super::tests::greedy_response;
use super::*;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::prompt_lookup::LookupConfig;
use crate::decode::tree_speculation::{TreeDrafting, tree_speculative_generate_drafting};
use crate::io::builtin;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;

/// A depth-1 trace of `(rank, top)` per position.
fn points(ranks: &[(usize, [u32; TOP_CANDIDATES])]) -> Trace {
    ranks
        .iter()
        .map(|&(rank, top)| {
            vec![DraftPoint {
                agrees: rank == 0,
                rank,
                confidence: 0.5,
                entropy: 0.5,
                arla: None,
                top,
            }]
        })
        .collect()
}

#[test]
fn hand_computed_lookup_rounds() {
    // prompt 1 2 3 4; response 1 2 3 9 ...: at i = 1 (context ...4 1 2) the suffix 1 2 occurred
    // at 0, so the guess is 3 4 (branch of 2): 3 right, 4 wrong (9): the branch gives 1
    let prompt = [1, 2, 3, 4];
    let response = [1, 2, 3, 9, 7, 7];
    let none = [u32::MAX; TOP_CANDIDATES];
    let trace = points(&[
        (0, [2, 0, 0, 0]), // i 0 -> 2: agrees
        (1, [8, 3, 0, 0]), // i 1 -> 3: the draft ranks it second, but the branch holds it
        (0, [9, 0, 0, 0]), // i 2 -> 9
        (1, [4, 7, 0, 0]), // i 3 -> 7: rank 1
        (5, none),         // i 4 -> 7: rank 5
    ]);
    let lookup = LookupConfig::new(2);
    let sim = simulate_lookup(&trace, (&prompt, &response), &[1], None, lookup).unwrap();
    // i 0: context 1 2 3 4 1, suffix "4 1" no, "1"? min 2: no guess; drafted 2 agrees: 1, emit 2
    // i 2: context ..1 2 3, suffix "2 3" at 1: guess 4 1; 4 wrong (9); drafted 9 agrees: 1
    // i 4: context ..3 9 7, no guess; rank 5: 0, emit 1 (the last position)
    assert_eq!(sim.accepted, [1, 1, 0]);
    assert_eq!((sim.rounds, sim.emitted), (3, 5));
    // levels: the root proposes (1 row) every round; depth 1 is a leaf (1 row), with the branch's
    // node at i 2 (2 rows), whose depth 2 drafts the branch's node alone (1 row)
    assert_eq!(sim.tree_proposing, [0, 3]);
    assert_eq!(sim.tree_leaves, [0, 3, 1]);
    assert_eq!(sim.tree_verifies, [0, 0, 2, 0, 1]);
    assert_eq!(sim.proposals, [1, 1, 1]);

    // the branch holds two tokens: at i 2 (context ..5 5 1 2) the guess after "1 2" is 3 4
    let (prompt, response) = ([1, 2, 3, 4, 5], [5, 1, 2, 3, 4, 6]);
    let trace = points(&[
        (3, none),
        (1, [9, 2, 0, 0]),
        (1, [4, 3, 0, 0]),
        (7, none),
        (0, none),
    ]);
    let sim = simulate_lookup(&trace, (&prompt, &response), &[1], None, lookup).unwrap();
    assert_eq!(sim.accepted, [0, 0, 2]);
    assert_eq!((sim.rounds, sim.emitted), (3, 5));

    // a wrong guess moves the root's drafted child to the runner-up: at i 0 (context 1 2 3 1 2)
    // the guess is 3 1, the next token 9 has rank 1; held when the skipped 3 ranks first
    let (prompt, response) = ([1, 2, 3, 1], [2, 9, 5]);
    for (top, accepted) in [([3, 9, 0, 0], &[1][..]), ([4, 9, 0, 0], &[0, 1])] {
        let trace = points(&[(1, top), (0, none)]);
        let sim = simulate_lookup(&trace, (&prompt, &response), &[1], None, lookup).unwrap();
        assert_eq!(sim.accepted, accepted, "{top:?}");
    }

    // refusals: a response that is not the trace's, no widths, bad suffix lengths, no scores
    assert!(simulate_lookup(&trace, (&prompt, &response[1..]), &[1], None, lookup).is_err());
    assert!(simulate_lookup(&trace, (&prompt, &response), &[], None, lookup).is_err());
    let bad = LookupConfig {
        min_ngram: 0,
        ..lookup
    };
    assert!(simulate_lookup(&trace, (&prompt, &response), &[1], None, bad).is_err());
    let arla = Some((GateKind::Arla, 0.5));
    assert!(simulate_lookup(&trace, (&prompt, &response), &[1], arla, lookup).is_err());
}

/// The simulation predicts the rounds `tree_speculative_generate_drafting` runs with a lookup
/// branch: the same number, the same accepted depth in every round but the last, and for fixed
/// trees and chains (where no node is off the greedy path) the same nodes verified; on the
/// built-in models, fixed and grown, at every gate. Rounds that accept a branch, and rounds
/// whose drafted child skipped a wrong guess, must occur.
#[test]
fn predicts_lookup_speculation() {
    let shapes: [&[usize]; 4] = [&[1], &[1, 1], &[2, 1], &[2, 1, 1]];
    let (mut branch_wins, mut rounds_checked) = (0, 0);
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [5, 17, 3, 9, 5, 17, 3];
        let response = greedy_response(&model, &prompt, 48);
        let capacity = prompt.len() + response.len() + 8;
        for gate in 1..=weights.config.num_gates() {
            let mut backend = ReferenceSpeculation::new(m2r2, gate, None, capacity).unwrap();
            let trace = trace(&mut backend, &prompt, &response, 1).unwrap();
            for widths in shapes {
                for grown in [None, Some((GateKind::Confidence, 0.3))] {
                    for branch in [2, 4] {
                        let context =
                            format!("{name}, gate {gate}, tree {widths:?} {grown:?}, {branch}");
                        let lookup = LookupConfig::new(branch);
                        let tree = crate::base::tree::TokenTree::from_widths(widths).unwrap();
                        let drafting = TreeDrafting {
                            threshold: grown.map(|g| g.1),
                            lookup: Some(lookup),
                        };
                        let (real, _) = tree_speculative_generate_drafting(
                            m2r2,
                            (gate, grown.map(|g| g.0)),
                            &tree,
                            drafting,
                            (&prompt, response.len(), &[]),
                            None,
                        )
                        .unwrap();
                        assert_eq!(real.tokens, response, "{context}");
                        let sim =
                            simulate_lookup(&trace, (&prompt, &response), widths, grown, lookup)
                                .unwrap();
                        assert_eq!(sim.rounds, real.rounds.len(), "{context}");
                        let last = real.rounds.len() - 1;
                        for (r, (round, &accepted)) in
                            real.rounds.iter().zip(&sim.accepted).enumerate().take(last)
                        {
                            assert_eq!(round.accepted, accepted, "{context}, round {r}");
                            branch_wins += usize::from(round.lookup_accepted() > 0);
                            rounds_checked += 1;
                        }
                        let exact = grown.is_none() || widths.iter().all(|&w| w == 1);
                        if exact {
                            let nodes: usize = sim
                                .tree_verifies
                                .iter()
                                .enumerate()
                                .map(|(n, c)| n * c)
                                .sum();
                            assert_eq!(nodes, real.verified_nodes(), "{context}");
                        }
                    }
                }
            }
        }
    }
    assert!(
        branch_wins > 0 && branch_wins < rounds_checked,
        "{branch_wins} of {rounds_checked} rounds accepted a branch"
    );
}

/// The steps `time_tree_steps` times for shapes (with their prefixes) and branches price every
/// round `simulate_lookup` counts, fixed and grown.
#[test]
fn timed_steps_price_every_lookup_round() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let m2r2 = M2r2::new(&model, &weights);
    let prompt = [5, 17, 3, 9, 5, 17, 3];
    let response = greedy_response(&model, &prompt, 32);
    let mut backend =
        ReferenceSpeculation::new(m2r2, 1, None, prompt.len() + response.len() + 8).unwrap();
    let trace = trace(&mut backend, &prompt, &response, 1).unwrap();
    let shapes = [vec![1], vec![2], vec![2, 1], vec![1, 1]];
    let branches = [2, 4];
    let tree =
        super::tree_steps::time_tree_steps(m2r2, 1, &prompt, (&shapes, &branches), 1).unwrap();
    let costs = StepCosts {
        greedy: 1.0,
        propose: 1.0,
        feed: 1.0,
        verify: vec![1.0],
        tree: Some(tree),
    };
    for widths in [&[1][..], &[2, 1], &[1, 1]] {
        for grown in [None, Some((GateKind::Confidence, 0.5))] {
            for &b in &branches {
                let sim = simulate_lookup(
                    &trace,
                    (&prompt, &response),
                    widths,
                    grown,
                    LookupConfig::new(b),
                )
                .unwrap();
                assert!(
                    sim.milliseconds(&costs).is_some(),
                    "{widths:?} {grown:?} {b}: {sim:?}"
                );
            }
        }
    }
}
