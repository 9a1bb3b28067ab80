//! What a token-tree golden records besides the graphs' rows: its drafting recipe
//! ([`TreeRecipe`]) and its rounds ([`TreeRounds`]), with the rows of the graphs' logits they imply
//! (layouts in [`tree`](super::tree)).

use super::rounds::step_rounds;
use crate::base::tree::TokenTree;
use crate::decode::prompt_lookup::LookupConfig;
use crate::decode::tree_speculation::{TreeDrafting, TreeRound};
use crate::error::Result;
use crate::m2r2::exit_gate::GateKind;
use ndarray::Array2;

/// How a token-tree golden drafts: the shape, where, and how a round's tree is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRecipe {
    /// 1-based
    pub draft_gate: usize,
    /// `draft_tree`: the widths `W1,W2,...` per depth (the largest tree a round grows)
    pub widths: Vec<usize>,
    /// Grown per branch while this gate's score is at least the threshold; `None`: the whole
    /// shape every round.
    pub grown: Option<(GateKind, f32)>,
    /// A prompt-lookup branch at the root in the rounds that find one.
    pub lookup: Option<LookupConfig>,
}

impl TreeRecipe {
    /// The whole shape `widths` every round, drafted at `draft_gate`.
    pub fn fixed(draft_gate: usize, widths: &[usize]) -> Self {
        TreeRecipe {
            draft_gate,
            widths: widths.to_vec(),
            grown: None,
            lookup: None,
        }
    }

    /// The drafting policy of the tree loop.
    pub fn drafting(&self) -> TreeDrafting {
        TreeDrafting {
            threshold: self.grown.map(|g| g.1),
            lookup: self.lookup,
        }
    }

    /// Whether rounds may differ from the shape (format version 5).
    pub fn varies(&self) -> bool {
        self.grown.is_some() || self.lookup.is_some()
    }

    /// The shape.
    ///
    /// # Errors
    /// Widths `TokenTree::from_widths` refuses.
    pub fn shape(&self) -> Result<TokenTree> {
        TokenTree::from_widths(&self.widths)
    }

    /// The largest tree a round may verify: the shape with the longest lookup branch.
    ///
    /// # Errors
    /// [`TreeRecipe::shape`]'s.
    pub fn largest(&self) -> Result<TokenTree> {
        Ok(self.drafting().largest_tree(&self.shape()?))
    }

    /// The depth below which a grown round's nodes all run the draft (`None`: a fixed tree).
    pub(super) fn grown_depth(&self) -> Option<usize> {
        self.grown.map(|_| self.widths.len())
    }

    /// The recipe in words: `2,1,1`, `1,1,1 grown while confidence >= 0.3, a lookup branch of
    /// up to 4 tokens`.
    pub fn describe(&self) -> String {
        widths_text(&self.widths) + &self.policy()
    }

    /// How rounds differ from the shape, in words after it (empty for a fixed tree).
    pub fn policy(&self) -> String {
        let mut text = String::new();
        if let Some((gate, threshold)) = self.grown {
            text += &format!(" grown while {gate} >= {threshold}");
        }
        if let Some(l) = self.lookup {
            text += &format!(", a lookup branch of up to {} tokens", l.max_tokens);
        }
        text
    }
}

/// The rounds of a token-tree speculative decode as tensors (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRounds {
    /// Every round's tree: the shape, or the tree the round grew, with its lookup branch.
    pub trees: Vec<TokenTree>,
    /// `[R, T]` every node's token, breadth-first (node 0: the root, the last emitted token), -1
    /// past the round's tree
    pub tokens: Array2<i64>,
    /// `[R]` the accepted node
    pub node: Vec<i64>,
    /// `[R]` drafts accepted (the accepted node's depth)
    pub accepted: Vec<i64>,
    /// `[R]` the base model's token after the accepted path (correction or bonus)
    pub base_token: Vec<i64>,
    /// Per round, the lookup branch's nodes by depth (empty: none).
    pub lookup: Vec<Vec<usize>>,
    /// Per round, the nodes the draft proposed from (its rows of `draft_logits`), breadth-first.
    pub proposing: Vec<Vec<usize>>,
    /// `[R, S]` per grown round the draft gate's score of each proposing node, NaN past them
    /// (`S = 0` when no round was grown).
    pub scores: Array2<f32>,
}

