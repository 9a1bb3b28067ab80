//! Self-speculation with a token tree (the draft trees of SpecInfer, Medusa, EAGLE-2): the fast
//! stream drafts several candidates at each depth, and the base model verifies the whole tree in
//! one chunk (`base/tree.rs`). A chain drafts only the top candidate and loses the round at its
//! first miss; a tree's runner-up is often right. Greedy as below; with sampling, children are
//! drawn from the draft distribution and accepted by multi-candidate speculative sampling
//! (`decode/tree_sampling.rs`).
//!
//! One round, `last` the newest emitted token (the root, node 0) at position `n`, tree shape
//! `W1,W2,...` with depth `D`, draft gate `g_d` (numbering: docs/m2r2/README.md):
//!
//! ```text
//! draft:   for d = 0..=D: the nodes of depth d, one tree chunk, through intervals 0..g_d
//!          (layers 0..e_gd; slow rows write their slots, s_{e_gd} kept); a node with children also
//!          runs a fast row in interval g_d - 1, and the top W_{d+1} tokens of its exit logits,
//!          best first, are its children's; with a bridge at g_d that row reads h: the verified
//!          s_N[n-1] at the root, its parent's exit state u_gd below it
//! verify:  the kept s_{e_gd} of all nodes through layers e_gd..N as ONE tree chunk
//!          -> y_i = argmax of node i's base logits
//! accept:  from the root, step to the child whose token is y_i while there is one: node a; emit
//!          the drafts on path(a), then y_a (the correction, or the bonus at a leaf)
//! keep:    KvCache::compact(path(a)): the n + depth(a) + 1 positions whose inputs were right
//! ```
//!
//! **Exact.** Node `i`'s base logits are bitwise those of decoding `path(i)` one token at a time
//! (tree verification, `base/tree.rs`), so every accepted draft is the token greedy decoding
//! emits there and `y_a` is greedy's next: the output is greedy decoding's token for token, and
//! the compacted cache is the cache greedy decoding builds.
//!
//! **Engines.** The loop ([`tree_speculate`], [`tree_round`]) runs on a [`TreeBackend`]: the
//! reference's is `decode/tree_draft_verify.rs`, the ONNX runner's runs the exported graphs.
//!
//! **Sampling** (`Some` sampling params): a proposing node's children are `W` i.i.d. draws from
//! its draft distribution `q` (the draft logits through the sampling transform), and the accepted
//! node is chosen from the root by [`TreeSampling::accept`] (SpecInfer's multi-step speculative
//! sampling): lossless in distribution, `None` is greedy as above.
//!
//! **\[ours\]**, this version: the drafts of one depth run as one chunk, each depth after the one
//! before. **Dynamic drafting per branch** ([`tree_speculate_dynamic`], [`dynamic_round`]): the
//! shape is the largest tree a round may draft; the round grows it a level at a time and a node
//! gets its children only when the draft gate scores it at least the threshold (EAGLE-2 grows
//! its trees from the draft's confidence the same way). A chain
//! (`TokenTree::chain(m)`) gives `speculative_generate`'s rounds with a fixed draft length `m`,
//! with and without a bridge, greedy and sampled with the same seed (tested).
//!
//! **A prompt-lookup branch** ([`tree_speculate_with_lookup`], `decode/prompt_lookup.rs`;
//! greedy): each round may also hang a chain of tokens copied from the context at the root, beside
//! the whole shape or beside a tree grown per branch ([`dynamic_round_with_lookup`],
//! [`tree_speculative_generate_drafting`]). Its nodes
//! carry fixed tokens, run their slow rows with their depth and propose nothing, each the last node
//! of its depth; the root's drafted children skip the branch's first token, so no two siblings are
//! alike. Acceptance is the same rule on the round's tree, so the output stays greedy decoding's.
//!
//! **The bridge per branch** ([`crate::m2r2::bridge`], the chain's rule in
//! `decode/bridge_state.rs` applied along each path): a proposing node at position `p` reads the
//! state before it on its own path, `h = s_N[p-1]` for the root (position `p-1` is verified: the
//! previous round's accepted node, or the prompt's last row) and `h = u_gd` of its parent (the
//! parent's exit state with the gate term) below it. Siblings read the same parent state; the
//! rows of one depth get their terms in one product.

use crate::base::kv_cache::KvCache;
use crate::base::ops::argmax;
use crate::base::sampling::SamplingParams;
use crate::base::tree::TokenTree;
use crate::decode::prompt_lookup::{LookupConfig, with_lookup_branch};
pub use crate::decode::tree_backend::TreeBackend;
use crate::decode::tree_backend::tree_positions;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_sampling::TreeSampling;
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
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

