//! Tests of tree speculation (`decode/tree_speculation.rs`, `decode/tree_round.rs`).

use super::*;
use crate::base::config::{Architecture, ModelConfig, MoeConfig};
use crate::base::generate::greedy;
use crate::base::model::Model;
use crate::base::tree::MAX_TREE_NODES;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::speculative::{
    DraftLength, SpeculativeBackend, SpeculativeOptions, speculative_generate,
};
use crate::io::builtin::{self, random_model};
use crate::m2r2::bridge::BridgeSite;
use crate::m2r2::bridge_config::BridgeConfig;
use crate::m2r2::config::M2r2Config;
use crate::m2r2::draft_head::DraftHead;
use crate::m2r2::weights::M2r2Weights;
use proptest::prelude::*;

/// The cache greedy decoding leaves after emitting `tokens`: the prompt and every token but
/// the last, bit for bit what `cache` holds.
pub(crate) fn is_greedy_cache(
    model: &Model,
    prompt: &[u32],
    tokens: &[u32],
    cache: &KvCache,
) -> bool {
    let fed: Vec<u32> = prompt
        .iter()
        .chain(&tokens[..tokens.len().saturating_sub(1)])
        .copied()
        .collect();
    let mut want = model.new_cache(fed.len()).unwrap();
    model.forward(&fed, &mut want).unwrap();
    let bits = |x: ndarray::ArrayView2<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    cache.len() == fed.len()
        && (0..model.config.num_hidden_layers).all(|l| {
            let ((ak, av), (bk, bv)) = (cache.layer(l, fed.len()), want.layer(l, fed.len()));
            bits(ak) == bits(bk) && bits(av) == bits(bv)
        })
}

/// A chain drafts what the chain loop drafts: every draft gate, lengths 1 to 3, the full and
/// a pruned head, without and with a bridge (both sites, at each gate in turn), on the
/// built-in models: the same tokens, rounds, cache and counted work.
#[test]
fn a_chain_is_the_chain_loop() {
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        let full = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let vocab = model.config.vocab_size;
        let pruned = M2r2Weights {
            draft_head: Some(
                DraftHead::new((0..vocab as u32).step_by(3).collect(), vocab, "t").unwrap(),
            ),
            ..full.clone()
        };
        let mut all = vec![full.clone(), pruned];
        for gate in 1..=full.config.num_gates() {
            let bridge = BridgeConfig::new(gate, 4, BridgeSite::ALL.to_vec());
            all.push(
                full.clone()
                    .with_bridge(&model.config, bridge, 3, 0.5)
                    .unwrap(),
            );
        }
        for weights in &all {
            let m2r2 = M2r2::new(&model, weights);
            for gate in 1..=m2r2.num_gates() {
                for m in 1..=3 {
                    let what = format!("{name} gate {gate} length {m}");
                    let prompt = [3u32, 1, 4, 1];
                    let options = SpeculativeOptions {
                        max_new_tokens: 12,
                        stop_tokens: vec![],
                        draft_length: DraftLength::Fixed(m),
                        sampling: None,
                    };
                    let mut backend = ReferenceSpeculation::new(m2r2, gate, None, 64).unwrap();
                    let chain = speculative_generate(&mut backend, &prompt, &options).unwrap();
                    let tree = TokenTree::chain(m).unwrap();
                    let mut tree_backend = ReferenceTreeSpeculation::new(m2r2, gate, 64).unwrap();
                    let got =
                        tree_speculate(&mut tree_backend, &tree, &prompt, 12, &[], None).unwrap();
                    assert_eq!(got.tokens, chain.tokens, "{what}");
                    // the same rows through the same layers: the same work
                    assert_eq!(tree_backend.work(), backend.work(), "{what}");
                    let cache = tree_backend.into_cache();
                    for (t, c) in got.rounds.iter().zip(&chain.rounds) {
                        assert_eq!(
                            (t.start, &t.tokens[1..], t.accepted, t.base_token),
                            (c.start, &c.drafted[..], c.accepted, c.base_token),
                            "{what}"
                        );
                    }
                    assert_eq!(got.rounds.len(), chain.rounds.len(), "{what}");
                    assert_eq!(cache.len(), backend.len(), "{what}");
                    assert!(backend.cache().prefix_equals(&cache, cache.len()), "{what}");
                }
            }
        }
    }
}

