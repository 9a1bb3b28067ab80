//! One compared tensor ([`Comparison`]) and the reference's tensors laid out as the graphs' (a
//! batch of one, the cache as `[1, Hkv, S, Dh]`).

use super::TOLERANCE;
use ndarray::{Array4, ArrayD, ArrayView2, Axis};

/// One compared tensor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    pub graph: String,
    pub tensor: String,
    pub max_abs_diff: f32,
    pub max_abs_ref: f32,
    /// It passes when `max_abs_diff <= tolerance * max(1, max_abs_ref)`.
    pub tolerance: f32,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.max_abs_diff <= self.tolerance * self.max_abs_ref.max(1.0)
    }
}

pub(super) fn compare(
    graph: &str,
    tensor: &str,
    onnx: &ArrayD<f32>,
    reference: &ArrayD<f32>,
) -> Comparison {
    let max_abs_diff = if onnx.shape() == reference.shape() {
        onnx.iter()
            .zip(reference.iter())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, |m, d| if d.is_nan() { f32::NAN } else { m.max(d) })
    } else {
        f32::INFINITY
    };
    Comparison {
        graph: graph.into(),
        tensor: format!("{tensor} {:?}", reference.shape()),
        max_abs_diff,
        max_abs_ref: reference.iter().fold(0.0f32, |m, v| m.max(v.abs())),
        tolerance: TOLERANCE,
    }
}

/// `[T, X]` reference rows as a batch of one: `[1, T, X]`.
pub(super) fn batch1(x: ArrayView2<f32>) -> ArrayD<f32> {
    x.to_owned().insert_axis(Axis(0)).into_dyn()
}

/// Cache rows `[S, Hkv*Dh]` as the graphs' `[1, Hkv, S, Dh]`.
pub(super) fn kv_layout(x: ArrayView2<f32>, heads: usize, dh: usize) -> ArrayD<f32> {
    let s = x.nrows();
    let x = x
        .to_owned()
        .into_shape_with_order((s, heads, dh))
        .expect("kv_dim = Hkv*Dh");
    let x: Array4<f32> = x
        .permuted_axes([1, 0, 2])
        .insert_axis(Axis(0))
        .as_standard_layout()
        .to_owned();
    x.into_dyn()
}
