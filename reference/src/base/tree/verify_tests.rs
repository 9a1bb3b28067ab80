//! Tree verification on the base model: every node's logits are its path's one-token-at-a-time
//! decode, bit for bit; the compacted cache is that decode's cache.

use super::*;
use crate::base::config::{Architecture, ModelConfig, MoeConfig};
use crate::base::kv_cache::KvCache;
use crate::base::layer::TreeRows;
use crate::io::builtin::{self, random_model};
use ndarray::{Array2, ArrayView1};
use proptest::prelude::*;

/// A random tiny model, a verified prefix, a random tree of tokens after it, and the node
/// whose path is accepted.
#[derive(Debug, Clone)]
struct Problem {
    config: ModelConfig,
    seed: u64,
    prefix: Vec<u32>,
    /// Parents of nodes `1..` (breadth-first).
    parents: Vec<usize>,
    /// One token per node.
    tokens: Vec<u32>,
    accept: usize,
}

const VOCAB: u32 = 37;

fn config_strategy() -> impl Strategy<Value = ModelConfig> {
    (
        1usize..4,                                                           // layers
        prop_oneof![Just((4, 2)), Just((2, 2)), Just((4, 1)), Just((6, 3))], // (H, Hkv)
        prop_oneof![Just(4usize), Just(8)],                                  // head dim
        any::<bool>(),                                                       // moe
        any::<bool>(),                                                       // qkv bias
        prop::option::of(2usize..6),                                         // sliding window
    )
        .prop_map(|(layers, (h, hkv), dh, moe, bias, window)| ModelConfig {
            architecture: if moe {
                Architecture::Mixtral
            } else {
                Architecture::Llama
            },
            vocab_size: VOCAB as usize,
            hidden_size: 12,
            intermediate_size: 20,
            num_hidden_layers: layers,
            num_attention_heads: h,
            num_key_value_heads: hkv,
            head_dim: dh,
            max_position_embeddings: 32,
            qkv_bias: bias,
            tie_word_embeddings: !moe,
            sliding_window: window,
            moe: moe.then_some(MoeConfig {
                num_local_experts: 4,
                num_experts_per_tok: 2,
            }),
            ..builtin::tiny_config()
        })
}

/// Breadth-first parents from free choices: node `i` takes a parent in `previous..i`.
fn parents_from(choices: &[usize]) -> Vec<usize> {
    let mut previous = 0;
    (1..=choices.len())
        .map(|i| {
            previous += choices[i - 1] % (i - previous);
            previous
        })
        .collect()
}

fn problem_strategy() -> impl Strategy<Value = Problem> {
    (
        config_strategy(),
        any::<u64>(),
        prop::collection::vec(0..VOCAB, 1..8),
        prop::collection::vec(any::<usize>(), 0..12),
    )
        .prop_flat_map(|(config, seed, prefix, choices)| {
            let nodes = choices.len() + 1;
            (
                Just(config),
                Just(seed),
                Just(prefix),
                Just(parents_from(&choices)),
                prop::collection::vec(0..VOCAB, nodes),
                0..nodes,
            )
        })
        .prop_map(|(config, seed, prefix, parents, tokens, accept)| Problem {
            config,
            seed,
            prefix,
            parents,
            tokens,
            accept,
        })
}

fn same_bits(a: ArrayView1<f32>, b: ArrayView1<f32>) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Positions `0..len` of every layer, bit for bit.
fn same_cache(a: &KvCache, b: &KvCache, layers: usize, len: usize) -> bool {
    (0..layers).all(|l| {
        let ((ak, av), (bk, bv)) = (a.layer(l, len), b.layer(l, len));
        let bits = |x: ndarray::ArrayView2<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        bits(ak) == bits(bk) && bits(av) == bits(bv)
    })
}

