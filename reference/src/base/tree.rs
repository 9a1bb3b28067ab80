//! Token trees: several candidate continuations of one sequence, verified in one chunk with a
//! tree attention mask (SpecInfer, Medusa, EAGLE-2). The tree's shape only; the layer runs it
//! ([`DecoderLayer::forward_batch`](super::layer::DecoderLayer::forward_batch) with a
//! [`TreeRows`](super::layer::TreeRows)), [`Model::forward_tree`](super::model::Model::forward_tree)
//! runs a whole tree through the model.
//!
//! Nodes are numbered in breadth-first order: node 0 is the root (the newest token, the first one
//! not yet in the cache), every node's parent comes before it, and the nodes of one depth are
//! contiguous, children of an earlier parent first. With the root at position `n` (the cache holds
//! `0..n`):
//!
//! ```text
//! position(i) = n + depth(i)                            RoPE, the sliding window
//! slot(i)     = n + i                                   the cache row node i's K/V is written to
//! sees(i, j)  = j is an ancestor of i, or i itself      the tree mask
//! keys(i)     = cache[lo .. n] ++ [slot(a) for a in path(i) if position(a) >= lo]
//!               (lo = window start of position(i); path(i) = root .. i, depth by depth)
//! ```
//!
//! `keys(i)` are the keys a one-token-at-a-time decode of `path(i)` after the same cache reads at
//! `position(i)`, in the same order (the path holds exactly one node per position `n ..=
//! position(i)`), and the scratch slot of each holds the key that decode computes (same token,
//! same inputs, rotated for the same position). So node `i`'s logits are bitwise that decode's
//! (batch invariance, docs/ARCHITECTURE.md): invisible keys are skipped, not weighted by zero, so
//! the sums run over the same terms in the same order. After acceptance,
//! [`KvCache::compact`](super::kv_cache::KvCache::compact) moves the accepted path's slots to the
//! positions `n ..` (rows already rotated for those positions, so the copy is exact).
//!
//! Shape `W1,W2,...` **\[ours\]**: the root has `W1` children, each node at depth `d >= 1` has
//! `W_{d+1}`; `2,1,1` is two chains of three drafts (7 nodes), and `1,1,...,1` (m ones) the chain
//! of `--draft-len m`.

use crate::error::{Error, Result};
use std::ops::Range;

/// The most nodes (root and drafts) a tree may have: the rows of one verify chunk **\[ours\]**. The
/// batch-invariant product stays near a decode step's cost up to about 16 rows (`matmul.rs`); 64
/// leaves room for wide trees without letting a typo ask for millions of rows.
pub const MAX_TREE_NODES: usize = 64;

/// The shape of a token tree: parents and depths of its nodes in breadth-first order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTree {
    /// `parent[i]` of node `i >= 1`; `parent[0]` is unused (the root).
    parent: Vec<usize>,
    /// `depth[i]`: edges from the root (the root 0).
    depth: Vec<usize>,
}

impl TokenTree {
    /// The tree of shape `W1,W2,...`: each node at depth `d` has `widths[d]` children (the
    /// root alone when `widths` is empty).
    ///
    /// # Errors
    /// A width of 0, or more than [`MAX_TREE_NODES`] nodes.
    pub fn from_widths(widths: &[usize]) -> Result<Self> {
        let shape = shape_text(widths);
        if let Some(d) = widths.iter().position(|&w| w == 0) {
            return Err(Error::Invalid(format!(
                "token tree {shape}: the width at depth {} is 0 (every width is at least 1)",
                d + 1
            )));
        }
        // nodes at each depth: 1, W1, W1 W2, ... (saturating: a huge shape is refused below)
        let mut nodes = 1usize;
        let mut total = 1usize;
        for &w in widths {
            nodes = nodes.saturating_mul(w);
            total = total.saturating_add(nodes);
        }
        check_size(total, &shape)?;
        let mut parent = vec![0];
        let mut level = 0..1;
        for &w in widths {
            let first = parent.len();
            for p in level.clone() {
                parent.extend(std::iter::repeat_n(p, w));
            }
            level = first..parent.len();
        }
        Ok(Self::with_parents(parent))
    }

