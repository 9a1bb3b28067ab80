//! Training ARLA from trained adapters (docs/TRAINING.md "ARLA") and calibrating its threshold.
//!
//! Examples: every response position of the data at every gate `g`, with the fast exit states
//! `u_1..u_g` of the reference inference (`M2r2::all_exit_states`) and ARLA's training label
//! (docs/m2r2/arla.md), `argmax(exit logits at g) == argmax(final logits)`. The confidence and
//! entropy scores of the same exits are kept, so the three gates can be compared on the same
//! tokens.
//!
//! Calibration simulates early exit (docs/m2r2/early_exit.md) per token on held-out data: exit at
//! the first gate whose score reaches the threshold; an exited token agrees with the base model
//! when its label is 1, a token that never exits runs the full model and agrees. The threshold kept
//! is the one with the fewest layers per token among those reaching the target agreement: one
//! shared by every gate ([`calibrate`]), or one per gate ([`calibrate_per_gate`]), which lets a
//! gate that is confident and often wrong (a shallow draft gate) stop exiting without raising the
//! others' thresholds.

use crate::adamw::{AdamW, AdamWConfig, clip_grad_norm};
use crate::arla::{ArlaParams, backward, bce, forward};
use crate::data::DistillSample;
use crate::error::{Error, Result};
use crate::schedule::Schedule;
use ndarray::{Array2, Axis, s};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use reference::Model;
use reference::base::ops::argmax;
use reference::m2r2::arla::Arla;
use reference::m2r2::exit_gate::{GateKind, gate_score};
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;

/// One token's exit evidence at every gate.
#[derive(Clone, Debug)]
pub struct TokenGates {
    /// `[J, D]` fast exit states `u_1..u_J`
    pub states: Array2<f32>,
    /// Per gate: the exit token equals the base model's token.
    pub agree: Vec<bool>,
    /// Per gate: max-softmax confidence of the exit logits.
    pub confidence: Vec<f32>,
    /// Per gate: `1 - H / ln V` of the exit logits.
    pub entropy: Vec<f32>,
}

/// The exit evidence of every response position of `data` (`on_sample(i)` after each sample).
pub fn collect(
    model: &Model,
    weights: &M2r2Weights,
    data: &[DistillSample],
    on_sample: &mut dyn FnMut(usize),
) -> Result<Vec<TokenGates>> {
    let m2r2 = M2r2::new(model, weights);
    let j = m2r2.num_gates();
    let mut out = Vec::new();
    for (i, sample) in data.iter().enumerate() {
        let rows: Vec<usize> = (sample.first_row()..sample.tokens.len()).collect();
        // One pass: the exit states and the final slow residual; logits of the response rows only.
        let (gates, last) = m2r2.all_exit_states_and_final(&sample.tokens)?;
        let final_logits = model.head(last.select(Axis(0), &rows).view()).logits;
        let per_gate: Vec<(Array2<f32>, Array2<f32>)> = gates
            .iter()
            .map(|(u, _)| {
                let u = u.select(Axis(0), &rows);
                let logits = m2r2.exit_logits(u.view());
                (u, logits)
            })
            .collect();
        for r in 0..rows.len() {
            let want = argmax(final_logits.row(r).as_slice().expect("row"));
            let mut states = Array2::zeros((j, model.config.hidden_size));
            let (mut agree, mut confidence, mut entropy) = (vec![], vec![], vec![]);
            for (g, (u, logits)) in per_gate.iter().enumerate() {
                states.row_mut(g).assign(&u.row(r));
                let row = logits.row(r);
                let row = row.as_slice().expect("row");
                agree.push(argmax(row) == want);
                let eps = model.config.rms_norm_eps as f32;
                confidence.push(gate_score(GateKind::Confidence, None, &[], row, eps)?);
                entropy.push(gate_score(GateKind::Entropy, None, &[], row, eps)?);
            }
            out.push(TokenGates {
                states,
                agree,
                confidence,
                entropy,
            });
        }
        on_sample(i);
    }
    Ok(out)
}

/// ARLA training settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ArlaOptions {
    pub steps: usize,
    /// (token, gate) examples per step
    pub batch: usize,
    pub lr: f64,
    pub weight_decay: f64,
    pub seed: u64,
}