#[derive(Clone, Debug, PartialEq)]
pub struct TreeSpeculativeOutput {
    pub tokens: Vec<u32>,
    pub rounds: Vec<TreeRound>,
    /// Time spent in the prompt's prefill (decode speed excludes it).
    pub prefill_seconds: f64,
}

impl TreeSpeculativeOutput {
    /// Mean tokens emitted per verification (accepted drafts plus the base token).
    pub fn mean_accepted_length(&self) -> f64 {
        let emitted: usize = self.rounds.iter().map(|r| r.accepted + 1).sum();
        emitted as f64 / self.rounds.len().max(1) as f64
    }

    /// Per depth `d = 1..=depth`: the fraction of rounds that accepted at least `d` drafts
    /// (non-increasing in `d`; all 0 without rounds).
    pub fn acceptance_by_depth(&self, depth: usize) -> Vec<f64> {
        let rounds = self.rounds.len().max(1) as f64;
        (1..=depth)
            .map(|d| self.rounds.iter().filter(|r| r.accepted >= d).count() as f64 / rounds)
            .collect()
    }

    /// Rounds that verified a lookup branch.
    pub fn lookup_rounds(&self) -> usize {
        self.rounds.iter().filter(|r| !r.lookup.is_empty()).count()
    }

    /// Lookup nodes verified, over all rounds.
    pub fn lookup_nodes(&self) -> usize {
        self.rounds.iter().map(|r| r.lookup.len()).sum()
    }

    /// Tokens emitted as accepted lookup nodes, over all rounds.
    pub fn lookup_accepted(&self) -> usize {
        self.rounds.iter().map(TreeRound::lookup_accepted).sum()
    }

    /// Nodes verified, the roots included, over all rounds.
    pub fn verified_nodes(&self) -> usize {
        self.rounds.iter().map(|r| r.tree.nodes()).sum()
    }
}

/// Decoding of up to `max_new_tokens` after `prompt` on the reference, drafting `tree` from gate
/// `draft_gate` every round ([`tree_speculate`] on a [`ReferenceTreeSpeculation`]; `sampling`:
/// `None` greedy). Returns the output and the cache (the prompt and every emitted token but the
/// last).
///
/// # Errors
/// An empty prompt, a draft gate outside `1..=J`, a cache for the prompt, the budget and one tree
/// beyond the context, bad sampling params, and the base model's input errors.
pub fn tree_speculative_generate(
    m2r2: M2r2<'_>,
    draft_gate: usize,
    tree: &TokenTree,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
    sampling: Option<SamplingParams>,
) -> Result<(TreeSpeculativeOutput, KvCache)> {
    let request = (prompt, max_new_tokens, stop_tokens);
    tree_speculative_generate_drafting(
        m2r2,
        (draft_gate, None),
        tree,
        TreeDrafting::FIXED,
        request,
        sampling,
    )
}

/// [`tree_speculative_generate`] with dynamic drafting per branch ([`tree_speculate_dynamic`]):
/// the reference scores each proposing node with `gate` and gives it children only when the
/// score is at least `threshold`.
///
/// # Errors
/// [`tree_speculative_generate`]'s, and `gate` ARLA without ARLA weights.
#[allow(clippy::too_many_arguments)]
pub fn tree_speculative_generate_dynamic(
    m2r2: M2r2<'_>,
    draft_gate: usize,
    (gate, threshold): (GateKind, f32),
    tree: &TokenTree,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
    sampling: Option<SamplingParams>,
) -> Result<(TreeSpeculativeOutput, KvCache)> {
    let request = (prompt, max_new_tokens, stop_tokens);
    let drafting = TreeDrafting {
        threshold: Some(threshold),
        lookup: None,
    };
    tree_speculative_generate_drafting(
        m2r2,
        (draft_gate, Some(gate)),
        tree,
        drafting,
        request,
        sampling,
    )
}

/// Greedy [`tree_speculative_generate`] with a prompt-lookup branch beside `tree` in each round
/// that `lookup` finds one ([`tree_speculate_with_lookup`]).
///
/// # Errors
/// [`tree_speculative_generate`]'s, and suffix lengths [`LookupConfig::check`] refuses.
pub fn tree_speculative_generate_with_lookup(
    m2r2: M2r2<'_>,
    draft_gate: usize,
    tree: &TokenTree,
    lookup: LookupConfig,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
) -> Result<(TreeSpeculativeOutput, KvCache)> {
    let request = (prompt, max_new_tokens, stop_tokens);
    let drafting = TreeDrafting {
        threshold: None,
        lookup: Some(lookup),
    };
    tree_speculative_generate_drafting(m2r2, (draft_gate, None), tree, drafting, request, None)
}

