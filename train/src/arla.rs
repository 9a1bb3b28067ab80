//! ARLA training (docs/m2r2/arla.md, docs/TRAINING.md "ARLA"): the exit head of
//! `reference::m2r2::arla` with its hand-written backward, binary cross-entropy on "the exit token
//! equals the base model's token", and threshold calibration for a target agreement.
//!
//! Forward (as `reference::m2r2::arla::Arla::exit_prob`, one token at gate `g`):
//! ```text
//! n_i = RMSNorm_arla(u_i)   z_i = P n_i + E[i]          q = W_q z_g   k_i = W_k z_i   v_i = W_v z_i
//! s_i = q . k_i / sqrt(L)   a = softmax(s)   o = sum_i a_i v_i   h = o + z_g   logit = w_o . h + b_o
//! loss = softplus(logit) - y logit       (BCE with p_exit = sigmoid(logit))
//! ```
//! Backward:
//! ```text
//! dlogit = p_exit - y;  dw_o = dlogit h;  db_o = dlogit;  dh = dlogit w_o;  do = dh;  dz_g += dh
//! da_i = do . v_i;  ds_i = a_i (da_i - sum_j a_j da_j);  dv_i = a_i do
//! dq = sum_i ds_i k_i / sqrt(L);  dk_i = ds_i q / sqrt(L)
//! dW_q += dq z_g^T;  dW_k += dk_i z_i^T;  dW_v += dv_i z_i^T
//! dz_g += W_q^T dq;  dz_i += W_k^T dk_i + W_v^T dv_i
//! dP += dz_i n_i^T;  dE[i] += dz_i;  dn_i = P^T dz_i -> RMSNorm backward (weight gradient only)
//! ```

use crate::real::{Real, lift};
use crate::rmsnorm;
use ndarray::{Array1, Array2, ArrayView2, Axis, s};
use reference::m2r2::arla::Arla;

/// ARLA's parameters as matrices (vectors as one-row matrices, so the optimizer sees a list).
#[derive(Clone, Debug, PartialEq)]
pub struct ArlaParams<F> {
    /// `[1, D]`
    pub norm: Array2<F>,
    /// `[L, D]` P
    pub proj: Array2<F>,
    /// `[J, L]` E
    pub gate_embed: Array2<F>,
    /// `[L, L]`
    pub wq: Array2<F>,
    pub wk: Array2<F>,
    pub wv: Array2<F>,
    /// `[1, L]`
    pub wo: Array2<F>,
    /// `[1, 1]`
    pub bo: Array2<F>,
}

impl<F: Real> ArlaParams<F> {
    pub fn from_reference(a: &Arla) -> Self {
        ArlaParams {
            norm: lift(a.norm.view()).insert_axis(Axis(0)),
            proj: lift(a.proj.view()),
            gate_embed: lift(a.gate_embed.view()),
            wq: lift(a.wq.view()),
            wk: lift(a.wk.view()),
            wv: lift(a.wv.view()),
            wo: lift(a.wo.view()).insert_axis(Axis(0)),
            bo: Array2::from_elem((1, 1), F::lift(a.bo)),
        }
    }

    pub fn to_reference(&self) -> Arla {
        let low = |m: &Array2<F>| m.mapv(F::lower);
        Arla {
            norm: low(&self.norm).row(0).to_owned(),
            proj: low(&self.proj),
            gate_embed: low(&self.gate_embed),
            wq: low(&self.wq),
            wk: low(&self.wk),
            wv: low(&self.wv),
            wo: low(&self.wo).row(0).to_owned(),
            bo: self.bo[[0, 0]].lower(),
        }
    }

    pub fn tensors(&self) -> [&Array2<F>; 8] {
        [
            &self.norm,
            &self.proj,
            &self.gate_embed,
            &self.wq,
            &self.wk,
            &self.wv,
            &self.wo,
            &self.bo,
        ]
    }

