//! The optional alignment term of a gate (docs/TRAINING.md): pull the fast exit state `u` towards
//! the final slow residual `s_N` it estimates (docs/m2r2/streams.md), by cosine or mean squared
//! error.
//!
//! ```text
//! cosine: loss = w / R * sum_r (1 - cos(u_r, s_r))
//!         du_r = -w / R * (s_r / (|u_r| |s_r|) - cos_r * u_r / |u_r|^2)
//! mse:    loss = w / (R D) * sum_r |u_r - s_r|^2       du_r = 2 w / (R D) * (u_r - s_r)
//! ```

use crate::real::Real;
use ndarray::{Array2, ArrayView2};

/// Which alignment term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlignKind {
    Cosine,
    Mse,
}

impl std::str::FromStr for AlignKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cosine" => Ok(AlignKind::Cosine),
            "mse" => Ok(AlignKind::Mse),
            _ => Err(format!("unknown alignment `{s}` (expected cosine or mse)")),
        }
    }
}

/// The loss (weighted by `w`) and its gradient with respect to `u`.
///
/// # Shapes
/// - `u`, `target`: `[R, D]` -> (loss, `[R, D]`)
pub fn align_loss<F: Real>(
    kind: AlignKind,
    u: ArrayView2<F>,
    target: ArrayView2<F>,
    w: F,
) -> (F, Array2<F>) {
    let (rows, d) = (F::c(u.nrows() as f64), F::c(u.ncols() as f64));
    let mut du = Array2::zeros(u.raw_dim());
    let mut loss = F::zero();
    for r in 0..u.nrows() {
        let (ur, sr) = (u.row(r), target.row(r));
        match kind {
            AlignKind::Cosine => {
                let (nu, ns) = (ur.dot(&ur).sqrt(), sr.dot(&sr).sqrt());
                let cos = ur.dot(&sr) / (nu * ns);
                loss += w / rows * (F::one() - cos);
                let mut g = du.row_mut(r);
                g.assign(&(&sr / (nu * ns) - &ur * (cos / (nu * nu))));
                g.mapv_inplace(|x| -x * w / rows);
            }
            AlignKind::Mse => {
                let diff = &ur - &sr;
                loss += w / (rows * d) * diff.dot(&diff);
                du.row_mut(r).assign(&(diff * (F::c(2.0) * w / (rows * d))));
            }
        }
    }
    (loss, du)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::matrix;
    use ndarray::array;
    use proptest::prelude::*;

    #[test]
    fn hand_computed() {
        let u = array![[1.0f64, 0.0]];
        let s = array![[1.0f64, 1.0]];
        // cos = 1/sqrt(2); mse = (0 + 1) / 2
        let (c, _) = align_loss(AlignKind::Cosine, u.view(), s.view(), 1.0);
        approx::assert_abs_diff_eq!(c, 1.0 - 0.5f64.sqrt(), epsilon = 1e-12);
        let (m, _) = align_loss(AlignKind::Mse, u.view(), s.view(), 2.0);
        approx::assert_abs_diff_eq!(m, 1.0, epsilon = 1e-12);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, d in 1usize..6, cosine in any::<bool>(), seed in 0u64..1000) {
            let kind = if cosine { AlignKind::Cosine } else { AlignKind::Mse };
            let u = matrix::<f64>(rows, d, seed);
            let s = matrix::<f64>(rows, d, seed + 1);
            let (_, du) = align_loss(kind, u.view(), s.view(), 0.7);
            let n = numeric_gradient(u.view().into_dyn(), |p| {
                align_loss(kind, p.view().into_dimensionality().unwrap(), s.view(), 0.7).0
            });
            let r = compare("du", du.view().into_dyn(), n.view(), 1e-7, 1e-5);
            prop_assert!(r.ok, "{}", r);
        }
    }
}
