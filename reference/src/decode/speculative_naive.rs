//! Greedy self-speculative decoding as its equations, one token at a time: the naive twin of
//! [`speculative_generate`](super::speculative::speculative_generate) on
//! [`ReferenceSpeculation`](super::draft_verify::ReferenceSpeculation) with a fixed draft length,
//! written on the naive streams; no backend trait, no chunks, no work counting. The tests check
//! that it emits the same tokens in the same rounds and leaves the same KV cache.
//! docs/m2r2/speculative.md has the method.
//!
//! One round, `last` the newest emitted token and `n` positions in the cache, draft gate `g_d`:
//!
//! ```text
//! draft:    x_0 = last; for i in 0..=m, at position n + i:
//!               s_i = E[x_i] through intervals 0..g_d      slow rows write the cache; s_i kept
//!               (i < m) u = the fast row's exit state at g_d (the fast row runs in interval
//!                       g_d - 1 only: nothing else reads it), d_{i+1} = x_{i+1} = argmax Head(u)
//! verify:   s_i through layers e_gd..N, i = 0..=m in order -> y_i = argmax Head(s_N)
//! accept:   a = the longest prefix with d_{i+1} == y_i; base token y_a (a correction, or the
//!           bonus when a = m); emit d_1..d_a, y_a
//! rollback: keep the n + a + 1 positions whose inputs were right
//! ```
//!
//! Verifying one position at a time gives the chunked verifier's bits (batch invariance), which is
//! why greedy self-speculation is exactly greedy decoding. The pruned draft head restricts the
//! draft's argmax to its tokens (`m2r2/draft_head.rs`); drafting that reads a bridge
//! (docs/m2r2/bridge.md) has no naive twin and is refused.

use crate::base::kv_cache::KvCache;
use crate::base::layer_naive::layer_naive;
use crate::base::model_naive::{embed_naive, forward_naive, head_naive};
use crate::base::ops::argmax;
use crate::decode::speculative::{Round, SpeculativeOutput};
use crate::error::{Error, Result};
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::fast_stream_naive::interval_naive;
use ndarray::Array1;

/// Greedy self-speculation after `prompt`: `draft_len` proposals per round from gate
/// `draft_gate`, until `max_new_tokens` tokens or a stop token.
///
/// # Errors
/// An empty prompt, a draft gate outside `1..=J` or a draft length of 0, drafting that reads a
/// bridge, and the base model's input errors.
pub fn speculative_generate_naive(
    m2r2: M2r2<'_>,
    prompt: &[u32],
    draft_gate: usize,
    draft_len: usize,
    max_new_tokens: usize,
    stop_tokens: &[u32],
) -> Result<(SpeculativeOutput, KvCache)> {
    let model = m2r2.model;
    if prompt.is_empty() || draft_len == 0 {
        return Err(Error::Invalid("an empty prompt or draft".into()));
    }
    if !m2r2.weights.config.has_gate(draft_gate) || m2r2.weights.bridge_at(draft_gate).is_some() {
        return Err(Error::Invalid(format!(
            "draft gate {draft_gate}: not a gate, or it reads a bridge"
        )));
    }
    // Room for the last round's draft beyond the budget, as `ReferenceSpeculation` sizes it.
    let mut cache = model.new_cache(prompt.len() + max_new_tokens + draft_len + 1)?;
    let prompt_logits = forward_naive(model, prompt, &mut cache)?;
    let mut out = SpeculativeOutput {
        tokens: vec![],
        rounds: vec![],
    };
    if max_new_tokens == 0 {
        return Ok((out, cache));
    }
    let mut last = argmax(prompt_logits.row(prompt.len() - 1).as_slice().expect("row")) as u32;
    out.tokens.push(last);
    while out.tokens.len() < max_new_tokens && !stop_tokens.contains(&last) {
        let n = cache.len();
        let (drafted, accepted, base_token) =
            round_naive(m2r2, draft_gate, draft_len, last, &mut cache)?;
        out.rounds.push(Round {
            start: n,
            proposals: drafted.len(),
            drafted: drafted.clone(),
            accepted,
            base_token,
            scores: vec![],
        });
        let mut emitted = drafted[..accepted].to_vec();
        emitted.push(base_token);
        // stop at a stop token or the budget; the cache keeps the inputs of emitted tokens
        let room = max_new_tokens - out.tokens.len();
        let end = emitted
            .iter()
            .position(|t| stop_tokens.contains(t))
            .map_or(emitted.len(), |i| i + 1)
            .min(room);
        emitted.truncate(end);
        cache.truncate(n + emitted.len());
        last = *emitted.last().expect("at least one token per round");
        out.tokens.extend(emitted);
    }
    Ok((out, cache))
}

