//! Checking a greedy golden: recompute along the recorded tokens and compare tensor by tensor
//! (logits within a tolerance, tokens exactly), and the comparisons the M2R2 modes share.

use super::Golden;
use crate::base::config::ModelConfig;
use crate::base::generate::ReferenceGreedy;
use crate::base::model::Model;
use crate::error::{Error, Result};
use ndarray::ArrayView2;

impl Golden {
    /// Recompute this greedy golden with `model` along the recorded tokens and compare tensor by
    /// tensor. M2R2 modes need the M2R2 weights: see [`Golden::check_m2r2`].
    pub fn check(&self, model: &Model, atol: f32) -> Result<CheckReport> {
        if self.m2r2.is_some() {
            return Err(Error::Invalid(format!(
                "this golden records mode `{}`: checking it needs the M2R2 weights (check_m2r2)",
                self.mode
            )));
        }
        self.check_on(
            &mut ReferenceGreedy::new(model),
            &model.config,
            Tolerance::absolute(atol),
        )
    }

    /// Refuse a model config that is not the recorded one.
    pub(super) fn check_config(&self, config: &ModelConfig) -> Result<()> {
        if config.hash() != self.config_hash {
            return Err(Error::Invalid(format!(
                "the model's config (hash {}) is not the one this golden was recorded with (hash {}, model `{}`)",
                config.hash(),
                self.config_hash,
                self.model
            )));
        }
        Ok(())
    }
}

/// Token ids as the golden file stores them (I64), for [`compare_ints`].
pub(super) fn token_ids(tokens: &[u32]) -> Vec<i64> {
    tokens.iter().map(|&t| i64::from(t)).collect()
}

/// The result of comparing one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCheck {
    pub name: String,
    pub ok: bool,
    pub max_abs: f32,
    pub max_rel: f32,
    /// Index of the largest absolute difference (or of the first mismatching token).
    pub at: Vec<usize>,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    pub entries: Vec<TensorCheck>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.entries.iter().all(|e| e.ok)
    }
}

/// How close two logits must be: `|got - want| <= atol + rtol * |want|`, ONNX Runtime's (and
/// numpy's `allclose`) convention with the golden as the reference value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub atol: f32,
    pub rtol: f32,
}

impl Tolerance {
    /// An absolute tolerance alone.
    pub fn absolute(atol: f32) -> Self {
        Tolerance { atol, rtol: 0.0 }
    }

    /// How far `got` is past what is allowed around `want`, as a multiple of the allowance (`<= 1`:
    /// within; NaN anywhere is infinitely far).
    pub(super) fn excess(&self, want: f32, got: f32) -> f32 {
        let diff = (want - got).abs();
        if diff.is_nan() {
            return f32::INFINITY;
        }
        let allowed = self.atol + self.rtol * want.abs();
        if allowed > 0.0 {
            diff / allowed
        } else if diff == 0.0 {
            0.0
        } else {
            f32::INFINITY
        }
    }

    fn describe(&self) -> String {
        if self.rtol == 0.0 {
            format!("atol {:e}", self.atol)
        } else {
            format!("atol {:e} rtol {:e}", self.atol, self.rtol)
        }
    }
}

/// Compare two tensors elementwise: OK when every `|a - b| <= atol`.
pub fn compare(name: &str, want: ArrayView2<f32>, got: ArrayView2<f32>, atol: f32) -> TensorCheck {
    compare_within(name, want, got, Tolerance::absolute(atol))
}

/// Compare two tensors elementwise within `tol`; `at` is the worst element (the largest
/// difference relative to what `tol` allows there; with `rtol = 0` the largest difference).
pub fn compare_within(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    tol: Tolerance,
) -> TensorCheck {
    if want.shape() != got.shape() {
        return TensorCheck {
            name: name.into(),
            ok: false,
            max_abs: f32::INFINITY,
            max_rel: f32::INFINITY,
            at: vec![],
            note: format!("shape {:?} vs {:?}", want.shape(), got.shape()),
        };
    }
    let (mut max_abs, mut max_rel, mut worst, mut at) = (0.0f32, 0.0f32, 0.0f32, vec![0, 0]);
    for ((idx, &w), &g) in want.indexed_iter().zip(got.iter()) {
        let diff = (w - g).abs();
        // NaN anywhere is a mismatch.
        let diff = if diff.is_nan() { f32::INFINITY } else { diff };
        let excess = tol.excess(w, g);
        if excess > worst || (excess == worst && diff > max_abs && tol.rtol == 0.0) {
            worst = excess;
            at = vec![idx.0, idx.1];
        }
        max_abs = max_abs.max(diff);
        max_rel = max_rel.max(diff / w.abs().max(1e-6));
    }
    TensorCheck {
        name: name.into(),
        ok: worst <= 1.0,
        max_abs,
        max_rel,
        at,
        note: tol.describe(),
    }
}

