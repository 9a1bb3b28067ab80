//! Token trees in the simulator: ranks against `top_candidates`, tree rounds against hand-computed
//! ones and against `tree_speculative_generate` itself, the timed steps against a real round.

use super::tests::greedy_response;
use super::tree_steps::{TreeRoundSteps, time_tree_steps};
use super::*;
use crate::base::tree::TokenTree;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::tree_speculation::{
    top_candidates, tree_speculative_generate, tree_speculative_generate_dynamic,
};
use crate::io::builtin;
use crate::m2r2::bridge::{BridgeConfig, BridgeSite};
use crate::m2r2::draft_head::DraftHead;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use rand::{Rng, SeedableRng};

/// A trace of the given ranks per round start (first the depth-0 draft, then deeper ones).
fn ranked(ranks: &[&[usize]]) -> Trace {
    ranks
        .iter()
        .map(|round| {
            round
                .iter()
                .map(|&rank| DraftPoint {
                    agrees: rank == 0,
                    rank,
                    confidence: 0.5,
                    entropy: 0.5,
                    arla: None,
                    top: [u32::MAX; TOP_CANDIDATES],
                })
                .collect()
        })
        .collect()
}

#[test]
fn ranks_are_top_candidates_positions() {
    let check = |x: &[f32]| {
        let order = top_candidates(x, x.len());
        for (rank, &token) in order.iter().enumerate() {
            assert_eq!(candidate_rank(x, token), rank, "{x:?} token {token}");
        }
    };
    // ties in token order, -0 == 0, NaN last (top_candidates' own example)
    let x = [1.0, 3.0, f32::NAN, 3.0, -0.0, 0.0, f32::NEG_INFINITY];
    assert_eq!(
        (0..7).map(|t| candidate_rank(&x, t)).collect::<Vec<_>>(),
        [2, 0, 6, 1, 3, 4, 5]
    );
    check(&x);
    check(&[
        f32::NAN,
        2.0,
        f32::NAN,
        f32::NEG_INFINITY,
        f32::NEG_INFINITY,
    ]);
    // random logits drawn from a few values, so that ties are common
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for _ in 0..200 {
        let v = rng.random_range(1..12);
        let x: Vec<f32> = (0..v)
            .map(|_| [0.5, -1.0, 2.0, f32::NEG_INFINITY][rng.random_range(0..4)])
            .collect();
        check(&x);
    }
}