/// Wide trees on the built-in models: greedy decoding's tokens and cache, and rounds that
/// accept a runner-up (a child other than the first), which a chain would have lost.
#[test]
fn runner_ups_are_accepted() {
    let mut runner_ups = 0;
    for name in builtin::BUILTIN_NAMES {
        let model = builtin::builtin(name).unwrap();
        let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [7u32, 2, 9, 4, 4, 1];
        let want = greedy(&model, &prompt, 40, &[]).unwrap();
        for spec in ["3,2,1", "4", "2,2,2"] {
            let tree = TokenTree::parse(spec).unwrap();
            for gate in 1..=m2r2.num_gates() {
                let (got, cache) =
                    tree_speculative_generate(m2r2, gate, &tree, &prompt, 40, &[], None).unwrap();
                assert_eq!(got.tokens, want, "{name} {spec} gate {gate}");
                assert!(is_greedy_cache(&model, &prompt, &got.tokens, &cache));
                runner_ups += got
                    .rounds
                    .iter()
                    .filter(|r| {
                        let path = tree.path(r.node);
                        path.windows(2).any(|w| tree.children(w[0]).start != w[1])
                    })
                    .count();
            }
        }
    }
    assert!(runner_ups > 0, "no round accepted a runner-up");
}

proptest! {
    /// Selecting the `k` best equals sorting the whole row (stable, NaN last) and taking `k`.
    #[test]
    fn top_candidates_are_a_full_sorts_prefix(
        logits in prop::collection::vec(prop_oneof![
            (-3i8..3).prop_map(f32::from),
            Just(f32::NAN),
            Just(f32::NEG_INFINITY),
        ], 1..40),
        k in 0usize..45,
    ) {
        let key = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // NaN after -inf: sort by (not NaN, value) descending, stable
        order.sort_by(|&a, &b| {
            (!logits[b].is_nan(), key(logits[b]))
                .partial_cmp(&(!logits[a].is_nan(), key(logits[a])))
                .unwrap()
        });
        let want: Vec<u32> = order.into_iter().take(k).map(|t| t as u32).collect();
        prop_assert_eq!(top_candidates(&logits, k), want);
    }
}

#[test]
fn top_candidates_rank_like_argmax() {
    let x = [1.0, 3.0, f32::NAN, 3.0, -0.0, 0.0, f32::NEG_INFINITY];
    assert_eq!(top_candidates(&x, 1), [argmax(&x) as u32]);
    assert_eq!(top_candidates(&x, 7), [1, 3, 0, 4, 5, 6, 2]);
    assert_eq!(top_candidates(&x, 0), Vec::<u32>::new());
}

/// A random small model, its random M2R2 weights, a tree and a prompt to decode.
#[derive(Debug, Clone)]
struct Problem {
    layers: usize,
    moe: bool,
    window: Option<usize>,
    seed: u64,
    gate: usize,
    widths: Vec<usize>,
    pruned: Option<Vec<u32>>,
    /// A bridge at the draft gate: its sites (entry, gate) as two flags, at least one set.
    bridge: Option<(bool, bool)>,
    prompt: Vec<u32>,
    new_tokens: usize,
    stop: Option<u32>,
    /// A prompt-lookup branch: most tokens, and the suffix lengths (in either order).
    lookup: Option<(usize, usize, usize)>,
    /// Dynamic drafting: the confidence threshold a node needs for children.
    dynamic: Option<f32>,
}