/// Compare two integer tensors exactly; `at` is the first index that differs (row-major, in
/// `shape` of the recorded tensor) or where one tensor ends.
///
/// # Shapes
/// - `want`, `got`: flat, row-major with rows of `cols` (`cols = 1` for a vector)
pub fn compare_ints(name: &str, want: &[i64], got: &[i64], cols: usize) -> TensorCheck {
    let cols = cols.max(1);
    let first = want
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .or_else(|| (want.len() != got.len()).then_some(want.len().min(got.len())));
    let index = |i: usize| {
        if cols == 1 {
            vec![i]
        } else {
            vec![i / cols, i % cols]
        }
    };
    TensorCheck {
        name: name.into(),
        ok: first.is_none(),
        max_abs: first.map_or(0.0, |_| 1.0),
        max_rel: 0.0,
        at: first.map_or(vec![], index),
        note: match first {
            None => format!("{} values equal", want.len()),
            Some(i) => format!(
                "at {:?}: golden {} vs recomputed {}",
                index(i),
                want.get(i).map_or("(end)".into(), |v| v.to_string()),
                got.get(i).map_or("(end)".into(), |v| v.to_string())
            ),
        },
    }
}

/// [`compare`] for NaN-padded tensors (gate scores): NaN in both is equal (not evaluated), NaN in
/// one only is a mismatch.
pub fn compare_padded(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    atol: f32,
) -> TensorCheck {
    let same_padding =
        want.shape() == got.shape() && want.iter().zip(got).all(|(a, b)| a.is_nan() == b.is_nan());
    if !same_padding {
        return compare(name, want, got, atol);
    }
    let zero = |a: ArrayView2<f32>| a.mapv(|v| if v.is_nan() { 0.0 } else { v });
    compare(name, zero(want).view(), zero(got).view(), atol)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::DEFAULT_ATOL;
    use crate::io::builtin;

    #[test]
    fn round_trip_and_self_check() {
        let model = builtin::builtin("tiny").unwrap();
        let g = Golden::record_greedy(&model, "tiny", &[1, 2, 3], 5).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        g.write(&path).unwrap();
        let back = Golden::read(&path).unwrap();
        assert_eq!(back, g);
        assert_eq!(back.config().unwrap(), model.config);
        let report = back.check(&model, DEFAULT_ATOL).unwrap();
        assert!(report.ok(), "{report:?}");
        assert_eq!(
            report.entries[0].max_abs, 0.0,
            "the reference reproduces itself bit for bit"
        );
    }

    #[test]
    fn perturbed_logits_are_reported_where_they_differ() {
        let model = builtin::builtin("tiny").unwrap();
        let mut g = Golden::record_greedy(&model, "tiny", &[5, 6], 3).unwrap();
        g.logits[[1, 7]] += 0.01;
        let report = g.check(&model, DEFAULT_ATOL).unwrap();
        assert!(!report.ok());
        let logits = &report.entries[0];
        assert_eq!(logits.at, vec![1, 7]);
        assert!((logits.max_abs - 0.01).abs() < 1e-4, "{logits:?}");
    }

    #[test]
    fn another_model_is_refused() {
        let tiny = builtin::builtin("tiny").unwrap();
        let moe = builtin::builtin("tiny-moe").unwrap();
        let g = Golden::record_greedy(&tiny, "tiny", &[1], 2).unwrap();
        let err = g.check(&moe, DEFAULT_ATOL).unwrap_err().to_string();
        assert!(
            err.contains("not the one this golden was recorded with"),
            "{err}"
        );
    }
}
