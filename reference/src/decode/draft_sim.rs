//! Predicting greedy self-speculative decoding from one teacher-forced pass, to choose the drafting
//! policy (draft length, dynamic drafting's gate and threshold) by measurement without decoding
//! once per candidate policy.
//!
//! Greedy speculation emits the greedy continuation whatever the policy; only the rounds differ.
//! If every earlier draft of a round was right, the draft at a position is the draft gate's
//! proposal after the true prefix, and the base model's cache is bitwise the same however the
//! positions were chunked (batch invariance). So one pass over a known greedy continuation that
//! feeds each true token through the draft step ([`trace`]) gives, per position, whether the draft
//! equals the next greedy token and the gate scores of that draft. [`simulate`] then replays the
//! speculative loop of [`crate::decode::speculative`] on those points for any policy:
//!
//! - a round starting at position `i` accepts the drafts at `i, i+1, ...` while they agree, at
//!   most the number proposed, and emits one more (the base token);
//! - fixed drafting proposes `k` tokens (`k` proposing draft steps, one step that only feeds the
//!   last proposal) and verifies `k + 1` rows;
//! - dynamic drafting proposes while the gate score is `>= threshold`, at most `max`: `n`
//!   proposals cost `n + 1` proposing steps when a score stopped it (the step that scored low ran),
//!   or `max` proposing steps and one feeding step, and `n + 1` verified rows.
//!
//! Exact for everything the emitted tokens depend on (accepted counts, rounds, emitted tokens) and
//! for fixed drafting's steps. One approximation: after a wrong draft, later drafts of the same
//! round see a wrong prefix, so dynamic drafting's *number of proposals* after the first wrong one
//! uses the scores after the true prefix instead (those drafts are rejected either way; only their
//! cost is estimated). Tested against [`speculative_generate`](crate::decode::speculative) rounds.
//!
//! With a bridge ([`crate::m2r2::bridge`]) a draft also depends on where its round began: the
//! first draft reads the verified state before it, the next ones the previous draft's exit state.
//! So the trace keeps, per position `i`, the drafts of a round starting there, to a depth
//! ([`trace`]'s `depth`): point `(i, k)` is the `k`-th draft of that round. Without a bridge point
//! `(i, k)` equals `(i + k, 0)`, and depth 1 is exact.
//!
//! **Token trees** ([`tree`]): a tree round (`decode/tree_speculation.rs`) drafts the top `W_{k+1}`
//! candidates at every node of depth `k`. Only the nodes on the greedy path decide what is
//! accepted, and the greedy-path node at depth `k` of a round starting at `i` sees exactly what
//! the `k`-th chain draft along the true tokens sees (the same cache rows, bitwise, and with a
//! bridge its parent's exit state, the previous draft's). So each point also keeps the *rank* of
//! the next greedy token among the draft's candidates ([`DraftPoint::rank`], ranked as
//! [`top_candidates`] ranks them): the tree holds
//! it at depth `k` when `rank < W_{k+1}`. [`simulate_tree`] replays tree rounds on the same trace;
//! a round's cost is its draft levels (one chunk per depth) and one verification of all its nodes
//! ([`TreeCosts`]). Tested against `tree_speculative_generate` round by round.
//!
//! **Prompt-lookup branches** ([`lookup`]): the branch is copied from the context, which the trace
//! knows, so its accepted length is exact; the drafted children at the root skip its token, which
//! [`DraftPoint::top`] tells. [`simulate_lookup`] replays fixed and grown trees with a branch.

use crate::base::ops::argmax;
use crate::decode::speculative::SpeculativeBackend;
use crate::decode::tree_speculation::top_candidates;
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::{GateKind, gate_score};

/// The draft at one position of a greedy continuation, after the true prefix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftPoint {
    /// The draft equals the next greedy token.
    pub agrees: bool,
    /// The next greedy token's rank among the draft's candidates, best first as token trees rank
    /// them ([`candidate_rank`]): 0 when the draft agrees; a tree whose nodes at this depth have
    /// `W` children holds it when `rank < W`.
    pub rank: usize,
    /// Max softmax probability of the draft logits (the `confidence` gate).
    pub confidence: f32,
    /// The `entropy` gate's score of the draft logits.
    pub entropy: f32,
    /// ARLA's `p_exit`, when the backend scores with ARLA.
    pub arla: Option<f32>,
    /// The draft's best candidates, best first as token trees rank them (`u32::MAX` past the
    /// vocabulary): a prompt-lookup branch's token among them moves the root's drafted children
    /// down one rank ([`lookup`]).
    pub top: [u32; TOP_CANDIDATES],
}

