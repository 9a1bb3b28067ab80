//! How close a recomputed value must be to the golden's: [`Tolerance`], absolute and relative.

use crate::error::{Error, Result};

/// How close two values must be: `|got - want| <= atol + rtol * |want|`, ONNX Runtime's (and
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

    /// Check one bound, `atol` or `rtol`, named `name` in the message: a finite number `>= 0`.
    /// The one rule for the command line's `--atol` / `--rtol` and a golden file's pinned ones.
    pub fn check_bound(name: &str, x: f32) -> Result<()> {
        if x.is_finite() && x >= 0.0 {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{name} must be a finite number >= 0, got {x}"
            )))
        }
    }

    /// How far `got` is past what is allowed around `want`, as a multiple of the allowance (`<= 1`:
    /// within; a NaN in one of them only is infinitely far).
    pub(in crate::golden) fn excess(&self, want: f32, got: f32) -> f32 {
        if want == got || (want.is_nan() && got.is_nan()) {
            // equal infinities too (a pruned draft head's -inf outside its tokens), and NaN where
            // the other is NaN (a value not evaluated, or the same fault reproduced)
            return 0.0;
        }
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

    /// `atol 1e-4`, or `atol 1e-4 rtol 1e-2`.
    pub fn describe(&self) -> String {
        if self.rtol == 0.0 {
            format!("atol {:e}", self.atol)
        } else {
            format!("atol {:e} rtol {:e}", self.atol, self.rtol)
        }
    }
}
