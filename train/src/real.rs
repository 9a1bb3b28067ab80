//! The scalar type of the training code: `f32` for training, `f64` for the finite-difference
//! gradient checks. Every op is written once over [`Real`], so the checked code is the trained code.

use ndarray::{LinalgScalar, ScalarOperand};
use num_traits::Float;
use std::fmt::Debug;
use std::iter::Sum;
use std::ops::{AddAssign, DivAssign, MulAssign, SubAssign};

/// `f32` or `f64`. Matrix products go through ndarray (matrixmultiply's sgemm / dgemm); those with
/// the frozen weights through [`gemm`](crate::gemm).
pub trait Real:
    Float
    + LinalgScalar
    + ScalarOperand
    + Sum
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Debug
    + Send
    + Sync
    + 'static
{
    /// Widen (or keep) an `f32` from the reference.
    fn lift(x: f32) -> Self;
    /// Narrow (or keep) to `f32`, for weights written back to the reference format.
    fn lower(self) -> f32;
    /// A constant given in `f64`.
    fn c(x: f64) -> Self;
}

impl Real for f32 {
    fn lift(x: f32) -> Self {
        x
    }
    fn lower(self) -> f32 {
        self
    }
    fn c(x: f64) -> Self {
        x as f32
    }
}

impl Real for f64 {
    fn lift(x: f32) -> Self {
        x as f64
    }
    fn lower(self) -> f32 {
        self as f32
    }
    fn c(x: f64) -> Self {
        x
    }
}

/// An `f32` array of the reference as `F`.
pub fn lift<F: Real, D: ndarray::Dimension>(x: ndarray::ArrayView<f32, D>) -> ndarray::Array<F, D> {
    x.mapv(F::lift)
}
