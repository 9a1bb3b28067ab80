//! Token tree rounds replayed on a drafting [`Trace`](super::Trace) (`decode/tree_speculation.rs`
//! runs them): a round whose root is response token `i` accepts depth `k + 1` while every draft
//! on the greedy path so far held the next greedy token among its node's children, that is while
//! point `(i, k)`'s [`rank`](super::DraftPoint::rank) is `< W_{k+1}`, and emits one more token (the
//! base model's). Every round drafts and verifies the whole tree whatever it accepts, so its cost
//! is fixed by the shape: a draft level per depth (the levels above the leaves propose) and one
//! verification of all nodes.

use super::{DraftPoint, Simulated, round_point};
use crate::base::tree::TokenTree;
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;

/// The tree shapes `m2r2 tune-drafting` tries beside chains **\[ours\]**: a runner-up at the first
/// depth, where a chain's first draft is most often wrong and a second candidate is cheapest
/// (`2,1`, `2,1,1`, `3,1,1`, `4,1,1,1`), a second candidate one depth down (`2,2,1`, `3,2,1`),
/// and one wide level (`3`, `4`: a single draft step a round, for providers whose verify chunk
/// costs about the same for 2 to 16 rows, as CUDA graphs do, docs/GPU.md run 9). At most 17
/// nodes, one verification chunk of the size whose cost stays near a decode step's
/// (`base/tree.rs`, `MAX_TREE_NODES`).
pub const TREE_SHAPES: [&[usize]; 8] = [
    &[3],
    &[4],
    &[2, 1],
    &[2, 1, 1],
    &[3, 1, 1],
    &[2, 2, 1],
    &[3, 2, 1],
    &[4, 1, 1, 1],
];

/// The nodes at each depth `0..=D` of the tree of shape `widths`: `1, W1, W1 W2, ...` (saturating).
pub fn level_sizes(widths: &[usize]) -> Vec<usize> {
    let mut levels = vec![1usize];
    for &w in widths {
        levels.push(levels.last().expect("the root").saturating_mul(w));
    }
    levels
}

/// Replay greedy tree speculation with the tree of shape `widths` (`W1,W2,...`) on one sample's
/// trace (as [`simulate`](super::simulate) does for chains). `points` must be traced at least
/// `widths.len()` deep where drafts read a bridge; without one, depth 1 is exact (point `(i, k)`
/// is then `(i + k, 0)`).
///
/// Counts per round: the accepted depth, the proposing nodes as proposals, a draft level per depth
/// ([`Simulated::tree_proposing`] above the leaves, [`Simulated::tree_leaves`] at the deepest),
/// one verification of every node ([`Simulated::tree_verifies`]).
///
/// # Errors
/// A shape [`TokenTree::from_widths`] refuses, or one that drafts nothing (no widths).
pub fn simulate_tree(points: &[Vec<DraftPoint>], widths: &[usize]) -> Result<Simulated> {
    let (levels, mut sim) = tree_rounds(widths)?;
    let nodes: usize = levels.iter().sum();
    let proposing = nodes - levels[widths.len()];
    let point = |i: usize, k: usize| round_point(points, i, k);
    let mut i = 0;
    while i < points.len() {
        let accepted = widths
            .iter()
            .enumerate()
            .map_while(|(k, &w)| point(i, k).map(|p| p.rank < w))
            .take_while(|&held| held)
            .count();
        sim.proposals.push(proposing);
        for &n in &levels[..widths.len()] {
            sim.tree_proposing[n] += 1;
        }
        sim.tree_leaves[levels[widths.len()]] += 1;
        sim.tree_verifies[nodes] += 1;
        i += sim.close_round(accepted, points.len() - i);
    }
    Ok(sim)
}

/// Replay greedy tree speculation grown per branch (`--draft-tree W --dynamic-draft`,
/// `tree_speculation::dynamic_round`): a node of depth `d < D` gets its `W_{d+1}` children only
/// when `gate`'s score of its draft is `>= threshold`.
///
/// Exact for what the emitted tokens depend on: the greedy-path node at depth `d` is point
/// `(i, d)`, so a round accepts depth `d + 1` while that point's score passes and its rank is
/// below `W_{d+1}`. Estimated, as [`simulate`](super::simulate) estimates a chain's proposals
/// after a wrong draft: the nodes off the greedy path have no traced score, so each depth grows
/// or stops as a whole with the greedy-path point's score (a level of `n_d` nodes proposes, and
/// depth `d + 1` has `n_d W_{d+1}` nodes or none). With a chain shape (`1,1,...`) that is exactly
/// dynamic chain drafting at most `D`; with every score passing, exactly [`simulate_tree`].
///
/// Counts per round: the accepted depth, the nodes of the proposing levels as proposals, a
/// proposing level per depth reached above `D` ([`Simulated::tree_proposing`]), a leaf level when
/// depth `D` is reached, one verification of the nodes grown.
///
/// # Errors
/// A shape [`TokenTree::from_widths`] refuses or no widths, or a trace without `gate`'s scores.
pub fn simulate_dynamic_tree(
    points: &[Vec<DraftPoint>],
    widths: &[usize],
    (gate, threshold): (GateKind, f32),
) -> Result<Simulated> {
    let (levels, mut sim) = tree_rounds(widths)?;
    if points.iter().flatten().any(|p| p.score(gate).is_none()) {
        return Err(Error::Invalid(format!(
            "dynamic drafting with the {gate} gate needs its scores, and the trace has none"
        )));
    }
    let point = |i: usize, k: usize| round_point(points, i, k);
    let mut i = 0;
    while i < points.len() {
        let (mut nodes, mut proposing, mut accepted, mut on_path) = (0, 0, 0, true);
        for (d, &n) in levels.iter().enumerate() {
            nodes += n;
            let Some(&w) = widths.get(d) else {
                sim.tree_leaves[n] += 1;
                break;
            };
            sim.tree_proposing[n] += 1;
            proposing += n;
            // past the trace's end the decoder stops anyway: count the level, stop there
            let p = point(i, d);
            if p.and_then(|p| p.score(gate)).is_none_or(|s| s < threshold) {
                break;
            }
            on_path = on_path && p.is_some_and(|p| p.rank < w);
            accepted += usize::from(on_path);
        }
        sim.proposals.push(proposing);
        sim.tree_verifies[nodes] += 1;
        i += sim.close_round(accepted, points.len() - i);
    }
    Ok(sim)
}

/// The nodes at each depth of the shape `widths` and an empty [`Simulated`] with room for its
/// rounds' draft levels and verifications.
///
/// # Errors
/// A shape [`TokenTree::from_widths`] refuses, or no widths.
fn tree_rounds(widths: &[usize]) -> Result<(Vec<usize>, Simulated)> {
    TokenTree::from_widths(widths)?;
    if widths.is_empty() {
        return Err(Error::Invalid(
            "a token tree must draft: give at least one width".into(),
        ));
    }
    let levels = level_sizes(widths);
    let sim = Simulated {
        tree_proposing: vec![0; levels.iter().max().expect("the root") + 1],
        tree_leaves: vec![0; levels[widths.len()] + 1],
        tree_verifies: vec![0; levels.iter().sum::<usize>() + 1],
        ..Simulated::default()
    };
    Ok((levels, sim))
}

pub use crate::base::tree::shape_text;
