//! One round of tree speculation (`decode/tree_speculation.rs` drives the rounds): draft the tree
//! depth by depth, each depth one chunk through the draft layers ([`draft_depth`]), verify every
//! node in one chunk through the upper layers, then accept the deepest node whose path the base
//! model agrees with ([`tree_round`]). With dynamic drafting the tree grows a level at a time
//! from the draft gate's scores ([`dynamic_round`]); with a prompt-lookup branch its nodes carry
//! their tokens and propose nothing ([`tree_round_with_lookup`], [`dynamic_round_with_lookup`]).

use crate::base::ops::argmax;
use crate::base::tree::TokenTree;
use crate::decode::prompt_lookup::with_lookup_branch;
use crate::decode::tree_backend::TreeBackend;
use crate::decode::tree_sampling::TreeSampling;
use crate::error::{Error, Result};
use std::cmp::Ordering;

/// One verification round of tree speculation.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRound {
    /// Positions in the cache when the round began: the root's position.
    pub start: usize,
    /// Every node's token, breadth-first: the root (the last emitted token), then the drafts.
    pub tokens: Vec<u32>,
    /// The accepted node: its path's drafts were accepted.
    pub node: usize,
    /// How many drafts were accepted (the accepted node's depth).
    pub accepted: usize,
    /// The base model's token after the accepted path (correction or bonus).
    pub base_token: u32,
    /// The round's tree: the run's, or the run's with a lookup branch at its root.
    pub tree: TokenTree,
    /// The nodes of the round's lookup branch, by depth (empty: no branch).
    pub lookup: Vec<usize>,
    /// Dynamic drafting: the gate score of each node that could propose, breadth-first (those
    /// below the threshold got no children); empty otherwise.
    pub scores: Vec<f32>,
}

impl TreeRound {
    /// The accepted drafts that came from the lookup branch (all of them or none: the branch
    /// is a chain at the root).
    pub fn lookup_accepted(&self) -> usize {
        if self.lookup.contains(&self.node) {
            self.accepted
        } else {
            0
        }
    }
}

/// Draft `tree` after `last` (the root, at position `backend.len()`), verify it, and choose the
/// accepted node: greedily, or by speculative sampling with `sampling` (which draws the children
/// and keeps the random stream across rounds). Leaves the round's nodes in the backend for
/// [`TreeBackend::accept`].
///
/// # Errors
/// The backend's.
pub fn tree_round<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    last: u32,
    sampling: Option<&mut TreeSampling>,
) -> Result<TreeRound> {
    round_around(backend, tree, last, &[], sampling)
}

/// A greedy [`tree_round`] on `tree` with `guess` as a chain at its root
/// ([`with_lookup_branch`]): the round's tree
/// is the merged one; `tree` itself when `guess` is empty.
///
/// # Errors
/// The backend's.
pub fn tree_round_with_lookup<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    last: u32,
    guess: &[u32],
) -> Result<TreeRound> {
    round_with_lookup(backend, tree, last, guess, None)
}

/// [`tree_round_with_lookup`], greedy or sampled.
pub(crate) fn round_with_lookup<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    last: u32,
    guess: &[u32],
    sampling: Option<&mut TreeSampling>,
) -> Result<TreeRound> {
    let merged = with_lookup_branch(tree, guess.len());
    let fixed: Vec<(usize, u32)> = merged.lookup.iter().copied().zip(guess.to_vec()).collect();
    round_around(backend, &merged.tree, last, &fixed, sampling)
}

/// [`tree_round`] where the nodes of `fixed` (`(node, token)`, ascending) already carry their
/// tokens (a lookup branch): see [`draft_depth`]'s `fixed`.
fn round_around<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    last: u32,
    fixed: &[(usize, u32)],
    mut sampling: Option<&mut TreeSampling>,
) -> Result<TreeRound> {
    let mut tokens = vec![0u32; tree.nodes()];
    tokens[0] = last;
    for &(node, token) in fixed {
        tokens[node] = token;
    }
    let fixed: Vec<usize> = fixed.iter().map(|f| f.0).collect();
    // sampling: each proposing node's draft distribution q (empty for the others)
    let mut drafts = vec![Vec::new(); tree.nodes()];
    // draft: depth by depth, each depth one chunk
    for d in 0..=tree.max_depth() {
        draft_depth_around(
            backend,
            tree,
            d,
            (&mut tokens, &fixed),
            sampling.as_deref_mut(),
            &mut drafts,
        )?;
    }
    let round = finish_round(backend, tree, (tokens, &fixed), &drafts, sampling)?;
    Ok(TreeRound {
        lookup: fixed,
        ..round
    })
}

