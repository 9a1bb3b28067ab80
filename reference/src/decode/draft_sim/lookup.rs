//! Prompt-lookup branches replayed on a drafting [`Trace`](super::Trace), beside a fixed or grown
//! tree (`tree_speculation::tree_round_with_lookup`, `dynamic_round_with_lookup`), so
//! `m2r2 tune-drafting` prices a branch by measured step costs.
//!
//! A round whose root is response token `i` guesses from the context `prompt ++ response[..=i]`
//! ([`LookupConfig::guess`], cut to what one verify chunk holds beside the tree). The guess is
//! known, and so is the greedy continuation, so the branch's accepted length is exact: `m` = how
//! many leading guessed tokens equal `response[i + 1..]`. Then:
//!
//! - `m > 0`: the round accepts the branch's `m` tokens. The root's drafted children skip the
//!   guessed token, so no drafted path holds the next greedy token, which is that guessed one;
//! - `m = 0`: the drafted tree decides, as in [`simulate_tree`](super::simulate_tree) or
//!   [`simulate_dynamic_tree`](super::simulate_dynamic_tree), except at the first depth: the root's
//!   `W1` drafted children are its best candidates other than the guessed token, so the next
//!   greedy token is held when its rank is below `W1`, or equal to `W1` with the guessed token
//!   among the best `W1` ([`DraftPoint::top`] keeps the best [`TOP_CANDIDATES`]; a wider first
//!   depth is estimated as not held).
//!
//! Costs: the branch's node of depth `d` rides in the draft level of depth `d` (one more row; a
//! level beyond the drafted tree drafts the branch's node alone, as a leaf level of one row), and
//! in the verification (`b` more nodes). A level whose drafted nodes propose is priced as a
//! proposing level of its rows, the branch's node included: an upper estimate by one head row.

use super::tree::level_sizes;
use super::{DraftPoint, Simulated, TOP_CANDIDATES, round_point};
use crate::base::tree::{MAX_TREE_NODES, TokenTree};
use crate::decode::prompt_lookup::LookupConfig;
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;

/// `v[n] += 1`, growing `v` as needed.
fn bump(v: &mut Vec<usize>, n: usize) {
    if v.len() <= n {
        v.resize(n + 1, 0);
    }
    v[n] += 1;
}

/// Whether a node of `width` drafted children holds the next greedy token at point `p`, its
/// children skipping `skipped` (the guessed token, when the node is the root and the guess is
/// wrong there).
fn held(p: &DraftPoint, width: usize, skipped: Option<u32>) -> bool {
    p.rank < width
        || (p.rank == width
            && width <= TOP_CANDIDATES
            && skipped.is_some_and(|g| p.top[..width].contains(&g)))
}

/// The guess of `lookup` at every position of `response` after `prompt` (position `i`: the round
/// whose root is `response[i]`, guessing from `prompt ++ response[..=i]`), for the positions of a
/// trace (all but the last token). A shorter branch guesses a prefix of a longer one's guess, so
/// one call serves every branch length up to `lookup.max_tokens`.
pub fn lookup_guesses(prompt: &[u32], response: &[u32], lookup: LookupConfig) -> Vec<Vec<u32>> {
    let mut context = prompt.to_vec();
    (0..response.len().saturating_sub(1))
        .map(|i| {
            context.push(response[i]);
            lookup.guess(&context)
        })
        .collect()
}

/// Replay greedy tree speculation with a prompt-lookup branch (`lookup`) beside the tree of shape
/// `widths`, drafted whole every round or grown per branch while `grown`'s gate scores at least
/// its threshold, on one sample's trace of `response` after `prompt` (`response` has one token
/// more than `points` has positions). Counts as [`simulate_tree`](super::simulate_tree) does,
/// with the branch's rows in the draft levels and the verification.
///
/// # Errors
/// A shape [`TokenTree::from_widths`] refuses or no widths, suffix lengths
/// [`LookupConfig::check`] refuses, a response that does not match the trace, a trace without
/// `grown`'s scores.
pub fn simulate_lookup(
    points: &[Vec<DraftPoint>],
    (prompt, response): (&[u32], &[u32]),
    widths: &[usize],
    grown: Option<(GateKind, f32)>,
    lookup: LookupConfig,
) -> Result<Simulated> {
    lookup.check()?;
    let guesses = lookup_guesses(prompt, response, lookup);
    simulate_guesses(
        points,
        (response, &guesses),
        widths,
        grown,
        lookup.max_tokens,
    )
}