/// Tree speculation on the reference with any [`TreeDrafting`] (the wrappers above name the common
/// ones; a lookup branch beside a grown tree is `TreeDrafting { threshold: Some(..), lookup:
/// Some(..) }`): a [`ReferenceTreeSpeculation`] at `draft_gate` scoring with `gate`, its cache
/// holding the prompt, the budget and the largest tree a round may verify (the last round's may
/// reach past the budget), then [`tree_speculate_drafting`]. Returns the output and the cache.
///
/// # Errors
/// [`tree_speculative_generate`]'s, [`tree_speculate_drafting`]'s, and dynamic drafting without
/// `gate`.
pub fn tree_speculative_generate_drafting(
    m2r2: M2r2<'_>,
    (draft_gate, gate): (usize, Option<GateKind>),
    tree: &TokenTree,
    drafting: TreeDrafting,
    (prompt, max_new_tokens, stop_tokens): (&[u32], usize, &[u32]),
    sampling: Option<SamplingParams>,
) -> Result<(TreeSpeculativeOutput, KvCache)> {
    if prompt.is_empty() {
        return Err(empty_prompt());
    }
    let capacity = prompt.len() + max_new_tokens + drafting.largest_tree(tree).nodes();
    let mut backend = ReferenceTreeSpeculation::new(m2r2, draft_gate, capacity)?.with_gate(gate);
    let request = (prompt, max_new_tokens, stop_tokens);
    let out = tree_speculate_drafting(&mut backend, tree, drafting, request, sampling)?;
    Ok((out, backend.into_cache()))
}

/// Tree speculation on any engine: prefill `prompt`, then rounds of [`tree_round`] until
/// `max_new_tokens` tokens or a stop token; `sampling`: `None` greedy (the output is greedy
/// decoding's), `Some` seeded speculative sampling (the output is distributed as sampling from
/// the base model). The backend's cache ends holding the prompt and every emitted token but the
/// last.
///
/// # Errors
/// An empty prompt, bad sampling params, the backend's refusal of the tree, and its errors.
pub fn tree_speculate<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
    sampling: Option<SamplingParams>,
) -> Result<TreeSpeculativeOutput> {
    let sampling = sampling.map(TreeSampling::new).transpose()?;
    tree_speculate_with(backend, tree, prompt, max_new_tokens, stop_tokens, sampling)
}

/// [`tree_speculate`] with the sampler given (the tests give it another node rule).
pub(crate) fn tree_speculate_with<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
    sampling: Option<TreeSampling>,
) -> Result<TreeSpeculativeOutput> {
    let request = (prompt, max_new_tokens, stop_tokens);
    speculate(backend, tree, TreeDrafting::FIXED, request, sampling)
}

/// [`tree_speculate`] with dynamic drafting per branch: `tree` is the largest shape a round may
/// draft, and each round grows it a level at a time, giving a node its children only when its
/// gate score is at least `threshold` ([`dynamic_round`]). The backend must score its proposing
/// rows (the reference's [`ReferenceTreeSpeculation::with_gate`], the ONNX runner's gate).
///
/// # Errors
/// [`tree_speculate`]'s, and a backend that gives no scores.
pub fn tree_speculate_dynamic<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    threshold: f32,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
    sampling: Option<SamplingParams>,
) -> Result<TreeSpeculativeOutput> {
    let sampling = sampling.map(TreeSampling::new).transpose()?;
    let request = (prompt, max_new_tokens, stop_tokens);
    speculate(
        backend,
        tree,
        TreeDrafting {
            threshold: Some(threshold),
            lookup: None,
        },
        request,
        sampling,
    )
}

/// Greedy [`tree_speculate`] where each round also verifies the guess of `lookup` after the
/// context (the prompt and the tokens emitted so far) as a branch at the root, when it finds one
/// ([`tree_round_with_lookup`]). The backend is asked to take the largest such tree.
///
/// # Errors
/// [`tree_speculate`]'s, and suffix lengths [`LookupConfig::check`] refuses.
pub fn tree_speculate_with_lookup<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    lookup: LookupConfig,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
) -> Result<TreeSpeculativeOutput> {
    lookup.check()?;
    let request = (prompt, max_new_tokens, stop_tokens);
    speculate(
        backend,
        tree,
        TreeDrafting {
            threshold: None,
            lookup: Some(lookup),
        },
        request,
        None,
    )
}

/// How a round's tree is drafted: the whole shape every round, or grown a level at a time within
/// it (`threshold`: a node gets children when its gate score is at least this), with a
/// prompt-lookup branch at the root in the rounds where `lookup` finds one (greedy only).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TreeDrafting {
    pub threshold: Option<f32>,
    pub lookup: Option<LookupConfig>,
}

impl TreeDrafting {
    /// The whole shape every round, nothing else.
    pub const FIXED: TreeDrafting = TreeDrafting {
        threshold: None,
        lookup: None,
    };