const VOCAB: u32 = 40;

fn problem_strategy() -> impl Strategy<Value = Problem> {
    (
        (2usize..6, any::<bool>(), prop::option::of(2usize..8)),
        (any::<u64>(), 0usize..3),
        prop::collection::vec(1usize..4, 1..5).prop_filter("at most 24 nodes", |w| {
            TokenTree::from_widths(w).is_ok_and(|t| t.nodes() <= 24)
        }),
        (
            prop::option::of(prop::collection::btree_set(0..VOCAB, 1..20)),
            prop::option::of(
                (any::<bool>(), any::<bool>()).prop_filter("a site", |(e, g)| *e || *g),
            ),
        ),
        prop::collection::vec(0..VOCAB, 1..6),
        1usize..20,
        (
            prop::option::weighted(0.3, 0..VOCAB),
            prop::option::of((1usize..8, 1usize..4, 1usize..4)),
            prop::option::of(0.0f32..0.3),
        ),
    )
        .prop_map(
            |(
                (layers, moe, window),
                (seed, gate),
                widths,
                (pruned, bridge),
                prompt,
                new_tokens,
                (stop, lookup, dynamic),
            )| {
                Problem {
                    layers,
                    moe,
                    window,
                    seed,
                    gate,
                    widths,
                    pruned: pruned.map(|p| p.into_iter().collect()),
                    bridge,
                    prompt,
                    new_tokens,
                    stop,
                    lookup,
                    dynamic,
                }
            },
        )
}

