//! Two-dimensional PCA of a residual trajectory (`m2r2 analyze --plot`), through LAPACK.

use crate::error::{Error, Result};
use ndarray::{Array2, ArrayView2, Axis, s};

/// The top-2 principal axes of a point cloud, and the points in those axes.
#[derive(Clone, Debug)]
pub struct Pca2d {
    /// `[D]` the mean the points were centred on
    pub mean: ndarray::Array1<f64>,
    /// `[2, D]` unit principal axes, largest variance first
    pub axes: Array2<f64>,
    /// Share of the total variance along each axis (`sigma_k^2 / sum sigma^2`).
    pub explained_variance_ratio: [f64; 2],
    /// `[P, 2]` the points in the axes' coordinates
    pub coords: Array2<f64>,
}

impl Pca2d {
    /// Coordinates of further points (e.g. fast exit states) in the same centred axes.
    ///
    /// # Shapes
    /// - `x`: `[R, D]` -> `[R, 2]`
    ///
    /// # Panics
    /// If the width of `x` is not `D`.
    pub fn project(&self, x: ArrayView2<f32>) -> Array2<f64> {
        let centred = x.mapv(f64::from) - &self.mean;
        centred.dot(&self.axes.t())
    }
}

/// PCA of `points` onto two axes: centre on the mean, SVD `X_c = U S V^T` (LAPACK through
/// ndarray-linalg), axes = the first two rows of `V^T`, coordinates = `X_c V_2`. Each axis's sign is
/// chosen so that the LAST point has a non-negative coordinate on it (for a trajectory `s_0..s_N`:
/// the final residual lies to the right and up), which makes the output deterministic.
/// A cloud of rank one gets an arbitrary unit second axis with ratio 0.
///
/// # Shapes
/// - `points`: `[P, D]` with `P >= 2`, `D >= 2`
///
/// # Errors
/// Fewer than 2 points or dimensions, all points equal (no variance), or a LAPACK failure.
pub fn pca_2d(points: ArrayView2<f32>) -> Result<Pca2d> {
    use ndarray_linalg::SVD;
    let (p, d) = points.dim();
    if p < 2 || d < 2 {
        return Err(Error::Invalid(format!(
            "PCA needs at least 2 points of at least 2 dimensions, got [{p}, {d}]"
        )));
    }
    let x = points.mapv(f64::from);
    let mean = x.mean_axis(Axis(0)).expect("P >= 2");
    let centred = &x - &mean;
    let (_, sigma, vt) = centred
        .svd(false, true)
        .map_err(|e| Error::Invalid(format!("PCA: SVD of [{p}, {d}] points failed: {e}")))?;
    let vt = vt.expect("V^T was requested");
    let total: f64 = sigma.iter().map(|s| s * s).sum();
    if total == 0.0 {
        return Err(Error::Invalid(
            "PCA: all points are equal (no variance)".into(),
        ));
    }
    // min(P, D) >= 2, so LAPACK returns at least two singular values and rows of V^T.
    let mut axes = vt.slice(s![0..2, ..]).to_owned();
    let ratio = |k: usize| sigma[k] * sigma[k] / total;
    let mut coords = centred.dot(&axes.t());
    for k in 0..2 {
        if coords[[p - 1, k]] < 0.0 {
            axes.row_mut(k).mapv_inplace(|v| -v);
            coords.column_mut(k).mapv_inplace(|v| -v);
        }
    }
    Ok(Pca2d {
        mean,
        axes,
        explained_variance_ratio: [ratio(0), ratio(1)],
        coords,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::residual_dynamics;
    use crate::io::builtin;
    use crate::m2r2::weights::M2r2Weights;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    const TOKENS: [u32; 10] = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];

    #[test]
    fn pca_of_points_on_a_line() {
        // p_i = (1, 2, 3) + i * (2, -1, 2): rank one after centring, the axis is (2, -1, 2) / 3.
        let points = Array2::from_shape_fn((5, 3), |(i, k)| {
            [1.0f32, 2.0, 3.0][k] + i as f32 * [2.0f32, -1.0, 2.0][k]
        });
        let pca = pca_2d(points.view()).unwrap();
        assert_abs_diff_eq!(pca.explained_variance_ratio[0], 1.0, epsilon = 1e-12);
        assert_abs_diff_eq!(pca.explained_variance_ratio[1], 0.0, epsilon = 1e-12);
        // Last point is positive on the first axis, so the axis points along +(2, -1, 2) / 3.
        assert_abs_diff_eq!(
            pca.axes.row(0),
            array![2.0 / 3.0, -1.0 / 3.0, 2.0 / 3.0],
            epsilon = 1e-12
        );
        // Coordinates: (i - 2) * |(2, -1, 2)| = (i - 2) * 3.
        assert_abs_diff_eq!(
            pca.coords.column(0),
            array![-6.0, -3.0, 0.0, 3.0, 6.0],
            epsilon = 1e-9
        );
        // Projecting the points again gives the same coordinates.
        assert_abs_diff_eq!(pca.project(points.view()), pca.coords, epsilon = 1e-9);
    }

    #[test]
    fn pca_of_a_rectangle() {
        // Corners of a 4 x 2 rectangle: variances 4 and 1 along x and y, ratios 0.8 and 0.2.
        let points = array![[0.0f32, 0.0], [4.0, 0.0], [0.0, 2.0], [4.0, 2.0]];
        let pca = pca_2d(points.view()).unwrap();
        assert_abs_diff_eq!(pca.explained_variance_ratio[0], 0.8, epsilon = 1e-12);
        assert_abs_diff_eq!(pca.explained_variance_ratio[1], 0.2, epsilon = 1e-12);
        assert_abs_diff_eq!(pca.coords.row(3), array![2.0, 1.0], epsilon = 1e-12);
        assert!(pca_2d(array![[1.0f32, 2.0], [1.0, 2.0]].view()).is_err());
        assert!(pca_2d(array![[1.0f32, 2.0]].view()).is_err());
    }

    #[test]
    fn pca_of_a_tiny_trajectory() {
        let model = builtin::builtin("tiny").unwrap();
        let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
        let d = residual_dynamics(&model, &weights, &TOKENS).unwrap();
        let pca = pca_2d(d.last_trajectory.view()).unwrap();
        let [r0, r1] = pca.explained_variance_ratio;
        assert!(r0 >= r1 && r1 >= 0.0 && r0 + r1 <= 1.0 + 1e-12);
        assert_eq!(pca.coords.dim(), (model.config.num_hidden_layers + 1, 2));
        assert!(pca.coords[[model.config.num_hidden_layers, 0]] >= 0.0);
        assert_eq!(pca.project(d.last_exit_states.view()).dim(), (3, 2));
    }
}