    pub fn tensors_mut(&mut self) -> [&mut Array2<F>; 8] {
        [
            &mut self.norm,
            &mut self.proj,
            &mut self.gate_embed,
            &mut self.wq,
            &mut self.wk,
            &mut self.wv,
            &mut self.wo,
            &mut self.bo,
        ]
    }

    pub fn zeros_like(&self) -> Self {
        let z = |m: &Array2<F>| Array2::zeros(m.raw_dim());
        ArlaParams {
            norm: z(&self.norm),
            proj: z(&self.proj),
            gate_embed: z(&self.gate_embed),
            wq: z(&self.wq),
            wk: z(&self.wk),
            wv: z(&self.wv),
            wo: z(&self.wo),
            bo: z(&self.bo),
        }
    }
}

/// What the forward keeps.
pub struct ArlaTape<F> {
    u: Array2<F>,
    inv: Array1<F>,
    n: Array2<F>,
    z: Array2<F>,
    q: Array1<F>,
    k: Array2<F>,
    v: Array2<F>,
    a: Array1<F>,
    h: Array1<F>,
}

/// The exit logit (`p_exit = sigmoid(logit)`) of one token at gate `g = u.nrows()`.
///
/// # Shapes
/// - `u`: `[g, D]` the fast exit states `u_1..u_g`
pub fn forward<F: Real>(p: &ArlaParams<F>, u: ArrayView2<F>, eps: F) -> (F, ArlaTape<F>) {
    let g = u.nrows();
    let lat = p.proj.nrows();
    let (n, inv) = rmsnorm::forward(u, p.norm.row(0), eps);
    let z = n.dot(&p.proj.t()) + p.gate_embed.slice(s![..g, ..]); // [g, L]
    let q = p.wq.dot(&z.row(g - 1)); // [L]
    let k = z.dot(&p.wk.t()); // [g, L]
    let v = z.dot(&p.wv.t()); // [g, L]
    let scale = F::c(lat as f64).sqrt();
    let mut a = k.dot(&q) / scale;
    let max = a.iter().copied().fold(F::neg_infinity(), F::max);
    a.mapv_inplace(|x| (x - max).exp());
    let sum = a.sum();
    a /= sum;
    let h = a.dot(&v) + z.row(g - 1);
    let logit = p.wo.row(0).dot(&h) + p.bo[[0, 0]];
    let tape = ArlaTape {
        u: u.to_owned(),
        inv,
        n,
        z,
        q,
        k,
        v,
        a,
        h,
    };
    (logit, tape)
}

/// Accumulate into `grad` the gradient of a loss whose derivative by the logit is `dlogit`.
pub fn backward<F: Real>(
    p: &ArlaParams<F>,
    tape: &ArlaTape<F>,
    dlogit: F,
    grad: &mut ArlaParams<F>,
) {
    let g = tape.z.nrows();
    let scale = F::c(p.proj.nrows() as f64).sqrt();
    let wo = p.wo.row(0);
    grad.wo.row_mut(0).scaled_add(dlogit, &tape.h);
    grad.bo[[0, 0]] += dlogit;
    let dh = &wo * dlogit; // [L]
    let mut dz = Array2::zeros(tape.z.raw_dim()); // [g, L]
    dz.row_mut(g - 1).scaled_add(F::one(), &dh);
    // attention in the latent space
    let da = tape.v.dot(&dh); // [g]
    let mean = tape.a.dot(&da);
    let ds = (&da - mean) * &tape.a / scale; // [g], already divided by sqrt(L)
    let dq = tape.k.t().dot(&ds); // [L]
    for i in 0..g {
        let zi = tape.z.row(i);
        let dk_i = &tape.q * ds[i];
        let dv_i = &dh * tape.a[i];
        outer_add(&mut grad.wk, &dk_i, &zi);
        outer_add(&mut grad.wv, &dv_i, &zi);
        let back = p.wk.t().dot(&dk_i) + p.wv.t().dot(&dv_i);
        dz.row_mut(i).scaled_add(F::one(), &back);
    }
    outer_add(&mut grad.wq, &dq, &tape.z.row(g - 1));
    let back_q = p.wq.t().dot(&dq);
    dz.row_mut(g - 1).scaled_add(F::one(), &back_q);
    // z_i = P n_i + E[i]
    grad.proj += &dz.t().dot(&tape.n);
    let mut de = grad.gate_embed.slice_mut(s![..g, ..]);
    de += &dz;
    let dn = dz.dot(&p.proj); // [g, D]
    let (_, dw) = rmsnorm::backward(dn.view(), tape.u.view(), p.norm.row(0), tape.inv.view());
    grad.norm.row_mut(0).scaled_add(F::one(), &dw);
}

