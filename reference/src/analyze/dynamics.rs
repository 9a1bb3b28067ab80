//! The measures of the residual dynamics (see the folder's doc): cosines between residuals, exit
//! tokens and their agreement, summarised over positions.

use crate::base::model::Model;
use crate::base::ops::{argmax, rms_norm};
use crate::error::{Error, Result};
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use ndarray::{Array2, ArrayView1, ArrayView2, Axis, s};
use serde::Serialize;

/// Rows of logits computed at once when reading exit tokens: bounds the `[rows, V]` buffer.
const LOGIT_CHUNK: usize = 64;

/// Mean, minimum and maximum of one measure over the positions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Stats {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// Summarise `values`.
    ///
    /// # Panics
    /// If `values` is empty.
    pub fn of(values: &[f64]) -> Stats {
        assert!(!values.is_empty(), "Stats::of needs at least one value");
        Stats {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// The slow stream at one layer `l = 1..=N` (1-based: `s_l` is the residual after `l` layers).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerRow {
    pub layer: usize,
    /// `cos(s_{l-1}, s_l)` over positions
    pub cos_prev: Stats,
    /// `cos(s_l, s_N)` over positions
    pub cos_final: Stats,
    /// `cos(FinalNorm(s_l), FinalNorm(s_N))` over positions: the alignment in the space the LM
    /// head reads (the norm's per-channel weight rescales outlier channels)
    pub cos_final_normed: Stats,
    /// Fraction of positions whose exit token at `s_l` is the final greedy token.
    pub exit_agreement: f64,
}

/// The fast stream at gate `g` next to the slow stream at the gate's layer `e_g`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GateRow {
    /// 1-based gate number
    pub gate: usize,
    /// `e_g`: the gate sits after this many layers
    pub layer: usize,
    /// `cos(s_{e_g}, s_N)`: the slow stream's alignment at the gate (the layer row's `cos_final`)
    pub slow_cos_final: Stats,
    /// `cos(u_g, s_N)`: the fast exit state's alignment with the final residual
    pub fast_cos_final: Stats,
    /// `cos(FinalNorm(s_{e_g}), FinalNorm(s_N))` (the layer row's `cos_final_normed`)
    pub slow_cos_final_normed: Stats,
    /// `cos(FinalNorm(u_g), FinalNorm(s_N))`
    pub fast_cos_final_normed: Stats,
    /// `cos(u_g, s_{e_g})`: how far the adapters moved the fast state from its starting point
    pub cos_fast_slow: Stats,
    /// Fraction of positions whose exit token at `s_{e_g}` is the final greedy token.
    pub slow_exit_agreement: f64,
    /// Fraction of positions whose fast exit token `argmax LMHead(FinalNorm(u_g))` is the final
    /// greedy token.
    pub fast_exit_agreement: f64,
}

/// Everything measured on one sequence.
#[derive(Clone, Debug)]
pub struct Dynamics {
    /// `[T]` the teacher-forced input
    pub tokens: Vec<u32>,
    /// `[T]` the final greedy token at each position: `argmax LMHead(FinalNorm(s_N))`
    pub final_tokens: Vec<u32>,
    /// `N` rows, layers `1..=N`
    pub layers: Vec<LayerRow>,
    /// `J` rows, gates `1..=J`
    pub gates: Vec<GateRow>,
    /// `[T]` per position, the first layer `l` in `1..=N` from which the exit token equals the final
    /// token at every layer `l..=N` (`N` when only the last layer agrees).
    pub saturation_layer: Vec<usize>,
    /// `[N+1, D]` the slow residuals `s_0..s_N` of the last position
    pub last_trajectory: Array2<f32>,
    /// `[N+1, D]` the slow residuals `s_0..s_N` averaged over positions
    pub mean_trajectory: Array2<f32>,
    /// `[J, D]` the fast exit states `u_1..u_J` of the last position
    pub last_exit_states: Array2<f32>,
    /// `[J, D]` the fast exit states `u_1..u_J` averaged over positions
    pub mean_exit_states: Array2<f32>,
}

impl Dynamics {
    /// Mean of [`Dynamics::saturation_layer`] over positions.
    pub fn mean_saturation_layer(&self) -> f64 {
        let n = self.saturation_layer.len() as f64;
        self.saturation_layer.iter().map(|&l| l as f64).sum::<f64>() / n
    }
}