/// The draft's best candidates a [`DraftPoint`] keeps.
pub const TOP_CANDIDATES: usize = 4;

impl DraftPoint {
    /// The score `gate` gives this draft (`None`: ARLA was not traced).
    pub fn score(&self, gate: GateKind) -> Option<f32> {
        match gate {
            GateKind::Arla => self.arla,
            GateKind::Confidence => Some(self.confidence),
            GateKind::Entropy => Some(self.entropy),
        }
    }
}

/// The drafts after each position of a greedy continuation: `points[i][k]` is the `k`-th draft of
/// a round that starts by feeding response token `i` (so it proposes after token `i + k`), for
/// `k < depth` where the response allows.
pub type Trace = Vec<Vec<DraftPoint>>;

/// The rank of `token` among `logits` in
/// [`top_candidates`]'s order (highest logit first, equal
/// logits in token order, NaN last): `top_candidates(logits, V)[rank] == token`, in one pass.
///
/// # Panics
/// If `token` is not an index of `logits`.
///
/// # Shapes
/// - `logits`: `[V]`
pub fn candidate_rank(logits: &[f32], token: u32) -> usize {
    let t = token as usize;
    let x = logits[t];
    // the tokens top_candidates puts before t
    let before = |i: usize, y: f32| match (x.is_nan(), y.is_nan()) {
        (true, true) => i < t,
        (true, false) => true,
        (false, true) => false,
        (false, false) => y > x || (y == x && i < t),
    };
    logits
        .iter()
        .enumerate()
        .filter(|&(i, &y)| before(i, y))
        .count()
}

/// Trace `response`, the greedy continuation of `prompt`: prefill the prompt, then for each
/// response token `i` but the last, draft a round of up to `depth` proposals from it along the true
/// tokens, verify it and keep only token `i`. Point `(i, k)` is the draft proposed after feeding
/// `response[i + k]`, compared with `response[i + k + 1]`. `backend` scores with ARLA when it
/// should record ARLA's score ([`DraftPoint::arla`]); the confidence and entropy scores are
/// computed from the draft logits here.
///
/// # Errors
/// An empty prompt or response, a depth of 0, or a response that is not the backend's greedy
/// continuation (named by position), or a backend error.
pub fn trace(
    backend: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    response: &[u32],
    depth: usize,
) -> Result<Trace> {
    if prompt.is_empty() || response.is_empty() || depth == 0 {
        return Err(Error::Invalid(
            "tracing drafts needs a prompt and a response of at least one token each, and a \
             depth of at least 1"
                .into(),
        ));
    }
    let not_greedy = |i: usize, got: usize| {
        Error::Invalid(format!(
            "response token {i} is {}, but the base model's greedy token there is {got}: the \
             response is not this model's greedy continuation",
            response[i]
        ))
    };
    let first = argmax(&backend.prefill(prompt)?);
    if first as u32 != response[0] {
        return Err(not_greedy(0, first));
    }
    let last = response.len() - 1;
    let mut points = Vec::with_capacity(last);
    for i in 0..last {
        let start = backend.len();
        let mut round = Vec::new();
        for k in 0..depth.min(last - i) {
            let draft = backend
                .draft(response[i + k], true)?
                .ok_or_else(|| Error::Invalid("the draft step proposed nothing".into()))?;
            let score = |kind| gate_score(kind, None, &[], &draft.logits, 0.0);
            let mut top = [u32::MAX; TOP_CANDIDATES];
            for (slot, t) in top
                .iter_mut()
                .zip(top_candidates(&draft.logits, TOP_CANDIDATES))
            {
                *slot = t;
            }
            round.push(DraftPoint {
                agrees: argmax(&draft.logits) as u32 == response[i + k + 1],
                rank: candidate_rank(&draft.logits, response[i + k + 1]),
                confidence: score(GateKind::Confidence)?,
                entropy: score(GateKind::Entropy)?,
                arla: draft.score,
                top,
            });
        }
        let base = backend.verify()?;
        let next = argmax(&base.row(0).to_vec());
        if next as u32 != response[i + 1] {
            return Err(not_greedy(i + 1, next));
        }
        // keep token i, verified; the rest of the round is dropped
        backend.rollback(start + 1);
        points.push(round);
    }
    Ok(points)
}

/// How a round drafts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// `k` proposals per round.
    Fixed(usize),
    /// Propose while `gate`'s score is `>= threshold`, at most `max`.
    Dynamic {
        gate: GateKind,
        threshold: f32,
        max: usize,
    },
}