/// A round's verification and acceptance, once every node has its token: the tree through the
/// upper layers as one chunk, then the accepted node (greedily, or by speculative sampling with
/// the proposing nodes' draft distributions `drafts`, the `fixed` nodes (a lookup branch,
/// ascending) as deterministic proposals).
fn finish_round<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    (tokens, fixed): (Vec<u32>, &[usize]),
    drafts: &[Vec<f32>],
    sampling: Option<&mut TreeSampling>,
) -> Result<TreeRound> {
    let n = backend.len();
    let base = backend.verify_tree(tree)?; // [T, V]
    let (node, base_token) = match sampling {
        Some(s) => s.accept(tree, (&tokens, fixed), drafts, &base),
        None => {
            let choice = |i: usize| argmax(base.row(i).as_slice().expect("contiguous")) as u32;
            // accept: follow the base model's choices down the tree
            let mut node = 0;
            while let Some(child) = tree.children(node).find(|&c| tokens[c] == choice(node)) {
                node = child;
            }
            (node, choice(node))
        }
    };
    Ok(TreeRound {
        start: n,
        accepted: tree.depth(node),
        base_token,
        node,
        tokens,
        tree: tree.clone(),
        lookup: Vec::new(),
        scores: Vec::new(),
    })
}

/// A round with dynamic drafting per branch, within `shape` (widths `W1..WD`): the tree starts
/// as the root alone and grows a level at a time. Every node of depth `d < D` runs its fast row
/// and is scored by the draft gate; one whose score is at least `threshold` gets `W_{d+1}`
/// children (its top candidates, or draws with `sampling`), the others stay leaves. Then the
/// grown tree is verified as [`tree_round`]'s. A chain shape (`1,1,...`) drafts exactly what the
/// chain loop's dynamic draft length does (tested); the tree depends on the draft alone, so the
/// output stays greedy decoding's, or distributed as sampling (SpecInfer's rule holds for any
/// tree chosen from the draft).
///
/// # Errors
/// The backend's, and a backend that gives no scores.
pub fn dynamic_round<B: TreeBackend>(
    backend: &mut B,
    shape: &TokenTree,
    threshold: f32,
    last: u32,
    sampling: Option<&mut TreeSampling>,
) -> Result<TreeRound> {
    dynamic_round_around(backend, shape, threshold, last, &[], sampling)
}

/// A greedy [`dynamic_round`] with `guess` (a prompt-lookup branch) as a chain at the root: its
/// nodes carry their tokens, run their rows through the draft layers and propose nothing, each
/// the last node of its depth (as [`with_lookup_branch`] numbers them); the root's drafted
/// children skip the guessed token. The grown tree and the branch are verified together.
///
/// # Errors
/// [`dynamic_round`]'s.
pub fn dynamic_round_with_lookup<B: TreeBackend>(
    backend: &mut B,
    shape: &TokenTree,
    threshold: f32,
    last: u32,
    guess: &[u32],
) -> Result<TreeRound> {
    dynamic_round_around(backend, shape, threshold, last, guess, None)
}

/// [`dynamic_round`] with an optional lookup branch `guess` (empty: none; greedy only).
pub(crate) fn dynamic_round_around<B: TreeBackend>(
    backend: &mut B,
    shape: &TokenTree,
    threshold: f32,
    last: u32,
    guess: &[u32],
    mut sampling: Option<&mut TreeSampling>,
) -> Result<TreeRound> {
    // the shape's width at each depth 1..=D (a shape from widths is uniform per depth)
    let widths: Vec<usize> = (0..shape.max_depth())
        .map(|d| shape.children(shape.level(d).start).len())
        .collect();
    let (mut parents, mut tokens) = (Vec::new(), vec![last]);
    let mut drafts = vec![Vec::new()];
    let mut scores = Vec::new();
    // the branch's node of each depth 1..=guess.len(), in order
    let mut branch: Vec<usize> = Vec::new();
    let mut tree = TokenTree::from_parents(&parents)?;
    for d in 0.. {
        let level = tree.level(d);
        if level.is_empty() {
            break;
        }
        // the branch's node of this depth (the root at 0) takes the next guessed token as its
        // child, and proposes nothing itself beyond the root
        let branch_node = if d == 0 {
            Some(0)
        } else {
            branch.get(d - 1).copied()
        };
        let guessed = branch_node.and(guess.get(d).copied());
        // the children each drafted node of this depth would get (none past the shape)
        let width = widths.get(d).copied();
        let proposing: Vec<usize> = match width {
            Some(_) => (0..level.len())
                .filter(|&r| !branch.contains(&(level.start + r)))
                .collect(),
            None => Vec::new(),
        };
        let drafted = backend.draft_level(&tree, d, &tokens[level.clone()], &proposing)?;
        if !proposing.is_empty() {
            let level_scores = drafted.scores.ok_or_else(|| {
                Error::Invalid(
                    "dynamic drafting needs the draft gate's score: give the engine a gate".into(),
                )
            })?;
            let width = width.expect("proposing");
            for (i, &score) in level_scores.iter().enumerate() {
                scores.push(score);
                if score < threshold {
                    continue;
                }
                let node = level.start + proposing[i];
                let logits = drafted.logits.row(i);
                let logits = logits.as_slice().expect("contiguous");
                // the root's drafted children skip the guessed token
                let taken: Vec<u32> = guessed.filter(|_| node == 0).into_iter().collect();
                let children = drafted_children(
                    logits,
                    (width, &taken),
                    sampling.as_deref_mut(),
                    &mut drafts[node],
                );
                for token in children {
                    parents.push(node);
                    tokens.push(token);
                    drafts.push(Vec::new());
                }
            }
        }
        if let (Some(parent), Some(token)) = (branch_node, guessed) {
            // last of the next depth: every drafted child of this depth is numbered before it
            branch.push(tokens.len());
            parents.push(parent);
            tokens.push(token);
            drafts.push(Vec::new());
        }
        tree = TokenTree::from_parents(&parents)?;
    }
    let round = finish_round(backend, &tree, (tokens, &branch), &drafts, sampling)?;
    Ok(TreeRound {
        scores,
        lookup: branch,
        ..round
    })
}

