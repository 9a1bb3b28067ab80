//! Tests of dynamic drafting per branch (`tree_speculation::dynamic_round`): a chain shape drafts
//! exactly what the chain loop's dynamic draft length drafts, and any shape, gate and threshold
//! decodes greedy decoding's tokens and cache while the trees really change from round to round.
//! (Sampling on dynamic trees: the chi-square test in `tree_sampling.rs`.)

use crate::base::config::ModelConfig;
use crate::base::generate::greedy;
use crate::base::tree::TokenTree;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::speculative::{
    DraftLength, SpeculativeBackend, SpeculativeOptions, speculative_generate,
};
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_speculation::tests::is_greedy_cache;
use crate::decode::tree_speculation::{
    TreeSpeculativeOutput, tree_speculate, tree_speculate_dynamic,
    tree_speculative_generate_dynamic,
};
use crate::io::builtin::{self, random_model};
use crate::m2r2::bridge::{BridgeConfig, BridgeSite};
use crate::m2r2::config::M2r2Config;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use proptest::prelude::*;

const THRESHOLDS: [f32; 5] = [-1.0, 0.2, 0.5, 0.8, 2.0];

/// The chain `1,...,1` of `m` drafts grown dynamically is the chain loop with `DraftLength::Dynamic`:
/// every built-in model, draft gate, gate kind (ARLA where there are ARLA weights), threshold,
/// with and without a bridge: the same tokens, drafts, accepted counts, base tokens, scores,
/// cache and counted work.
#[test]
fn a_dynamic_chain_is_the_chain_loops_dynamic_draft() {
    let mut compared = (0, 0); // (rounds, rounds that stopped drafting early)
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        let plain = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let bridge = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
        let bridged = plain
            .clone()
            .with_bridge(&model.config, bridge, 3, 0.5)
            .unwrap();
        for weights in [&plain, &bridged] {
            let m2r2 = M2r2::new(&model, weights);
            let kinds: Vec<GateKind> = GateKind::ALL
                .into_iter()
                .filter(|k| *k != GateKind::Arla || weights.arla.is_some())
                .collect();
            for draft_gate in 1..=m2r2.num_gates() {
                for &kind in &kinds {
                    for threshold in THRESHOLDS {
                        let m = 3;
                        let what = format!("{name} gate {draft_gate} {kind:?} {threshold}");
                        let prompt = [3u32, 1, 4, 1];
                        let options = SpeculativeOptions {
                            max_new_tokens: 12,
                            stop_tokens: vec![],
                            draft_length: DraftLength::Dynamic {
                                max: m,
                                gate: kind,
                                threshold,
                            },
                            sampling: None,
                        };
                        let mut chain_backend =
                            ReferenceSpeculation::new(m2r2, draft_gate, Some(kind), 64).unwrap();
                        let chain =
                            speculative_generate(&mut chain_backend, &prompt, &options).unwrap();
                        let mut backend = ReferenceTreeSpeculation::new(m2r2, draft_gate, 64)
                            .unwrap()
                            .with_gate(Some(kind));
                        let shape = TokenTree::chain(m).unwrap();
                        let got = tree_speculate_dynamic(
                            &mut backend,
                            &shape,
                            threshold,
                            &prompt,
                            12,
                            &[],
                            None,
                        )
                        .unwrap();
                        assert_eq!(got.tokens, chain.tokens, "{what}");
                        assert_eq!(got.rounds.len(), chain.rounds.len(), "{what}");
                        for (t, c) in got.rounds.iter().zip(&chain.rounds) {
                            assert_eq!(
                                (t.start, &t.tokens[1..], t.accepted, t.base_token, &t.scores),
                                (c.start, &c.drafted[..], c.accepted, c.base_token, &c.scores),
                                "{what}"
                            );
                            compared.0 += 1;
                            compared.1 += usize::from(c.drafted.len() < m);
                        }
                        assert_eq!(backend.work(), chain_backend.work(), "{what}");
                        let cache = backend.into_cache();
                        assert_eq!(cache.len(), chain_backend.len(), "{what}");
                        assert!(
                            chain_backend.cache().prefix_equals(&cache, cache.len()),
                            "{what}"
                        );
                    }
                }
            }
        }
    }
    // the thresholds both stop and continue drafting
    assert!(
        compared.1 > 50 && compared.0 - compared.1 > 50,
        "{compared:?}"
    );
}

/// With a threshold below every score the whole shape grows every round: the fixed tree's
/// rounds; above every score no node proposes: one row per round, greedy decoding.
#[test]
fn thresholds_at_the_ends_give_the_whole_tree_or_none() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let m2r2 = M2r2::new(&model, &weights);
    let shape = TokenTree::parse("2,2,1").unwrap();
    let prompt = [5u32, 9, 14, 3];
    let mut fixed = ReferenceTreeSpeculation::new(m2r2, 1, 64).unwrap();
    let want = tree_speculate(&mut fixed, &shape, &prompt, 16, &[], None).unwrap();
    let gate = (GateKind::Confidence, -1.0);
    let (all, _) =
        tree_speculative_generate_dynamic(m2r2, 1, gate, &shape, &prompt, 16, &[], None).unwrap();
    assert_eq!(all.tokens, want.tokens);
    for (a, w) in all.rounds.iter().zip(&want.rounds) {
        assert_eq!((&a.tree, &a.tokens, a.node), (&w.tree, &w.tokens, w.node));
        assert_eq!(
            a.scores.len(),
            1 + 2 + 4,
            "every node above the leaves was scored"
        );
    }
    let gate = (GateKind::Confidence, 2.0);
    let (none, _) =
        tree_speculative_generate_dynamic(m2r2, 1, gate, &shape, &prompt, 16, &[], None).unwrap();
    assert_eq!(none.tokens, want.tokens);
    assert!(
        none.rounds
            .iter()
            .all(|r| r.tree.nodes() == 1 && r.scores.len() == 1)
    );
}

