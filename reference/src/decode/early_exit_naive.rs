//! Early exit as its equations, one token at a time: the naive twin of
//! [`early_exit_generate`](super::early_exit::early_exit_generate) (`decode/early_exit.rs`),
//! written on the naive streams (`base/model_naive.rs`, `m2r2/fast_stream_naive.rs`); no work
//! counting. The tests check that it emits the same tokens with the same gate scores (bit for bit)
//! and leaves the same KV cache. docs/m2r2/early_exit.md has the method.
//!
//! ```text
//! prefill the prompt with the base model; the first token from its last logits
//! for each next token x at position p:
//!     s = E[x]
//!     for j in 0..J:
//!         u_{j+1} = interval_j(s, p)                 slow row writes the cache, fast row -> u
//!         logits  = Head(u_{j+1});  score = gate(u_1..u_{j+1}, logits)
//!         if score >= tau: emit from logits, exit at gate j+1, stop here
//!     no exit: s through the last interval; emit from Head(s_N)
//!     the skipped layers' K/V at p, by the KV policy:
//!         exact:   s continues through layers e_g..N (slow row only)
//!         fast-kv: k = RoPE(W_k RMSNorm(u_g; w_attn_l), p), v = W_v RMSNorm(u_g; w_attn_l)
//! ```
//!
//! With `exact`, `early_exit_generate` runs the skipped layers later, batched with the next token
//! that reaches them, so the exited token is emitted sooner; here they run at once. Either way they
//! compute the same bits (a row's result never depends on the rows beside it), and every token's
//! fast rows read a complete cache of the earlier positions: only when the layers run differs.

use crate::base::kv_cache::KvCache;
use crate::base::layer_naive::{layer_naive, project, rms_norm_row, rope};
use crate::base::model_naive::{embed_naive, forward_naive, head_naive};
use crate::base::sampling::Sampler;
use crate::decode::early_exit::{EarlyExitOptions, ExitTrace, KvPolicy};
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::{gate_score, should_exit};
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::fast_stream_naive::interval_naive;
use ndarray::{Array1, ArrayView1, Axis};

/// Decode with early exit after `prompt`: the emitted tokens with their exits and scores, and the
/// KV cache left behind.
pub fn early_exit_generate_naive(
    m2r2: M2r2<'_>,
    prompt: &[u32],
    options: &EarlyExitOptions,
) -> Result<(Vec<ExitTrace>, KvCache)> {
    let model = m2r2.model;
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    let mut sampler = Sampler::new(options.sampling.clone())?;
    let mut cache = model.new_cache(prompt.len() + options.max_new_tokens)?;
    let prompt_logits = forward_naive(model, prompt, &mut cache)?;
    let mut trace = Vec::new();
    if options.max_new_tokens == 0 {
        return Ok((trace, cache));
    }
    let last = prompt_logits.row(prompt.len() - 1).to_vec();
    let mut token = sampler.next(&last);
    trace.push(ExitTrace {
        token,
        exit_gate: None,
        scores: vec![],
        layers_at_emit: model.config.num_hidden_layers,
    });
    while trace.len() < options.max_new_tokens && !options.stop_tokens.contains(&token) {
        let step = step_naive(m2r2, token, &mut cache, options, &mut sampler)?;
        token = step.token;
        trace.push(step);
    }
    Ok((trace, cache))
}

/// One token `x` at position `p = cache.len()`: interval by interval until a gate fires or the last
/// layer; fills the skipped layers' K/V by the policy and advances the cache. Returns the next
/// token with its exit and scores.
fn step_naive(
    m2r2: M2r2<'_>,
    x: u32,
    cache: &mut KvCache,
    options: &EarlyExitOptions,
    sampler: &mut Sampler,
) -> Result<ExitTrace> {
    let (model, config) = (m2r2.model, &m2r2.weights.config);
    let n_layers = model.config.num_hidden_layers;
    let p = cache.len();
    model.check_input(&[x], p, cache)?;
    let eps = model.config.rms_norm_eps as f32;
    let mut s = embed_naive(model, x);
    let (mut exit_states, mut scores) = (Vec::new(), Vec::new());
    for j in 0..config.num_gates() {
        exit_states.push(interval_naive(m2r2, j, &mut s, p, cache));
        let u = exit_states.last().expect("just pushed");
        let logits = head_naive(model, u).to_vec();
        let views: Vec<ArrayView1<f32>> = exit_states.iter().map(|u| u.view()).collect();
        let score = gate_score(
            options.gate,
            m2r2.weights.arla.as_ref(),
            &views,
            &logits,
            eps,
        )?;
        scores.push(score);
        let gate = j + 1;
        if should_exit(score, options.threshold.at(gate)) {
            let exit_layer = config.gate_layer(gate);
            match options.kv_policy {
                KvPolicy::Exact => {
                    for l in exit_layer..n_layers {
                        layer_naive(model, l, &mut s, p, cache);
                    }
                }
                KvPolicy::FastKv => fill_kv_naive(m2r2, exit_layer, u, p, cache),
            }
            cache.set_len(p + 1);
            return Ok(ExitTrace {
                token: sampler.next(&logits),
                exit_gate: Some(gate),
                scores,
                layers_at_emit: exit_layer,
            });
        }
    }
    for l in config.interval_layers(config.num_gates()) {
        layer_naive(model, l, &mut s, p, cache);
    }
    cache.set_len(p + 1);
    Ok(ExitTrace {
        token: sampler.next(head_naive(model, &s).as_slice().expect("owned vector")),
        exit_gate: None,
        scores,
        layers_at_emit: n_layers,
    })
}