/// The rounds [`simulate`] predicts, summed over the traced samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Simulated {
    pub rounds: usize,
    /// Tokens emitted by rounds (a sample's first token comes from the prefill, not counted).
    pub emitted: usize,
    /// Accepted drafts per round, in order.
    pub accepted: Vec<usize>,
    /// Proposals per round (for dynamic drafting, proposing steps, as `Round::proposals`).
    pub proposals: Vec<usize>,
    /// Draft steps that propose (run the fast stream and the draft head).
    pub propose_steps: usize,
    /// Draft steps that only feed the last proposal to the cache.
    pub feed_steps: usize,
    /// `verifies[n]`: verifications of `n` rows.
    pub verifies: Vec<usize>,
    /// Token trees ([`simulate_tree`]): `tree_proposing[n]`, draft levels of `n` nodes that
    /// propose (each depth of a round above the leaves).
    pub tree_proposing: Vec<usize>,
    /// `tree_leaves[n]`: draft levels of `n` leaves (each round's deepest level).
    pub tree_leaves: Vec<usize>,
    /// `tree_verifies[n]`: verifications of trees of `n` nodes.
    pub tree_verifies: Vec<usize>,
}

/// Milliseconds of each kind of step on one engine.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepCosts {
    pub greedy: f64,
    pub propose: f64,
    pub feed: f64,
    /// `verify[n - 1]`: a verification of `n` rows.
    pub verify: Vec<f64>,
    /// The steps of token trees; `None` where the engine runs no trees.
    pub tree: Option<TreeCosts>,
}

/// Milliseconds of the steps of tree rounds (`decode/tree_speculation.rs`); `None` entries were
/// not timed.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct TreeCosts {
    /// `propose[n - 1]`: one draft level of `n` nodes that propose: the draft layers with a fast
    /// row each, the draft head, and each node's top candidates.
    pub propose: Vec<Option<f64>>,
    /// `leaves[n - 1]`: one draft level of `n` leaves: the draft layers only.
    pub leaves: Vec<Option<f64>>,
    /// `verify[n - 1]`: a verification of a tree of `n` nodes (the layers above the draft gate
    /// with the tree mask, and the head).
    pub verify: Vec<Option<f64>>,
}

impl TreeCosts {
    /// Milliseconds of one round of the tree of shape `widths`: each depth's draft level, then
    /// one verification of all its nodes; `None` when a step was not timed.
    pub fn round_ms(&self, widths: &[usize]) -> Option<f64> {
        let at = |v: &[Option<f64>], rows: usize| v.get(rows.checked_sub(1)?).copied().flatten();
        let levels = tree::level_sizes(widths);
        let (leaves, proposing) = levels.split_last()?;
        let mut ms = at(&self.leaves, *leaves)?;
        for &n in proposing {
            ms += at(&self.propose, n)?;
        }
        Some(ms + at(&self.verify, levels.iter().sum())?)
    }
}

/// `a[n] += b[n]`, growing `a` as needed.
fn add_counts(a: &mut Vec<usize>, b: &[usize]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (a, b) in a.iter_mut().zip(b) {
        *a += b;
    }
}

impl Simulated {
    /// Add another sample's rounds.
    pub fn add(&mut self, other: &Simulated) {
        self.rounds += other.rounds;
        self.emitted += other.emitted;
        self.accepted.extend(&other.accepted);
        self.proposals.extend(&other.proposals);
        self.propose_steps += other.propose_steps;
        self.feed_steps += other.feed_steps;
        add_counts(&mut self.verifies, &other.verifies);
        add_counts(&mut self.tree_proposing, &other.tree_proposing);
        add_counts(&mut self.tree_leaves, &other.tree_leaves);
        add_counts(&mut self.tree_verifies, &other.tree_verifies);
    }

    /// Count a round that accepted `accepted` drafts with `left` traced positions to go; returns
    /// the tokens it emits (the base token included; the trace's end cuts the last round).
    fn close_round(&mut self, accepted: usize, left: usize) -> usize {
        self.accepted.push(accepted);
        self.rounds += 1;
        let emitted = (accepted + 1).min(left);
        self.emitted += emitted;
        emitted
    }

    /// Mean tokens emitted per verification.
    pub fn tokens_per_round(&self) -> f64 {
        self.emitted as f64 / self.rounds.max(1) as f64
    }

    /// Mean proposing draft steps per verification (as `Round::proposals`).
    pub fn proposals_per_round(&self) -> f64 {
        self.proposals.iter().sum::<usize>() as f64 / self.rounds.max(1) as f64
    }