/// A backend without a gate cannot grow a tree dynamically: a clear error, not a fixed tree.
#[test]
fn dynamic_trees_need_scores() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let mut backend = ReferenceTreeSpeculation::new(M2r2::new(&model, &weights), 1, 64).unwrap();
    let shape = TokenTree::parse("2,1").unwrap();
    let err = tree_speculate_dynamic(&mut backend, &shape, 0.5, &[1, 2], 4, &[], None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("dynamic drafting needs the draft gate's score"),
        "{err}"
    );
}

/// Rounds whose tree is neither the root alone nor the whole shape.
fn partial_rounds(out: &TreeSpeculativeOutput, shape: &TokenTree) -> usize {
    out.rounds
        .iter()
        .filter(|r| r.tree.nodes() > 1 && r.tree.nodes() < shape.nodes())
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// Dynamic trees decode greedy decoding's tokens and leave its cache: random dense models,
    /// any draft gate, shapes up to 24 nodes, the confidence, entropy and ARLA gates, with and
    /// without a bridge; the threshold is a quantile of the scores a first run (every node
    /// growing) saw, so that trees are pruned in some rounds and grow in others.
    #[test]
    fn dynamic_trees_are_greedy(
        seed in any::<u64>(),
        layers in 2usize..6,
        gate in 0usize..3,
        kind in 0usize..3,
        quantile in 0.0f64..1.0,
        widths in prop::collection::vec(1usize..4, 1..5)
            .prop_filter("at most 24 nodes", |w| {
                TokenTree::from_widths(w).is_ok_and(|t| t.nodes() <= 24)
            }),
        bridged in any::<bool>(),
        prompt in prop::collection::vec(0u32..40, 1..6),
        new_tokens in 1usize..20,
    ) {
        let config = ModelConfig {
            vocab_size: 40,
            hidden_size: 16,
            intermediate_size: 24,
            num_hidden_layers: layers,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 4,
            max_position_embeddings: 64,
            ..builtin::tiny_config()
        };
        let model = random_model(config.clone(), seed).unwrap();
        let mut weights =
            M2r2Weights::random(&config, M2r2Config::default_for(&config), seed ^ 0x55).unwrap();
        let draft_gate = 1 + gate % weights.config.num_gates();
        if bridged {
            let bridge = BridgeConfig::new(draft_gate, 3, BridgeSite::ALL.to_vec());
            weights = weights.with_bridge(&config, bridge, seed ^ 0x77, 0.5).unwrap();
        }
        let kind = GateKind::ALL[kind];
        prop_assume!(kind != GateKind::Arla || weights.arla.is_some());
        let shape = TokenTree::from_widths(&widths).unwrap();
        let m2r2 = M2r2::new(&model, &weights);
        let want = greedy(&model, &prompt, new_tokens, &[]).unwrap();
        let (pilot, _) = tree_speculative_generate_dynamic(
            m2r2, draft_gate, (kind, -1.0), &shape, &prompt, new_tokens, &[], None,
        )
        .unwrap();
        let mut seen: Vec<f32> = pilot.rounds.iter().flat_map(|r| r.scores.clone()).collect();
        seen.sort_by(f32::total_cmp);
        // (no rounds when the prefill's token is the whole budget)
        let threshold = match seen.len() {
            0 => 0.5,
            n => seen[((n - 1) as f64 * quantile) as usize],
        };
        let (got, cache) = tree_speculative_generate_dynamic(
            m2r2, draft_gate, (kind, threshold), &shape, &prompt, new_tokens, &[], None,
        )
        .unwrap();
        prop_assert_eq!(&got.tokens, &want);
        prop_assert!(is_greedy_cache(&model, &prompt, &got.tokens, &cache));
        for round in &got.rounds {
            // a node has children only when its score passed, and then all of its shape's
            let scored = (0..round.tree.nodes()).filter(|&i| round.tree.depth(i) < shape.max_depth());
            prop_assert_eq!(scored.clone().count(), round.scores.len());
            for (i, &score) in scored.zip(&round.scores) {
                let children = round.tree.children(i).len();
                let width = shape.children(shape.level(round.tree.depth(i)).start).len();
                prop_assert_eq!(children, if score >= threshold { width } else { 0 });
            }
        }
    }
}

/// Thresholds between the scores seen prune trees partly: on tiny with the confidence gate at
/// the quartiles of the scores, trees `2,2,1` grow partly (neither the root alone nor the whole
/// shape) in many rounds.
#[test]
fn trees_change_from_round_to_round() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let m2r2 = M2r2::new(&model, &weights);
    let shape = TokenTree::parse("2,2,1").unwrap();
    let prompt = [5u32, 9, 14, 3];
    let run = |threshold| {
        let gate = (GateKind::Confidence, threshold);
        tree_speculative_generate_dynamic(m2r2, 1, gate, &shape, &prompt, 40, &[], None)
            .unwrap()
            .0
    };
    let mut seen: Vec<f32> = run(-1.0)
        .rounds
        .iter()
        .flat_map(|r| r.scores.clone())
        .collect();
    seen.sort_by(f32::total_cmp);
    let mut partial = 0;
    for q in [1, 2, 3] {
        partial += partial_rounds(&run(seen[seen.len() * q / 4]), &shape);
    }
    assert!(partial >= 5, "only {partial} partly grown rounds");
}