#[test]
fn hand_computed_tree_rounds() {
    // depth-1 trace (no bridge): point (i, k) is (i + k, 0)
    let p = ranked(&[&[0], &[1], &[0], &[2], &[0], &[1], &[3], &[0]]);
    // 2,2,1: at 0 ranks 0 < 2, 1 < 2, 0 < 1: 3 accepted, 4 emitted; at 4: 0 < 2, 1 < 2, 3 >= 1:
    // 2 accepted; at 7: 0 < 2, then the end: 1 accepted, 1 emitted
    let sim = simulate_tree(&p, &[2, 2, 1]).unwrap();
    assert_eq!(sim.accepted, [3, 2, 1]);
    assert_eq!((sim.rounds, sim.emitted), (3, 8));
    // levels 1, 2, 4 propose, 4 leaves, 11 nodes, each once a round; 11 - 4 proposing nodes
    assert_eq!(sim.proposals, [7, 7, 7]);
    assert_eq!(sim.tree_proposing, [0, 3, 3, 0, 3]);
    assert_eq!(sim.tree_leaves, [0, 0, 0, 0, 3]);
    assert_eq!(sim.tree_verifies[11], 3);
    assert_eq!(sim.tree_verifies.iter().sum::<usize>(), 3);
    assert_eq!((sim.propose_steps, sim.feed_steps), (0, 0));
    assert!(sim.verifies.iter().all(|&c| c == 0));
    // 2,1: at 0 (0 < 2, 1 >= 1), 2 (0, 2 >= 1), 4 (0, 1 >= 1): 1 accepted each; at 6 3 >= 2: none;
    // at 7: 1 accepted, the end
    let sim = simulate_tree(&p, &[2, 1]).unwrap();
    assert_eq!(sim.accepted, [1, 1, 1, 0, 1]);
    assert_eq!((sim.rounds, sim.emitted), (5, 8));
    // the chain 1,1,1 is fixed drafting of 3 (agreement is rank 0)
    let chain = simulate_tree(&p, &[1, 1, 1]).unwrap();
    assert_eq!(
        chain.accepted,
        simulate(&p, Policy::Fixed(3)).unwrap().accepted
    );

    // deeper points are read where traced (a bridge): (0, 1) has rank 0 while (1, 0) has 5
    let deep = ranked(&[&[0, 0], &[5], &[0]]);
    assert_eq!(simulate_tree(&deep, &[1, 1]).unwrap().accepted, [2]);
    assert_eq!(simulate(&deep, Policy::Fixed(2)).unwrap().accepted, [2]);

    // costs: levels of 1 / 2 / 4 proposing nodes 2 / 3 / 5 ms, 4 leaves 1.5, 11 nodes verified 12
    let tree = TreeCosts {
        propose: vec![Some(2.0), Some(3.0), None, Some(5.0)],
        leaves: vec![None, None, None, Some(1.5)],
        verify: [vec![None; 10], vec![Some(12.0)]].concat(),
    };
    assert_eq!(tree.round_ms(&[2, 2, 1]), Some(23.5));
    assert_eq!(
        tree.round_ms(&[2, 1]),
        None,
        "2 leaves and 5 nodes not timed"
    );
    let costs = StepCosts {
        greedy: 10.0,
        propose: 3.0,
        feed: 1.0,
        verify: vec![8.0],
        tree: Some(tree),
    };
    let sim = simulate_tree(&p, &[2, 2, 1]).unwrap();
    assert_eq!(sim.milliseconds(&costs), Some(3.0 * 23.5));
    assert_eq!(sim.speedup(&costs), Some(80.0 / 70.5));
    let chains_only = StepCosts {
        tree: None,
        ..costs.clone()
    };
    assert_eq!(sim.milliseconds(&chains_only), None);
    // a chain is priced without tree costs (here: verify 2 is not timed, verify 1 is)
    let fixed = simulate(&p, Policy::Fixed(1)).unwrap();
    assert!(
        fixed.milliseconds(&chains_only).is_none(),
        "verify 2 not timed"
    );
    let no_drafts = Simulated {
        verifies: vec![0, 2],
        ..Simulated::default()
    };
    assert_eq!(no_drafts.milliseconds(&chains_only), Some(16.0));
    let mut sum = sim.clone();
    sum.add(&sim);
    assert_eq!(sum.tree_proposing, [0, 6, 6, 0, 6]);
    assert_eq!(sum.milliseconds(&costs), Some(6.0 * 23.5));

    assert!(simulate_tree(&p, &[]).is_err());
    assert!(simulate_tree(&p, &[2, 0]).is_err());
    assert_eq!(tree::level_sizes(&[3, 2, 1]), [1, 3, 6, 6]);
    assert_eq!(tree::shape_text(&[3, 2, 1]), "3,2,1");
}

/// The built-in models' weights: plain, with a pruned draft head, and with a bridge at gate 1
/// (both sites).
fn variants(name: &str, model: &crate::base::model::Model) -> Vec<(&'static str, M2r2Weights)> {
    let plain = M2r2Weights::builtin_for(name, &model.config).unwrap();
    let vocab = model.config.vocab_size;
    let pruned = M2r2Weights {
        draft_head: Some(
            DraftHead::new((0..vocab as u32).step_by(3).collect(), vocab, "t").unwrap(),
        ),
        ..plain.clone()
    };
    let bridge = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
    let bridged = plain
        .clone()
        .with_bridge(&model.config, bridge, 11, 0.5)
        .unwrap();
    vec![("plain", plain), ("pruned", pruned), ("bridged", bridged)]
}