    /// Predicted milliseconds of the rounds under `costs`; `None` when a step is larger than the
    /// costs cover (a verification not timed; tree steps on an engine without them).
    pub fn milliseconds(&self, costs: &StepCosts) -> Option<f64> {
        let mut ms =
            self.propose_steps as f64 * costs.propose + self.feed_steps as f64 * costs.feed;
        for (rows, &count) in self.verifies.iter().enumerate().filter(|(_, c)| **c > 0) {
            ms += count as f64 * costs.verify.get(rows.checked_sub(1)?)?;
        }
        let trees = self.tree_verifies.iter().any(|&c| c > 0);
        if trees {
            let tree = costs.tree.as_ref()?;
            let steps = [
                (&self.tree_proposing, &tree.propose),
                (&self.tree_leaves, &tree.leaves),
                (&self.tree_verifies, &tree.verify),
            ];
            for (counts, step_ms) in steps {
                for (rows, &count) in counts.iter().enumerate().filter(|(_, c)| **c > 0) {
                    ms += count as f64 * (*step_ms.get(rows.checked_sub(1)?)?)?;
                }
            }
        }
        Some(ms)
    }

    /// Predicted speed over greedy decoding of the same tokens (`> 1`: faster).
    pub fn speedup(&self, costs: &StepCosts) -> Option<f64> {
        Some(self.emitted as f64 * costs.greedy / self.milliseconds(costs)?)
    }
}

/// Replay the speculative loop on one sample's [`Trace`] (`points[i]`: the drafts of a round that
/// starts by feeding response token `i`, so a sample of `R` response tokens has `R - 1` positions
/// and its rounds emit `R - 1` tokens). A dynamic policy needs its gate's scores in the points.
///
/// # Errors
/// A policy proposing nothing (`Fixed(0)`, `max == 0`), or ARLA scores missing.
pub fn simulate(points: &[Vec<DraftPoint>], policy: Policy) -> Result<Simulated> {
    let max = match policy {
        Policy::Fixed(k) => k,
        Policy::Dynamic { max, .. } => max,
    };
    if max == 0 {
        return Err(Error::Invalid(
            "a drafting policy must propose at least one token".into(),
        ));
    }
    if let Policy::Dynamic { gate, .. } = policy
        && points.iter().flatten().any(|p| p.score(gate).is_none())
    {
        return Err(Error::Invalid(format!(
            "dynamic drafting with the {gate} gate needs its scores, and the trace has none"
        )));
    }
    let point = |i: usize, k: usize| round_point(points, i, k);
    let mut sim = Simulated {
        verifies: vec![0; max + 2],
        ..Simulated::default()
    };
    let mut i = 0;
    while i < points.len() {
        let proposed = match policy {
            Policy::Fixed(k) => {
                sim.propose_steps += k;
                sim.feed_steps += 1;
                sim.proposals.push(k);
                k
            }
            Policy::Dynamic {
                gate, threshold, ..
            } => {
                let mut n = 0;
                loop {
                    if n == max {
                        sim.feed_steps += 1;
                        break;
                    }
                    sim.propose_steps += 1;
                    // Past the trace's end the decoder stops anyway: count the step, stop there.
                    let score = point(i, n).and_then(|p| p.score(gate));
                    if score.is_none_or(|s| s < threshold) {
                        break;
                    }
                    n += 1;
                }
                sim.proposals.push(if n == max { max } else { n + 1 });
                n
            }
        };
        let accepted = (0..proposed)
            .map_while(|k| point(i, k))
            .take_while(|p| p.agrees)
            .count();
        sim.verifies[proposed + 1] += 1;
        i += sim.close_round(accepted, points.len() - i);
    }
    Ok(sim)
}

/// The `k`-th draft of a round starting at response position `i`: traced to that depth, or (exact
/// without a bridge) the first draft of a round starting at `i + k`; `None` past the trace.
fn round_point(points: &[Vec<DraftPoint>], i: usize, k: usize) -> Option<&DraftPoint> {
    points
        .get(i)
        .and_then(|r| r.get(k))
        .or_else(|| points.get(i + k).and_then(|r| r.first()))
}

pub mod lookup;
pub mod tree;
pub mod tree_steps;

pub use lookup::{lookup_guesses, simulate_guesses, simulate_lookup};
pub use tree::{TREE_SHAPES, simulate_dynamic_tree, simulate_tree};

#[cfg(test)]
mod lookup_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tree_tests;
