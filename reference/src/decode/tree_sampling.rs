//! Lossless speculative sampling on a token tree (docs/m2r2/speculative.md): SpecInfer's
//! multi-step speculative sampling (Miao et al., 2024, Theorem 4.2), the chain's rule tried
//! sibling after sibling. `decode/tree_speculation.rs` runs it when sampling params are given.
//!
//! **Drafting.** A proposing node's `W` children are `W` independent draws (duplicates allowed)
//! from its draft distribution `q`: the draft logits through the same sampling transform as the
//! base model's (temperature, top-k, top-p: [`sampling_distribution`]).
//!
//! **Verification**, from the root; at node `i` with base distribution `p` (node `i`'s base
//! logits through the sampling transform) and children `x_1..x_W` drawn from `q`:
//!
//! ```text
//! r_0 = p
//! for j = 1..W:  accept x_j with probability min(1, r_{j-1}(x_j) / q(x_j)): continue at x_j
//!                rejected: r_j = norm(max(0, r_{j-1} - q))
//! none accepted (or a leaf): the round's base token ~ r_W
//! ```
//!
//! One node is [`verify_node`]; a chain (one child per node) is the chain loop's rule, which
//! calls it too. Why it is lossless: each `x_j` is independent of the rejections before it, so
//! step `j` is plain speculative sampling of the target `r_{j-1}` with the draft `q`, whose
//! output (accepted `x_j`, or else a sample of the residual `r_j`) is distributed as `r_{j-1}`;
//! by induction the node emits `p`. An accepted child's own children were drawn from its own `q`,
//! independently of how it was chosen, so the argument repeats down the tree and every token is
//! distributed as sampling from the base model.
//!
//! **Why i.i.d. and not without replacement \[ours\]:** the i.i.d. rule is the chain's rule with one
//! shared `q` (no per-sibling renormalisation), so a chain is bit for bit the chain loop with the
//! same seed (tested), and its proof is SpecInfer's as written. Drawing without replacement (with
//! Recursive Speculative Decoding's correction, Jeon et al., 2024) avoids duplicate siblings,
//! which the i.i.d. rule wastes: a sibling repeating a rejected token is rejected with certainty
//! (`r_j(x) = 0` after `x` was rejected). That matters when `q` is peaked (low temperature); it
//! is not built.
//!
//! **A child proposed another way: a prompt-lookup branch \[ours\].** The branch's tokens are
//! copied from the context, not drawn from `q`. SpecInfer's step allows one proposal distribution
//! per candidate, so such a child is tested against its own: one-hot on its token `g`, a
//! deterministic proposal (it depends on the emitted text only, never on this round's random
//! draws). Accepted with probability `min(1, r_{j-1}(g) / 1) = r_{j-1}(g)`; rejected, the residual
//! is `norm(max(0, r_{j-1} - onehot(g)))`: `r_{j-1}` without `g`. Step `j` is then plain
//! speculative sampling of `r_{j-1}` with that proposal, which emits `r_{j-1}`, and the induction
//! holds ([`verify_node_with_fixed`]; tested with the chi-square test beside drafted children,
//! whole and grown).

use crate::base::sampling::{SamplingParams, draw, sampling_distribution};
use crate::base::tree::TokenTree;
use crate::error::Result;
use ndarray::Array2;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What the rule decides at one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeChoice {
    /// The candidate at this index was accepted: the round continues at its node.
    Accept(usize),
    /// Every candidate was rejected (or there was none): this token, sampled from the residual,
    /// ends the round (the correction, or the bonus at a leaf).
    Sample(u32),
}

/// Multi-candidate speculative sampling at one node: `p` the base distribution, `q` the draft
/// distribution the `candidates` were drawn from (i.i.d.), tried in order. One uniform number per
/// candidate tried and one for the final sample, so one candidate consumes the random stream as
/// the chain loop does.
///
/// # Shapes
/// - `p`, `q`: `[V]`, each summing to one (`q` may be empty when `candidates` is)
pub fn verify_node<R: Rng>(p: Vec<f32>, q: &[f32], candidates: &[u32], rng: &mut R) -> NodeChoice {
    let mut r = p;
    for (j, &x) in candidates.iter().enumerate() {
        let (rx, qx) = (r[x as usize], q[x as usize]);
        let u: f32 = rng.random();
        if qx > 0.0 && u < (rx / qx).min(1.0) {
            return NodeChoice::Accept(j);
        }
        r = residual(r, q);
    }
    NodeChoice::Sample(draw(&r, rng) as u32)
}