    /// The tree of a shape written `W1,W2,...` (`"2,1,1"`), as [`TokenTree::from_widths`].
    ///
    /// # Errors
    /// An empty shape, a width that is not a whole number, and [`TokenTree::from_widths`]'s.
    pub fn parse(spec: &str) -> Result<Self> {
        let widths = spec
            .split(',')
            .map(|w| {
                w.trim().parse::<usize>().map_err(|_| {
                    Error::Invalid(format!(
                        "token tree `{spec}`: `{}` is not a width (give widths per depth, \
                         like 2,1,1)",
                        w.trim()
                    ))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        Self::from_widths(&widths)
    }

    /// A chain: the root and `drafts` nodes, each the child of the one before (shape `1,1,...`).
    ///
    /// # Errors
    /// More than [`MAX_TREE_NODES`] nodes.
    pub fn chain(drafts: usize) -> Result<Self> {
        Self::from_widths(&vec![1; drafts])
    }

    /// The tree whose node `i >= 1` has parent `parents[i - 1]`.
    ///
    /// # Errors
    /// Parents not in breadth-first order (each before its child, never decreasing), or more than
    /// [`MAX_TREE_NODES`] nodes.
    pub fn from_parents(parents: &[usize]) -> Result<Self> {
        check_size(
            parents.len() + 1,
            &format!("of {} nodes", parents.len() + 1),
        )?;
        let mut previous = 0;
        for (i, &p) in parents.iter().enumerate() {
            let node = i + 1;
            if p >= node || p < previous {
                return Err(Error::Invalid(format!(
                    "token tree: node {node} has parent {p}, but nodes are in breadth-first \
                     order (each parent before its child, parents never decreasing: here \
                     {previous}..{node})"
                )));
            }
            previous = p;
        }
        let mut parent = vec![0];
        parent.extend_from_slice(parents);
        Ok(Self::with_parents(parent))
    }

    fn with_parents(parent: Vec<usize>) -> Self {
        let mut depth = vec![0; parent.len()];
        for i in 1..parent.len() {
            depth[i] = depth[parent[i]] + 1;
        }
        TokenTree { parent, depth }
    }

    /// Nodes, the root included (at least 1).
    pub fn nodes(&self) -> usize {
        self.parent.len()
    }

    /// The parent of node `i`; `None` for the root.
    pub fn parent(&self, i: usize) -> Option<usize> {
        (i > 0).then(|| self.parent[i])
    }

    /// Edges from the root to node `i`.
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    /// The depth of the deepest node.
    pub fn max_depth(&self) -> usize {
        *self.depth.last().expect("the root")
    }

    /// The nodes at depth `d` (contiguous in breadth-first order; empty past the deepest).
    pub fn level(&self, d: usize) -> Range<usize> {
        let first = self.depth.partition_point(|&x| x < d);
        let end = self.depth.partition_point(|&x| x <= d);
        first..end
    }

    /// The children of node `i`, best candidate first.
    pub fn children(&self, i: usize) -> Range<usize> {
        let first = 1 + self.parent[1..].partition_point(|&p| p < i);
        let end = 1 + self.parent[1..].partition_point(|&p| p <= i);
        first..end
    }

    /// The nodes from the root to `i`, depth by depth: `path(i)[d]` is at depth `d`.
    pub fn path(&self, i: usize) -> Vec<usize> {
        let mut path = vec![i];
        let mut node = i;
        while let Some(p) = self.parent(node) {
            path.push(p);
            node = p;
        }
        path.reverse();
        path
    }

    /// The tree mask: whether node `i` sees node `j` (`j` is an ancestor of `i`, or `i`).
    pub fn sees(&self, i: usize, j: usize) -> bool {
        j <= i && self.path(i).get(self.depth[j]) == Some(&j)
    }

    /// The position of node `i` when the root sits at position `root`: `root + depth(i)`.
    pub fn position(&self, i: usize, root: usize) -> usize {
        root + self.depth[i]
    }

    /// The cache rows a row of node `i` attends to, in key order, with the root at position
    /// `root` and the window starting at `lo`: `lo..root`, then the slots `root + a` of the
    /// nodes `a` of `path(i)` at positions `>= lo`; node `i`'s own slot only `with_self` (a slow
    /// row, which wrote its key; a fast row brings its own).
    pub fn key_slots(&self, i: usize, root: usize, lo: usize, with_self: bool) -> Vec<usize> {
        let mut path = self.path(i);
        if !with_self {
            path.pop();
        }
        (lo..root)
            .chain(
                path.into_iter()
                    .filter(|&a| self.position(a, root) >= lo)
                    .map(|a| root + a),
            )
            .collect()
    }
}

/// `W1,W2,...` as written.
/// A shape as it is written: `2,1,1`.
pub fn shape_text(widths: &[usize]) -> String {
    let text: Vec<String> = widths.iter().map(usize::to_string).collect();
    text.join(",")
}

fn check_size(nodes: usize, what: &str) -> Result<()> {
    if nodes > MAX_TREE_NODES {
        let nodes = if nodes == usize::MAX {
            "too many".to_string()
        } else {
            nodes.to_string()
        };
        return Err(Error::Invalid(format!(
            "token tree {what} has {nodes} nodes (the root and its drafts): one verify chunk \
             takes at most {MAX_TREE_NODES} (MAX_TREE_NODES)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_2_1_1_is_two_chains() {
        let tree = TokenTree::parse("2,1,1").unwrap();
        // root; depth 1: 1, 2; depth 2: 3 (of 1), 4 (of 2); depth 3: 5 (of 3), 6 (of 4)
        assert_eq!(tree.nodes(), 7);
        let parents: Vec<_> = (0..7).map(|i| tree.parent(i)).collect();
        assert_eq!(
            parents,
            [None, Some(0), Some(0), Some(1), Some(2), Some(3), Some(4)]
        );
        assert_eq!(tree.path(6), [0, 2, 4, 6]);
        assert_eq!(tree.path(0), [0]);
        assert_eq!(tree.level(1), 1..3);
        assert_eq!(tree.level(3), 5..7);
        assert_eq!(tree.level(4), 7..7);
        assert_eq!(tree.children(0), 1..3);
        assert_eq!(tree.children(2), 4..5);
        assert_eq!(tree.children(6), 7..7);
        assert_eq!(tree.max_depth(), 3);
        assert_eq!(tree.position(5, 10), 13);
        assert!(tree.sees(6, 4) && tree.sees(6, 0) && tree.sees(6, 6));
        assert!(!tree.sees(6, 3) && !tree.sees(6, 1) && !tree.sees(2, 1) && !tree.sees(0, 1));
        assert_eq!(tree, TokenTree::from_parents(&[0, 0, 1, 2, 3, 4]).unwrap());
    }

    #[test]
    fn a_chain_is_a_chunk() {
        let tree = TokenTree::chain(3).unwrap();
        assert_eq!(tree, TokenTree::parse("1, 1,1").unwrap());
        assert_eq!(TokenTree::chain(0).unwrap().nodes(), 1);
        // a chain's keys are the chunk's: lo..=position, its slots its positions
        for i in 0..4 {
            assert_eq!(tree.position(i, 5), 5 + i);
            assert_eq!(
                tree.key_slots(i, 5, 2, true),
                (2..=5 + i).collect::<Vec<_>>()
            );
            assert_eq!(
                tree.key_slots(i, 5, 2, false),
                (2..5 + i).collect::<Vec<_>>()
            );
        }
    }

    /// The keys of node 6 of `2,1,1` (path 0, 2, 4, 6) with the root at 4 and a window of 3.
    #[test]
    fn key_slots_skip_other_branches_and_the_window() {
        let tree = TokenTree::parse("2,1,1").unwrap();
        // no window: cache 0..4, then slots of 0, 2, 4, 6
        assert_eq!(tree.key_slots(6, 4, 0, true), [0, 1, 2, 3, 4, 6, 8, 10]);
        assert_eq!(tree.key_slots(6, 4, 0, false), [0, 1, 2, 3, 4, 6, 8]);
        // node 6 at position 7, window 3: positions 5..=7, i.e. nodes 2 (slot 6), 4, 6
        assert_eq!(tree.key_slots(6, 4, 5, true), [6, 8, 10]);
        // node 1 at position 5, window 3: cache 3, the root, itself
        assert_eq!(tree.key_slots(1, 4, 3, true), [3, 4, 5]);
    }

    #[test]
    fn bad_shapes_are_refused_with_the_reason() {
        let err = |spec: &str| TokenTree::parse(spec).unwrap_err().to_string();
        assert!(
            err("2,0,1").contains("width at depth 2 is 0"),
            "{}",
            err("2,0,1")
        );
        assert!(err("").contains("`` is not a width"), "{}", err(""));
        assert!(err("2,x").contains("`x` is not a width"));
        assert!(err("-1").contains("`-1` is not a width"));
        // 1 + 8 + 64 = 73 nodes
        let big = err("8,8");
        assert!(
            big.contains("8,8 has 73 nodes") && big.contains("at most 64"),
            "{big}"
        );
        // sizes that overflow are refused, not wrapped
        let huge = err("99999999999,99999999999,99999999999");
        assert!(huge.contains("too many nodes"), "{huge}");
        assert_eq!(TokenTree::from_widths(&[63]).unwrap().nodes(), 64);
        assert!(TokenTree::chain(64).is_err());
        let order = TokenTree::from_parents(&[0, 1, 0]).unwrap_err().to_string();
        assert!(order.contains("node 3 has parent 0"), "{order}");
        assert!(TokenTree::from_parents(&[1]).is_err());
    }
}

/// Tree verification on the base model: every node's logits are its path's one-token-at-a-time
/// decode, bit for bit; the compacted cache is that decode's cache.
#[cfg(test)]
mod verify_tests {
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
            let bits =
                |x: ndarray::ArrayView2<f32>| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
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
}
