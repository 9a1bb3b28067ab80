//! Ahead-of-time expert prediction for MoE models (docs/MOE_AOT.md): which experts each MoE layer
//! of a decoded token will need, as guessed by four predictors behind one interface, recorded on a
//! real greedy token stream of the base model. The memory simulator (`memory_sim.rs`) consumes the
//! trace; nothing here changes what the model computes.
//!
//! | predictor   | prediction for MoE layer `l` of a token                       | issued            |
//! |-------------|---------------------------------------------------------------|-------------------|
//! | `lazy`      | none: every miss is loaded on demand                          | -                 |
//! | `next-gate` | router of `l` on `RMSNorm_l(s_{l-1})`, the slow state entering layer `l-1` (Mixtral-offloading) | start of layer `l-1` |
//! | `m2r2`      | router of `l` on `RMSNorm_l(f)`, the fast state at aligned depth `d_j(i)` with `d_j(i-1) <= l < d_j(i)` \[ours\] | end of the fast stream's `i`-th layer of interval `j` |
//! | `oracle`    | the experts the slow stream really uses                       | start of the token |
//!
//! `RMSNorm_l` is layer `l`'s own `post_attention_layernorm`, the norm its router reads. The m2r2
//! rule: after its `i`-th layer in interval `j` the fast state estimates the slow residual
//! `s_{d_j(i)}` (docs/m2r2/streams.md, `M2r2Config::aligned_depth`); the MoE block of layer `l`
//! reads a residual between `s_l` and `s_{l+1}`, so the estimate of `s_d` predicts the layers whose
//! MoE input lies at depth `d` or just before it, back to the previous aligned depth
//! ([`m2r2_targets`]). A layer in interval `j'` is predicted once by each fast interval `j <= j'`
//! that reaches past it; the prefetch set is the union of those predictions. Layer 0 is predicted
//! only by `oracle`; `next-gate` has nothing for it either.

use crate::base::layer::FastRows;
use crate::base::model::Model;
use crate::base::moe::route;
use crate::base::ops::{argmax, rms_norm};
use crate::base::weights::FeedForward;
use crate::error::{Error, Result};
use crate::m2r2::config::M2r2Config;
use crate::m2r2::fast_stream::M2r2;
use ndarray::Array2;
use serde::Serialize;
use std::ops::Range;

/// A moment in one token's forward pass: the start or the end of a layer. Ordered as they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct IssuePoint {
    pub layer: usize,
    pub phase: Phase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Start,
    End,
}

impl IssuePoint {
    pub fn start(layer: usize) -> Self {
        IssuePoint {
            layer,
            phase: Phase::Start,
        }
    }

    pub fn end(layer: usize) -> Self {
        IssuePoint {
            layer,
            phase: Phase::End,
        }
    }
}

/// Experts predicted for one MoE layer, and when the prediction is available.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Prediction {
    pub at: IssuePoint,
    /// Top-k expert indices, most probable first.
    pub experts: Vec<usize>,
}

/// One MoE layer of one decoded token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MoeLayerTrace {
    /// The experts the slow stream used (top-k order): what `oracle` predicts.
    pub used: Vec<usize>,
    /// `next-gate`'s prediction (issued at the start of the previous layer; `None` for layer 0).
    pub next_gate: Option<Vec<usize>>,
    /// `m2r2`'s predictions, in issue order (empty for layer 0).
    pub m2r2: Vec<Prediction>,
}

/// One decoded token: the token fed, its position, and per layer its MoE trace (`None`: dense layer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepTrace {
    pub position: usize,
    pub token: u32,
    pub layers: Vec<Option<MoeLayerTrace>>,
}

/// The expert trace of a decoded token stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpertTrace {
    /// N
    pub num_layers: usize,
    /// E
    pub num_experts: usize,
    /// k
    pub top_k: usize,
    /// The M2R2 gates the fast stream ran with.
    pub gates: Vec<usize>,
    pub steps: Vec<StepTrace>,
}