/// [`verify_node`] where some candidates were proposed deterministically (`fixed[j]`: a
/// prompt-lookup branch's token, proposed with probability one) and the others drawn from `q`:
/// a fixed candidate `x` is accepted with probability `r(x)`, and rejected leaves `r` without `x`
/// (module docs). One uniform number per candidate tried and one for the final sample.
///
/// # Shapes
/// - `p`, `q`: `[V]`, each summing to one (`q` may be empty when every candidate is fixed)
/// - `fixed`: one per candidate
pub fn verify_node_with_fixed<R: Rng>(
    p: Vec<f32>,
    q: &[f32],
    (candidates, fixed): (&[u32], &[bool]),
    rng: &mut R,
) -> NodeChoice {
    let mut r = p;
    for (j, (&x, &fixed)) in candidates.iter().zip(fixed).enumerate() {
        let x = x as usize;
        let u: f32 = rng.random();
        if fixed {
            if u < r[x] {
                return NodeChoice::Accept(j);
            }
            let mut onehot = vec![0.0; r.len()];
            onehot[x] = 1.0;
            r = residual(r, &onehot);
        } else {
            if q[x] > 0.0 && u < (r[x] / q[x]).min(1.0) {
                return NodeChoice::Accept(j);
            }
            r = residual(r, q);
        }
    }
    NodeChoice::Sample(draw(&r, rng) as u32)
}

/// `norm(max(0, p - q))`, or `p` itself when nothing is left (`p <= q` everywhere up to
/// rounding, where a rejection has probability 0).
///
/// # Shapes
/// - `p`, `q`: `[V]`
pub fn residual(p: Vec<f32>, q: &[f32]) -> Vec<f32> {
    let mut r: Vec<f32> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let mass: f32 = r.iter().sum();
    if mass > 0.0 {
        r.iter_mut().for_each(|x| *x /= mass);
        r
    } else {
        p
    }
}

/// The rule applied at each node (the tests swap in wrong ones to see the chi-square test fail).
pub(crate) type NodeRule = fn(Vec<f32>, &[f32], &[u32], &mut ChaCha8Rng) -> NodeChoice;

/// The sampling side of a tree run: the transform, the seeded random stream (ChaCha8, as
/// [`Sampler`](crate::base::sampling::Sampler): the same seed gives the same tokens everywhere),
/// and the node rule.
#[derive(Clone, Debug)]
pub struct TreeSampling {
    params: SamplingParams,
    rng: ChaCha8Rng,
    rule: NodeRule,
}

impl TreeSampling {
    /// # Errors
    /// Params that [`SamplingParams::validate`] refuses.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        Ok(Self::with_rule(params, verify_node))
    }

    pub(crate) fn with_rule(params: SamplingParams, rule: NodeRule) -> Self {
        TreeSampling {
            rng: ChaCha8Rng::seed_from_u64(params.seed),
            params,
            rule,
        }
    }

    /// A token sampled from `logits` (the prompt's: no draft to verify).
    pub fn token(&mut self, logits: &[f32]) -> u32 {
        draw(&sampling_distribution(logits, &self.params), &mut self.rng) as u32
    }

    /// `k` children drawn i.i.d. from a node's draft `logits`, and the draft distribution `q`
    /// they were drawn from (verification needs it).
    pub fn children(&mut self, logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
        let q = sampling_distribution(logits, &self.params);
        let drawn = (0..k).map(|_| draw(&q, &mut self.rng) as u32).collect();
        (drawn, q)
    }

    /// The accepted node and the base token after it: the node rule from the root down.
    /// `tokens[i]` is node `i`'s token, `drafts[i]` the `q` its drafted children were drawn from
    /// (empty at a leaf), `base` row `i` node `i`'s base logits, `fixed` the nodes proposed
    /// deterministically (a lookup branch, ascending: [`verify_node_with_fixed`] at their
    /// parents, tried before their drafted siblings).
    ///
    /// # Shapes
    /// - `base`: `[T, V]`
    pub fn accept(
        &mut self,
        tree: &TokenTree,
        (tokens, fixed): (&[u32], &[usize]),
        drafts: &[Vec<f32>],
        base: &Array2<f32>,
    ) -> (usize, u32) {
        let mut node = 0;
        loop {
            let p =
                sampling_distribution(base.row(node).as_slice().expect("contiguous"), &self.params);
            let children = tree.children(node);
            // the children tried in order: a lookup branch's first (a guess that holds goes on
            // for its whole branch), then the drafted ones
            let is_fixed = |c: &usize| fixed.binary_search(c).is_ok();
            let order: Vec<usize> = children
                .clone()
                .filter(is_fixed)
                .chain(children.clone().filter(|c| !is_fixed(c)))
                .collect();
            let candidates: Vec<u32> = order.iter().map(|&c| tokens[c]).collect();
            let choice = match order.iter().any(is_fixed) {
                true => {
                    let fixed: Vec<bool> = order.iter().map(is_fixed).collect();
                    let proposals = (&candidates[..], &fixed[..]);
                    verify_node_with_fixed(p, &drafts[node], proposals, &mut self.rng)
                }
                false => (self.rule)(p, &drafts[node], &candidates, &mut self.rng),
            };
            match choice {
                NodeChoice::Accept(j) => node = order[j],
                NodeChoice::Sample(token) => return (node, token),
            }
        }
    }
}

#[cfg(test)]
mod tests;
