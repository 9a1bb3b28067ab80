//! Attention of one fast row over a fixed (detached) slow KV cache plus the row's own key/value
//! (spec section 2), forward and backward. The cached keys/values are constants: only `q`, the own
//! key and the own value receive gradients.
//!
//! Per query head `h` (kv head `g = h / (H / Hkv)`), visible keys `k_0..k_{S-1}` (cache) and
//! `k_S` (own):
//! ```text
//! z_j = q_h . k_j / sqrt(Dh)      a = softmax(z)      o_h = sum_j a_j v_j
//! da_j = do_h . v_j               dz_j = a_j (da_j - sum_i a_i da_i)
//! dq_h = sum_j dz_j k_j / sqrt(Dh)   dk_S += dz_S q_h / sqrt(Dh)   dv_S += a_S do_h
//! ```

use crate::real::Real;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2};

/// Head layout: `H` query heads of size `Dh` over `Hkv` key/value heads.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub fn of(config: &reference::ModelConfig) -> Self {
        Heads {
            heads: config.num_attention_heads,
            kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
        }
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// The visible keys/values of one row: cached rows, then the row's own.
pub struct Visible<'a, F> {
    /// `[S, Hkv*Dh]` cached slow keys (already rotated), constants
    pub keys: ArrayView2<'a, F>,
    /// `[S, Hkv*Dh]`
    pub values: ArrayView2<'a, F>,
    /// `[Hkv*Dh]` the row's own key (rotated)
    pub own_k: ArrayView1<'a, F>,
    /// `[Hkv*Dh]`
    pub own_v: ArrayView1<'a, F>,
}

impl<'a, F: Real> Visible<'a, F> {
    fn len(&self) -> usize {
        self.keys.nrows() + 1
    }

    /// Head `g`'s slice of key `j` (the own key when `j == S`).
    fn key(&self, j: usize, g: usize, dh: usize) -> ArrayView1<'_, F> {
        let row = if j < self.keys.nrows() {
            self.keys.row(j)
        } else {
            self.own_k.view()
        };
        row.slice_move(ndarray::s![g * dh..(g + 1) * dh])
    }

    fn value(&self, j: usize, g: usize, dh: usize) -> ArrayView1<'_, F> {
        let row = if j < self.values.nrows() {
            self.values.row(j)
        } else {
            self.own_v.view()
        };
        row.slice_move(ndarray::s![g * dh..(g + 1) * dh])
    }
}

/// Forward of one row: the attention output and the softmax weights (kept for the backward).
///
/// # Shapes
/// - `q`: `[H*Dh]` -> (`[H*Dh]`, `[H, S+1]`)
pub fn forward<F: Real>(
    heads: Heads,
    q: ArrayView1<F>,
    vis: &Visible<'_, F>,
) -> (Array1<F>, Array2<F>) {
    let dh = heads.head_dim;
    let scale = F::c(dh as f64).powf(F::c(-0.5));
    let mut out = Array1::zeros(heads.heads * dh);
    let mut probs = Array2::zeros((heads.heads, vis.len()));
    for h in 0..heads.heads {
        let g = h / heads.group();
        let q_h = q.slice(ndarray::s![h * dh..(h + 1) * dh]);
        let mut a = probs.row_mut(h);
        for j in 0..vis.len() {
            a[j] = q_h.dot(&vis.key(j, g, dh)) * scale;
        }
        let max = a.iter().copied().fold(F::neg_infinity(), F::max);
        a.mapv_inplace(|z| (z - max).exp());
        let sum = a.sum();
        a.mapv_inplace(|e| e / sum);
        let mut out_h = out.slice_mut(ndarray::s![h * dh..(h + 1) * dh]);
        for j in 0..vis.len() {
            out_h.scaled_add(a[j], &vis.value(j, g, dh));
        }
    }
    (out, probs)
}

/// Gradients of one row's inputs that are not constants.
pub struct RowGrad<F> {
    /// `[H*Dh]`
    pub dq: Array1<F>,
    /// `[Hkv*Dh]`
    pub dk_own: Array1<F>,
    /// `[Hkv*Dh]`
    pub dv_own: Array1<F>,
}

