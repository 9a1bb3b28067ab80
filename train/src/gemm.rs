//! Products with the frozen base weights at GEMM speed: `x W^T` (forward) and `dy W` (backward),
//! for a whole batch of rows at once.
//!
//! Each product is one `matrixmultiply` GEMM per block of output columns (ndarray's
//! [`general_mat_mul`]), the blocks computed in parallel with rayon. A GEMM packs (copies into its
//! panel layout) the weight block it multiplies, so the cost of a product is one pass over the
//! weight for the packing plus the arithmetic: the more rows share one product, the cheaper each
//! row. The previous layout, 16-row sub-batches each multiplying the whole weight, spent more time
//! packing than multiplying (docs/PERFORMANCE.md, "Training").
//!
//! Deterministic: the blocks depend on the shapes only (not on the number of threads), and every
//! output element is one block's dot product in matrixmultiply's fixed order.

use crate::real::Real;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, Axis};
use rayon::prelude::*;

/// Output columns per task at least: below this a block's arithmetic does not pay for its task.
const MIN_COLS: usize = 128;
/// A product is cut into about this many blocks (enough for load balance on a few cores).
const BLOCKS: usize = 16;

/// Output columns per task for `cols` columns: a multiple of 16 (whole SIMD panels).
fn block_cols(cols: usize) -> usize {
    cols.div_ceil(BLOCKS).next_multiple_of(16).max(MIN_COLS)
}

/// `x W^T`.
///
/// # Shapes
/// - `x`: `[R, in]`, `w`: `[out, in]` -> `[R, out]`
pub fn x_wt<F: Real>(x: ArrayView2<F>, w: ArrayView2<F>) -> Array2<F> {
    let mut y = Array2::zeros((x.nrows(), w.nrows()));
    let cols = block_cols(w.nrows());
    y.axis_chunks_iter_mut(Axis(1), cols)
        .into_par_iter()
        .zip(w.axis_chunks_iter(Axis(0), cols))
        .for_each(|(mut y, w)| general_mat_mul(F::one(), &x, &w.t(), F::zero(), &mut y));
    y
}

/// `dy W`.
///
/// # Shapes
/// - `dy`: `[R, out]`, `w`: `[out, in]` -> `[R, in]`
pub fn dy_w<F: Real>(dy: ArrayView2<F>, w: ArrayView2<F>) -> Array2<F> {
    let mut y = Array2::zeros((dy.nrows(), w.ncols()));
    let cols = block_cols(w.ncols());
    y.axis_chunks_iter_mut(Axis(1), cols)
        .into_par_iter()
        .zip(w.axis_chunks_iter(Axis(1), cols))
        .for_each(|(mut y, w)| general_mat_mul(F::one(), &dy, &w, F::zero(), &mut y));
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::matrix;
    use proptest::prelude::*;

    /// The naive triple loop in `f64`, the oracle of both products.
    fn naive(a: ArrayView2<f64>, b: ArrayView2<f64>) -> Array2<f64> {
        Array2::from_shape_fn((a.nrows(), b.ncols()), |(i, j)| {
            (0..a.ncols()).map(|k| a[[i, k]] * b[[k, j]]).sum()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Both products equal the naive definition, on shapes with several blocks and ragged
        /// last blocks (up to 700 columns: blocks of 128 and a tail).
        #[test]
        fn products_equal_naive(rows in 0usize..9, inner in 1usize..40, out in 1usize..700, seed in 0u64..1000) {
            let x = matrix::<f64>(rows, inner, seed);
            let w = matrix::<f64>(out, inner, seed + 1);
            let dy = matrix::<f64>(rows, out, seed + 2);
            let got = x_wt(x.view(), w.view());
            let want = naive(x.view(), w.t());
            prop_assert!(got.abs_diff_eq(&want, 1e-12), "x W^T");
            let got = dy_w(dy.view(), w.view());
            let want = naive(dy.view(), w.view());
            prop_assert!(got.abs_diff_eq(&want, 1e-12), "dy W");
        }
    }

    /// A row's product does not depend on the other rows of the batch (so a row's gradient does
    /// not depend on which rows it was drawn with), in f32, bit for bit.
    #[test]
    fn rows_are_independent_of_the_batch() {
        let x = matrix::<f32>(64, 576, 7);
        let w = matrix::<f32>(1000, 576, 8);
        let all = x_wt(x.view(), w.view());
        for r in [0, 17, 63] {
            let alone = x_wt(x.slice(ndarray::s![r..r + 1, ..]), w.view());
            assert_eq!(alone.row(0), all.row(r), "row {r}");
        }
    }
}
