//! The random decoding problems the property tests draw: a small random model, its random M2R2
//! weights and a prompt ([`DecodeProblem`]), and for self-speculation the draft settings
//! ([`DraftSettings`]). One copy for the reference's tests (`tests/tests/speculative.rs`,
//! `early_exit.rs`) and the ONNX runner's (`onnx-runner/tests/equivalence.rs`).

use proptest::prelude::*;
use reference::Model;
use reference::decode::speculative::DraftLength;
use reference::io::builtin::random_model;
use reference::m2r2::bridge::{BridgeConfig, BridgeSite};
use reference::m2r2::config::M2r2Config;
use reference::m2r2::draft_head::DraftHead;
use reference::m2r2::weights::M2r2Weights;
use std::ops::Range;

/// A random small model ([`small_config`]) and a prompt to decode with it.
#[derive(Debug, Clone)]
pub struct DecodeProblem {
    pub layers: usize,
    pub moe: bool,
    pub seed: u64,
    pub vocab: usize,
    pub prompt: Vec<u32>,
    pub new_tokens: usize,
    /// Adapter ranks per interval (interval j takes entry `j % 3`, PEFT's `rank_pattern` case), or
    /// `None` for the config's one rank.
    pub ranks: Option<[usize; 3]>,
}

impl DecodeProblem {
    /// Problems with `layers` layers, dense or MoE, any seed, a prompt of `prompt_len` tokens below
    /// `vocab`, `new_tokens` tokens to decode, and half the time ranks 1-8 per interval.
    pub fn strategy(
        layers: Range<usize>,
        vocab: usize,
        prompt_len: Range<usize>,
        new_tokens: Range<usize>,
    ) -> impl Strategy<Value = DecodeProblem> {
        (
            layers,
            any::<bool>(),
            any::<u64>(),
            prop::collection::vec(0u32..vocab as u32, prompt_len),
            new_tokens,
            prop::option::of(prop::array::uniform3(1usize..9)),
        )
            .prop_map(move |(layers, moe, seed, prompt, new_tokens, ranks)| {
                DecodeProblem {
                    layers,
                    moe,
                    seed,
                    vocab,
                    prompt,
                    new_tokens,
                    ranks,
                }
            })
    }

    /// The model (seed `seed`) and random M2R2 weights with the default config (seed
    /// `seed ^ weights_salt`), at `ranks` when given.
    pub fn setup(&self, weights_salt: u64) -> (Model, M2r2Weights) {
        let config = small_config(self.layers, self.moe, self.vocab);
        let model = random_model(config.clone(), self.seed).unwrap();
        let seed = self.seed ^ weights_salt;
        let m2r2 = M2r2Config::default_for(&config);
        let weights = match self.ranks {
            Some(r) => {
                let ranks: Vec<usize> = (0..m2r2.num_gates()).map(|j| r[j % 3]).collect();
                M2r2Weights::random_ranked(&config, m2r2, &ranks, seed)
            }
            None => M2r2Weights::random(&config, m2r2, seed),
        }
        .unwrap();
        (model, weights)
    }
}

/// How a self-speculation property test drafts.
#[derive(Debug, Clone)]
pub struct DraftSettings {
    /// Index into the gates (0-based, taken modulo their number) of the draft gate.
    pub draft_gate: usize,
    pub draft: DraftLength,
    /// Token ids of a pruned draft head, or the full head.
    pub head: Option<Vec<u32>>,
    /// The bridge's sites (rank 3, random nonzero maps), or none.
    pub bridge: Option<Vec<BridgeSite>>,
}

impl DraftSettings {
    /// Any of the first three gates, drafts of up to `max_draft - 1` tokens
    /// ([`draft_length_strategy`]), a pruned head of 1 to 19 tokens below `vocab` half the time,
    /// and a bridge (entry, gate or both) half the time.
    pub fn strategy(max_draft: usize, vocab: u32) -> impl Strategy<Value = DraftSettings> {
        (
            0usize..3,
            draft_length_strategy(max_draft),
            prop::option::of(prop::collection::btree_set(0u32..vocab, 1..20)),
            prop::option::of(prop::sample::select(vec![
                vec![BridgeSite::Entry],
                vec![BridgeSite::Gate],
                vec![BridgeSite::Entry, BridgeSite::Gate],
            ])),
        )
            .prop_map(|(draft_gate, draft, head, bridge)| DraftSettings {
                draft_gate,
                draft,
                head: head.map(|h| h.into_iter().collect()),
                bridge,
            })
    }

    /// Put the pruned head and the bridge (if any) on `weights` of `model` and return the 1-based
    /// draft gate.
    pub fn apply(&self, model: &Model, weights: &mut M2r2Weights) -> usize {
        let vocab = model.config.vocab_size;
        weights.draft_head = self
            .head
            .clone()
            .map(|t| DraftHead::new(t, vocab, "test").unwrap());
        let draft_gate = 1 + self.draft_gate % weights.config.num_gates();
        if let Some(sites) = &self.bridge {
            let config = BridgeConfig {
                gate: draft_gate,
                rank: 3,
                sites: sites.clone(),
                // a scale other than 1 where the entry is used
                scales: sites
                    .iter()
                    .filter(|&&s| s == BridgeSite::Entry)
                    .map(|&s| (s, 0.5))
                    .collect(),
            };
            *weights = weights
                .clone()
                .with_bridge(&model.config, config, 0xb41d6e, 0.5)
                .unwrap();
        }
        draft_gate
    }
}

/// A small model config for property tests: `D = 16`, `I = 24`, 4 query heads over 2 key/value heads
/// of 4, context 64; Mixtral-like (4 experts, top-2, untied head) when `moe`, else Llama-like with a
/// tied head. Everything else as the built-in `tiny`.
pub fn small_config(layers: usize, moe: bool, vocab: usize) -> reference::ModelConfig {
    use reference::base::config::{Architecture, MoeConfig};
    reference::ModelConfig {
        architecture: if moe {
            Architecture::Mixtral
        } else {
            Architecture::Llama
        },
        vocab_size: vocab,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: layers,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 4,
        max_position_embeddings: 64,
        tie_word_embeddings: !moe,
        moe: moe.then_some(MoeConfig {
            num_local_experts: 4,
            num_experts_per_tok: 2,
        }),
        ..reference::io::builtin::tiny_config()
    }
}

/// Draft lengths for speculative property tests: fixed `1..max` drafts, or dynamic drafting of up
/// to `1..max` proposals with any gate at a threshold in `[0, 1)`.
pub fn draft_length_strategy(
    max: usize,
) -> impl proptest::strategy::Strategy<Value = reference::decode::speculative::DraftLength> {
    use proptest::prelude::*;
    use reference::decode::speculative::DraftLength;
    use reference::m2r2::exit_gate::GateKind;
    prop_oneof![
        (1usize..max).prop_map(DraftLength::Fixed),
        (
            1usize..max,
            prop_oneof![
                Just(GateKind::Arla),
                Just(GateKind::Confidence),
                Just(GateKind::Entropy)
            ],
            0.0f32..1.0
        )
            .prop_map(|(max, gate, threshold)| DraftLength::Dynamic {
                max,
                gate,
                threshold
            }),
    ]
}
