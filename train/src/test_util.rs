//! Seeded random tensors for the unit tests.

use crate::real::Real;
use ndarray::{Array1, Array2};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// `[rows, cols]` of `N(0, 1)` draws from `seed`.
pub fn matrix<F: Real>(rows: usize, cols: usize, seed: u64) -> Array2<F> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Array2::from_shape_simple_fn((rows, cols), || {
        F::lift(reference::io::builtin::standard_normal(&mut rng))
    })
}

/// `[n]` of `N(0, 1)` draws from `seed`.
pub fn vector<F: Real>(n: usize, seed: u64) -> Array1<F> {
    matrix(1, n, seed)
        .into_shape_with_order(n)
        .expect("one row")
}
