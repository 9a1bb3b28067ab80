//! The speculative rounds of a chain-drafting golden as padded tensors ([`RoundTensors`]), and
//! which round emitted each token.

use crate::decode::speculative::SpeculativeOutput;
use crate::error::{Error, Result};
use crate::golden::file::GoldenFile;
use ndarray::Array2;

/// The speculative rounds as padded tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundTensors {
    /// `[R, M]` padded with -1
    pub drafted: Array2<i64>,
    /// `[R]`
    pub accepted: Vec<i64>,
    /// `[R]`
    pub base_token: Vec<i64>,
    /// `[R, M+1]` padded with NaN
    pub scores: Array2<f32>,
}

impl RoundTensors {
    /// Rounds recorded.
    pub fn len(&self) -> usize {
        self.accepted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accepted.is_empty()
    }

    /// The tokens round `r` drafted (its row of `drafted` without the padding).
    pub fn drafted_in(&self, r: usize) -> Vec<i64> {
        self.drafted
            .row(r)
            .iter()
            .copied()
            .filter(|&t| t >= 0)
            .collect()
    }

    /// Proposals the draft made in round `r`: its drafts, or one more where a dynamic draft
    /// stopped at a score under the threshold.
    pub fn proposals(&self, r: usize) -> usize {
        let scored = self.scores.row(r).iter().filter(|s| !s.is_nan()).count();
        self.drafted_in(r).len().max(scored)
    }

    /// The round of each row of `verify_logits` (`None` for the prompt's row).
    pub fn verify_rounds(&self) -> Vec<Option<usize>> {
        let mut rows = vec![None];
        for r in 0..self.len() {
            rows.extend(std::iter::repeat_n(Some(r), self.drafted_in(r).len() + 1));
        }
        rows
    }

    /// The round of each row of `draft_logits`.
    pub fn proposal_rounds(&self) -> Vec<Option<usize>> {
        (0..self.len())
            .flat_map(|r| std::iter::repeat_n(Some(r), self.proposals(r)))
            .collect()
    }

    /// The round that emitted each of `n` tokens (`None` for the first, from the prompt's row).
    pub fn step_rounds(&self, n: usize) -> Vec<Option<usize>> {
        step_rounds(&self.accepted, n)
    }

    pub(super) fn from_output(out: &SpeculativeOutput, max: usize) -> RoundTensors {
        let r = out.rounds.len();
        let mut drafted = Array2::from_elem((r, max), -1i64);
        let mut scores = Array2::from_elem((r, max + 1), f32::NAN);
        for (i, round) in out.rounds.iter().enumerate() {
            for (k, &t) in round.drafted.iter().enumerate() {
                drafted[[i, k]] = i64::from(t);
            }
            for (k, &s) in round.scores.iter().enumerate() {
                scores[[i, k]] = s;
            }
        }
        RoundTensors {
            drafted,
            accepted: out.rounds.iter().map(|r| r.accepted as i64).collect(),
            base_token: out.rounds.iter().map(|r| i64::from(r.base_token)).collect(),
            scores,
        }
    }
}

/// The round that emitted each of `n` tokens, rounds accepting `accepted` drafts each (`None`
/// for the first token, from the prompt's row).
pub(super) fn step_rounds(accepted: &[i64], n: usize) -> Vec<Option<usize>> {
    let mut steps = vec![None; n.min(1)];
    for (r, &accepted) in accepted.iter().enumerate() {
        let emitted = (accepted.max(0) as usize + 1).min(n.saturating_sub(steps.len()));
        steps.extend(std::iter::repeat_n(Some(r), emitted));
    }
    steps
}

/// Refuse a chain's rounds whose own tensors do not hold what a decode records, before anything
/// that follows from them (the accepted counts' range, the rows of `verify_logits` and
/// `draft_logits`) is compared, so that the message names the tensor that is off: each row of
/// `round_drafted` its drafted token ids (below `vocab`, the config's, when known), then -1
/// padding, and all `draft_max` of them under a fixed draft length (the loop drafts in full every
/// round, even next to the budget); `round_base_token` token ids.
pub(super) fn check_round_tokens(
    file: &GoldenFile<'_>,
    rounds: &RoundTensors,
    fixed: bool,
    vocab: Option<u64>,
) -> Result<()> {
    let bad = |msg: String| Err(Error::format(&file.label, msg));
    let outside = |t: i64| match vocab {
        Some(v) if u64::try_from(t).is_ok_and(|t| t >= v) => {
            format!(", outside the vocabulary of {v} tokens (metadata `config`)")
        }
        _ if u32::try_from(t).is_err() => " (token ids are 0..=2^32-1)".into(),
        _ => String::new(),
    };
    for (r, row) in rounds.drafted.rows().into_iter().enumerate() {
        let d = row.iter().take_while(|&&t| t >= 0).count();
        if let Some((j, &t)) = row.iter().enumerate().skip(d).find(|&(_, &t)| t != -1) {
            return bad(format!(
                "tensor `round_drafted`: round {r} holds {t} at draft {j}, after its {d} drafts \
                 (drafted token ids, then -1 padding)"
            ));
        }
        if let Some((j, &t)) = row
            .iter()
            .enumerate()
            .find(|&(_, &t)| t >= 0 && !outside(t).is_empty())
        {
            return bad(format!(
                "tensor `round_drafted`: round {r} holds token id {t} at draft {j}{}",
                outside(t)
            ));
        }
        if fixed && d != row.len() {
            return bad(format!(
                "tensor `round_drafted`: round {r} drafted {d} tokens, but a fixed draft length \
                 drafts `draft_max` = {} every round",
                row.len()
            ));
        }
    }
    if let Some((r, &t)) = rounds
        .base_token
        .iter()
        .enumerate()
        .find(|&(_, &t)| t < 0 || !outside(t).is_empty())
    {
        return bad(format!(
            "tensor `round_base_token`: round {r} holds token id {t}{}",
            outside(t)
        ));
    }
    Ok(())
}

/// Refuse rounds of `accepted` drafts (each `>= 0`) that do not emit the file's `n` tokens: the
/// first token comes from the prompt's row and each round emits its accepted drafts and a base
/// token, so every round but the last emits all of them and the last at least one (fewer than
/// all only where the budget or a stop token cut it, which the reader checks against `max_steps`
/// and `stop_tokens`). A file without rounds is the caller's to check.
pub(super) fn check_emitted(file: &GoldenFile<'_>, accepted: &[i64], n: usize) -> Result<()> {
    let Some((last, earlier)) = accepted.split_last() else {
        return Ok(());
    };
    let emits = |a: &i64| a.unsigned_abs() as usize + 1;
    let before = 1 + earlier.iter().map(emits).sum::<usize>();
    let all = before + emits(last);
    if before < n && n <= all {
        return Ok(());
    }
    Err(Error::format(
        &file.label,
        format!(
            "tensor `round_accepted` does not agree with `tokens`: the prompt's token and {} \
             rounds of accepted drafts and a base token each make {before} tokens before the last \
             round and {all} with it, but `tokens` holds {n} (the last round emits at least one, \
             and fewer than all only where the budget or a stop token cut it)",
            accepted.len()
        ),
    ))
}
