//! The exit head and the distillation loss of one gate (docs/m2r2/streams.md, docs/TRAINING.md):
//! final RMSNorm, LM head (both frozen), and the KL divergence from the base model's final
//! distribution.
//!
//! ```text
//! logits = RMSNorm_final(u) W_head^T                        [R, V]
//! p_t = softmax(teacher / tau)   log p_s = log_softmax(logits / tau)
//! loss = tau^2 / R * sum_r sum_v p_t (log p_t - log p_s)    (Hinton's tau^2 keeps gradients O(1))
//! dlogits = tau / R * (p_s - p_t)
//! du = RMSNorm backward of (dlogits W_head)
//! ```
//! The teacher logits are the base model's own: `LMHead(RMSNorm_final(s_N))`, recomputed from the
//! stored final slow residual instead of storing `V`-sized distributions.

use crate::gemm;
use crate::real::{Real, lift};
use crate::rmsnorm;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis};
use rayon::prelude::*;

/// The frozen final norm and LM head.
#[derive(Clone, Debug)]
pub struct Head<F> {
    /// `[D]`
    pub norm: Array1<F>,
    /// `[V, D]`
    pub w: Array2<F>,
    pub eps: F,
}

/// What the head forward keeps for the backward.
pub struct HeadTape<F> {
    /// `[R, D]` the input `u`
    pub u: Array2<F>,
    /// `[R]`
    pub inv: Array1<F>,
}

/// Loss of one batch: mean KL and top-1 agreement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlStats {
    /// The objective: `tau^2 * mean_r [KL(p_t || p_s) + w * CE(argmax p_t, p_s)]` (`w`: the
    /// hard-label weight; 0 gives the KL alone).
    pub loss: f64,
    /// `tau^2 * mean_r KL(p_t || p_s)`, what validation and early stopping compare.
    pub kl: f64,
    /// Rows whose argmax equals the teacher's argmax.
    pub agree: usize,
    pub rows: usize,
}

impl<F: Real> Head<F> {
    pub fn from_model(model: &reference::Model) -> Self {
        Head {
            norm: lift(model.weights.final_norm.view()),
            w: lift(model.weights.lm_head().view()),
            eps: F::c(model.config.rms_norm_eps),
        }
    }

    /// `LMHead(RMSNorm_final(u))`, with what the backward needs.
    ///
    /// # Shapes
    /// - `u`: `[R, D]` -> `[R, V]`
    pub fn forward(&self, u: ArrayView2<F>) -> (Array2<F>, HeadTape<F>) {
        let (z, inv) = rmsnorm::forward(u, self.norm.view(), self.eps);
        let logits = gemm::x_wt(z.view(), self.w.view());
        (
            logits,
            HeadTape {
                u: u.to_owned(),
                inv,
            },
        )
    }

    /// The student's logits (with the tape) and the teacher's, `LMHead(RMSNorm_final(teacher_u))`,
    /// from one product: the rows of both stacked, so the head's weight (the largest product of a
    /// step) is packed and streamed once instead of twice. A row's logits do not depend on the other
    /// rows of a product (`gemm`'s tests), so both equal two separate [`forward`](Self::forward)s.
    ///
    /// # Shapes
    /// - `u`, `teacher_u`: `[R, D]` -> (`[R, V]`, tape, `[R, V]`)
    pub fn forward_with_teacher(
        &self,
        u: ArrayView2<F>,
        teacher_u: ArrayView2<F>,
    ) -> (Array2<F>, HeadTape<F>, Array2<F>) {
        let rows = u.nrows();
        let both = ndarray::concatenate(Axis(0), &[u, teacher_u])
            .expect("student and teacher states have the model's width");
        let (logits, tape) = self.forward(both.view());
        let teacher = logits.slice(ndarray::s![rows.., ..]).to_owned();
        let logits = logits.slice_move(ndarray::s![..rows, ..]);
        let tape = HeadTape {
            u: u.to_owned(),
            inv: tape.inv.slice(ndarray::s![..rows]).to_owned(),
        };
        (logits, tape, teacher)
    }

    /// `du` from `dlogits`.
    ///
    /// # Shapes
    /// - `dlogits`: `[R, V]` -> `[R, D]`
    pub fn backward(&self, dlogits: ArrayView2<F>, tape: &HeadTape<F>) -> Array2<F> {
        let dz = gemm::dy_w(dlogits, self.w.view());
        rmsnorm::backward(dz.view(), tape.u.view(), self.norm.view(), tape.inv.view()).0
    }
}

/// `softmax(x / tau)` of one row and its logarithm, with one exponential per entry.
fn softmax_and_log<F: Real>(x: ArrayView1<F>, tau: F) -> (Array1<F>, Array1<F>) {
    let max = x.iter().copied().fold(F::neg_infinity(), F::max) / tau;
    let e = x.mapv(|v| (v / tau - max).exp());
    let sum = e.sum();
    let log_sum = sum.ln() + max;
    (e / sum, x.mapv(|v| v / tau - log_sum))
}