/// Train `init` with BCE on every (token, gate) of `tokens`; returns the weights and the mean batch
/// loss of each step. Deterministic for a seed (step `s` draws from ChaCha8 stream `s`).
/// `on_step(n)` is called after each step with the steps done (progress reports).
pub fn train(
    init: &Arla,
    tokens: &[TokenGates],
    eps: f32,
    options: &ArlaOptions,
    on_step: &mut dyn FnMut(usize),
) -> Result<(Arla, Vec<f64>)> {
    if tokens.is_empty() || options.batch == 0 {
        return Err(Error::Invalid(
            "ARLA training needs examples and a batch of at least 1".into(),
        ));
    }
    let j = init.n_gates();
    let mut params = ArlaParams::<f32>::from_reference(init);
    let mut opt = AdamW::new(
        AdamWConfig {
            weight_decay: options.weight_decay,
            ..AdamWConfig::default()
        },
        params.tensors().into_iter(),
    );
    let schedule = Schedule {
        lr_max: options.lr,
        lr_min: options.lr / 10.0,
        warmup: options.steps / 20,
        steps: options.steps,
    };
    let mut losses = Vec::with_capacity(options.steps);
    for step in 0..options.steps {
        let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
        rng.set_stream(step as u64);
        let picks: Vec<(usize, usize)> = (0..options.batch)
            .map(|_| (rng.random_range(0..tokens.len()), rng.random_range(1..=j)))
            .collect();
        let parts: Vec<(f64, ArlaParams<f32>)> = picks
            .par_chunks(64)
            .map(|chunk| {
                let mut grad = params.zeros_like();
                let mut loss = 0.0;
                for &(t, g) in chunk {
                    let (logit, tape) = forward(&params, tokens[t].states.slice(s![..g, ..]), eps);
                    let (l, dlogit) = bce(logit, tokens[t].agree[g - 1]);
                    loss += l as f64;
                    backward(&params, &tape, dlogit / options.batch as f32, &mut grad);
                }
                (loss, grad)
            })
            .collect();
        let mut grad = params.zeros_like();
        let mut loss = 0.0;
        for (l, g) in parts {
            loss += l;
            for (acc, part) in grad.tensors_mut().into_iter().zip(g.tensors()) {
                *acc += part;
            }
        }
        clip_grad_norm(grad.tensors_mut().into_iter(), 1.0);
        opt.step(
            schedule.lr(step),
            params.tensors_mut().into_iter(),
            grad.tensors().into_iter(),
        );
        losses.push(loss / options.batch as f64);
        on_step(step + 1);
    }
    Ok((params.to_reference(), losses))
}

/// `p_exit` of every token at every gate.
pub fn arla_scores(arla: &Arla, tokens: &[TokenGates], eps: f32) -> Vec<Vec<f32>> {
    tokens
        .par_iter()
        .map(|t| {
            (1..=arla.n_gates())
                .map(|g| {
                    let states: Vec<_> = (0..g).map(|i| t.states.row(i)).collect();
                    arla.exit_prob(&states, eps)
                })
                .collect()
        })
        .collect()
}

/// Mean BCE and accuracy (p_exit >= 0.5 vs label) of ARLA over every (token, gate).
pub fn arla_accuracy(scores: &[Vec<f32>], tokens: &[TokenGates]) -> (f64, f64) {
    let (mut loss, mut right, mut n) = (0.0, 0usize, 0usize);
    for (s, t) in scores.iter().zip(tokens) {
        for (&p, &y) in s.iter().zip(&t.agree) {
            let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
            loss -= if y { p.ln() } else { (1.0 - p).ln() };
            right += usize::from((p >= 0.5) == y);
            n += 1;
        }
    }
    (loss / n.max(1) as f64, right as f64 / n.max(1) as f64)
}

/// One point of an early-exit sweep: a threshold per gate and what early exit does with them.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPoint {
    /// tau per gate: a token exits at the first gate `g` whose score is `>= thresholds[g]`.
    pub thresholds: Vec<f32>,
    /// Fraction of tokens equal to the base model's.
    pub agreement: f64,
    /// Mean layers computed before the token is emitted (`e_g` at an exit, `N` otherwise).
    pub layers_per_token: f64,
    /// Fraction of tokens exiting at each gate.
    pub exits: Vec<f64>,
}

impl SweepPoint {
    /// The threshold every gate shares, if they share one.
    pub fn shared(&self) -> Option<f32> {
        let first = *self.thresholds.first()?;
        self.thresholds.iter().all(|&t| t == first).then_some(first)
    }
}

/// Simulate early exit over `tokens` with per-gate `scores` and one threshold per gate.
pub fn simulate(
    tokens: &[TokenGates],
    scores: &[Vec<f32>],
    gate_layers: &[usize],
    num_layers: usize,
    thresholds: &[f32],
) -> SweepPoint {
    let n = tokens.len().max(1) as f64;
    let (mut agree, mut layers) = (0usize, 0usize);
    let mut exits = vec![0usize; gate_layers.len()];
    for (t, s) in tokens.iter().zip(scores) {
        match s.iter().zip(thresholds).position(|(&x, &tau)| x >= tau) {
            Some(g) => {
                exits[g] += 1;
                layers += gate_layers[g];
                agree += usize::from(t.agree[g]);
            }
            None => {
                layers += num_layers;
                agree += 1;
            }
        }
    }
    SweepPoint {
        thresholds: thresholds.to_vec(),
        agreement: agree as f64 / n,
        layers_per_token: layers as f64 / n,
        exits: exits.iter().map(|&e| e as f64 / n).collect(),
    }
}