impl Problem {
    fn check(&self) -> std::result::Result<(), TestCaseError> {
        let model = random_model(self.config.clone(), self.seed).unwrap();
        let tree = TokenTree::from_parents(&self.parents).unwrap();
        let layers = model.config.num_hidden_layers;
        let mut verified = model.new_cache(self.prefix.len() + tree.nodes()).unwrap();
        model.forward(&self.prefix, &mut verified).unwrap();
        let n = verified.len();

        // the whole tree as one chunk
        let mut cache = verified.clone();
        let logits = model
            .forward_tree(&self.tokens, &tree, &mut cache)
            .unwrap()
            .logits;
        prop_assert_eq!(cache.len(), n);

        // the oracle: each node's path decoded one token at a time after the same cache
        let decode = |node: usize| {
            let mut c = verified.clone();
            let mut last = Array2::zeros((0, 0));
            for a in tree.path(node) {
                last = model.forward(&[self.tokens[a]], &mut c).unwrap().logits;
            }
            (last, c)
        };
        for i in 0..tree.nodes() {
            let (want, _) = decode(i);
            prop_assert!(
                same_bits(logits.row(i), want.row(0)),
                "node {} (path {:?}) logits differ from its path's decode",
                i,
                tree.path(i)
            );
        }

        // depth by depth, as drafting runs it: each level a chunk after the levels before
        let mut stepped = verified.clone();
        for d in 0..=tree.max_depth() {
            let level = tree.level(d);
            let mut s = model.embed(&self.tokens[level.clone()]);
            let rows = TreeRows {
                tree: &tree,
                first: level.start,
            };
            for l in 0..layers {
                model
                    .layer(l)
                    .forward_tree(&mut s, n, rows, &mut stepped, None);
            }
            let head = model.head(s.view()).logits;
            for (t, i) in level.enumerate() {
                prop_assert!(
                    same_bits(head.row(t), logits.row(i)),
                    "level {}, node {}",
                    d,
                    i
                );
            }
        }

        // keep the accepted path: the cache of decoding it
        let path = tree.path(self.accept);
        let (_, want) = decode(self.accept);
        cache.compact(&path);
        prop_assert_eq!(cache.len(), n + path.len());
        prop_assert_eq!(want.len(), n + path.len());
        prop_assert!(
            same_cache(&cache, &want, layers, n + path.len()),
            "compacted cache"
        );
        stepped.compact(&path);
        prop_assert!(
            same_cache(&stepped, &want, layers, n + path.len()),
            "stepped cache"
        );
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Dense and MoE, with and without a sliding window (shorter than the trees' depth),
    /// GQA, biases; chains, stars and everything between.
    #[test]
    fn tree_nodes_are_their_paths_decoded(problem in problem_strategy()) {
        problem.check()?;
    }
}

/// `2,1,1` on the built-in models with a window that slides inside the tree.
#[test]
fn two_chains_on_the_builtin_models() {
    for name in builtin::BUILTIN_NAMES {
        let mut model = builtin::builtin(name).unwrap();
        model.config.sliding_window = Some(3);
        let problem = Problem {
            config: model.config.clone(),
            seed: builtin::BUILTIN_SEED,
            prefix: vec![3, 1, 4, 1, 5],
            parents: vec![0, 0, 1, 2, 3, 4],
            tokens: vec![9, 2, 6, 5, 3, 5, 8],
            accept: 6,
        };
        problem.check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// A tree that does not fit the cache is refused, naming the slots it needs and the capacity.
#[test]
fn a_tree_past_the_cache_is_refused() {
    let model = builtin::builtin("tiny").unwrap();
    let mut cache = model.new_cache(8).unwrap();
    model.forward(&[1, 2, 3], &mut cache).unwrap();
    let tree = TokenTree::parse("2,2").unwrap(); // 7 nodes: slots 3..10
    let err = model
        .forward_tree(&[1; 7], &tree, &mut cache)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("7 nodes after 3 positions needs 10 cache slots")
            && err.contains("the cache holds 8 positions"),
        "{err}"
    );
    let err = model.forward_tree(&[1; 3], &tree, &mut cache).unwrap_err();
    assert!(
        err.to_string()
            .contains("3 tokens for a token tree of 7 nodes")
    );
    let tree = TokenTree::parse("2").unwrap();
    let err = model
        .forward_tree(&[1, 2, 999], &tree, &mut cache)
        .unwrap_err();
    assert!(
        err.to_string().contains("token id 999 at position 4"),
        "{err}"
    );
    assert_eq!(cache.len(), 3);
}