impl Problem {
    fn check(&self) -> std::result::Result<(), TestCaseError> {
        let config = ModelConfig {
            architecture: if self.moe {
                Architecture::Mixtral
            } else {
                Architecture::Llama
            },
            vocab_size: VOCAB as usize,
            hidden_size: 16,
            intermediate_size: 24,
            num_hidden_layers: self.layers,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 4,
            max_position_embeddings: 64,
            tie_word_embeddings: !self.moe,
            sliding_window: self.window,
            moe: self.moe.then_some(MoeConfig {
                num_local_experts: 4,
                num_experts_per_tok: 2,
            }),
            ..builtin::tiny_config()
        };
        let model = random_model(config.clone(), self.seed).unwrap();
        let m2r2_config = M2r2Config::default_for(&config);
        let mut weights = M2r2Weights::random(&config, m2r2_config, self.seed ^ 0x55).unwrap();
        weights.draft_head = self
            .pruned
            .clone()
            .map(|t| DraftHead::new(t, VOCAB as usize, "test").unwrap());
        let gate = 1 + self.gate % weights.config.num_gates();
        if let Some((entry, at_gate)) = self.bridge {
            let sites = [(entry, BridgeSite::Entry), (at_gate, BridgeSite::Gate)];
            let sites = sites.into_iter().filter(|s| s.0).map(|s| s.1).collect();
            let bridge = BridgeConfig::new(gate, 3, sites);
            weights = weights
                .with_bridge(&config, bridge, self.seed ^ 0x77, 0.5)
                .unwrap();
        }
        let m2r2 = M2r2::new(&model, &weights);
        let tree = TokenTree::from_widths(&self.widths).unwrap();
        let stop: Vec<u32> = self.stop.into_iter().collect();
        let want = greedy(&model, &self.prompt, self.new_tokens, &stop).unwrap();
        let (prompt, budget) = (&self.prompt, self.new_tokens);
        let lookup = self.lookup.map(|(len, a, b)| LookupConfig {
            max_tokens: len,
            max_ngram: a.max(b),
            min_ngram: a.min(b),
        });
        let confidence = |t| (GateKind::Confidence, t);
        let (got, cache) = match (lookup, self.dynamic) {
            (Some(lookup), None) => tree_speculative_generate_with_lookup(
                m2r2, gate, &tree, lookup, prompt, budget, &stop,
            ),
            (Some(lookup), Some(t)) => tree_speculative_generate_drafting(
                m2r2,
                (gate, Some(GateKind::Confidence)),
                &tree,
                TreeDrafting {
                    threshold: Some(t),
                    lookup: Some(lookup),
                },
                (prompt, budget, &stop),
                None,
            ),
            (None, Some(t)) => tree_speculative_generate_dynamic(
                m2r2,
                gate,
                confidence(t),
                &tree,
                prompt,
                budget,
                &stop,
                None,
            ),
            (None, None) => {
                tree_speculative_generate(m2r2, gate, &tree, prompt, budget, &stop, None)
            }
        }
        .unwrap();
        prop_assert_eq!(&got.tokens, &want);
        for round in &got.rounds {
            prop_assert!(distinct_siblings(round), "{:?}", round);
        }
        prop_assert!(
            is_greedy_cache(&model, &self.prompt, &got.tokens, &cache),
            "the cache is not greedy decoding's"
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Greedy tree speculation is greedy decoding, token for token, and leaves its cache:
    /// dense and MoE, sliding windows, any gate, trees up to 24 nodes, a pruned draft head,
    /// a bridge at the draft gate (entry, gate or both), stop tokens, a prompt-lookup branch,
    /// trees grown per branch (dynamic drafting), with and without the branch.
    #[test]
    fn tree_speculation_is_greedy(problem in problem_strategy()) {
        problem.check()?;
    }
}

/// No node of a round has two children with the same token.
fn distinct_siblings(round: &TreeRound) -> bool {
    (0..round.tree.nodes()).all(|i| {
        let mut tokens: Vec<u32> = round.tree.children(i).map(|c| round.tokens[c]).collect();
        let all = tokens.len();
        tokens.sort_unstable();
        tokens.dedup();
        tokens.len() == all
    })
}

/// A prompt that repeats itself, so that lookup branches find matches.
const REPETITIVE: [u32; 12] = [7, 2, 9, 4, 1, 7, 2, 9, 4, 1, 7, 2];

/// Each built-in model with its built-in M2R2 weights.
fn builtin_models() -> Vec<(&'static str, Model, M2r2Weights)> {
    builtin::BUILTIN_NAMES
        .iter()
        .map(|&name| {
            let model = builtin::builtin(name).unwrap();
            let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
            (name, model, weights)
        })
        .collect()
}

/// 40 greedy tokens after [`REPETITIVE`] drafted at gate 1 as `drafting` says, scored by the
/// confidence gate.
fn grown_on_repetitive(
    m2r2: M2r2<'_>,
    tree: &TokenTree,
    drafting: TreeDrafting,
) -> (TreeSpeculativeOutput, KvCache) {
    let request = (&REPETITIVE[..], 40, &[][..]);
    let gate = (1, Some(GateKind::Confidence));
    tree_speculative_generate_drafting(m2r2, gate, tree, drafting, request, None).unwrap()
}

/// A greedy tree decode of [`REPETITIVE`]: `want`'s tokens, greedy decoding's cache, and no
/// two siblings alike in any round.
fn assert_greedy_rounds(
    model: &Model,
    (want, got, cache): (&[u32], &TreeSpeculativeOutput, &KvCache),
    what: &str,
) {
    assert_eq!(got.tokens, want, "{what}");
    assert!(
        is_greedy_cache(model, &REPETITIVE, &got.tokens, cache),
        "{what}"
    );
    for round in &got.rounds {
        assert!(distinct_siblings(round), "{what}: {round:?}");
    }
}

/// A repetitive prompt on the built-in models, chains and a tree with a lookup branch: greedy
/// decoding's tokens and cache, branches that are accepted, no two siblings alike, and the
/// rounds without a match verify the drafted tree alone.
#[test]
fn lookup_branches_are_accepted_and_stay_greedy() {
    let mut accepted = 0;
    for (name, model, weights) in builtin_models() {
        let m2r2 = M2r2::new(&model, &weights);
        let want = greedy(&model, &REPETITIVE, 40, &[]).unwrap();
        for spec in ["1", "1,1,1", "2,1"] {
            let tree = TokenTree::parse(spec).unwrap();
            for len in [1, 4] {
                let lookup = LookupConfig::new(len);
                let (got, cache) = tree_speculative_generate_with_lookup(
                    m2r2,
                    1,
                    &tree,
                    lookup,
                    &REPETITIVE,
                    40,
                    &[],
                )
                .unwrap();
                let what = format!("{name} {spec} lookup {len}");
                assert_greedy_rounds(&model, (&want, &got, &cache), &what);
                for round in &got.rounds {
                    let fits = round.lookup.len();
                    assert!(fits <= len, "{what}");
                    assert_eq!(round.tree.nodes(), tree.nodes() + fits, "{what}");
                }
                assert!(got.lookup_rounds() > 0, "{what}: no round found a match");
                assert_eq!(
                    got.lookup_nodes() + got.rounds.len() * tree.nodes(),
                    got.verified_nodes()
                );
                accepted += got.lookup_accepted();
            }
        }
    }
    assert!(accepted > 0, "no lookup token was accepted");
}

/// Dynamic drafting with a lookup branch on a repetitive prompt (the built-in models, a chain
/// and a tree shape, thresholds that grow always, sometimes and never): greedy decoding's
/// tokens and cache, each branch node last at its depth, no two siblings alike, branch tokens
/// accepted; a threshold above 1 verifies the branch alone.
#[test]
fn lookup_branches_beside_dynamic_drafting() {
    let mut accepted = 0;
    for (name, model, weights) in builtin_models() {
        let m2r2 = M2r2::new(&model, &weights);
        let want = greedy(&model, &REPETITIVE, 40, &[]).unwrap();
        for spec in ["1", "2,1"] {
            let tree = TokenTree::parse(spec).unwrap();
            for threshold in [0.0, 0.1, 2.0] {
                let drafting = TreeDrafting {
                    threshold: Some(threshold),
                    lookup: Some(LookupConfig::new(4)),
                };
                let (got, cache) = grown_on_repetitive(m2r2, &tree, drafting);
                let what = format!("{name} {spec} >= {threshold}");
                assert_greedy_rounds(&model, (&want, &got, &cache), &what);
                for round in &got.rounds {
                    for (d, &node) in round.lookup.iter().enumerate() {
                        assert_eq!(round.tree.depth(node), d + 1, "{what}");
                        assert_eq!(node, round.tree.level(d + 1).end - 1, "{what}");
                    }
                    if threshold > 1.0 {
                        assert_eq!(round.tree.nodes(), 1 + round.lookup.len(), "{what}");
                    }
                }
                assert!(got.lookup_rounds() > 0, "{what}: no round found a match");
                accepted += got.lookup_accepted();
            }
        }
    }
    assert!(accepted > 0, "no lookup token was accepted");
}

/// A branch longer than a verify chunk holds is cut to fit beside a grown tree as beside a
/// fixed one (`with_lookup_branch`'s cap): no round passes MAX_TREE_NODES, and the output
/// stays greedy.
#[test]
fn a_long_branch_beside_a_grown_tree_fits_one_chunk() {
    for (name, model, weights) in builtin_models() {
        let m2r2 = M2r2::new(&model, &weights);
        let want = greedy(&model, &REPETITIVE, 40, &[]).unwrap();
        let tree = TokenTree::parse("2,1").unwrap();
        let drafting = TreeDrafting {
            threshold: Some(0.0),
            lookup: Some(LookupConfig::new(2 * MAX_TREE_NODES)),
        };
        let (got, cache) = grown_on_repetitive(m2r2, &tree, drafting);
        assert_greedy_rounds(&model, (&want, &got, &cache), name);
        let room = MAX_TREE_NODES - tree.nodes();
        assert!(got.rounds.iter().all(|r| r.lookup.len() <= room), "{name}");
        assert!(got.rounds.iter().all(|r| r.tree.nodes() <= MAX_TREE_NODES));
        assert!(
            got.rounds.iter().any(|r| r.lookup.len() > tree.nodes()),
            "{name}"
        );
    }
}

/// A guess that equals the top draft: the root's drafted child takes the runner-up, so the
/// tree holds both candidates once each, and the base model's choice at the root is the
/// same either way.
#[test]
fn a_guess_equal_to_the_draft_moves_the_draft_to_the_runner_up() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let m2r2 = M2r2::new(&model, &weights);
    let tree = TokenTree::chain(1).unwrap();
    let prompt = [3u32, 1, 4];
    let fresh = || {
        let mut backend = ReferenceTreeSpeculation::new(m2r2, 1, 16).unwrap();
        let logits = backend.prefill(&prompt).unwrap();
        (backend, argmax(&logits) as u32)
    };
    let (mut plain, last) = fresh();
    let plain = tree_round(&mut plain, &tree, last, None).unwrap();
    let drafted = plain.tokens[1];
    let (mut backend, _) = fresh();
    let round = tree_round_with_lookup(&mut backend, &tree, last, &[drafted, 5]).unwrap();
    // root; 1 (drafted), 2 (guess); 3 (guess)
    assert_eq!(round.lookup, [2, 3]);
    assert_eq!(round.tokens[2..], [drafted, 5]);
    assert_ne!(round.tokens[1], drafted);
    assert!(distinct_siblings(&round));
    let choice = if plain.accepted == 1 {
        drafted
    } else {
        plain.base_token
    };
    let path = round.tree.path(round.node);
    let first = match path.get(1) {
        Some(&node) => round.tokens[node],
        None => round.base_token,
    };
    assert_eq!(first, choice);
}

#[test]
fn missing_gates_and_empty_prompts_are_refused() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let m2r2 = M2r2::new(&model, &weights);
    let tree = TokenTree::parse("2,1").unwrap();
    let err = tree_speculative_generate(m2r2, 0, &tree, &[1], 4, &[], None).unwrap_err();
    assert!(
        err.to_string().contains("draft gate 0 does not exist"),
        "{err}"
    );
    let err = tree_speculative_generate(m2r2, 1, &tree, &[], 4, &[], None).unwrap_err();
    assert!(err.to_string().contains("the prompt is empty"), "{err}");
}

