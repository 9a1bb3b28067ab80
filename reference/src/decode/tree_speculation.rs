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
//! **Engines.** The loop ([`tree_speculate`], here) and its rounds ([`tree_round`],
//! `decode/tree_round.rs`) run on a [`TreeBackend`]: the reference's is
//! `decode/tree_draft_verify.rs`, the ONNX runner's runs the exported graphs.
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
pub use crate::decode::tree_round::{
    TreeRound, draft_depth, dynamic_round, dynamic_round_with_lookup, top_candidates, tree_round,
    tree_round_with_lookup,
};
use crate::decode::tree_round::{dynamic_round_around, round_with_lookup};
use crate::decode::tree_sampling::TreeSampling;
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;

#[derive(Clone, Debug, PartialEq)]
pub struct TreeSpeculativeOutput {
    pub tokens: Vec<u32>,
    pub rounds: Vec<TreeRound>,
    /// Time spent in the prompt's prefill (decode speed excludes it).
    pub prefill_seconds: f64,
}

impl TreeSpeculativeOutput {
    /// Mean tokens emitted per verification, as
    /// [`SpeculativeOutput::mean_accepted_length`](crate::decode::speculative::SpeculativeOutput::mean_accepted_length)
    /// counts them: a last round cut short by the budget or a stop token counts what it emitted.
    pub fn mean_accepted_length(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.rounds.len().max(1) as f64
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
/// holding what the decode may write ([`tree_positions`]: the prompt, the budget and the largest
/// tree a round may verify, the last round's reaching past the budget), then
/// [`tree_speculate_drafting`]. Returns the output and the cache.
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
    let largest = drafting.largest_tree(tree).nodes();
    let capacity = tree_positions(0, prompt.len(), max_new_tokens, largest);
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

#[cfg(test)]
pub(crate) mod tests;
