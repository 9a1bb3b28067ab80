//! Invariants of the reference base model over random small configs (dense and MoE), checked with
//! proptest:
//! - cached incremental decoding equals a full recompute, bit for bit;
//! - batch invariance: a position's logits are bitwise identical whether it is computed alone or in a
//!   chunk of any split (the property that makes self-speculative decoding exactly lossless);
//! - the KV cache a chunked run builds equals the one token-by-token decoding builds;
//! - truncating the cache and recomputing gives the same logits (rollback).

use ndarray::{Array2, s};
use proptest::prelude::*;
use reference::base::config::{Architecture, ModelConfig, MoeConfig, RopeScaling};
use reference::io::builtin::random_model;
use reference::{KvCache, Model};

/// A random small model: the `Problem` of these property tests.
#[derive(Debug, Clone)]
struct Problem {
    config: ModelConfig,
    seed: u64,
    tokens: Vec<u32>,
    /// Chunk boundaries for the split run (each chunk at least one token).
    splits: Vec<usize>,
}

fn config_strategy() -> impl Strategy<Value = ModelConfig> {
    (
        1usize..4,                                                           // layers
        prop_oneof![Just((4, 2)), Just((2, 2)), Just((4, 1)), Just((6, 3))], // (H, Hkv)
        prop_oneof![Just(4usize), Just(8)],                                  // head dim
        prop::bool::ANY,                                                     // moe
        prop::bool::ANY,                                                     // qkv bias
        prop::option::of(2usize..6),                                         // sliding window
        prop::bool::ANY,                                                     // tied
    )
        .prop_map(
            |(layers, (h, hkv), dh, moe, bias, window, tied)| ModelConfig {
                architecture: if moe {
                    Architecture::Mixtral
                } else {
                    Architecture::Llama
                },
                vocab_size: 37,
                hidden_size: 12,
                intermediate_size: 20,
                num_hidden_layers: layers,
                num_attention_heads: h,
                num_key_value_heads: hkv,
                head_dim: dh,
                max_position_embeddings: 32,
                rms_norm_eps: 1e-5,
                rope_theta: 10000.0,
                rope_scaling: RopeScaling::Default,
                qkv_bias: bias,
                o_bias: false,
                mlp_bias: false,
                tie_word_embeddings: tied,
                sliding_window: window,
                moe: moe.then_some(MoeConfig {
                    num_local_experts: 4,
                    num_experts_per_tok: 2,
                }),
                bos_token_id: None,
                eos_token_ids: vec![],
            },
        )
}

fn problem_strategy() -> impl Strategy<Value = Problem> {
    (
        config_strategy(),
        any::<u64>(),
        prop::collection::vec(0u32..37, 2..14),
    )
        .prop_flat_map(|(config, seed, tokens)| {
            let n = tokens.len();
            (
                Just(config),
                Just(seed),
                Just(tokens),
                prop::collection::btree_set(1..n, 0..4),
            )
        })
        .prop_map(|(config, seed, tokens, cuts)| Problem {
            config,
            seed,
            tokens,
            splits: cuts.into_iter().collect(),
        })
}

impl Problem {
    fn model(&self) -> Model {
        random_model(self.config.clone(), self.seed).unwrap()
    }

    /// Logits of all tokens, fed in the given chunks, and the cache it leaves.
    fn run(&self, model: &Model, bounds: &[usize]) -> (Array2<f32>, KvCache) {
        let mut cache = model.new_cache(self.tokens.len()).unwrap();
        let mut rows = Vec::new();
        let mut start = 0;
        for &end in bounds.iter().chain(std::iter::once(&self.tokens.len())) {
            let logits = model
                .forward(&self.tokens[start..end], &mut cache)
                .unwrap()
                .logits;
            rows.extend(logits.rows().into_iter().map(|r| r.to_owned()));
            start = end;
        }
        let v = model.config.vocab_size;
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        (
            Array2::from_shape_vec((rows.len(), v), flat).unwrap(),
            cache,
        )
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let model = self.model();
        let (whole, whole_cache) = self.run(&model, &[]);
        let one_by_one: Vec<usize> = (1..self.tokens.len()).collect();
        let (stepped, stepped_cache) = self.run(&model, &one_by_one);
        let (split, split_cache) = self.run(&model, &self.splits);
        prop_assert!(
            bitwise_eq(&whole, &stepped),
            "chunked prefill vs token by token"
        );
        prop_assert!(
            bitwise_eq(&whole, &split),
            "chunked prefill vs split {:?}",
            self.splits
        );
        let n = self.tokens.len();
        prop_assert!(
            whole_cache.prefix_equals(&stepped_cache, n),
            "KV cache differs"
        );
        prop_assert!(
            whole_cache.prefix_equals(&split_cache, n),
            "KV cache differs (split)"
        );
        prop_assert!(whole.iter().all(|v| v.is_finite()));

        // Rollback: truncate to a prefix, recompute the rest, same logits.
        let keep = n / 2;
        let mut cache = whole_cache.clone();
        cache.truncate(keep);
        let redone = model
            .forward(&self.tokens[keep..], &mut cache)
            .unwrap()
            .logits;
        prop_assert!(
            bitwise_eq(&whole.slice(s![keep.., ..]).to_owned(), &redone),
            "rollback"
        );
        Ok(())
    }
}

fn bitwise_eq(a: &Array2<f32>, b: &Array2<f32>) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn cache_recompute_and_batch_invariance(problem in problem_strategy()) {
        problem.check()?;
    }
}

/// The built-in configs (random weights), on a longer sequence than the proptest uses.
#[test]
fn builtin_models_are_batch_invariant() {
    for name in ["tiny", "tiny-moe"] {
        let model = reference::io::builtin::builtin(name).unwrap();
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 300) as u32).collect();
        let problem = Problem {
            config: model.config.clone(),
            seed: 0,
            tokens,
            splits: vec![1, 7, 8, 30],
        };
        problem.check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// A named edge case: a sliding window of 2 with GQA and MoE, split so a
/// chunk starts right where the window begins to slide.
#[test]
fn window_boundary_split() {
    let mut config = reference::io::builtin::tiny_moe_config();
    config.sliding_window = Some(2);
    config.num_hidden_layers = 2;
    let problem = Problem {
        config,
        seed: 3,
        tokens: vec![5, 9, 1, 1, 300, 2, 7],
        splits: vec![2, 3],
    };
    problem.check().unwrap();
}
