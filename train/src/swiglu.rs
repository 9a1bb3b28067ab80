//! SwiGLU gating `a = silu(g) * u` (HF `LlamaMLP` between its projections), forward and backward.
//!
//! ```text
//! silu(g)  = g * sig(g)               sig = 1 / (1 + e^-g)
//! silu'(g) = sig(g) * (1 + g * (1 - sig(g)))
//! dg = da * u * silu'(g)    du = da * silu(g)
//! ```

use crate::real::Real;
use ndarray::{Array2, ArrayView2, Zip};

fn silu<F: Real>(g: F) -> F {
    g / (F::one() + (-g).exp())
}

/// # Shapes
/// - `g`, `u`: `[R, I]` -> `[R, I]`
pub fn forward<F: Real>(g: ArrayView2<F>, u: ArrayView2<F>) -> Array2<F> {
    Zip::from(&g).and(&u).map_collect(|&g, &u| silu(g) * u)
}

/// `(dg, du)` from `da`.
///
/// # Shapes
/// - `da`, `g`, `u`: `[R, I]` -> (`[R, I]`, `[R, I]`)
pub fn backward<F: Real>(
    da: ArrayView2<F>,
    g: ArrayView2<F>,
    u: ArrayView2<F>,
) -> (Array2<F>, Array2<F>) {
    let mut dg = Array2::zeros(g.raw_dim());
    let mut du = Array2::zeros(g.raw_dim());
    Zip::from(&mut dg)
        .and(&mut du)
        .and(&da)
        .and(&g)
        .and(&u)
        .for_each(|dg, du, &da, &g, &u| {
            let sig = F::one() / (F::one() + (-g).exp());
            *dg = da * u * sig * (F::one() + g * (F::one() - sig));
            *du = da * g * sig;
        });
    (dg, du)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::matrix;
    use proptest::prelude::*;

    #[test]
    fn forward_equals_reference() {
        let (g, u) = (matrix::<f32>(2, 9, 1), matrix::<f32>(2, 9, 2));
        let mut want = g.clone();
        reference::base::ops::swiglu_inplace(&mut want, &u);
        approx::assert_abs_diff_eq!(forward(g.view(), u.view()), want, epsilon = 1e-6);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, i in 1usize..8, seed in 0u64..1000) {
            let g = matrix::<f64>(rows, i, seed) * 3.0;
            let u = matrix::<f64>(rows, i, seed + 1);
            let c = matrix::<f64>(rows, i, seed + 2);
            let two = |p: &ndarray::ArrayD<f64>| p.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
            let (dg, du) = backward(c.view(), g.view(), u.view());
            let ng = numeric_gradient(g.view().into_dyn(), |p| (&forward(two(p).view(), u.view()) * &c).sum());
            let nu = numeric_gradient(u.view().into_dyn(), |p| (&forward(g.view(), two(p).view()) * &c).sum());
            for (name, a, n) in [("dg", dg, ng), ("du", du, nu)] {
                let r = compare(name, a.view().into_dyn(), n.view(), 1e-7, 1e-6);
                prop_assert!(r.ok, "{}", r);
            }
        }
    }
}
