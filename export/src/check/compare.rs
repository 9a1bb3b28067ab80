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
    /// Which side holds a NaN or an infinite value, if one does ("the ONNX Runtime output", "the
    /// reference" or both): the row then fails whatever its differences say, since NaN minus NaN
    /// is no difference and an infinite `max_abs_ref` makes the tolerance infinite.
    pub non_finite: Option<&'static str>,
}

impl Comparison {
    pub fn ok(&self) -> bool {
        self.non_finite.is_none() && self.max_abs_diff <= self.tolerance * self.max_abs_ref.max(1.0)
    }
}

pub(super) fn compare(
    graph: &str,
    tensor: &str,
    onnx: &ArrayD<f32>,
    reference: &ArrayD<f32>,
) -> Comparison {
    let max_abs_diff = if onnx.shape() == reference.shape() {
        max_abs(onnx.iter().zip(reference.iter()).map(|(a, b)| a - b))
    } else {
        f32::INFINITY
    };
    Comparison {
        graph: graph.into(),
        tensor: format!("{tensor} {:?}", reference.shape()),
        max_abs_diff,
        max_abs_ref: max_abs(reference.iter().copied()),
        tolerance: TOLERANCE,
        non_finite: non_finite(onnx, reference),
    }
}

/// The largest `|x|`, NaN as soon as one `x` is NaN (`f32::max` would drop it for any number
/// that follows).
fn max_abs(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(0.0f32, |m, x| {
        if m.is_nan() || x.is_nan() {
            f32::NAN
        } else {
            m.max(x.abs())
        }
    })
}

/// Which of the two compared tensors holds a NaN or an infinite value, if any.
fn non_finite(onnx: &ArrayD<f32>, reference: &ArrayD<f32>) -> Option<&'static str> {
    let bad = |a: &ArrayD<f32>| a.iter().any(|v| !v.is_finite());
    match (bad(onnx), bad(reference)) {
        (false, false) => None,
        (true, false) => Some("the ONNX Runtime output"),
        (false, true) => Some("the reference"),
        (true, true) => Some("the ONNX Runtime output and the reference"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &[f32]) -> ArrayD<f32> {
        ndarray::arr1(values).into_dyn()
    }

    #[test]
    fn a_nan_in_the_middle_is_kept_and_fails() {
        let row = compare(
            "model.onnx",
            "logits",
            &tensor(&[1.0, f32::NAN, 3.0]),
            &tensor(&[1.0, 2.0, 3.5]),
        );
        assert!(row.max_abs_diff.is_nan(), "{row:?}");
        assert_eq!(row.non_finite, Some("the ONNX Runtime output"));
        assert!(!row.ok());
    }

    #[test]
    fn an_infinite_reference_fails_whatever_the_tolerance() {
        let inf = tensor(&[1.0, f32::INFINITY]);
        let row = compare("model.onnx", "logits", &tensor(&[1.0, 2.0]), &inf);
        assert_eq!(row.non_finite, Some("the reference"));
        assert!(!row.ok(), "{row:?}");
        let both = compare("model.onnx", "logits", &inf, &inf);
        assert_eq!(
            both.non_finite,
            Some("the ONNX Runtime output and the reference")
        );
        assert!(!both.ok());
        let finite = compare(
            "model.onnx",
            "logits",
            &tensor(&[1.0, 2.0]),
            &tensor(&[1.0, 2.0]),
        );
        assert!(finite.ok() && finite.non_finite.is_none(), "{finite:?}");
    }
}
