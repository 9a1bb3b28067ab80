//! Finite-difference gradient checks, in the spirit of llm.c's `test_gpt2.c`: every hand-written
//! backward pass is compared with central differences of its forward pass, in `f64`.
//!
//! ```text
//! numeric_i = (L(x + h e_i) - L(x - h e_i)) / 2h
//! ok       <=> |analytic_i - numeric_i| <= atol + rtol * max(|analytic_i|, |numeric_i|)
//! ```

use ndarray::{ArrayD, ArrayViewD};

/// Result of one comparison: the worst coordinate.
#[derive(Clone, Debug)]
pub struct GradReport {
    pub name: String,
    pub max_abs_diff: f64,
    pub worst_index: usize,
    pub analytic: f64,
    pub numeric: f64,
    pub ok: bool,
}

/// Central-difference step for `f64` checks.
pub const STEP: f64 = 1e-5;

/// The numeric gradient of `loss` at `x`, one coordinate at a time.
///
/// # Shapes
/// - `x`: any -> same shape
pub fn numeric_gradient(
    x: ArrayViewD<f64>,
    mut loss: impl FnMut(&ArrayD<f64>) -> f64,
) -> ArrayD<f64> {
    let mut probe = x.to_owned();
    let mut grad = ArrayD::zeros(x.raw_dim());
    for i in 0..x.len() {
        let orig = probe.as_slice().expect("standard layout")[i];
        probe.as_slice_mut().expect("standard layout")[i] = orig + STEP;
        let plus = loss(&probe);
        probe.as_slice_mut().expect("standard layout")[i] = orig - STEP;
        let minus = loss(&probe);
        probe.as_slice_mut().expect("standard layout")[i] = orig;
        grad.as_slice_mut().expect("standard layout")[i] = (plus - minus) / (2.0 * STEP);
    }
    grad
}

/// Compare an analytic gradient with a numeric one; `ok` when every coordinate is within
/// `atol + rtol * max(|a|, |n|)`.
pub fn compare(
    name: &str,
    analytic: ArrayViewD<f64>,
    numeric: ArrayViewD<f64>,
    atol: f64,
    rtol: f64,
) -> GradReport {
    assert_eq!(analytic.shape(), numeric.shape(), "{name}: shapes differ");
    let mut report = GradReport {
        name: name.into(),
        max_abs_diff: 0.0,
        worst_index: 0,
        analytic: 0.0,
        numeric: 0.0,
        ok: true,
    };
    for (i, (&a, &n)) in analytic.iter().zip(numeric.iter()).enumerate() {
        let diff = (a - n).abs();
        if diff > atol + rtol * a.abs().max(n.abs()) {
            report.ok = false;
        }
        if diff > report.max_abs_diff || !diff.is_finite() {
            report.max_abs_diff = diff;
            report.worst_index = i;
            report.analytic = a;
            report.numeric = n;
        }
    }
    report
}

impl std::fmt::Display for GradReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: max |diff| {:.3e} at {} (analytic {:.6e}, numeric {:.6e})",
            if self.ok { "OK" } else { "NOT OK" },
            self.name,
            self.max_abs_diff,
            self.worst_index,
            self.analytic,
            self.numeric
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// d/dx sum(x^3) = 3 x^2, hand-computed.
    #[test]
    fn cubic() {
        let x = array![1.0f64, -2.0, 0.5].into_dyn();
        let numeric = numeric_gradient(x.view(), |p| p.iter().map(|v| v * v * v).sum());
        let analytic = x.mapv(|v| 3.0 * v * v);
        let report = compare("cubic", analytic.view(), numeric.view(), 1e-8, 1e-7);
        assert!(report.ok, "{report}");
        // A wrong gradient is caught.
        let wrong = x.mapv(|v| 3.0 * v * v + 1e-3);
        assert!(!compare("wrong", wrong.view(), numeric.view(), 1e-8, 1e-7).ok);
    }
}