/// The simulation predicts the rounds `tree_speculative_generate` runs: the same number, and the
/// same accepted depth in every round but the last (past the end of the trace the decoder still
/// drafts); on the built-in models, every gate, the candidate shapes and a chain. Depth-1 traces
/// without a bridge, traces as deep as the deepest tree with one. Rounds that accept a runner-up
/// (which a chain would lose) must occur.
#[test]
fn predicts_tree_speculation() {
    let mut shapes: Vec<&[usize]> = TREE_SHAPES.to_vec();
    shapes.extend([&[1, 1][..], &[2]]);
    let deepest = shapes.iter().map(|s| s.len()).max().unwrap();
    let mut runner_ups = 0;
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        for (variant, weights) in variants(name, &model) {
            let m2r2 = M2r2::new(&model, &weights);
            let prompt = [5, 17, 3, 9];
            let response = greedy_response(&model, &prompt, 48);
            let capacity = prompt.len() + response.len() + 8;
            for gate in 1..=weights.config.num_gates() {
                let depth = if weights.bridge_at(gate).is_some() {
                    deepest
                } else {
                    1
                };
                let mut backend = ReferenceSpeculation::new(m2r2, gate, None, capacity).unwrap();
                let trace = trace(&mut backend, &prompt, &response, depth).unwrap();
                for widths in &shapes {
                    let context = format!("{name} {variant}, gate {gate}, tree {widths:?}");
                    let tree = TokenTree::from_widths(widths).unwrap();
                    let (real, _) = tree_speculative_generate(
                        m2r2,
                        gate,
                        &tree,
                        &prompt,
                        response.len(),
                        &[],
                        None,
                    )
                    .unwrap();
                    assert_eq!(real.tokens, response, "{context}");
                    let sim = simulate_tree(&trace, widths).unwrap();
                    assert_eq!(sim.rounds, real.rounds.len(), "{context}");
                    assert_eq!(sim.emitted, response.len() - 1, "{context}");
                    let last = real.rounds.len() - 1;
                    for (r, (round, &accepted)) in
                        real.rounds.iter().zip(&sim.accepted).enumerate().take(last)
                    {
                        assert_eq!(round.accepted, accepted, "{context}, round {r}");
                        let path = tree.path(round.node);
                        runner_ups +=
                            usize::from(path.windows(2).any(|w| tree.children(w[0]).start != w[1]));
                    }
                }
            }
        }
    }
    assert!(runner_ups > 0, "no round accepted a runner-up");
}

/// A round run step by step drafts the tokens and takes the base tokens of
/// `tree_speculative_generate`'s first round: the timed steps are the real round's.
#[test]
fn steps_are_a_real_round() {
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        for (variant, weights) in variants(name, &model) {
            let m2r2 = M2r2::new(&model, &weights);
            let prompt = [7u32, 2, 9, 4, 4, 1];
            for gate in 1..=weights.config.num_gates() {
                for widths in [&[3, 2, 1][..], &[2, 1, 1], &[4]] {
                    let context = format!("{name} {variant}, gate {gate}, tree {widths:?}");
                    let tree = TokenTree::from_widths(widths).unwrap();
                    let (real, _) =
                        tree_speculative_generate(m2r2, gate, &tree, &prompt, 8, &[], None)
                            .unwrap();
                    let round = &real.rounds[0];
                    let (mut steps, root) =
                        TreeRoundSteps::prefill(m2r2, gate, &prompt, tree.nodes()).unwrap();
                    assert_eq!(root, real.tokens[0], "{context}");
                    steps.start(&tree, root).unwrap();
                    for d in 0..=tree.max_depth() {
                        steps.draft_level(d).unwrap();
                    }
                    assert_eq!(steps.tokens(), &round.tokens[..], "{context}");
                    let choice = steps.verify().unwrap();
                    let mut node = 0;
                    while let Some(child) = tree
                        .children(node)
                        .find(|&c| steps.tokens()[c] == choice[node])
                    {
                        node = child;
                    }
                    assert_eq!((node, choice[node]), (round.node, round.base_token));
                }
            }
        }
    }
}

