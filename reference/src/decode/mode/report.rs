//! Building a [`ModeRun`] from a decoding loop's output (greedy, chain or token-tree
//! speculation): its per-token steps, per-token figures and the mode's own details; what the
//! reference's modes and the ONNX runner's loops both report with.

use super::{Mode, ModeDetails, ModeRun, TokenStep};
use crate::base::generate::Generation;
use crate::base::tree::TokenTree;
use crate::base::work::Work;
use crate::decode::prompt_lookup::{LookupConfig, with_lookup_branch};
use crate::decode::speculative::SpeculativeOutput;
use crate::decode::tree_speculation::TreeSpeculativeOutput;

/// The report of a tree speculation run `out` of `tree` (shape `widths`) on a model of `n`
/// layers that took `seconds` in all (prefill included), with the `work` of its draft and verify
/// steps (`Work::default()` where the engine does not count it).
pub fn tree_speculative_run(
    out: TreeSpeculativeOutput,
    tree: &TokenTree,
    widths: &[usize],
    n: usize,
    seconds: f64,
    work: Work,
) -> ModeRun {
    tree_speculative_run_with_lookup(out, tree, widths, None, n, seconds, work)
}

/// [`tree_speculative_run`] of a run whose rounds may have had a `lookup` branch.
pub fn tree_speculative_run_with_lookup(
    out: TreeSpeculativeOutput,
    tree: &TokenTree,
    widths: &[usize],
    lookup: Option<LookupConfig>,
    n: usize,
    seconds: f64,
    work: Work,
) -> ModeRun {
    let accepted: Vec<usize> = out.rounds.iter().map(|r| r.accepted).collect();
    let steps = speculative_steps(&out.tokens, &accepted, n);
    let rows = out.verified_nodes();
    let depth = with_lookup_branch(tree, lookup.map_or(0, |l| l.max_tokens))
        .tree
        .max_depth();
    ModeRun {
        mode: Mode::Speculative,
        layers_per_token: (rows * n) as f64 / out.tokens.len().saturating_sub(1).max(1) as f64,
        details: ModeDetails::TreeSpeculative {
            widths: widths.to_vec(),
            nodes: tree.nodes(),
            prompt_lookup: lookup,
            dynamic: None,
            mean_accepted_tokens: out.mean_accepted_length(),
            acceptance_by_depth: out.acceptance_by_depth(depth),
            rounds: out.rounds,
        },
        tokens: out.tokens,
        steps,
        prefill_seconds: Some(out.prefill_seconds),
        decode_seconds: (seconds - out.prefill_seconds).max(0.0),
        work,
        num_layers: n,
    }
}

/// A greedy step: the token with its logit and probability under `logits`.
pub fn greedy_step(token: u32, logits: &[f32], n: usize) -> TokenStep {
    let mut step = TokenStep::plain(token, n);
    let (logit, probability) = logit_and_probability(logits, token);
    step.logit = Some(logit);
    step.probability = Some(probability);
    step
}

/// The [`ModeRun`] of a greedy generation over an `n`-layer model, its steps from [`greedy_step`].
pub fn greedy_run(generation: Generation, steps: Vec<TokenStep>, n: usize) -> ModeRun {
    ModeRun {
        mode: Mode::Greedy,
        layers_per_token: n as f64,
        tokens: generation.tokens,
        steps,
        prefill_seconds: Some(generation.prefill_seconds),
        decode_seconds: generation.decode_seconds,
        work: generation.work,
        num_layers: n,
        details: ModeDetails::Greedy,
    }
}

/// The [`ModeRun`] of a speculative decode over an `n`-layer model that took `seconds` in all,
/// `prefill_seconds` of them in the prompt's prefill.
pub fn speculative_run(
    out: SpeculativeOutput,
    n: usize,
    prefill_seconds: f64,
    seconds: f64,
    work: Work,
) -> ModeRun {
    let accepted: Vec<usize> = out.rounds.iter().map(|r| r.accepted).collect();
    let steps = speculative_steps(&out.tokens, &accepted, n);
    let fed: usize = out.rounds.iter().map(|r| r.drafted.len() + 1).sum();
    ModeRun {
        mode: Mode::Speculative,
        layers_per_token: (fed * n) as f64 / out.tokens.len().saturating_sub(1).max(1) as f64,
        details: ModeDetails::Speculative {
            mean_accepted_tokens: out.mean_accepted_length(),
            acceptance_by_position: out.acceptance_by_position(),
            acceptance_rate: out.acceptance_rate(),
            rounds: out.rounds,
        },
        tokens: out.tokens,
        steps,
        prefill_seconds: Some(prefill_seconds),
        decode_seconds: (seconds - prefill_seconds).max(0.0),
        work,
        num_layers: n,
    }
}

/// The emitted tokens of speculative decoding, attributed to their rounds (`accepted[r]`: the
/// drafts round `r` accepted). The output may stop inside a round (a stop token or
/// `max_new_tokens`), so tokens lead and rounds follow.
fn speculative_steps(tokens: &[u32], accepted: &[usize], n: usize) -> Vec<TokenStep> {
    let mut steps: Vec<TokenStep> = tokens
        .first()
        .map(|&t| TokenStep::plain(t, n))
        .into_iter()
        .collect();
    let mut rest = tokens.iter().skip(1);
    'rounds: for (r, &round_accepted) in accepted.iter().enumerate() {
        for i in 0..=round_accepted {
            let Some(&token) = rest.next() else {
                break 'rounds;
            };
            steps.push(TokenStep {
                round: Some(r),
                accepted_draft: i < round_accepted,
                ..TokenStep::plain(token, n)
            });
        }
    }
    steps
}

/// The chosen token's logit and its probability under `softmax(logits)`.
fn logit_and_probability(logits: &[f32], token: u32) -> (f32, f32) {
    let logit = logits[token as usize];
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    (logit, (logit - max).exp() / sum)
}
