//! RoPE (HF rotate-half, as `reference::base::rope`) at per-row positions, and its backward.
//!
//! A rotation is orthogonal, so the backward is the rotation by the opposite angle:
//! ```text
//! y1 = x1 c - x2 s      dx1 =  dy1 c + dy2 s
//! y2 = x2 c + x1 s      dx2 = -dy1 s + dy2 c
//! ```

use crate::real::Real;
use ndarray::{Array2, ArrayViewMut2};
use reference::base::config::ModelConfig;
use reference::base::rope::inverse_frequencies;

/// `cos(p f_i)`, `sin(p f_i)` computed exactly as the reference does (angle and trig in f32).
#[derive(Clone, Debug)]
pub struct RopeTable<F> {
    /// `[max_pos, Dh/2]`
    cos: Array2<F>,
    /// `[max_pos, Dh/2]`
    sin: Array2<F>,
    head_dim: usize,
}

impl<F: Real> RopeTable<F> {
    pub fn new(config: &ModelConfig) -> Self {
        let inv = inverse_frequencies(config.head_dim, config.rope_theta, &config.rope_scaling);
        let shape = (config.max_position_embeddings, inv.len());
        let angle = |p: usize, i: usize| p as f32 * inv[i];
        RopeTable {
            cos: Array2::from_shape_fn(shape, |(p, i)| F::lift(angle(p, i).cos())),
            sin: Array2::from_shape_fn(shape, |(p, i)| F::lift(angle(p, i).sin())),
            head_dim: config.head_dim,
        }
    }

    /// Rotate every head of row `t` by its position `positions[t]` (`inverse`: by minus the
    /// angle, which is the backward).
    ///
    /// # Shapes
    /// - `x`: `[R, heads * Dh]`, `positions`: `[R]`
    ///
    /// # Panics
    /// If a position is beyond the table.
    pub fn rotate(&self, mut x: ArrayViewMut2<F>, positions: &[usize], inverse: bool) {
        let half = self.head_dim / 2;
        for (mut row, &p) in x.rows_mut().into_iter().zip(positions) {
            let (cos, sin) = (self.cos.row(p), self.sin.row(p));
            let row = row.as_slice_mut().expect("rows are contiguous");
            for head in row.chunks_exact_mut(self.head_dim) {
                for i in 0..half {
                    let (x1, x2) = (head[i], head[i + half]);
                    let s = if inverse { -sin[i] } else { sin[i] };
                    head[i] = x1 * cos[i] - x2 * s;
                    head[i + half] = x2 * cos[i] + x1 * s;
                }
            }
        }
    }

    /// Forward: rotate in place.
    pub fn forward(&self, x: ArrayViewMut2<F>, positions: &[usize]) {
        self.rotate(x, positions, false)
    }

    /// Backward: `dy` becomes `dx` in place.
    pub fn backward(&self, dy: ArrayViewMut2<F>, positions: &[usize]) {
        self.rotate(dy, positions, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grad_check::{compare, numeric_gradient};
    use crate::test_util::matrix;
    use proptest::prelude::*;

    /// Same bits as `reference::base::rope::Rope::apply` in f32.
    #[test]
    fn forward_equals_reference() {
        let config = reference::io::builtin::tiny_config();
        let table = RopeTable::<f32>::new(&config);
        let x = matrix::<f32>(3, config.q_dim(), 7);
        let mut ours = x.clone();
        table.forward(ours.view_mut(), &[5, 6, 7]);
        let mut want = x.clone();
        reference::base::rope::Rope::new(&config).apply(want.view_mut(), 5, config.head_dim);
        assert_eq!(ours, want);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        #[test]
        fn backward_matches_finite_differences(rows in 1usize..4, seed in 0u64..1000) {
            let config = reference::io::builtin::tiny_config();
            let table = RopeTable::<f64>::new(&config);
            let positions: Vec<usize> = (0..rows).map(|t| (seed as usize * 7 + t * 13) % 500).collect();
            let x = matrix::<f64>(rows, config.head_dim * 2, seed);
            let c = matrix::<f64>(rows, config.head_dim * 2, seed + 1);
            let numeric = numeric_gradient(x.view().into_dyn(), |p| {
                let mut y = p.clone().into_dimensionality().unwrap();
                table.forward(ndarray::ArrayViewMut2::from(&mut y), &positions);
                (&y * &c).sum()
            });
            let mut analytic = c.clone();
            table.backward(analytic.view_mut(), &positions);
            let r = compare("dx", analytic.view().into_dyn(), numeric.view(), 1e-8, 1e-6);
            prop_assert!(r.ok, "{}", r);
        }
    }
}