/// Cosine similarity `a.b / (|a| |b|)`, accumulated in f64 and clamped to `[-1, 1]`; 0 when either
/// vector is zero (no direction). `cos(a, a)` is exactly 1 for any non-zero `a`.
///
/// # Panics
/// If the lengths differ.
pub fn cosine(a: ArrayView1<f32>, b: ArrayView1<f32>) -> f64 {
    assert_eq!(a.len(), b.len(), "cosine of vectors of different lengths");
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b.iter()) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    // sqrt(aa * bb) rather than sqrt(aa) * sqrt(bb): for a == b it is exactly aa, so cos(a, a) == 1.
    (ab / (aa * bb).sqrt()).clamp(-1.0, 1.0)
}

/// Row-wise cosines of two `[T, D]` matrices -> `[T]`.
fn row_cosines(a: ArrayView2<f32>, b: ArrayView2<f32>) -> Vec<f64> {
    a.outer_iter()
        .zip(b.outer_iter())
        .map(|(x, y)| cosine(x, y))
        .collect()
}

/// The exit token `argmax LMHead(FinalNorm(x_t))` of each row (logits computed `LOGIT_CHUNK` rows at
/// a time; the reference is batch invariant, so chunking changes nothing).
///
/// # Shapes
/// - `x`: `[T, D]` -> `[T]`
pub fn exit_tokens(model: &Model, x: ArrayView2<f32>) -> Vec<u32> {
    let mut out = Vec::with_capacity(x.nrows());
    for start in (0..x.nrows()).step_by(LOGIT_CHUNK) {
        let end = (start + LOGIT_CHUNK).min(x.nrows());
        let logits = model.head(x.slice(s![start..end, ..])).logits;
        for row in logits.outer_iter() {
            out.push(argmax(&row.to_vec()) as u32);
        }
    }
    out
}

/// Fraction of positions where `a[t] == b[t]`.
fn agreement(a: &[u32], b: &[u32]) -> f64 {
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    same as f64 / a.len() as f64
}