/// A bridge that acts changes the drafts of a wide tree (so the branches read it), and the
/// output stays greedy decoding's.
#[test]
fn bridged_trees_draft_differently_and_stay_greedy() {
    let model = builtin::builtin("tiny").unwrap();
    let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
    let bridge = BridgeConfig::new(1, 4, BridgeSite::ALL.to_vec());
    let bridged = weights
        .clone()
        .with_bridge(&model.config, bridge, 5, 2.0)
        .unwrap();
    let tree = TokenTree::parse("3,2,1").unwrap();
    let prompt = [5u32, 3, 8, 1];
    let want = greedy(&model, &prompt, 24, &[]).unwrap();
    let run = |w: &M2r2Weights| {
        tree_speculative_generate(M2r2::new(&model, w), 1, &tree, &prompt, 24, &[], None).unwrap()
    };
    let (plain, _) = run(&weights);
    let (got, cache) = run(&bridged);
    assert_eq!(got.tokens, want);
    assert!(is_greedy_cache(&model, &prompt, &got.tokens, &cache));
    let drafts = |o: &TreeSpeculativeOutput| -> Vec<Vec<u32>> {
        o.rounds.iter().map(|r| r.tokens.clone()).collect()
    };
    assert_ne!(drafts(&got), drafts(&plain), "the bridge changed no draft");
}
