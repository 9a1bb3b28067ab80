//! The dense SwiGLU MLP (HF `LlamaMLP`): `down(silu(gate x) * up x)`.

use crate::base::matmul::linear_many;
use crate::base::ops::swiglu_inplace;
use crate::base::weight_names::MlpProj;
use crate::base::weights::{Linear, Mlp};
use ndarray::{Array2, ArrayView2};

/// # Shapes
/// - `h`: `[T, D]` (already RMS-normed) -> `[T, D]`
pub fn mlp(weights: &Mlp, h: ArrayView2<f32>) -> Array2<f32> {
    swiglu_mlp(weights, h, |lins, x| {
        let args: Vec<_> = lins
            .iter()
            .map(|(lin, _)| (lin.w.view(), lin.b.as_ref()))
            .collect();
        linear_many(x, &args)
    })
}

/// The MLP with the projections done by `project` (the decoder layer's adds the fast rows' adapter
/// terms and counts the work), gate and up together (one parallel section, `linear_many`).
///
/// # Shapes
/// - `h`: `[T, D]` -> `[T, D]`; `project(lins, x)`: `[T, in]` -> `[T, out]` for each of `lins`
pub fn swiglu_mlp(
    weights: &Mlp,
    h: ArrayView2<f32>,
    project: impl Fn(&[(&Linear, MlpProj)], ArrayView2<f32>) -> Vec<Array2<f32>>,
) -> Array2<f32> {
    let gate_up = [(&weights.gate, MlpProj::Gate), (&weights.up, MlpProj::Up)];
    let [mut gate, up]: [Array2<f32>; 2] = project(&gate_up, h).try_into().expect("two"); // [T, I]
    swiglu_inplace(&mut gate, &up);
    let down = [(&weights.down, MlpProj::Down)];
    project(&down, gate.view()).pop().expect("one") // [T, D]
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
