//! The dense SwiGLU MLP (HF `LlamaMLP`): `down(silu(gate x) * up x)`.

use crate::matmul::linear;
use crate::ops::swiglu_inplace;
use crate::weights::Mlp;
use ndarray::{Array2, ArrayView2};

/// # Shapes
/// - `h`: `[T, D]` (already RMS-normed) -> `[T, D]`
pub fn mlp(weights: &Mlp, h: ArrayView2<f32>) -> Array2<f32> {
    let mut gate = linear(h, weights.gate.w.view(), weights.gate.b.as_ref()); // [T, I]
    let up = linear(h, weights.up.w.view(), weights.up.b.as_ref()); // [T, I]
    swiglu_inplace(&mut gate, &up);
    linear(gate.view(), weights.down.w.view(), weights.down.b.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::silu;
    use crate::weights::Linear;
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
