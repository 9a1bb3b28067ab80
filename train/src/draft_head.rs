//! Choosing and measuring the pruned draft head (drafts that score `K` tokens of the vocabulary
//! instead of all `V`, docs/TRAINING.md "Pruned draft head"): the head itself (`DraftHead`,
//! `draft_head.json`, the pruned draft logits) lives in [`reference::m2r2::draft_head`]; here are
//! the choice of the subset (the `K` most frequent response tokens of the distillation data) and
//! the held-out agreement of full and pruned drafts.
//!
//! ```text
//! draft = subset[ argmax_k  (FinalNorm(u_gd) . W_head[subset[k]]) ]       K rows instead of V
//! ```

use crate::data::DistillSample;
use crate::error::Result;
use reference::Model;
use reference::base::ops::argmax;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;

pub use reference::m2r2::draft_head::{DRAFT_HEAD_FILE, DraftHead};

/// The `k` most frequent response tokens of `data` (ties: the smaller id first), as a head.
///
/// # Panics
/// If `k` is not in `1..=vocab_size` or a token is `>= vocab_size` (the caller checks both).
pub fn most_frequent(data: &[DistillSample], vocab_size: usize, k: usize) -> DraftHead {
    let mut counts = vec![0usize; vocab_size];
    for s in data {
        for &t in &s.tokens[s.prompt_len..] {
            counts[t as usize] += 1;
        }
    }
    let mut order: Vec<u32> = (0..vocab_size as u32).collect();
    order.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
    let mut tokens: Vec<u32> = order.into_iter().take(k).collect();
    tokens.sort_unstable();
    DraftHead::new(tokens, vocab_size, "most frequent tokens").expect("1 <= k <= vocab_size")
}

/// Draft agreement of the full and of each pruned head at gate `gate` on the response rows of
/// `data`.
#[derive(Clone, Debug, PartialEq)]
pub struct PrunedAgreement {
    pub rows: usize,
    /// Rows where the full exit argmax equals the base model's token.
    pub full: usize,
    /// Per head: rows where the pruned draft equals the base model's token.
    pub pruned: Vec<usize>,
    /// Per head: rows whose base token is in the subset.
    pub covered: Vec<usize>,
}

/// Compare the full and pruned draft heads against the base model's greedy tokens.
pub fn pruned_agreement(
    model: &Model,
    weights: &M2r2Weights,
    gate: usize,
    data: &[DistillSample],
    heads: &[DraftHead],
) -> Result<PrunedAgreement> {
    let m2r2 = M2r2::new(model, weights);
    let mut out = PrunedAgreement {
        rows: 0,
        full: 0,
        pruned: vec![0; heads.len()],
        covered: vec![0; heads.len()],
    };
    for sample in data {
        // the draft as decoding's first draft of a round runs it: with the bridge, if any
        let (u, last) = m2r2.draft_states_and_final(&sample.tokens, gate)?;
        let rows: Vec<usize> = (sample.first_row()..sample.tokens.len()).collect();
        let u = u.select(ndarray::Axis(0), &rows);
        let exit = m2r2.exit_logits(u.view());
        let base = model
            .head(last.select(ndarray::Axis(0), &rows).view())
            .logits;
        for r in 0..rows.len() {
            let want = argmax(base.row(r).as_slice().expect("row")) as u32;
            let logits = exit.row(r);
            let logits = logits.as_slice().expect("row");
            out.rows += 1;
            out.full += usize::from(argmax(logits) as u32 == want);
            for (h, head) in heads.iter().enumerate() {
                out.pruned[h] += usize::from(head.draft(logits) == want);
                out.covered[h] += usize::from(head.tokens.binary_search(&want).is_ok());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_frequent_counts_responses_only() {
        let data = [DistillSample {
            prompt_id: "a".into(),
            sample: 0,
            prompt_len: 2,
            tokens: vec![7, 7, 3, 5, 3, 1],
        }];
        // response tokens 3, 5, 3, 1: 3 twice, then 1 and 5 once (smaller id first)
        assert_eq!(most_frequent(&data, 8, 2).tokens, vec![1, 3]);
        let head = most_frequent(&data, 8, 3);
        assert_eq!(head.tokens, vec![1, 3, 5]);
        // the full argmax (7) is outside the subset: the best subset token wins
        assert_eq!(head.draft(&[0.0, 0.5, 0.0, 0.7, 0.0, 0.1, 0.0, 9.0]), 3);
    }
}