/// KL distillation loss and its gradient with respect to the student logits, plus, with weight
/// `hard`, the cross-entropy of the student on the teacher's argmax (the token greedy decoding
/// emits, which a draft must match to be accepted): per row
/// `tau^2 * [KL(p_t || p_s) - hard * ln p_s(y)]`, `p = softmax(z / tau)`, `y = argmax z_t`, whose
/// gradient is `tau * [(p_s - p_t) + hard * (p_s - e_y)]`; both averaged over the rows.
///
/// # Shapes
/// - `student`, `teacher`: `[R, V]` -> (stats, `dlogits` `[R, V]`)
pub fn kl_loss<F: Real>(
    student: ArrayView2<F>,
    teacher: ArrayView2<F>,
    tau: F,
    hard: F,
) -> (KlStats, Array2<F>) {
    let rows = student.nrows();
    let r = F::c(rows as f64);
    let mut dlogits = Array2::zeros(student.raw_dim());
    let per_row: Vec<(f64, f64, bool)> = dlogits
        .axis_iter_mut(Axis(0))
        .into_par_iter()
        .enumerate()
        .map(|(t, mut d)| {
            let (ps, ls) = softmax_and_log(student.row(t), tau);
            let (pt, lt) = softmax_and_log(teacher.row(t), tau);
            let own = reference::base::ops::argmax(&student.row(t).mapv(F::lower).to_vec());
            let y = reference::base::ops::argmax(&teacher.row(t).mapv(F::lower).to_vec());
            let mut kl = F::zero();
            for v in 0..ls.len() {
                if pt[v] > F::zero() {
                    kl += pt[v] * (lt[v] - ls[v]);
                }
                d[v] = tau / r * (ps[v] - pt[v]);
                if hard != F::zero() {
                    let e_y = if v == y { F::one() } else { F::zero() };
                    d[v] += tau / r * hard * (ps[v] - e_y);
                }
            }
            let ce = if hard != F::zero() { -ls[y] } else { F::zero() };
            let f = |x: F| (tau * tau * x).to_f64().unwrap_or(f64::NAN);
            (f(kl + hard * ce), f(kl), own == y)
        })
        .collect();
    let mean = |x: f64| x / rows.max(1) as f64;
    let stats = KlStats {
        loss: mean(per_row.iter().map(|p| p.0).sum()),
        kl: mean(per_row.iter().map(|p| p.1).sum()),
        agree: per_row.iter().filter(|p| p.2).count(),
        rows,
    };
    (stats, dlogits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::{matrix, vector};
    use ndarray::array;
    use proptest::prelude::*;

    /// KL of a distribution with itself is 0; hand-computed KL for two 2-way distributions.
    #[test]
    fn kl_hand_computed() {
        let t = array![[0.0f64, 0.0]];
        let (s, d) = kl_loss(t.view(), t.view(), 1.0, 0.0);
        assert_eq!(s.loss, 0.0);
        assert!(d.iter().all(|&v| v == 0.0));
        // p_t = [1/2, 1/2], p_s = softmax([ln 3, 0]) = [3/4, 1/4]:
        // KL = 1/2 ln(2/3) + 1/2 ln(2) = 0.1438410
        let s = array![[3f64.ln(), 0.0]];
        let (stats, _) = kl_loss(s.view(), t.view(), 1.0, 0.0);
        let kl = 0.5 * (2.0f64 / 3.0).ln() + 0.5 * 2f64.ln();
        approx::assert_abs_diff_eq!(stats.loss, kl, epsilon = 1e-12);
        assert_eq!(stats.kl, stats.loss);
        assert_eq!(stats.agree, 1); // ties: both argmax 0
        // With the hard label (y = 0, the teacher's tie goes to the first): + 2 * -ln(3/4).
        let (stats, d) = kl_loss(s.view(), t.view(), 1.0, 2.0);
        approx::assert_abs_diff_eq!(stats.kl, kl, epsilon = 1e-12);
        approx::assert_abs_diff_eq!(stats.loss, kl - 2.0 * 0.75f64.ln(), epsilon = 1e-12);
        // d = (p_s - p_t) + 2 (p_s - e_0) = [1/4, -1/4] + 2 [-1/4, 1/4]
        approx::assert_abs_diff_eq!(d, array![[-0.25, 0.25]], epsilon = 1e-12);
    }

    /// The stacked product gives, bit for bit, the logits and tape of two separate forwards (f32,
    /// the model's shapes in small: enough rows and vocabulary for several GEMM blocks).
    #[test]
    fn forward_with_teacher_equals_two_forwards() {
        let head = Head {
            norm: vector::<f32>(48, 1),
            w: matrix(700, 48, 2),
            eps: 1e-5,
        };
        let (u, t) = (matrix::<f32>(13, 48, 3), matrix::<f32>(13, 48, 4));
        let (logits, tape, teacher) = head.forward_with_teacher(u.view(), t.view());
        let (want_logits, want_tape) = head.forward(u.view());
        assert_eq!(logits, want_logits);
        assert_eq!(teacher, head.forward(t.view()).0);
        assert_eq!((tape.u, tape.inv), (want_tape.u, want_tape.inv));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// d loss / d u through the KL, the LM head and the final RMSNorm.
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, d in 2usize..6, v in 2usize..9, tau in 0.5f64..3.0, hard in prop_oneof![Just(0.0f64), 0.1f64..2.0], seed in 0u64..1000) {
            let head = Head { norm: vector::<f64>(d, seed), w: matrix(v, d, seed + 1), eps: 1e-5 };
            let u = matrix::<f64>(rows, d, seed + 2);
            let teacher = matrix::<f64>(rows, v, seed + 3) * 2.0;
            let loss = |u: ArrayView2<f64>| kl_loss(head.forward(u).0.view(), teacher.view(), tau, hard).0.loss;
            let (logits, tape) = head.forward(u.view());
            let (_, dlogits) = kl_loss(logits.view(), teacher.view(), tau, hard);
            let du = head.backward(dlogits.view(), &tape);
            let n = numeric_gradient(u.view().into_dyn(), |p| loss(p.view().into_dimensionality().unwrap()));
            let r = compare("du", du.view().into_dyn(), n.view(), 1e-7, 1e-5);
            prop_assert!(r.ok, "{}", r);
        }
    }
}