impl ExpertTrace {
    /// Code indices of the MoE layers (those with a trace in every step).
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_layers)
            .filter(|&l| {
                self.steps
                    .first()
                    .is_some_and(|s| s.layers.get(l).is_some_and(Option::is_some))
            })
            .collect()
    }
}

/// The four predictors (the table above, docs/MOE_AOT.md), one interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Predictor {
    Lazy,
    NextGate,
    M2r2,
    Oracle,
}

impl Predictor {
    pub const ALL: [Predictor; 4] = [
        Predictor::Lazy,
        Predictor::NextGate,
        Predictor::M2r2,
        Predictor::Oracle,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Predictor::Lazy => "lazy",
            Predictor::NextGate => "next-gate",
            Predictor::M2r2 => "m2r2",
            Predictor::Oracle => "oracle",
        }
    }

    /// Whether the policy runs the fast stream (it then pays for the fast rows' compute).
    pub fn uses_fast_stream(self) -> bool {
        self == Predictor::M2r2
    }

    /// The predictions this predictor makes for MoE layer `l` of `step`, in issue order.
    pub fn predictions(self, step: &StepTrace, l: usize) -> Vec<Prediction> {
        let Some(Some(layer)) = step.layers.get(l) else {
            return vec![];
        };
        match self {
            Predictor::Lazy => vec![],
            Predictor::NextGate => layer
                .next_gate
                .iter()
                .filter(|_| l > 0)
                .map(|experts| Prediction {
                    at: IssuePoint::start(l - 1),
                    experts: experts.clone(),
                })
                .collect(),
            Predictor::M2r2 => layer.m2r2.clone(),
            Predictor::Oracle => vec![Prediction {
                at: IssuePoint::start(0),
                experts: layer.used.clone(),
            }],
        }
    }
}

impl std::fmt::Display for Predictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Predictor {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Predictor::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown expert predictor `{s}` (expected one of lazy, next-gate, m2r2, oracle)"
                ))
            })
    }
}

/// The MoE layers that `m2r2` predicts after the fast stream's `i`-th layer (`i = 1..=k_j`) in
/// interval `j` \[ours\]: those whose MoE input lies between the previous aligned depth and this one,
/// `d_j(i-1) <= l < d_j(i)`. The caller drops layers that are not in the future.
pub fn m2r2_targets(config: &M2r2Config, j: usize, i: usize) -> Range<usize> {
    config.aligned_depth(j, i - 1)..config.aligned_depth(j, i)
}

/// The top-k experts that MoE layer `l`'s router picks for the residual `x` (its own
/// `post_attention_layernorm` first).
///
/// # Shapes
/// - `x`: `[1, D]`
fn predict_experts(model: &Model, l: usize, x: &Array2<f32>) -> Option<Vec<usize>> {
    let layer = &model.weights.layers[l];
    let FeedForward::Moe(moe) = &layer.ffn else {
        return None;
    };
    let h = rms_norm(x.view(), &layer.mlp_norm, model.config.rms_norm_eps as f32);
    Some(route(moe, h.view()).swap_remove(0).experts)
}

/// A greedy decode with its expert trace.
pub struct TracedDecode {
    pub trace: ExpertTrace,
    /// `steps + 1` greedy tokens after the prompt (the first from the prompt's prefill).
    pub tokens: Vec<u32>,
    /// The logits each token was chosen from: `steps + 1` rows of `[V]`.
    pub logits: Vec<Vec<f32>>,
    /// Per layer, the mean wall-clock seconds of one decode step's `DecoderLayer::forward_batch` call on this
    /// machine (with the fast row in the gated intervals). Not part of the trace: it varies run to run.
    pub layer_seconds: Vec<f64>,
}