/// Simulate early exit over `tokens` for each shared threshold (every gate the same).
pub fn sweep(
    tokens: &[TokenGates],
    scores: &[Vec<f32>],
    gate_layers: &[usize],
    num_layers: usize,
    thresholds: &[f32],
) -> Vec<SweepPoint> {
    thresholds
        .iter()
        .map(|&tau| {
            let shared = vec![tau; gate_layers.len()];
            simulate(tokens, scores, gate_layers, num_layers, &shared)
        })
        .collect()
}

/// Whether `a` is the better calibration: fewer layers per token, then higher agreement.
fn fewer_layers(a: &SweepPoint, b: &SweepPoint) -> bool {
    a.layers_per_token < b.layers_per_token
        || (a.layers_per_token == b.layers_per_token && a.agreement > b.agreement)
}

/// The sweep point with the fewest layers per token whose agreement reaches `target` (the largest
/// threshold on ties); `None` if no threshold reaches it.
pub fn calibrate(points: &[SweepPoint], target: f64) -> Option<&SweepPoint> {
    let first = |p: &SweepPoint| p.thresholds.first().copied().unwrap_or(f32::NAN);
    points
        .iter()
        .filter(|p| p.agreement >= target)
        .min_by(|a, b| {
            a.layers_per_token
                .total_cmp(&b.layers_per_token)
                .then(first(b).total_cmp(&first(a)))
        })
}

/// A threshold per gate with the fewest layers per token whose agreement reaches `target`, by
/// local search from the best shared threshold: a move changes one gate's threshold, or two gates'
/// at once, to any of `candidates`, and is kept when it saves layers (or keeps them and agrees
/// more) without falling under the target. Pairs matter: closing a confident, often wrong gate
/// costs layers until a later gate's threshold falls to catch its tokens. It stops when no move
/// helps. Never worse than [`calibrate`] over the same candidates; `None` when no shared threshold
/// reaches the target (add one above 1, which never exits, to make sure one does).
pub fn calibrate_per_gate(
    tokens: &[TokenGates],
    scores: &[Vec<f32>],
    gate_layers: &[usize],
    num_layers: usize,
    candidates: &[f32],
    target: f64,
) -> Option<SweepPoint> {
    let shared = sweep(tokens, scores, gate_layers, num_layers, candidates);
    let mut best = calibrate(&shared, target)?.clone();
    let j = gate_layers.len();
    let pairs: Vec<(usize, usize)> = (0..j)
        .flat_map(|a| (a + 1..j).map(move |b| (a, b)))
        .collect();
    // one gate's moves, then two gates' when no single move helps
    let try_moves = |best: &mut SweepPoint, moves: &mut dyn Iterator<Item = Vec<f32>>| {
        let mut changed = false;
        for thresholds in moves {
            let p = simulate(tokens, scores, gate_layers, num_layers, &thresholds);
            if p.agreement >= target && fewer_layers(&p, best) {
                *best = p;
                changed = true;
            }
        }
        changed
    };
    loop {
        let start = best.thresholds.clone();
        let mut singles = (0..j).flat_map(|g| {
            let start = start.clone();
            candidates.iter().map(move |&tau| {
                let mut t = start.clone();
                t[g] = tau;
                t
            })
        });
        if try_moves(&mut best, &mut singles) {
            continue;
        }
        let mut doubles = pairs.iter().flat_map(|&(a, b)| {
            let start = start.clone();
            candidates.iter().flat_map(move |&ta| {
                let start = start.clone();
                candidates.iter().map(move |&tb| {
                    let mut t = start.clone();
                    (t[a], t[b]) = (ta, tb);
                    t
                })
            })
        });
        if !try_moves(&mut best, &mut doubles) {
            return Some(best);
        }
    }
}