/// The steps each shape needs are timed, and only those: shapes 2,1 (levels 1, 2, 2; 5 nodes)
/// and 3,2,1 (levels 1, 3, 6, 6; 16 nodes).
#[test]
fn tree_steps_time_what_the_shapes_need() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let m2r2 = M2r2::new(&model, &weights);
    let shapes = [vec![2, 1], vec![3, 2, 1]];
    let costs = time_tree_steps(m2r2, 2, &[1, 2, 3, 4], (&shapes, &[]), 2).unwrap();
    let timed = |v: &[Option<f64>]| -> Vec<usize> {
        v.iter()
            .enumerate()
            .filter(|(_, ms)| ms.is_some_and(|ms| ms.is_finite() && ms >= 0.0))
            .map(|(i, _)| i + 1)
            .collect()
    };
    assert_eq!(timed(&costs.propose), [1, 2, 3, 6]);
    assert_eq!(costs.propose.len(), 6);
    assert_eq!(timed(&costs.leaves), [2, 6]);
    assert_eq!(costs.leaves.len(), 6);
    assert_eq!(timed(&costs.verify), [5, 16]);
    assert_eq!(costs.verify.len(), 16);
    for widths in &shapes {
        assert!(costs.round_ms(widths).is_some());
    }
    assert!(costs.round_ms(&[2, 2, 1]).is_none());
    // a lookup branch of 2 beside 1: levels 1, 1 + 1, then the branch's node alone (1), 4 nodes;
    // grown and stopped at the root: the root proposing, then 1, 1 (3 nodes)
    let costs = time_tree_steps(m2r2, 2, &[1, 2, 3, 4], (&[vec![1]], &[2]), 1).unwrap();
    assert_eq!(timed(&costs.propose), [1, 2]);
    assert_eq!(timed(&costs.leaves), [1, 2]);
    assert_eq!(timed(&costs.verify), [2, 3, 4]);
    assert!(time_tree_steps(m2r2, 2, &[1], (&[], &[]), 1).is_err());
    assert!(time_tree_steps(m2r2, 2, &[1], (&shapes, &[]), 0).is_err());
    assert!(time_tree_steps(m2r2, 4, &[1], (&shapes, &[]), 1).is_err());
}

/// A trace of `(rank, confidence)` per point.
fn scored(rounds: &[&[(usize, f32)]]) -> Trace {
    rounds
        .iter()
        .map(|round| {
            round
                .iter()
                .map(|&(rank, confidence)| DraftPoint {
                    agrees: rank == 0,
                    rank,
                    confidence,
                    entropy: 0.5,
                    arla: None,
                    top: [u32::MAX; TOP_CANDIDATES],
                })
                .collect()
        })
        .collect()
}

