//! Attention of one fast row over a fixed (detached) slow KV cache plus the row's own key/value
//! (the shared KV cache, docs/m2r2/shared_kv.md), forward and backward. The cached keys/values are
//! constants: only `q`, the own key and the own value receive gradients.
//!
//! Per query head `h` (kv head `g = h / (H / Hkv)`), visible keys `k_0..k_{S-1}` (cache) and
//! `k_S` (own):
//! ```text
//! z_j = q_h . k_j / sqrt(Dh)      a = softmax(z)      o_h = sum_j a_j v_j
//! da_j = do_h . v_j               dz_j = a_j (da_j - sum_i a_i da_i)
//! dq_h = sum_j dz_j k_j / sqrt(Dh)   dk_S += dz_S q_h / sqrt(Dh)   dv_S += a_S do_h
//! ```

use crate::real::Real;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, CowArray, Ix1, Ix2};

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

    /// The keys and values as contiguous `[S * Hkv*Dh]` slices, with the own key and value: the
    /// loops below index head `g` of position `j` as `[j * width + g * Dh..][..Dh]` (cheap, where
    /// an ndarray slice per position and head cost more than the arithmetic it fed).
    fn slices(&self) -> HeadRows<'_, F> {
        HeadRows {
            keys: self.keys.as_standard_layout(),
            values: self.values.as_standard_layout(),
            own_k: self.own_k.as_standard_layout(),
            own_v: self.own_v.as_standard_layout(),
            cached: self.keys.nrows(),
            width: self.keys.ncols(),
        }
    }
}

/// [`Visible`] as contiguous memory (borrowed when it already is).
struct HeadRows<'a, F> {
    keys: CowArray<'a, F, Ix2>,
    values: CowArray<'a, F, Ix2>,
    own_k: CowArray<'a, F, Ix1>,
    own_v: CowArray<'a, F, Ix1>,
    cached: usize,
    width: usize,
}

impl<F: Real> HeadRows<'_, F> {
    /// Head `g`'s slice of key `j` (the own key when `j == S`).
    fn key(&self, j: usize, g: usize, dh: usize) -> &[F] {
        self.head(&self.keys, &self.own_k, j, g, dh)
    }

    fn value(&self, j: usize, g: usize, dh: usize) -> &[F] {
        self.head(&self.values, &self.own_v, j, g, dh)
    }

    fn head<'s>(
        &self,
        cached: &'s CowArray<F, Ix2>,
        own: &'s CowArray<F, Ix1>,
        j: usize,
        g: usize,
        dh: usize,
    ) -> &'s [F] {
        let contiguous = "standard layout is contiguous";
        if j < self.cached {
            &cached.as_slice().expect(contiguous)[j * self.width + g * dh..][..dh]
        } else {
            &own.as_slice().expect(contiguous)[g * dh..][..dh]
        }
    }
}

/// `a . b` with eight running sums (the compiler vectorises them; one sum would be a serial chain).
fn dot<F: Real>(a: &[F], b: &[F]) -> F {
    let mut sums = [F::zero(); 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: F = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(&x, &y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            sums[i] += x[i] * y[i];
        }
    }
    sums.iter().copied().sum::<F>() + tail
}

/// `y += alpha x`.
fn axpy<F: Real>(y: &mut [F], alpha: F, x: &[F]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x;
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
    let kv = vis.slices();
    let q = q.as_standard_layout();
    let q = q.as_slice().expect("standard layout is contiguous");
    let mut out = vec![F::zero(); heads.heads * dh];
    let mut probs = Array2::zeros((heads.heads, vis.len()));
    for h in 0..heads.heads {
        let g = h / heads.group();
        let q_h = &q[h * dh..][..dh];
        let mut a = probs.row_mut(h);
        for j in 0..vis.len() {
            a[j] = dot(q_h, kv.key(j, g, dh)) * scale;
        }
        let max = a.iter().copied().fold(F::neg_infinity(), F::max);
        a.mapv_inplace(|z| (z - max).exp());
        let sum = a.sum();
        a.mapv_inplace(|e| e / sum);
        let out_h = &mut out[h * dh..][..dh];
        for j in 0..vis.len() {
            axpy(out_h, a[j], kv.value(j, g, dh));
        }
    }
    (Array1::from(out), probs)
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
    let kv = vis.slices();
    let contiguous = "standard layout is contiguous";
    let (q, d_out) = (q.as_standard_layout(), d_out.as_standard_layout());
    let (q, d_out) = (
        q.as_slice().expect(contiguous),
        d_out.as_slice().expect(contiguous),
    );
    let mut dq = vec![F::zero(); heads.heads * dh];
    let mut dk_own = vec![F::zero(); heads.kv_heads * dh];
    let mut dv_own = vec![F::zero(); heads.kv_heads * dh];
    let mut dz = vec![F::zero(); vis.len()];
    for h in 0..heads.heads {
        let g = h / heads.group();
        let do_h = &d_out[h * dh..][..dh];
        let a = probs.row(h);
        // da_j = do_h . v_j; dz_j = a_j (da_j - sum_i a_i da_i)
        for (j, dz) in dz.iter_mut().enumerate() {
            *dz = dot(do_h, kv.value(j, g, dh));
        }
        let mean = dz.iter().zip(&a).map(|(&d, &a)| a * d).sum::<F>();
        for (dz, &a) in dz.iter_mut().zip(&a) {
            *dz = a * (*dz - mean) * scale;
        }
        let dq_h = &mut dq[h * dh..][..dh];
        for (j, &dz) in dz.iter().enumerate() {
            axpy(dq_h, dz, kv.key(j, g, dh));
        }
        let q_h = &q[h * dh..][..dh];
        axpy(&mut dk_own[g * dh..][..dh], dz[own], q_h);
        axpy(&mut dv_own[g * dh..][..dh], a[own], do_h);
    }
    RowGrad {
        dq: Array1::from(dq),
        dk_own: Array1::from(dk_own),
        dv_own: Array1::from(dv_own),
    }
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

    /// Keys and values in any memory layout give the same result (the loops read contiguous
    /// copies of views that are not).
    #[test]
    fn layout_does_not_matter() {
        let heads = Heads {
            heads: 4,
            kv_heads: 2,
            head_dim: 3,
        };
        let keys = matrix::<f64>(6, 7, 1);
        let values = matrix::<f64>(6, 7, 2);
        let (own_k, own_v, q) = (
            vector::<f64>(6, 3),
            vector::<f64>(6, 4),
            vector::<f64>(12, 5),
        );
        let strided = keys.t().as_standard_layout().into_owned().reversed_axes(); // column-major
        let run = |keys: ArrayView2<'_, f64>| {
            let vis = Visible {
                keys: keys.slice_move(ndarray::s![.., 1..]),
                values: values.slice(ndarray::s![.., 1..]),
                own_k: own_k.view(),
                own_v: own_v.view(),
            };
            forward(heads, q.view(), &vis)
        };
        let (want, want_p) = run(keys.view());
        let (got, got_p) = run(strided.view());
        assert!(!strided.is_standard_layout());
        assert_eq!((got, got_p), (want, want_p));
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
