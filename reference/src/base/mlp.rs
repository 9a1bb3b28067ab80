//! The dense SwiGLU MLP (HF `LlamaMLP`): `down(silu(gate x) * up x)`.

use crate::base::matmul::linear;
use crate::base::ops::swiglu_inplace;
use crate::base::weight_names::MlpProj;
use crate::base::weights::{Linear, Mlp};
use ndarray::{Array2, ArrayView2};

/// # Shapes
/// - `h`: `[T, D]` (already RMS-normed) -> `[T, D]`
pub fn mlp(weights: &Mlp, h: ArrayView2<f32>) -> Array2<f32> {
    swiglu_mlp(weights, h, |lin, _, x| {
        linear(x, lin.w.view(), lin.b.as_ref())
    })
}

/// The MLP with each projection done by `project` (the decoder layer's adds the fast rows' adapter
/// terms and counts the work).
///
/// # Shapes
/// - `h`: `[T, D]` -> `[T, D]`; `project(lin, which, x)`: `[T, in]` -> `[T, out]`
pub fn swiglu_mlp(
    weights: &Mlp,
    h: ArrayView2<f32>,
    project: impl Fn(&Linear, MlpProj, ArrayView2<f32>) -> Array2<f32>,
) -> Array2<f32> {
    let mut gate = project(&weights.gate, MlpProj::Gate, h); // [T, I]
    let up = project(&weights.up, MlpProj::Up, h); // [T, I]
    swiglu_inplace(&mut gate, &up);
    project(&weights.down, MlpProj::Down, gate.view()) // [T, D]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ops::silu;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    #[test]
    fn hand_computed() {
        // D = 2, I = 1: gate = x0, up = x1, down = [[1], [2]]
        let lin = |w: Array2<f32>| Linear { w, b: None };
        let m = Mlp {
            gate: lin(array![[1.0, 0.0]]),
            up: lin(array![[0.0, 1.0]]),
            down: lin(array![[1.0], [2.0]]),
        };
        let y = mlp(&m, array![[2.0f32, 3.0]].view());
        let g = silu(2.0) * 3.0;
        assert_abs_diff_eq!(y, array![[g, 2.0 * g]], epsilon = 1e-6);
    }
}