    /// The largest tree a round may verify: `tree` with the longest lookup branch (as many of
    /// its tokens as one verify chunk holds).
    pub fn largest_tree(&self, tree: &TokenTree) -> TokenTree {
        let branch = self.lookup.map_or(0, |l| l.max_tokens);
        with_lookup_branch(tree, branch).tree
    }
}

/// Tree speculation with any [`TreeDrafting`]: [`tree_speculate`], [`tree_speculate_with_lookup`]
/// or [`tree_speculate_dynamic`] (what the command lines call). With sampling, a lookup branch's
/// tokens are verified as deterministic proposals (`tree_sampling::verify_node_with_fixed`).
///
/// # Errors
/// Theirs, and suffix lengths [`LookupConfig::check`] refuses.
pub fn tree_speculate_drafting<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    drafting: TreeDrafting,
    (prompt, max_new_tokens, stop_tokens): (&[u32], usize, &[u32]),
    sampling: Option<SamplingParams>,
) -> Result<TreeSpeculativeOutput> {
    if let Some(lookup) = drafting.lookup {
        lookup.check()?;
    }
    let sampling = sampling.map(TreeSampling::new).transpose()?;
    let request = (prompt, max_new_tokens, stop_tokens);
    speculate(backend, tree, drafting, request, sampling)
}

/// The loop: drafting, a lookup branch beside it, greedy or sampled.
fn speculate<B: TreeBackend>(
    backend: &mut B,
    tree: &TokenTree,
    drafting: TreeDrafting,
    (prompt, max_new_tokens, stop_tokens): (&[u32], usize, &[u32]),
    mut sampling: Option<TreeSampling>,
) -> Result<TreeSpeculativeOutput> {
    let TreeDrafting { threshold, lookup } = drafting;
    if prompt.is_empty() {
        return Err(empty_prompt());
    }
    let largest = drafting.largest_tree(tree);
    let positions = tree_positions(backend.len(), prompt.len(), max_new_tokens, largest.nodes());
    backend.check_tree(&largest, positions)?;
    let start = std::time::Instant::now();
    let prompt_logits = backend.prefill(prompt)?;
    let mut out = TreeSpeculativeOutput {
        tokens: vec![],
        rounds: vec![],
        prefill_seconds: start.elapsed().as_secs_f64(),
    };
    if max_new_tokens == 0 {
        return Ok(out);
    }
    let mut last = match &mut sampling {
        Some(s) => s.token(&prompt_logits),
        None => argmax(&prompt_logits) as u32,
    };
    out.tokens.push(last);
    // what lookup searches: the prompt and the emitted tokens, the root last
    let mut context = prompt.to_vec();
    while out.tokens.len() < max_new_tokens && !stop_tokens.contains(&last) {
        // at most the branch the largest tree holds (`with_lookup_branch` caps it to fit one
        // verify chunk), for fixed and grown trees alike
        let mut guess = match lookup {
            Some(l) => {
                context.extend_from_slice(&out.tokens[context.len() - prompt.len()..]);
                l.guess(&context)
            }
            None => Vec::new(),
        };
        guess.truncate(largest.nodes() - tree.nodes());
        let round = match threshold {
            Some(threshold) => {
                dynamic_round_around(backend, tree, threshold, last, &guess, sampling.as_mut())?
            }
            None if guess.is_empty() => tree_round(backend, tree, last, sampling.as_mut())?,
            None => round_with_lookup(backend, tree, last, &guess, sampling.as_mut())?,
        };
        let path = round.tree.path(round.node);
        let mut emitted: Vec<u32> = path[1..].iter().map(|&i| round.tokens[i]).collect();
        emitted.push(round.base_token);
        // stop at a stop token or the budget; the cache keeps the inputs of emitted tokens
        let room = max_new_tokens - out.tokens.len();
        let end = emitted
            .iter()
            .position(|t| stop_tokens.contains(t))
            .map_or(emitted.len(), |i| i + 1)
            .min(room);
        emitted.truncate(end);
        backend.accept(&path[..end])?;
        last = *emitted.last().expect("at least one token per round");
        out.tokens.extend(emitted);
        out.rounds.push(round);
    }
    Ok(out)
}

fn empty_prompt() -> Error {
    Error::Invalid("the prompt is empty: give at least one token".into())
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
fn round_with_lookup<B: TreeBackend>(
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
fn dynamic_round_around<B: TreeBackend>(
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

#[cfg(test)]
pub(crate) mod tests {
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
                        let mut tree_backend =
                            ReferenceTreeSpeculation::new(m2r2, gate, 64).unwrap();
                        let got = tree_speculate(&mut tree_backend, &tree, &prompt, 12, &[], None)
                            .unwrap();
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
                        tree_speculative_generate(m2r2, gate, &tree, &prompt, 40, &[], None)
                            .unwrap();
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
            tree_speculative_generate(M2r2::new(&model, w), 1, &tree, &prompt, 24, &[], None)
                .unwrap()
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
}