/// Measure the residual dynamics of `tokens` (teacher forced, one chunk from an empty cache) in the
/// slow stream and, with `weights`, in the fast stream at each gate (module docs).
///
/// # Shapes
/// - `tokens`: `[T]`, `T >= 1`
///
/// # Errors
/// Empty `tokens`, token ids outside the vocabulary, a sequence longer than the context, or M2R2
/// weights made for a different number of layers.
pub fn residual_dynamics(model: &Model, weights: &M2r2Weights, tokens: &[u32]) -> Result<Dynamics> {
    let n = model.config.num_hidden_layers;
    if tokens.is_empty() {
        return Err(Error::Invalid("analyze needs at least one token".into()));
    }
    if weights.config.num_layers != n {
        return Err(Error::Invalid(format!(
            "the M2R2 weights are for {} layers but the model has {n}",
            weights.config.num_layers
        )));
    }

    // The slow stream s_0..s_N, every layer kept: N+1 entries of [T, D].
    let mut cache = model.new_cache(tokens.len())?;
    model.check_input(tokens, 0, &cache)?;
    let mut s = model.embed(tokens);
    let mut residuals = Vec::with_capacity(n + 1);
    residuals.push(s.clone());
    for l in 0..n {
        model.layer_forward(l, &mut s, 0, &mut cache);
        residuals.push(s.clone());
    }
    let s_final = residuals[n].view();
    let final_norm = |x: ArrayView2<f32>| {
        rms_norm(
            x,
            &model.weights.final_norm,
            model.config.rms_norm_eps as f32,
        )
    };
    let normed_final = final_norm(s_final);

    // Exit tokens of every layer; layer N's are the final greedy tokens.
    let exits: Vec<Vec<u32>> = (1..=n)
        .map(|l| exit_tokens(model, residuals[l].view()))
        .collect();
    let final_tokens = exits[n - 1].clone();

    let layers: Vec<LayerRow> = (1..=n)
        .map(|l| LayerRow {
            layer: l,
            cos_prev: Stats::of(&row_cosines(residuals[l - 1].view(), residuals[l].view())),
            cos_final: Stats::of(&row_cosines(residuals[l].view(), s_final)),
            cos_final_normed: Stats::of(&row_cosines(
                final_norm(residuals[l].view()).view(),
                normed_final.view(),
            )),
            exit_agreement: agreement(&exits[l - 1], &final_tokens),
        })
        .collect();

    // Saturation: walk down from N while the exit token still equals the final one.
    let saturation_layer = (0..tokens.len())
        .map(|t| {
            let mut first = n;
            while first > 1 && exits[first - 2][t] == final_tokens[t] {
                first -= 1;
            }
            first
        })
        .collect();

    // The fast stream: u_g and s_{e_g} for every gate.
    let states = M2r2::new(model, weights).all_exit_states(tokens)?;
    let gates: Vec<GateRow> = states
        .iter()
        .enumerate()
        .map(|(i, (u, slow))| {
            let g = i + 1;
            let e = weights.config.gate_layer(g);
            debug_assert_eq!(slow, &residuals[e], "the fast stream's slow rows are s_e");
            let fast_exits = exit_tokens(model, u.view());
            GateRow {
                gate: g,
                layer: e,
                slow_cos_final: layers[e - 1].cos_final,
                fast_cos_final: Stats::of(&row_cosines(u.view(), s_final)),
                slow_cos_final_normed: layers[e - 1].cos_final_normed,
                fast_cos_final_normed: Stats::of(&row_cosines(
                    final_norm(u.view()).view(),
                    normed_final.view(),
                )),
                cos_fast_slow: Stats::of(&row_cosines(u.view(), slow.view())),
                slow_exit_agreement: layers[e - 1].exit_agreement,
                fast_exit_agreement: agreement(&fast_exits, &final_tokens),
            }
        })
        .collect();

    // Trajectories for the PCA view: the last position, and the mean over positions.
    let last = tokens.len() - 1;
    let stack = |rows: Vec<ndarray::Array1<f32>>| {
        let views: Vec<_> = rows.iter().map(|r| r.view()).collect();
        ndarray::stack(Axis(0), &views).expect("rows of one width")
    };
    let mean_rows = |x: &Array2<f32>| x.mean_axis(Axis(0)).expect("T >= 1");
    let last_trajectory = stack(residuals.iter().map(|r| r.row(last).to_owned()).collect());
    let mean_trajectory = stack(residuals.iter().map(mean_rows).collect());
    let (last_exit_states, mean_exit_states) = if states.is_empty() {
        let d = model.config.hidden_size;
        (Array2::zeros((0, d)), Array2::zeros((0, d)))
    } else {
        (
            stack(states.iter().map(|(u, _)| u.row(last).to_owned()).collect()),
            stack(states.iter().map(|(u, _)| mean_rows(u)).collect()),
        )
    };

    Ok(Dynamics {
        tokens: tokens.to_vec(),
        final_tokens,
        layers,
        gates,
        saturation_layer,
        last_trajectory,
        mean_trajectory,
        last_exit_states,
        mean_exit_states,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    const TOKENS: [u32; 10] = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];

    #[test]
    fn cosine_hand_computed() {
        let a = array![3.0f32, 4.0];
        assert_eq!(cosine(a.view(), a.view()), 1.0);
        assert_eq!(cosine(a.view(), array![-6.0f32, -8.0].view()), -1.0);
        assert_eq!(cosine(a.view(), array![-4.0f32, 3.0].view()), 0.0);
        // (3*1 + 4*0) / (5 * 1) = 0.6
        assert_abs_diff_eq!(
            cosine(a.view(), array![1.0f32, 0.0].view()),
            0.6,
            epsilon = 1e-15
        );
        // A zero vector has no direction.
        assert_eq!(cosine(a.view(), array![0.0f32, 0.0].view()), 0.0);
    }

    #[test]
    fn stats_hand_computed() {
        let st = Stats::of(&[0.5, 1.0, 0.0]);
        assert_eq!(
            st,
            Stats {
                mean: 0.5,
                min: 0.0,
                max: 1.0
            }
        );
        assert_eq!(agreement(&[1, 2, 3, 4], &[1, 0, 3, 0]), 0.5);
    }

    #[test]
    fn last_layer_is_aligned_and_agrees() {
        for name in builtin::BUILTIN_NAMES {
            let model = builtin::builtin(name).unwrap();
            let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
            let d = residual_dynamics(&model, &weights, &TOKENS).unwrap();
            let n = model.config.num_hidden_layers;
            assert_eq!(d.layers.len(), n);
            let last = &d.layers[n - 1];
            assert_eq!(last.layer, n);
            assert_eq!(
                last.cos_final,
                Stats {
                    mean: 1.0,
                    min: 1.0,
                    max: 1.0
                },
                "{name}"
            );
            assert_eq!(last.cos_final_normed, last.cos_final, "{name}");
            assert_eq!(last.exit_agreement, 1.0, "{name}");
            // The final tokens are the base model's teacher-forced greedy tokens.
            let logits = model.teacher_forced_logits(&TOKENS).unwrap();
            let greedy: Vec<u32> = logits
                .outer_iter()
                .map(|r| argmax(&r.to_vec()) as u32)
                .collect();
            assert_eq!(d.final_tokens, greedy, "{name}");
            for row in &d.layers {
                for st in [row.cos_prev, row.cos_final, row.cos_final_normed] {
                    assert!(-1.0 <= st.min && st.min <= st.mean && st.mean <= st.max);
                    assert!(st.max <= 1.0);
                }
                assert!((0.0..=1.0).contains(&row.exit_agreement));
            }
            // Saturation is consistent with the per-layer agreement: every position has agreed
            // from its saturation layer on, so layer l agrees at least where saturation <= l.
            for row in &d.layers {
                let saturated = d
                    .saturation_layer
                    .iter()
                    .filter(|&&s| s <= row.layer)
                    .count();
                assert!(row.exit_agreement >= saturated as f64 / TOKENS.len() as f64);
            }
            assert!(d.saturation_layer.iter().all(|&s| (1..=n).contains(&s)));
            assert_eq!(d.last_trajectory.dim(), (n + 1, model.config.hidden_size));
            assert_eq!(d.mean_trajectory.dim(), (n + 1, model.config.hidden_size));
        }
    }

    /// With zero adapters the fast exit states are the slow residuals at the gates, so every gate
    /// row's fast columns equal its slow columns.
    #[test]
    fn zero_adapters_give_fast_rows_equal_to_slow_rows() {
        for name in builtin::BUILTIN_NAMES {
            let model = builtin::builtin(name).unwrap();
            let weights = M2r2Weights::zeros(&model.config);
            let d = residual_dynamics(&model, &weights, &TOKENS).unwrap();
            assert_eq!(d.gates.len(), weights.config.num_gates());
            for row in &d.gates {
                assert_eq!(row.layer, weights.config.gate_layer(row.gate));
                assert_eq!(
                    row.fast_cos_final, row.slow_cos_final,
                    "{name} gate {}",
                    row.gate
                );
                assert_eq!(row.fast_cos_final_normed, row.slow_cos_final_normed);
                assert_eq!(row.fast_exit_agreement, row.slow_exit_agreement);
                assert_eq!(
                    row.cos_fast_slow,
                    Stats {
                        mean: 1.0,
                        min: 1.0,
                        max: 1.0
                    }
                );
                assert_eq!(row.slow_cos_final, d.layers[row.layer - 1].cos_final);
                assert_eq!(
                    d.last_exit_states.row(row.gate - 1),
                    d.last_trajectory.row(row.layer)
                );
            }
        }
    }

    /// The built-in random adapters move the fast stream away from the slow one.
    #[test]
    fn random_adapters_move_the_fast_stream() {
        let model = builtin::builtin("tiny").unwrap();
        let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
        let d = residual_dynamics(&model, &weights, &TOKENS).unwrap();
        assert!(d.gates.iter().all(|g| g.cos_fast_slow.min < 1.0));
        // The mean trajectory is the mean of the residuals over positions: check s_0 by hand.
        let embed = model.embed(&TOKENS);
        let mean0 = embed.mean_axis(Axis(0)).unwrap();
        assert_eq!(d.mean_trajectory.row(0), mean0);
        assert_eq!(d.last_trajectory.row(0), embed.row(TOKENS.len() - 1));
    }

    #[test]
    fn bad_inputs_are_refused() {
        let model = builtin::builtin("tiny").unwrap();
        let weights = M2r2Weights::zeros(&model.config);
        assert!(residual_dynamics(&model, &weights, &[]).is_err());
        let err = residual_dynamics(&model, &weights, &[1, 999]).unwrap_err();
        assert!(err.to_string().contains("token id 999"), "{err}");
        let other = builtin::builtin("tiny").unwrap();
        let mut fewer = other.config.clone();
        fewer.num_hidden_layers = 4;
        let err = residual_dynamics(&model, &M2r2Weights::zeros(&fewer), &[1, 2])
            .unwrap_err()
            .to_string();
        assert!(err.contains("4 layers but the model has 8"), "{err}");
    }
}