/// Backward of one row from `d_out` and the forward's `probs`.
///
/// # Shapes
/// - `d_out`, `q`: `[H*Dh]`, `probs`: `[H, S+1]`
pub fn backward<F: Real>(
    heads: Heads,
    d_out: ArrayView1<F>,
    q: ArrayView1<F>,
    vis: &Visible<'_, F>,
    probs: ArrayView2<F>,
) -> RowGrad<F> {
    let dh = heads.head_dim;
    let scale = F::c(dh as f64).powf(F::c(-0.5));
    let own = vis.len() - 1;
    let mut grad = RowGrad {
        dq: Array1::zeros(heads.heads * dh),
        dk_own: Array1::zeros(heads.kv_heads * dh),
        dv_own: Array1::zeros(heads.kv_heads * dh),
    };
    let mut dz = Array1::zeros(vis.len());
    for h in 0..heads.heads {
        let g = h / heads.group();
        let kv = ndarray::s![g * dh..(g + 1) * dh];
        let do_h = d_out.slice(ndarray::s![h * dh..(h + 1) * dh]);
        let a = probs.row(h);
        // da_j = do_h . v_j; dz_j = a_j (da_j - sum_i a_i da_i)
        for j in 0..vis.len() {
            dz[j] = do_h.dot(&vis.value(j, g, dh));
        }
        let mean = a.dot(&dz);
        for j in 0..vis.len() {
            dz[j] = a[j] * (dz[j] - mean) * scale;
        }
        let mut dq_h = grad.dq.slice_mut(ndarray::s![h * dh..(h + 1) * dh]);
        for j in 0..vis.len() {
            dq_h.scaled_add(dz[j], &vis.key(j, g, dh));
        }
        let q_h = q.slice(ndarray::s![h * dh..(h + 1) * dh]);
        grad.dk_own.slice_mut(kv).scaled_add(dz[own], &q_h);
        grad.dv_own.slice_mut(kv).scaled_add(a[own], &do_h);
    }
    grad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::{matrix, vector};
    use proptest::prelude::*;

    /// f32 forward agrees with `reference::base::attention::attend` (own row supplied separately).
    #[test]
    fn forward_equals_reference() {
        let config = reference::io::builtin::tiny_config();
        let kv = config.num_key_value_heads * config.head_dim;
        let keys = matrix::<f32>(5, kv, 1);
        let values = matrix::<f32>(5, kv, 2);
        let (own_k, own_v) = (vector::<f32>(kv, 3), vector::<f32>(kv, 4));
        let q = vector::<f32>(config.q_dim(), 5);
        let vis = Visible {
            keys: keys.view(),
            values: values.view(),
            own_k: own_k.view(),
            own_v: own_v.view(),
        };
        let (out, _) = forward(Heads::of(&config), q.view(), &vis);
        let want = reference::base::attention::attend(
            &config,
            q.view(),
            keys.view(),
            values.view(),
            Some((own_k.view(), own_v.view())),
        );
        approx::assert_abs_diff_eq!(out, want, epsilon = 1e-5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// dq, d(own k), d(own v) against central differences, with GQA and an empty cache.
        #[test]
        fn backward_matches_finite_differences(cached in 0usize..5, kv_heads in 1usize..3, group in 1usize..3, dh in 1usize..5, seed in 0u64..1000) {
            let heads = Heads { heads: kv_heads * group, kv_heads, head_dim: dh };
            let kv = kv_heads * dh;
            let keys = matrix::<f64>(cached, kv, seed);
            let values = matrix::<f64>(cached, kv, seed + 1);
            let own_k = vector::<f64>(kv, seed + 2);
            let own_v = vector::<f64>(kv, seed + 3);
            let q = vector::<f64>(heads.heads * dh, seed + 4);
            let c = vector::<f64>(heads.heads * dh, seed + 5);
            let loss = |q: &Array1<f64>, k: &Array1<f64>, v: &Array1<f64>| {
                let vis = Visible { keys: keys.view(), values: values.view(), own_k: k.view(), own_v: v.view() };
                forward(heads, q.view(), &vis).0.dot(&c)
            };
            let vis = Visible { keys: keys.view(), values: values.view(), own_k: own_k.view(), own_v: own_v.view() };
            let (_, probs) = forward(heads, q.view(), &vis);
            let g = backward(heads, c.view(), q.view(), &vis, probs.view());
            let one = |p: &ndarray::ArrayD<f64>| p.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
            let nq = numeric_gradient(q.view().into_dyn(), |p| loss(&one(p), &own_k, &own_v));
            let nk = numeric_gradient(own_k.view().into_dyn(), |p| loss(&q, &one(p), &own_v));
            let nv = numeric_gradient(own_v.view().into_dyn(), |p| loss(&q, &own_k, &one(p)));
            for (name, a, n) in [("dq", g.dq, nq), ("dk", g.dk_own, nk), ("dv", g.dv_own, nv)] {
                let r = compare(name, a.view().into_dyn(), n.view(), 1e-7, 1e-6);
                prop_assert!(r.ok, "{}", r);
            }
        }
    }
}