#[test]
fn hand_computed_dynamic_tree_rounds() {
    let gate = (GateKind::Confidence, 0.5);
    // depth-1 trace: point (i, k) is (i + k, 0)
    let p = scored(&[
        &[(0, 0.9)],
        &[(1, 0.8)],
        &[(0, 0.2)],
        &[(0, 0.9)],
        &[(3, 0.7)],
    ]);
    // 2,1 from 0: root 0.9 grows (rank 0 < 2: depth 1 held), depth 1 (point 1) 0.8 grows, rank 1
    // >= 1: 1 accepted, 1 + 2 + 2 nodes, levels 1 and 2 propose, 2 leaves; from 2: the root
    // scores 0.2, no children: 0 accepted, one node; from 3: 0.9 grows, held; depth 1 (point 4)
    // 0.7 grows, rank 3 >= 1: 1 accepted; 2 + 1 + 2 tokens
    let sim = simulate_dynamic_tree(&p, &[2, 1], gate).unwrap();
    assert_eq!(sim.accepted, [1, 0, 1]);
    assert_eq!((sim.rounds, sim.emitted), (3, 5));
    assert_eq!(sim.proposals, [3, 1, 3]);
    assert_eq!(sim.tree_proposing, [0, 3, 2]);
    assert_eq!(sim.tree_leaves, [0, 0, 2]);
    assert_eq!((sim.tree_verifies[5], sim.tree_verifies[1]), (2, 1));
    assert_eq!(sim.tree_verifies.iter().sum::<usize>(), 3);
    // a node that stops the path holds nothing below it even when its rank would
    let p = scored(&[&[(0, 0.9), (0, 0.1), (0, 0.9)], &[(0, 0.9)], &[(0, 0.9)]]);
    let sim = simulate_dynamic_tree(&p, &[1, 1, 1], gate).unwrap();
    assert_eq!(sim.accepted[0], 1);
    assert_eq!(sim.proposals[0], 2);
    assert!(simulate_dynamic_tree(&p, &[], gate).is_err());
    assert!(
        simulate_dynamic_tree(&p, &[2], (GateKind::Arla, 0.5)).is_err(),
        "no ARLA scores traced"
    );
}

/// Two identities: a chain shape `1,...,1` of depth `D` replays dynamic chain drafting at most
/// `D` (its levels are the chain's steps: a proposing level of one node is a proposing draft step,
/// the leaf level the feeding step, a tree of `n` nodes a verification of `n` rows), and with no
/// score below the threshold a dynamic tree is the fixed tree (but past the trace's end).
#[test]
fn dynamic_trees_reduce_to_chains_and_fixed_trees() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for case in 0..300 {
        let len = rng.random_range(1..30);
        let depth = rng.random_range(1..4);
        let trace: Trace = (0..len)
            .map(|_| {
                (0..depth)
                    .map(|_| {
                        let rank = [0, 0, 1, 2, 5][rng.random_range(0..5)];
                        DraftPoint {
                            agrees: rank == 0,
                            rank,
                            confidence: rng.random_range(0.0..1.0),
                            entropy: rng.random_range(0.0..1.0),
                            arla: Some(rng.random_range(0.0..1.0)),
                            top: [u32::MAX; TOP_CANDIDATES],
                        }
                    })
                    .collect()
            })
            .collect();
        let gate = [GateKind::Confidence, GateKind::Entropy, GateKind::Arla][case % 3];
        let threshold = rng.random_range(0.0..1.0);
        let max = rng.random_range(1..5);
        let chain = simulate(
            &trace,
            Policy::Dynamic {
                gate,
                threshold,
                max,
            },
        )
        .unwrap();
        let tree = simulate_dynamic_tree(&trace, &vec![1; max], (gate, threshold)).unwrap();
        let context = format!("case {case}, {gate} >= {threshold}, at most {max}");
        assert_eq!(tree.accepted, chain.accepted, "{context}");
        assert_eq!(tree.proposals, chain.proposals, "{context}");
        assert_eq!((tree.rounds, tree.emitted), (chain.rounds, chain.emitted));
        assert_eq!(
            tree.tree_proposing.get(1).copied(),
            Some(chain.propose_steps)
        );
        assert_eq!(tree.tree_leaves.get(1).copied(), Some(chain.feed_steps));
        let rows = |v: &[usize]| {
            v.iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(n, c)| (n, *c))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            rows(&tree.tree_verifies),
            rows(&chain.verifies),
            "{context}"
        );

        let widths: Vec<usize> = (0..rng.random_range(1..4))
            .map(|_| rng.random_range(1..4))
            .collect();
        // every round but the last (past the trace's end the dynamic round stops drafting, as
        // the chain simulation does, while a fixed tree drafts whole)
        let fixed = simulate_tree(&trace, &widths).unwrap();
        let all = simulate_dynamic_tree(&trace, &widths, (gate, f32::NEG_INFINITY)).unwrap();
        let context = format!("case {case}, tree {widths:?}");
        assert_eq!(all.accepted, fixed.accepted, "{context}");
        assert_eq!((all.rounds, all.emitted), (fixed.rounds, fixed.emitted));
        let but_last = |s: &Simulated| s.proposals[..s.rounds - 1].to_vec();
        assert_eq!(but_last(&all), but_last(&fixed), "{context}");
    }
}

