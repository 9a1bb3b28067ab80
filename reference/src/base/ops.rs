//! Row-wise operators of the base model. Each works on one row at a time, so results never depend on
//! the other rows of a chunk (batch invariance).

use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut1, Zip};

/// RMSNorm (HF `LlamaRMSNorm`): `y = w * x / sqrt(mean(x^2) + eps)`, all in f32.
///
/// # Shapes
/// - `x`: `[T, D]`, `w`: `[D]` -> `[T, D]`
pub fn rms_norm(x: ArrayView2<f32>, w: &Array1<f32>, eps: f32) -> Array2<f32> {
    let mut y = x.to_owned();
    for row in y.rows_mut() {
        rms_norm_inplace(row, w, eps);
    }
    y
}

/// [`rms_norm`] of one row, in place: the one definition both the chunked layers and the naive
/// layer (`base::layer_naive`) use.
///
/// # Shapes
/// - `x`: `[D]`, `w`: `[D]`
pub fn rms_norm_inplace(mut x: ArrayViewMut1<f32>, w: &Array1<f32>, eps: f32) {
    let mut sum_sq = 0.0f32;
    for &v in x.iter() {
        sum_sq += v * v;
    }
    // PyTorch: hidden * torch.rsqrt(variance + eps), then weight * hidden
    let inv = 1.0 / (sum_sq / x.len() as f32 + eps).sqrt();
    Zip::from(&mut x)
        .and(w)
        .for_each(|v, &wi| *v = wi * (*v * inv));
}

/// SiLU: `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// SwiGLU gating in place: `gate <- silu(gate) * up`.
///
/// # Shapes
/// - `gate`, `up`: `[T, I]`
pub fn swiglu_inplace(gate: &mut Array2<f32>, up: &Array2<f32>) {
    Zip::from(gate).and(up).for_each(|g, &u| *g = silu(*g) * u);
}

/// Numerically stable softmax of one row, in place: `exp(x - max) / sum(exp(x - max))`.
pub fn softmax_inplace(mut x: ArrayViewMut1<f32>) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Index of the largest value; the first one on ties (like `torch.argmax`). NaN never wins.
pub fn argmax(x: &[f32]) -> usize {
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_abs_diff_eq;
    use ndarray::array;

    #[test]
    fn rms_norm_hand_computed() {
        // mean(x^2) = (9 + 16) / 2 = 12.5; 1/sqrt(12.5) = 0.28284271
        let y = rms_norm(array![[3.0f32, 4.0]].view(), &array![1.0, 2.0], 0.0);
        assert_abs_diff_eq!(y, array![[0.84852814f32, 2.2627417]], epsilon = 1e-6);
        // eps matters for small inputs: x = [0, 0] stays 0, no NaN.
        let z = rms_norm(array![[0.0f32, 0.0]].view(), &array![1.0, 1.0], 1e-5);
        assert_eq!(z, array![[0.0f32, 0.0]]);
    }

    #[test]
    fn silu_and_swiglu_hand_computed() {
        assert_eq!(silu(0.0), 0.0);
        assert_abs_diff_eq!(silu(1.0), 0.7310586, epsilon = 1e-6); // 1 * sigmoid(1)
        assert_abs_diff_eq!(silu(-2.0), -0.23840584, epsilon = 1e-6);
        let mut g = array![[1.0f32, -2.0]];
        swiglu_inplace(&mut g, &array![[2.0f32, 0.5]]);
        assert_abs_diff_eq!(g, array![[1.4621172f32, -0.11920292]], epsilon = 1e-6);
    }

    #[test]
    fn softmax_hand_computed() {
        let mut x = array![1.0f32, 2.0, 3.0];
        softmax_inplace(x.view_mut());
        // e^-2, e^-1, 1 over their sum 1.5032147
        assert_abs_diff_eq!(
            x,
            array![0.09003057f32, 0.24472847, 0.66524096],
            epsilon = 1e-6
        );
        // Large logits do not overflow.
        let mut big = array![1000.0f32, 1000.0];
        softmax_inplace(big.view_mut());
        assert_eq!(big, array![0.5f32, 0.5]);
    }

    #[test]
    fn argmax_takes_first_on_ties() {
        assert_eq!(argmax(&[0.0, 3.0, 3.0, 1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
    }
}
