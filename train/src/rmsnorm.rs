//! RMSNorm forward (same order of operations as `reference::base::ops::rms_norm`) and its backward.
//!
//! ```text
//! inv_t = 1 / sqrt(mean_d(x_td^2) + eps)       n = x * inv       y = w * n
//! dw    = sum_t dy * n
//! dn    = dy * w
//! dx    = inv * (dn - n * mean_d(dn * n))
//! ```

use crate::real::Real;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, Zip};

/// Forward: `y` and the per-row `inv` the backward needs.
///
/// # Shapes
/// - `x`: `[R, D]`, `w`: `[D]` -> (`y` `[R, D]`, `inv` `[R]`)
pub fn forward<F: Real>(x: ArrayView2<F>, w: ArrayView1<F>, eps: F) -> (Array2<F>, Array1<F>) {
    let d = F::c(x.ncols() as f64);
    let mut y = x.to_owned();
    let mut inv = Array1::zeros(x.nrows());
    for (mut row, inv_t) in y.rows_mut().into_iter().zip(inv.iter_mut()) {
        let mut sum_sq = F::zero();
        for &v in row.iter() {
            sum_sq += v * v;
        }
        *inv_t = F::one() / (sum_sq / d + eps).sqrt();
        let i = *inv_t;
        Zip::from(&mut row)
            .and(&w)
            .for_each(|v, &wi| *v = wi * (*v * i));
    }
    (y, inv)
}

/// Backward: `(dx, dw)` from `dy`, the forward input `x`, `w` and the saved `inv`.
///
/// # Shapes
/// - `dy`, `x`: `[R, D]`, `w`: `[D]`, `inv`: `[R]` -> (`[R, D]`, `[D]`)
pub fn backward<F: Real>(
    dy: ArrayView2<F>,
    x: ArrayView2<F>,
    w: ArrayView1<F>,
    inv: ArrayView1<F>,
) -> (Array2<F>, Array1<F>) {
    let d = F::c(x.ncols() as f64);
    let n = &x * &inv.insert_axis(Axis(1)); // [R, D]
    let dw = (&dy * &n).sum_axis(Axis(0));
    let dn = &dy * &w; // [R, D]
    let mut dx = Array2::zeros(x.raw_dim());
    for t in 0..x.nrows() {
        let (dn_t, n_t) = (dn.row(t), n.row(t));
        let mean = dn_t.dot(&n_t) / d;
        Zip::from(dx.row_mut(t))
            .and(&dn_t)
            .and(&n_t)
            .for_each(|dx, &dn, &n| *dx = inv[t] * (dn - n * mean));
    }
    (dx, dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::{matrix, vector};
    use ndarray::Array2;
    use proptest::prelude::*;

    /// f32 forward equals the reference's RMSNorm bit for bit.
    #[test]
    fn forward_equals_reference() {
        let x = matrix::<f32>(3, 7, 1);
        let w = vector::<f32>(7, 2);
        let (y, _) = forward(x.view(), w.view(), 1e-5);
        assert_eq!(y, reference::base::ops::rms_norm(x.view(), &w, 1e-5));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// dx and dw against central differences of `sum(c * y)` for a random `c`.
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, d in 1usize..9, seed in 0u64..1000) {
            let x = matrix::<f64>(rows, d, seed);
            let w = vector::<f64>(d, seed + 1);
            let c: Array2<f64> = matrix(rows, d, seed + 2);
            let eps = 1e-5;
            let loss = |x: ArrayView2<f64>, w: ArrayView1<f64>| (&forward(x, w, eps).0 * &c).sum();
            let (_, inv) = forward(x.view(), w.view(), eps);
            let (dx, dw) = backward(c.view(), x.view(), w.view(), inv.view());
            let ndx = numeric_gradient(x.view().into_dyn(), |p| {
                loss(p.view().into_dimensionality().unwrap(), w.view())
            });
            let ndw = numeric_gradient(w.view().into_dyn(), |p| {
                loss(x.view(), p.view().into_dimensionality().unwrap())
            });
            let r = compare("dx", dx.view().into_dyn(), ndx.view(), 1e-7, 1e-5);
            prop_assert!(r.ok, "{}", r);
            let r = compare("dw", dw.view().into_dyn(), ndw.view(), 1e-7, 1e-5);
            prop_assert!(r.ok, "{}", r);
        }
    }
}
