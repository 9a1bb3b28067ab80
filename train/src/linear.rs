//! A frozen linear map with an optional trainable LoRA pair (an accelerator adapter,
//! docs/m2r2/accelerator.md), forward and backward.
//!
//! ```text
//! xa = x A^T                         [R, r]
//! y  = x W^T (+ b) + s * xa B^T      [R, out]      s = alpha / r
//! dx = dy W + s * (dy B) A
//! dB = s * dy^T xa                   [out, r]
//! dA = s * (dy B)^T x                [r, in]
//! ```
//! `W` and `b` are base weights: frozen, no gradient. Their products (`x W^T`, `dy W`) run as
//! parallel GEMMs over the whole batch ([`gemm`]); the rank-`r` LoRA products are small.

use crate::gemm;
use crate::real::{Real, lift};
use ndarray::{Array1, Array2, ArrayView2};

/// A base weight, frozen.
#[derive(Clone, Debug)]
pub struct Frozen<F> {
    /// `[out, in]`
    pub w: Array2<F>,
    /// `[out]`
    pub b: Option<Array1<F>>,
}

impl<F: Real> Frozen<F> {
    /// The reference's `Linear` as `F`.
    pub fn from_reference(lin: &reference::base::weights::Linear) -> Self {
        Frozen {
            w: lift(lin.w.view()),
            b: lin.b.as_ref().map(|b| lift(b.view())),
        }
    }
}

/// A trainable LoRA pair (or its gradient: same shapes).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraPair<F> {
    /// `[r, in]`
    pub a: Array2<F>,
    /// `[out, r]`
    pub b: Array2<F>,
}

impl<F: Real> LoraPair<F> {
    /// Zeros shaped like `self` (a gradient accumulator).
    pub fn zeros_like(&self) -> Self {
        LoraPair {
            a: Array2::zeros(self.a.raw_dim()),
            b: Array2::zeros(self.b.raw_dim()),
        }
    }
}

/// Forward: `y` and `xa = x A^T` (kept for the backward; `None` without a LoRA pair).
///
/// # Shapes
/// - `x`: `[R, in]` -> (`[R, out]`, `[R, r]`)
pub fn forward<F: Real>(
    x: ArrayView2<F>,
    base: &Frozen<F>,
    lora: Option<&LoraPair<F>>,
    scale: F,
) -> (Array2<F>, Option<Array2<F>>) {
    let mut y = gemm::x_wt(x, base.w.view());
    if let Some(b) = &base.b {
        y += b;
    }
    let xa = lora.map(|l| {
        let xa = x.dot(&l.a.t()); // [R, r]
        y.scaled_add(scale, &xa.dot(&l.b.t()));
        xa
    });
    (y, xa)
}

/// Backward: `dx`, and the LoRA gradient when there is a pair (`xa` from the forward).
///
/// # Shapes
/// - `dy`: `[R, out]`, `x`: `[R, in]`, `xa`: `[R, r]` -> (`[R, in]`, (`[r, in]`, `[out, r]`))
pub fn backward<F: Real>(
    dy: ArrayView2<F>,
    x: ArrayView2<F>,
    xa: Option<&Array2<F>>,
    base: &Frozen<F>,
    lora: Option<&LoraPair<F>>,
    scale: F,
) -> (Array2<F>, Option<LoraPair<F>>) {
    let mut dx = gemm::dy_w(dy, base.w.view()); // [R, in]
    let grad = match (lora, xa) {
        (Some(l), Some(xa)) => {
            let dyb = dy.dot(&l.b) * scale; // [R, r]: s * dy B
            dx += &dyb.dot(&l.a);
            Some(LoraPair {
                a: dyb.t().dot(&x),
                b: dy.t().dot(xa) * scale,
            })
        }
        _ => None,
    };
    (dx, grad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::{matrix, vector};
    use proptest::prelude::*;

    /// f32 forward agrees with the reference's `linear` plus `Lora::delta`.
    #[test]
    fn forward_equals_reference() {
        let x = matrix::<f32>(5, 24, 1);
        let base = Frozen {
            w: matrix(12, 24, 2),
            b: Some(vector(12, 3)),
        };
        let lora = LoraPair {
            a: matrix(4, 24, 4),
            b: matrix(12, 4, 5),
        };
        let (y, _) = forward(x.view(), &base, Some(&lora), 0.5);
        let mut want = reference::base::matmul::linear(x.view(), base.w.view(), base.b.as_ref());
        want += &reference::m2r2::accelerator::Lora::new(lora.a.clone(), lora.b.clone(), 2.0)
            .delta(x.view(), 0.5);
        approx::assert_abs_diff_eq!(y, want, epsilon = 1e-4);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// dx, dA, dB against central differences of `sum(c * y)`.
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, inp in 1usize..7, out in 1usize..7, r in 1usize..4, bias in any::<bool>(), seed in 0u64..1000) {
            let x = matrix::<f64>(rows, inp, seed);
            let base = Frozen { w: matrix(out, inp, seed + 1), b: bias.then(|| vector(out, seed + 2)) };
            let lora = LoraPair { a: matrix(r, inp, seed + 3), b: matrix(out, r, seed + 4) };
            let c = matrix::<f64>(rows, out, seed + 5);
            let scale = 1.7;
            let loss = |x: ArrayView2<f64>, l: &LoraPair<f64>| (&forward(x, &base, Some(l), scale).0 * &c).sum();
            let (_, xa) = forward(x.view(), &base, Some(&lora), scale);
            let (dx, g) = backward(c.view(), x.view(), xa.as_ref(), &base, Some(&lora), scale);
            let g = g.unwrap();
            let ndx = numeric_gradient(x.view().into_dyn(), |p| loss(p.view().into_dimensionality().unwrap(), &lora));
            let nda = numeric_gradient(lora.a.view().into_dyn(), |p| {
                loss(x.view(), &LoraPair { a: p.clone().into_dimensionality().unwrap(), b: lora.b.clone() })
            });
            let ndb = numeric_gradient(lora.b.view().into_dyn(), |p| {
                loss(x.view(), &LoraPair { a: lora.a.clone(), b: p.clone().into_dimensionality().unwrap() })
            });
            for (name, a, n) in [("dx", dx.into_dyn(), ndx), ("dA", g.a.into_dyn(), nda), ("dB", g.b.into_dyn(), ndb)] {
                let r = compare(name, a.view(), n.view(), 1e-7, 1e-6);
                prop_assert!(r.ok, "{}", r);
            }
        }
    }
}