/// Thresholds `0, 0.02, ..., 1` and `1.01` (never exits).
pub fn default_thresholds() -> Vec<f32> {
    let mut t: Vec<f32> = (0..=50).map(|i| i as f32 / 50.0).collect();
    t.push(1.01);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(agree: [bool; 2]) -> TokenGates {
        TokenGates {
            states: Array2::zeros((2, 1)),
            agree: agree.to_vec(),
            confidence: vec![0.0; 2],
            entropy: vec![0.0; 2],
        }
    }

    /// Two tokens, gates after layers 2 and 4 of 6: hand-computed sweep and calibration.
    #[test]
    fn sweep_hand_computed() {
        let tokens = [token([true, true]), token([false, true])];
        let scores = vec![vec![0.9, 0.9], vec![0.6, 0.8]];
        let points = sweep(&tokens, &scores, &[2, 4], 6, &[0.5, 0.7, 0.95]);
        // 0.5: both exit at gate 1, the second disagrees.
        assert_eq!(points[0].agreement, 0.5);
        assert_eq!(points[0].layers_per_token, 2.0);
        // 0.7: first exits at gate 1, second at gate 2 (agrees).
        assert_eq!(points[1].agreement, 1.0);
        assert_eq!(points[1].layers_per_token, 3.0);
        assert_eq!(points[1].exits, vec![0.5, 0.5]);
        // 0.95: nobody exits.
        assert_eq!(points[2].layers_per_token, 6.0);
        assert_eq!(calibrate(&points, 0.9).unwrap().shared(), Some(0.7));
        assert_eq!(calibrate(&points, 0.4).unwrap().shared(), Some(0.5));
        // Per gate, no move of one or both gates saves a layer at agreement 0.9: the shared point
        // is the answer.
        let candidates = [0.5, 0.7, 0.95];
        let per_gate = calibrate_per_gate(&tokens, &scores, &[2, 4], 6, &candidates, 0.9).unwrap();
        assert_eq!(per_gate.thresholds, vec![0.7, 0.7]);
        assert_eq!(per_gate.layers_per_token, 3.0);
    }

    /// Gates after layers 2 and 4 of 6 where gate 1 is confident and wrong: no shared threshold
    /// exits without disagreeing, one per gate exits both tokens at gate 2 (4 layers, not 6).
    #[test]
    fn per_gate_thresholds_skip_a_confident_wrong_gate() {
        let tokens = [token([false, true]), token([false, true])];
        let scores = vec![vec![0.9, 0.9], vec![0.8, 0.9]];
        let candidates = [0.5, 0.8, 0.9, 1.01];
        let shared = sweep(&tokens, &scores, &[2, 4], 6, &candidates);
        let best = calibrate(&shared, 1.0).unwrap();
        assert_eq!((best.shared(), best.layers_per_token), (Some(1.01), 6.0));
        let per_gate = calibrate_per_gate(&tokens, &scores, &[2, 4], 6, &candidates, 1.0).unwrap();
        assert_eq!(per_gate.thresholds, vec![1.01, 0.5]);
        assert_eq!((per_gate.agreement, per_gate.layers_per_token), (1.0, 4.0));
        assert_eq!(per_gate.exits, vec![0.0, 1.0]);
        assert_eq!(per_gate.shared(), None);
    }

    /// A case only a move of both gates improves, at target 0.75. Token G is confident and wrong
    /// at gate 1 and right at gate 2; F is wrong at gate 2; H and I are right at gate 2. The best
    /// shared threshold, 0.8, exits G at gate 1 (wrong) and runs the rest fully: 5 layers, 0.75.
    /// Raising gate 1 alone sends G to gate 2 but costs layers elsewhere (5.5); lowering gate 2
    /// alone exits F wrongly (0.5). Both at once: G right at gate 2, F, H, I at gate 2: 4 layers,
    /// 0.75.
    #[test]
    fn per_gate_calibration_moves_two_gates_at_once() {
        let tokens = [
            token([false, true]),
            token([false, false]),
            token([false, true]),
            token([false, true]),
        ];
        let scores = vec![
            vec![0.9, 0.9],
            vec![0.3, 0.6],
            vec![0.3, 0.6],
            vec![0.3, 0.6],
        ];
        let candidates = [0.5, 0.8, 0.95, 1.01];
        let shared = sweep(&tokens, &scores, &[2, 4], 6, &candidates);
        let best = calibrate(&shared, 0.75).unwrap();
        assert_eq!((best.shared(), best.layers_per_token), (Some(0.8), 5.0));
        let raise_1 = simulate(&tokens, &scores, &[2, 4], 6, &[0.95, 0.8]);
        assert_eq!(raise_1.layers_per_token, 5.5);
        let lower_2 = simulate(&tokens, &scores, &[2, 4], 6, &[0.8, 0.5]);
        assert_eq!(lower_2.agreement, 0.5);
        let per_gate = calibrate_per_gate(&tokens, &scores, &[2, 4], 6, &candidates, 0.75).unwrap();
        assert_eq!(per_gate.thresholds, vec![0.95, 0.5]);
        assert_eq!((per_gate.agreement, per_gate.layers_per_token), (0.75, 4.0));
    }
}