/// Greedily decode `steps + 1` tokens after `prompt` with the base model, running the fast stream
/// next to the slow one in every gated interval of each decode step, and record per decoded token
/// and MoE layer the experts used and every predictor's guess. The slow stream and the KV cache are
/// exactly the base model's (the fast rows never write the cache), so the tokens and logits equal
/// `generate::greedy`'s; `tests/tests/moe_sim.rs` checks it. No stop tokens: the stream has a
/// fixed length.
pub fn collect_trace(m2r2: M2r2<'_>, prompt: &[u32], steps: usize) -> Result<TracedDecode> {
    let model = m2r2.model;
    let config = &model.config;
    let m2r2_config = &m2r2.weights.config;
    let moe = config.moe.as_ref().ok_or_else(|| {
        Error::Invalid(
            "expert prefetch needs an MoE model (a Mixtral-like config with num_local_experts)"
                .into(),
        )
    })?;
    if prompt.is_empty() {
        return Err(Error::Invalid(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    let n = config.num_hidden_layers;
    // The prompt, then `steps` fed tokens (the last of the `steps + 1` is never fed): exactly what
    // `generate` needs for `steps + 1` new tokens. Saturating: a huge `steps` is a context overflow.
    let mut cache = model.new_cache(prompt.len().saturating_add(steps))?;
    let prefill = model.forward(prompt, &mut cache)?.logits;
    let mut logits = vec![prefill.row(prompt.len() - 1).to_vec()];
    let mut tokens = vec![argmax(&logits[0]) as u32];
    let mut trace_steps = Vec::with_capacity(steps);
    let mut layer_seconds = vec![0.0f64; n];
    for _ in 0..steps {
        let token = *tokens.last().expect("one token");
        let pos = cache.len();
        model.check_input(&[token], pos, &cache)?;
        let mut layers: Vec<Option<MoeLayerTrace>> = model
            .weights
            .layers
            .iter()
            .map(|layer| {
                matches!(layer.ffn, FeedForward::Moe(_)).then(|| MoeLayerTrace {
                    used: vec![],
                    next_gate: None,
                    m2r2: vec![],
                })
            })
            .collect();
        let mut s = model.embed(&[token]); // [1, D]
        for j in 0..m2r2_config.num_intervals() {
            let gated = j < m2r2_config.num_gates();
            let mut f = s.clone(); // f <- s_{e_j}
            for (i, l) in m2r2_config.interval_layers(j).enumerate() {
                // next-gate: layer l+1's router on the slow state entering layer l.
                if l + 1 < n
                    && let Some(guess) = predict_experts(model, l + 1, &s)
                {
                    layers[l + 1].as_mut().expect("MoE layer").next_gate = Some(guess);
                }
                let fast = gated.then_some(FastRows {
                    f: &mut f,
                    slot: &[0],
                    adapter: Some(&m2r2.weights.accelerator),
                });
                let start = std::time::Instant::now();
                let out = model.layer(l).forward(&mut s, pos, &mut cache, fast);
                layer_seconds[l] += start.elapsed().as_secs_f64() / steps as f64;
                if let (Some(routing), Some(trace)) = (out.routing, layers[l].as_mut()) {
                    trace.used = routing[0].experts.clone();
                }
                if !gated {
                    continue;
                }
                // m2r2: the fast state now estimates s_{d_j(i+1)}; predict the future layers
                // whose MoE input lies just before that depth.
                for target in m2r2_targets(m2r2_config, j, i + 1).filter(|&t| t > l) {
                    if let Some(guess) = predict_experts(model, target, &f) {
                        layers[target]
                            .as_mut()
                            .expect("MoE layer")
                            .m2r2
                            .push(Prediction {
                                at: IssuePoint::end(l),
                                experts: guess,
                            });
                    }
                }
            }
        }
        cache.set_len(pos + 1);
        let row = model.head(s.view()).logits.row(0).to_vec();
        tokens.push(argmax(&row) as u32);
        logits.push(row);
        trace_steps.push(StepTrace {
            position: pos,
            token,
            layers,
        });
    }
    Ok(TracedDecode {
        trace: ExpertTrace {
            num_layers: n,
            num_experts: moe.num_local_experts,
            top_k: moe.num_experts_per_tok,
            gates: m2r2_config.gates.clone(),
            steps: trace_steps,
        },
        tokens,
        logits,
        layer_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use crate::m2r2::weights::M2r2Weights;

    /// tiny-moe: N = 8, gates [2, 4, 6]. Interval 0 (layers 0, 1) runs at rate 4: d_0 = 0, 4, 8, so
    /// after layer 0 it predicts layers 1..4 (0 is past) and after layer 1 layers 4..8.
    #[test]
    fn m2r2_targets_hand_values() {
        let model = builtin::builtin("tiny-moe").unwrap();
        let w = M2r2Weights::zeros(&model.config);
        assert_eq!(m2r2_targets(&w.config, 0, 1), 0..4);
        assert_eq!(m2r2_targets(&w.config, 0, 2), 4..8);
        // Interval 2 (layers 4, 5): d = 4, 6, 8.
        assert_eq!(m2r2_targets(&w.config, 2, 1), 4..6);
        assert_eq!(m2r2_targets(&w.config, 2, 2), 6..8);
    }

    /// The trace's shape and issue points on tiny-moe, and `oracle` = the experts used.
    #[test]
    fn trace_layout_on_tiny_moe() {
        let model = builtin::builtin("tiny-moe").unwrap();
        let w = M2r2Weights::builtin_for("tiny-moe", &model.config).unwrap();
        let out = collect_trace(M2r2::new(&model, &w), &[5, 6, 7], 4).unwrap();
        assert_eq!(out.tokens.len(), 5);
        assert_eq!(out.logits.len(), 5);
        let t = &out.trace;
        assert_eq!((t.num_layers, t.num_experts, t.top_k), (8, 8, 2));
        assert_eq!(t.moe_layers(), (0..8).collect::<Vec<_>>());
        for (i, step) in t.steps.iter().enumerate() {
            assert_eq!(step.position, 3 + i);
            assert_eq!(step.token, out.tokens[i]);
            for (l, layer) in step.layers.iter().enumerate() {
                let layer = layer.as_ref().unwrap();
                assert_eq!(layer.used.len(), 2);
                assert_eq!(layer.next_gate.is_some(), l > 0);
                // Every layer after the first is predicted by each fast interval that starts
                // before it (gates 2, 4, 6 -> intervals 0, 1, 2 start at 0, 2, 4).
                let expected = [0usize, 2, 4].iter().filter(|&&e| e < l).count();
                assert_eq!(layer.m2r2.len(), expected, "layer {l}");
                for p in &layer.m2r2 {
                    assert_eq!(p.at.phase, Phase::End);
                    assert!(p.at.layer < l && p.experts.len() == 2);
                }
                assert_eq!(
                    Predictor::Oracle.predictions(step, l)[0].experts,
                    layer.used
                );
            }
        }
    }

    #[test]
    fn dense_models_are_refused() {
        let model = builtin::builtin("tiny").unwrap();
        let w = M2r2Weights::zeros(&model.config);
        let err = collect_trace(M2r2::new(&model, &w), &[1], 2)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("needs an MoE model"), "{err}");
    }

    /// The trace needs the prompt's positions and one per step, no more: it fills the context
    /// exactly, and one step beyond it is a context overflow (not a panic, even for `usize::MAX`).
    #[test]
    fn the_trace_fills_the_context_exactly() {
        let model = builtin::builtin("tiny-moe").unwrap();
        let w = M2r2Weights::zeros(&model.config);
        let context = model.context_length();
        let prompt = vec![1; context - 3];
        let out = collect_trace(M2r2::new(&model, &w), &prompt, 3).unwrap();
        assert_eq!(out.trace.steps.last().unwrap().position, context - 1);
        for steps in [4, usize::MAX] {
            let err = collect_trace(M2r2::new(&model, &w), &prompt, steps)
                .err()
                .unwrap();
            assert!(matches!(err, Error::ContextOverflow { .. }), "{err}");
        }
    }

    #[test]
    fn predictor_names_round_trip() {
        for p in Predictor::ALL {
            assert_eq!(p.name().parse::<Predictor>().unwrap(), p);
        }
        assert!("belady".parse::<Predictor>().is_err());
    }
}