/// `m += x y^T`.
fn outer_add<F: Real>(m: &mut Array2<F>, x: &Array1<F>, y: &ndarray::ArrayView1<F>) {
    for (i, &xi) in x.iter().enumerate() {
        m.row_mut(i).scaled_add(xi, y);
    }
}

/// Binary cross-entropy of `sigmoid(logit)` against `label`, and its derivative by the logit.
pub fn bce<F: Real>(logit: F, label: bool) -> (F, F) {
    let y = if label { F::one() } else { F::zero() };
    // softplus(x) = max(x, 0) + ln(1 + e^-|x|), stable for large |x|
    let softplus = logit.max(F::zero()) + (F::one() + (-logit.abs()).exp()).ln();
    let p = F::one() / (F::one() + (-logit).exp());
    (softplus - y * logit, p - y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::matrix;
    use proptest::prelude::*;

    /// f32 forward equals the reference `exit_prob` (after the sigmoid).
    #[test]
    fn forward_equals_reference() {
        let arla = Arla::random(24, 3, 8, 4);
        let p = ArlaParams::<f32>::from_reference(&arla);
        let u = matrix::<f32>(3, 24, 9);
        for g in 1..=3 {
            let states: Vec<_> = (0..g).map(|i| u.row(i)).collect();
            let want = arla.exit_prob(&states, 1e-5);
            let (logit, _) = forward(&p, u.slice(s![..g, ..]), 1e-5);
            approx::assert_abs_diff_eq!(1.0 / (1.0 + (-logit).exp()), want, epsilon = 1e-5);
        }
        assert_eq!(p.to_reference(), arla);
    }

    #[test]
    fn bce_hand_computed() {
        let (l, d) = bce(0.0f64, true);
        approx::assert_abs_diff_eq!(l, 2f64.ln(), epsilon = 1e-12);
        approx::assert_abs_diff_eq!(d, -0.5, epsilon = 1e-12);
        let (l, _) = bce(-800.0f64, false); // no overflow
        approx::assert_abs_diff_eq!(l, 0.0, epsilon = 1e-12);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        /// Every ARLA parameter's gradient of the BCE loss against central differences.
        #[test]
        fn backward_matches_finite_differences(g in 1usize..4, label in any::<bool>(), seed in 0u64..1000) {
            let (d, lat, gates) = (6, 4, 3);
            let p = ArlaParams::<f64>::from_reference(&Arla::random(d, gates, lat, seed));
            let u = matrix::<f64>(g, d, seed + 1);
            let loss = |p: &ArlaParams<f64>| bce(forward(p, u.view(), 1e-5).0, label).0;
            let (logit, tape) = forward(&p, u.view(), 1e-5);
            let mut grad = p.zeros_like();
            backward(&p, &tape, bce(logit, label).1, &mut grad);
            for i in 0..8 {
                let numeric = numeric_gradient(p.tensors()[i].view().into_dyn(), |x| {
                    let mut probe = p.clone();
                    probe.tensors_mut()[i].assign(&x.view().into_dimensionality::<ndarray::Ix2>().unwrap());
                    loss(&probe)
                });
                let r = compare(&format!("tensor {i}"), grad.tensors()[i].view().into_dyn(), numeric.view(), 1e-8, 1e-5);
                prop_assert!(r.ok, "{}", r);
            }
        }
    }
}