impl TreeRounds {
    /// Rounds recorded.
    pub fn len(&self) -> usize {
        self.node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.node.is_empty()
    }

    /// The rounds of a tree decode: `tokens` is as wide as the largest round's tree and at least
    /// `min_nodes`; `grown_depth` is the shape's depth when rounds were grown per branch.
    pub fn from_rounds(
        rounds: &[TreeRound],
        min_nodes: usize,
        grown_depth: Option<usize>,
    ) -> TreeRounds {
        let nodes = rounds
            .iter()
            .map(|r| r.tree.nodes())
            .max()
            .unwrap_or(0)
            .max(min_nodes);
        let mut tokens = Array2::from_elem((rounds.len(), nodes), -1i64);
        let width = rounds.iter().map(|r| r.scores.len()).max().unwrap_or(0);
        let mut scores = Array2::from_elem((rounds.len(), width), f32::NAN);
        for (r, round) in rounds.iter().enumerate() {
            for (i, &t) in round.tokens.iter().enumerate() {
                tokens[[r, i]] = i64::from(t);
            }
            for (i, &x) in round.scores.iter().enumerate() {
                scores[[r, i]] = x;
            }
        }
        TreeRounds {
            trees: rounds.iter().map(|r| r.tree.clone()).collect(),
            tokens,
            node: rounds.iter().map(|r| r.node as i64).collect(),
            accepted: rounds.iter().map(|r| r.accepted as i64).collect(),
            base_token: rounds.iter().map(|r| i64::from(r.base_token)).collect(),
            lookup: rounds.iter().map(|r| r.lookup.clone()).collect(),
            proposing: rounds
                .iter()
                .map(|r| proposing_in(&r.tree, &r.lookup, grown_depth))
                .collect(),
            scores,
        }
    }

    /// `(round, node)` of each row of `verify_logits` (`None` for the prompt's row).
    pub fn verify_rows(&self) -> Vec<Option<(usize, usize)>> {
        std::iter::once(None)
            .chain(
                self.trees
                    .iter()
                    .enumerate()
                    .flat_map(|(r, t)| (0..t.nodes()).map(move |i| Some((r, i)))),
            )
            .collect()
    }

    /// `(round, node)` of each row of `draft_logits`.
    pub fn draft_rows(&self) -> Vec<(usize, usize)> {
        self.proposing
            .iter()
            .enumerate()
            .flat_map(|(r, p)| p.iter().map(move |&i| (r, i)))
            .collect()
    }

    /// The round that emitted each of `n` tokens (`None` for the first, from the prompt's row).
    pub fn step_rounds(&self, n: usize) -> Vec<Option<usize>> {
        step_rounds(&self.accepted, n)
    }
}

/// The nodes of `tree` that propose (have children), breadth-first: the draft's rows of a round
/// of a fixed tree without a lookup branch.
pub fn proposing_nodes(tree: &TokenTree) -> Vec<usize> {
    proposing_in(tree, &[], None)
}

/// The nodes of a round's `tree` the draft ran its logits for, breadth-first (module docs): with
/// `grown_depth` every node above it off the `lookup` branch, else every node with a drafted
/// (not looked-up) child.
pub(super) fn proposing_in(
    tree: &TokenTree,
    lookup: &[usize],
    grown_depth: Option<usize>,
) -> Vec<usize> {
    (0..tree.nodes())
        .filter(|&i| match grown_depth {
            Some(depth) => tree.depth(i) < depth && !lookup.contains(&i),
            None => tree.children(i).any(|c| !lookup.contains(&c)),
        })
        .collect()
}

/// The widths as the metadata writes them: `2,1,1`.
pub use crate::base::tree::shape_text as widths_text;