/// One round after `last` at position `n = cache.len()`: the drafted tokens, how many the base
/// model accepts, and its token after them. Leaves `n + m + 1` positions in the cache (the caller
/// rolls back).
fn round_naive(
    m2r2: M2r2<'_>,
    draft_gate: usize,
    m: usize,
    last: u32,
    cache: &mut KvCache,
) -> Result<(Vec<u32>, usize, u32)> {
    let (model, config) = (m2r2.model, &m2r2.weights.config);
    let n = cache.len();
    // draft: feed last, d_1, .., d_m through the draft layers, keeping s at e_gd
    let (mut drafted, mut kept) = (
        Vec::with_capacity(m),
        Vec::<Array1<f32>>::with_capacity(m + 1),
    );
    let mut x = last;
    for i in 0..=m {
        let p = n + i;
        model.check_input(&[x], p, cache)?;
        let mut s = embed_naive(model, x);
        // the slow row alone below the draft gate's interval
        let last_interval = draft_gate - 1;
        for l in 0..config.boundary(last_interval) {
            layer_naive(model, l, &mut s, p, cache);
        }
        if i < m {
            // propose: a fast row in the interval ending at the draft gate
            let u = interval_naive(m2r2, last_interval, &mut s, p, cache);
            let logits = head_naive(model, &u);
            let logits = logits.as_slice().expect("owned vector");
            x = match &m2r2.weights.draft_head {
                Some(pruned) => pruned.draft(logits),
                None => argmax(logits) as u32,
            };
            drafted.push(x);
        } else {
            for l in config.interval_layers(last_interval) {
                layer_naive(model, l, &mut s, p, cache);
            }
        }
        kept.push(s);
        cache.set_len(p + 1); // the lower layers of p are written; the upper ones at verify
    }
    // verify: each kept residual through the upper layers, in position order
    let upper = config.gate_layer(draft_gate)..model.config.num_hidden_layers;
    let base: Vec<u32> = kept
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            for l in upper.clone() {
                layer_naive(model, l, &mut s, n + i, cache);
            }
            argmax(head_naive(model, &s).as_slice().expect("owned vector")) as u32
        })
        .collect();
    // accept: the longest prefix the base model agrees with, then its own token
    let accepted = drafted
        .iter()
        .zip(&base)
        .take_while(|(d, y)| d == y)
        .count();
    Ok((drafted, accepted, base[accepted]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::draft_verify::ReferenceSpeculation;
    use crate::decode::speculative::{
        DraftLength, SpeculativeBackend, SpeculativeOptions, speculative_generate,
    };
    use crate::io::builtin;
    use crate::m2r2::draft_head::DraftHead;
    use crate::m2r2::weights::M2r2Weights;

    /// Every draft gate and draft lengths 1 to 4, with the full head and with a pruned one, on the
    /// built-in dense and MoE models: the naive rounds are the production loop's, token for token,
    /// and the caches agree.
    #[test]
    fn naive_speculation_is_speculative_generate() {
        let (mut accepted, mut rejected) = (0, 0);
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
            for weights in [&full, &pruned] {
                let m2r2 = M2r2::new(&model, weights);
                for gate in 1..=m2r2.num_gates() {
                    for m in 1..=4 {
                        let what = format!(
                            "{name} gate {gate} length {m} pruned {}",
                            weights.draft_head.is_some()
                        );
                        let prompt = [3u32, 1, 4, 1];
                        let options = SpeculativeOptions {
                            max_new_tokens: 14,
                            stop_tokens: vec![],
                            draft_length: DraftLength::Fixed(m),
                            sampling: None,
                        };
                        let mut backend = ReferenceSpeculation::new(m2r2, gate, None, 64).unwrap();
                        let fast = speculative_generate(&mut backend, &prompt, &options).unwrap();
                        let (naive, cache) =
                            speculative_generate_naive(m2r2, &prompt, gate, m, 14, &[]).unwrap();
                        assert_eq!(naive, fast, "{what}");
                        assert_eq!(cache.len(), backend.len(), "{what}");
                        assert!(backend.cache().prefix_equals(&cache, cache.len()), "{what}");
                        for r in &naive.rounds {
                            accepted += r.accepted;
                            rejected += usize::from(r.accepted < r.drafted.len());
                        }
                    }
                }
            }
        }
        // the rounds exercise both: accepted drafts and corrections
        assert!(
            accepted > 20 && rejected > 20,
            "{accepted} accepted, {rejected} rejections"
        );
    }
}