/// [`simulate_lookup`] with each position's guess given ([`lookup_guesses`] of a config whose
/// `max_tokens` is at least `branch`), cut to `branch` tokens.
///
/// # Errors
/// [`simulate_lookup`]'s but the suffix lengths, and guesses that are not one per position.
pub fn simulate_guesses(
    points: &[Vec<DraftPoint>],
    (response, guesses): (&[u32], &[Vec<u32>]),
    widths: &[usize],
    grown: Option<(GateKind, f32)>,
    branch: usize,
) -> Result<Simulated> {
    let shape = TokenTree::from_widths(widths)?;
    if widths.is_empty() {
        return Err(Error::Invalid(
            "a token tree must draft: give at least one width".into(),
        ));
    }
    if response.len() != points.len() + 1 || guesses.len() != points.len() {
        return Err(Error::Invalid(format!(
            "a trace of {} positions is of a response of {} tokens and as many guesses, not {} \
             and {}",
            points.len(),
            points.len() + 1,
            response.len(),
            guesses.len()
        )));
    }
    if let Some((gate, _)) = grown
        && points.iter().flatten().any(|p| p.score(gate).is_none())
    {
        return Err(Error::Invalid(format!(
            "dynamic drafting with the {gate} gate needs its scores, and the trace has none"
        )));
    }
    let levels = level_sizes(widths);
    let room = MAX_TREE_NODES.saturating_sub(shape.nodes()).min(branch);
    let point = |i: usize, k: usize| round_point(points, i, k);
    let mut sim = Simulated::default();
    let mut i = 0;
    while i < points.len() {
        let guess = &guesses[i][..guesses[i].len().min(room)];
        let branch = guess.len();
        let matched = guess
            .iter()
            .zip(&response[i + 1..])
            .take_while(|(g, t)| g == t)
            .count();
        // a wrong guess is skipped by the root's drafted children
        let skipped = guess.first().copied().filter(|_| matched == 0);
        // the drafted levels (nodes, proposing) and the accepted drafted depth
        let mut drafted: Vec<(usize, bool)> = Vec::new();
        let (mut accepted, mut on_path) = (0, true);
        for (d, &n) in levels.iter().enumerate() {
            let Some(&w) = widths.get(d) else {
                drafted.push((n, false));
                break;
            };
            drafted.push((n, true));
            let p = point(i, d);
            if let Some((gate, threshold)) = grown
                && p.and_then(|p| p.score(gate)).is_none_or(|s| s < threshold)
            {
                break;
            }
            let skip = skipped.filter(|_| d == 0);
            on_path = on_path && p.is_some_and(|p| held(p, w, skip));
            accepted += usize::from(on_path);
        }
        if matched > 0 {
            accepted = matched;
        }
        let depth = (drafted.len() - 1).max(branch);
        let mut nodes = branch;
        let mut proposals = 0;
        for d in 0..=depth {
            let (n, proposing) = drafted.get(d).copied().unwrap_or((0, false));
            let rows = n + usize::from((1..=branch).contains(&d));
            nodes += n;
            if proposing {
                proposals += n;
                bump(&mut sim.tree_proposing, rows);
            } else {
                bump(&mut sim.tree_leaves, rows);
            }
        }
        sim.proposals.push(proposals);
        bump(&mut sim.tree_verifies, nodes);
        i += sim.close_round(accepted, points.len() - i);
    }
    Ok(sim)
}