/// The simulation predicts the rounds `tree_speculative_generate_dynamic` runs: the same number and
/// the same accepted depth in every round but the last, on the built-in models (plain, pruned
/// head, bridged), every gate, several shapes and thresholds; for chain shapes whose drafts were all
/// accepted also the nodes that scored. Rounds that stop early and rounds that accept must both
/// occur.
#[test]
fn predicts_dynamic_tree_speculation() {
    let shapes: [&[usize]; 4] = [&[2, 1, 1], &[3, 2, 1], &[1, 1, 1], &[2]];
    let (mut stopped, mut accepting) = (0, 0);
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        for (variant, weights) in variants(name, &model) {
            let m2r2 = M2r2::new(&model, &weights);
            let prompt = [5, 17, 3, 9];
            let response = greedy_response(&model, &prompt, 40);
            let capacity = prompt.len() + response.len() + 8;
            for gate in 1..=weights.config.num_gates() {
                let mut backend = ReferenceSpeculation::new(m2r2, gate, None, capacity).unwrap();
                let trace = trace(&mut backend, &prompt, &response, 3).unwrap();
                // thresholds at quantiles of the traced confidences, so rounds both grow and stop
                let mut scores: Vec<f32> = trace.iter().flatten().map(|p| p.confidence).collect();
                scores.sort_by(f32::total_cmp);
                for q in [0.25, 0.6] {
                    let threshold = scores[(q * (scores.len() - 1) as f64) as usize];
                    for widths in shapes {
                        let context = format!(
                            "{name} {variant}, gate {gate}, tree {widths:?}, >= {threshold}"
                        );
                        let tree = TokenTree::from_widths(widths).unwrap();
                        let (real, _) = tree_speculative_generate_dynamic(
                            m2r2,
                            gate,
                            (GateKind::Confidence, threshold),
                            &tree,
                            &prompt,
                            response.len(),
                            &[],
                            None,
                        )
                        .unwrap();
                        assert_eq!(real.tokens, response, "{context}");
                        let sim = simulate_dynamic_tree(
                            &trace,
                            widths,
                            (GateKind::Confidence, threshold),
                        )
                        .unwrap();
                        assert_eq!(sim.rounds, real.rounds.len(), "{context}");
                        assert_eq!(sim.emitted, response.len() - 1, "{context}");
                        let last = real.rounds.len() - 1;
                        for (r, round) in real.rounds.iter().enumerate().take(last) {
                            assert_eq!(round.accepted, sim.accepted[r], "{context}, round {r}");
                            // a chain whose drafts were all accepted (after a wrong one the
                            // scores are estimated, as the chain simulation's are)
                            if widths.iter().all(|&w| w == 1)
                                && round.accepted + 1 == round.tree.nodes()
                            {
                                assert_eq!(
                                    round.scores.len(),
                                    sim.proposals[r],
                                    "{context}, round {r}"
                                );
                            }
                            stopped += usize::from(round.tree.nodes() < tree.nodes());
                            accepting += usize::from(round.accepted > 0);
                        }
                    }
                }
            }
        }
    }
    assert!(
        stopped > 0 && accepting > 0,
        "stopped {stopped}, accepting {accepting}"
    );
}
