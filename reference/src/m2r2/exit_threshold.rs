//! Early exit's threshold tau (docs/m2r2/early_exit.md): one shared by every gate, or one per gate
//! \[ours\]. A token exits at the first gate `g` whose score is `>= tau_g`
//! ([`should_exit`](crate::m2r2::exit_gate::should_exit)); a threshold above 1 closes a gate.
//!
//! Why per gate: calibration keeps the thresholds with the fewest layers per token at a target
//! agreement. With one shared threshold, the gate that is most often confidently wrong sets it for
//! all; a shallow draft gate (2 of 30 layers) is such a gate, and pushed SmolLM2's shared ARLA
//! threshold over 1. Per gate, that gate alone can be closed while the others exit (`m2r2
//! train-arla` calibrates both and writes the per-gate thresholds of the best gate kind as the
//! M2R2 config's `early_exit`).
//!
//! In text (`--threshold`, golden metadata) a shared threshold is one number (`0.5`) and per-gate
//! thresholds are one number per gate, comma-separated (`1.01,0.6,0.5,0.5`); with one gate the
//! two are the same text and the same rule.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;

/// tau of early exit.
#[derive(Clone, Debug, PartialEq)]
pub enum ExitThreshold {
    /// The same threshold at every gate.
    Shared(f32),
    /// `tau_g` of gate `g` at index `g - 1`; as many as the M2R2 config has gates.
    PerGate(Vec<f32>),
}

impl ExitThreshold {
    /// The threshold of gate `g` (1-based).
    ///
    /// # Panics
    /// Per-gate thresholds without gate `g` ([`check`](Self::check) rules that out).
    pub fn at(&self, g: usize) -> f32 {
        match self {
            ExitThreshold::Shared(t) => *t,
            ExitThreshold::PerGate(t) => t[g - 1],
        }
    }

    /// Every threshold finite, and per-gate thresholds one per gate of a config with `num_gates`;
    /// `named` says where they came from (`--threshold`, `early_exit.thresholds`).
    pub fn check(&self, num_gates: usize, named: &str) -> Result<()> {
        let values: &[f32] = match self {
            ExitThreshold::Shared(t) => std::slice::from_ref(t),
            ExitThreshold::PerGate(t) => t,
        };
        if let Some(bad) = values.iter().find(|t| !t.is_finite()) {
            return Err(Error::Invalid(format!(
                "{named} must be finite numbers, got {bad}"
            )));
        }
        if let ExitThreshold::PerGate(t) = self
            && t.len() != num_gates
        {
            return Err(Error::Invalid(format!(
                "{named} has {} thresholds ({self}) for {num_gates} exit gates: give one per gate, \
                 or one number for all",
                t.len()
            )));
        }
        Ok(())
    }
}

impl From<f32> for ExitThreshold {
    fn from(t: f32) -> Self {
        ExitThreshold::Shared(t)
    }
}

/// f32's Display is the shortest text that parses back to the same value, so this round-trips.
impl fmt::Display for ExitThreshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitThreshold::Shared(t) => write!(f, "{t}"),
            ExitThreshold::PerGate(t) => {
                let text: Vec<String> = t.iter().map(f32::to_string).collect();
                f.write_str(&text.join(","))
            }
        }
    }
}

impl FromStr for ExitThreshold {
    type Err = Error;

    /// `0.5` (shared) or `1.01,0.6,0.5` (per gate). The count and finiteness are
    /// [`check`](Self::check)'s, which knows the gates.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::Invalid(format!(
                "threshold `{s}` is not a number or a comma-separated list of numbers (one per gate)"
            ))
        };
        let values: Vec<f32> = s
            .split(',')
            .map(|v| v.trim().parse::<f32>().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        Ok(match (s.contains(','), values.as_slice()) {
            (false, [t]) => ExitThreshold::Shared(*t),
            _ => ExitThreshold::PerGate(values),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_and_per_gate_thresholds() {
        let shared: ExitThreshold = "0.5".parse().unwrap();
        assert_eq!(shared, ExitThreshold::Shared(0.5));
        assert_eq!((shared.at(1), shared.at(4)), (0.5, 0.5));
        let per_gate: ExitThreshold = "1.01, 0.6,0.5".parse().unwrap();
        assert_eq!(per_gate, ExitThreshold::PerGate(vec![1.01, 0.6, 0.5]));
        assert_eq!((per_gate.at(1), per_gate.at(3)), (1.01, 0.5));
        // text round trip; one gate's own threshold reads back as shared, which means the same
        for t in [shared, per_gate] {
            assert_eq!(t.to_string().parse::<ExitThreshold>().unwrap(), t);
        }
        let one = ExitThreshold::PerGate(vec![0.1]).to_string();
        assert_eq!(
            one.parse::<ExitThreshold>().unwrap(),
            ExitThreshold::Shared(0.1)
        );
        assert_eq!(ExitThreshold::from(0.25), ExitThreshold::Shared(0.25));
    }

    #[test]
    fn bad_thresholds_are_named_errors() {
        for text in ["", "x", "0.5,", "0.5;0.6"] {
            let err = text.parse::<ExitThreshold>().unwrap_err().to_string();
            assert!(err.contains(&format!("threshold `{text}`")), "{err}");
        }
        let three = ExitThreshold::PerGate(vec![1.0, 0.5, 0.5]);
        three.check(3, "--threshold").unwrap();
        let err = three.check(4, "--threshold").unwrap_err().to_string();
        assert!(
            err.contains("--threshold has 3 thresholds (1,0.5,0.5) for 4 exit gates"),
            "{err}"
        );
        let err = ExitThreshold::PerGate(vec![0.5, f32::NAN])
            .check(2, "early_exit.thresholds")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("early_exit.thresholds must be finite"),
            "{err}"
        );
        ExitThreshold::Shared(f32::INFINITY)
            .check(2, "--threshold")
            .unwrap_err();
    }
}