/// Draft depth `d` of `tree` (after depths `0..d`): the depth's nodes (`tokens` of
/// `tree.level(d)`) as one chunk through the backend's draft layers; the children of its
/// proposing nodes get their tokens: the top candidates of the node's draft logits, or drawn from
/// its draft distribution `q` with `sampling` (then `drafts[node] = q`).
///
/// # Errors
/// The backend's.
pub fn draft_depth<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    d: usize,
    tokens: &mut [u32],
    sampling: Option<&mut TreeSampling>,
    drafts: &mut [Vec<f32>],
) -> Result<()> {
    draft_depth_around(backend, tree, d, (tokens, &[]), sampling, drafts)
}

/// [`draft_depth`] where the nodes `fixed` (ascending) already hold their tokens in `tokens` (a
/// lookup branch): they are drafted nothing and propose only if they have drafted children; a
/// node's drafted children take its top candidates other than its fixed children's tokens, so no
/// two siblings are alike (greedy; sampling draws as [`draft_depth`]).
fn draft_depth_around<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    d: usize,
    (tokens, fixed): (&mut [u32], &[usize]),
    mut sampling: Option<&mut TreeSampling>,
    drafts: &mut [Vec<f32>],
) -> Result<()> {
    let level = tree.level(d);
    let drafted = |c: &usize| fixed.binary_search(c).is_err();
    // the rows of the level whose nodes have drafted children: they propose
    let proposing: Vec<usize> = level
        .clone()
        .filter(|&i| tree.children(i).any(|c| drafted(&c)))
        .map(|i| i - level.start)
        .collect();
    let logits = backend
        .draft_level(tree, d, &tokens[level.clone()], &proposing)?
        .logits; // [P, V]
    for (row, &t) in proposing.iter().enumerate() {
        let node = level.start + t;
        let children = tree.children(node);
        let taken: Vec<u32> = children
            .clone()
            .filter(|c| !drafted(c))
            .map(|c| tokens[c])
            .collect();
        let wanted = children.len() - taken.len();
        let logits = logits.row(row);
        let logits = logits.as_slice().expect("contiguous");
        let best = drafted_children(
            logits,
            (wanted, &taken),
            sampling.as_deref_mut(),
            &mut drafts[node],
        );
        for (child, token) in children.filter(drafted).zip(best) {
            tokens[child] = token;
        }
    }
    Ok(())
}

/// The tokens of a proposing node's `wanted` drafted children from its draft `logits`: drawn with
/// `sampling` (its draft distribution `q` goes to `draft`), else its top candidates other than
/// `taken` (tokens its other children already carry, a lookup branch's), so no two siblings are
/// alike. The fixed and the grown rounds draft their children here.
fn drafted_children(
    logits: &[f32],
    (wanted, taken): (usize, &[u32]),
    sampling: Option<&mut TreeSampling>,
    draft: &mut Vec<f32>,
) -> Vec<u32> {
    match sampling {
        Some(s) => {
            let (drawn, q) = s.children(logits, wanted);
            *draft = q;
            drawn
        }
        None => top_candidates(logits, wanted + taken.len())
            .into_iter()
            .filter(|token| !taken.contains(token))
            .take(wanted)
            .collect(),
    }
}

/// The `k` tokens with the highest logits, best first; ties (and `-inf`s) in token order, NaN
/// last: the first is [`argmax`]'s choice, so a chain drafts what the chain loop drafts.
///
/// # Shapes
/// - `logits`: `[V]`
pub fn top_candidates(logits: &[f32], k: usize) -> Vec<u32> {
    let rank = |a: f32, b: f32| match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => a.partial_cmp(&b).expect("not NaN"),
    };
    // higher logit first, then lower token id: a total order, so selecting the k best and
    // sorting only them gives what a stable sort of the whole vocabulary gives
    let before = |&a: &usize, &b: &usize| rank(logits[b], logits[a]).then(a.cmp(&b));
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(order.len());
    if k == 0 {
        return Vec::new();
    }
    order.select_nth_unstable_by(k - 1, before);
    order.truncate(k);
    order.sort_unstable_by(before);
    order.into_iter().map(|t| t as u32).collect()
}