/// `fast-kv`: the K/V of layers `from..N` at position `p` from the exit state `u`, with each
/// layer's own input norm and k / v projections (no adapters).
///
/// # Shapes
/// - `u`: `[D]`
fn fill_kv_naive(m2r2: M2r2<'_>, from: usize, u: &Array1<f32>, p: usize, cache: &mut KvCache) {
    let model = m2r2.model;
    let eps = model.config.rms_norm_eps as f32;
    for l in from..model.config.num_hidden_layers {
        let w = &model.weights.layers[l];
        let h = rms_norm_row(u, &w.attn_norm, eps);
        let mut k = project(&w.attn.k, &h); // [Hkv*Dh]
        let v = project(&w.attn.v, &h); // [Hkv*Dh]
        rope(&mut k, p, model.rope().frequencies(), model.config.head_dim);
        cache.write(
            l,
            p,
            k.view().insert_axis(Axis(0)),
            v.view().insert_axis(Axis(0)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::sampling::SamplingParams;
    use crate::decode::early_exit::early_exit_generate;
    use crate::io::builtin;
    use crate::m2r2::exit_gate::GateKind;
    use crate::m2r2::exit_threshold::ExitThreshold;
    use crate::m2r2::weights::M2r2Weights;

    /// For both KV policies, every gate kind and thresholds that exit never, sometimes and always,
    /// shared and per gate (gate 1 closed), greedy and sampled: the naive twin emits the production
    /// decoder's tokens with the same exits, bitwise the same scores, and the same cache.
    #[test]
    fn naive_early_exit_is_early_exit_generate() {
        let (mut exited, mut ran_through) = (0, 0);
        for name in builtin::BUILTIN_NAMES {
            let model = builtin::builtin(name).unwrap();
            let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
            let m2r2 = M2r2::new(&model, &weights);
            let j = weights.config.num_gates();
            // gate 1 closed, the others open wide
            let closed_first: Vec<f32> = (0..j).map(|g| if g == 0 { 2.0 } else { 0.05 }).collect();
            for kv_policy in [KvPolicy::Exact, KvPolicy::FastKv] {
                for (gate, threshold) in [
                    (GateKind::Arla, 0.5.into()),
                    (GateKind::Confidence, 0.05.into()),
                    (GateKind::Entropy, 0.2.into()),
                    (GateKind::Confidence, 2.0.into()),
                    (GateKind::Confidence, 0.0.into()),
                    (
                        GateKind::Confidence,
                        ExitThreshold::PerGate(closed_first.clone()),
                    ),
                ] {
                    for sampling in [
                        None,
                        Some(SamplingParams {
                            temperature: 0.9,
                            top_k: Some(20),
                            top_p: None,
                            seed: 3,
                        }),
                    ] {
                        let options = EarlyExitOptions {
                            max_new_tokens: 12,
                            stop_tokens: vec![],
                            gate,
                            threshold: threshold.clone(),
                            kv_policy,
                            sampling,
                        };
                        let what = format!("{name} {kv_policy} {gate} >= {threshold}");
                        let prompt = [2u32, 7, 1, 8];
                        let fast = early_exit_generate(m2r2, &prompt, &options).unwrap();
                        let (trace, cache) =
                            early_exit_generate_naive(m2r2, &prompt, &options).unwrap();
                        assert_eq!(trace.len(), fast.trace.len(), "{what}");
                        for (a, b) in trace.iter().zip(&fast.trace) {
                            let bits = |t: &ExitTrace| -> Vec<u32> {
                                t.scores.iter().map(|s| s.to_bits()).collect()
                            };
                            assert_eq!(
                                (a.token, a.exit_gate, a.layers_at_emit, bits(a)),
                                (b.token, b.exit_gate, b.layers_at_emit, bits(b)),
                                "{what}"
                            );
                        }
                        assert_eq!(cache.len(), fast.cache.len(), "{what}");
                        assert!(cache.prefix_equals(&fast.cache, cache.len()), "{what}");
                        if let ExitThreshold::PerGate(_) = threshold {
                            // a closed gate never exits; the open ones do
                            assert!(trace.iter().all(|t| t.exit_gate != Some(1)), "{what}");
                            assert!(
                                j < 2 || trace.iter().any(|t| t.exit_gate.is_some()),
                                "{what}"
                            );
                        }
                        exited += trace.iter().filter(|t| t.exit_gate.is_some()).count();
                        ran_through += trace[1..].iter().filter(|t| t.exit_gate.is_none()).count();
                    }
                }
            }
        }
        // the cases exercise both: tokens that exit and tokens that run every layer
        assert!(
            exited > 50 && ran_through > 50,
            "{exited} exits, {ran_through} full"
        );
    }
}
