//! Exit gates (docs/m2r2/arla.md): one score per token at gate `g`, one threshold rule for all
//! kinds: exit when `score >= threshold`.
//!
//! | kind         | score                                   | needs               |
//! |--------------|-----------------------------------------|---------------------|
//! | `arla`       | ARLA's `p_exit` from `u_1..u_g`          | ARLA weights        |
//! | `confidence` | `max_v softmax(logits)_v` (CALM-style)   | the exit logits     |
//! | `entropy`    | `1 - H(softmax(logits)) / ln V`          | the exit logits     |
//!
//! The entropy score is normalised \[ours\] so that, like the others, it lies in `[0, 1]` and higher
//! means more confident: 1 for a one-hot distribution, 0 for the uniform one.

use crate::error::{Error, Result};
use crate::m2r2::arla::Arla;
use ndarray::ArrayView1;
use std::fmt;
use std::str::FromStr;

/// Which score decides early exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateKind {
    /// ARLA's `p_exit` (`m2r2/arla.rs`).
    Arla,
    /// Max softmax probability of the exit logits.
    Confidence,
    /// One minus the normalised entropy of the exit logits.
    Entropy,
}

impl GateKind {
    pub const ALL: [GateKind; 3] = [GateKind::Arla, GateKind::Confidence, GateKind::Entropy];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            GateKind::Arla => "arla",
            GateKind::Confidence => "confidence",
            GateKind::Entropy => "entropy",
        }
    }
}

impl fmt::Display for GateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GateKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        GateKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "unknown gate `{s}` (expected one of: arla, confidence, entropy)"
                ))
            })
    }
}

/// In `m2r2_config.json` a gate kind is its name (`arla`, `confidence`, `entropy`).
impl serde::Serialize for GateKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for GateKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// The exit rule shared by every gate kind: exit when `score >= threshold`.
pub fn should_exit(score: f32, threshold: f32) -> bool {
    score >= threshold
}

/// The gate score of one token at gate `g = exit_states.len()`.
///
/// - `Arla`: [`Arla::exit_prob`] of `exit_states` (`u_1..u_g`, the fast exit states) with `eps`
///   the model's `rms_norm_eps`; `exit_logits` is not used.
/// - `Confidence`: `max_v p_v` with `p = softmax(exit_logits)`; `exit_states` only gives `g`.
/// - `Entropy`: `1 - H(p) / ln V`, `H(p) = -sum_v p_v ln p_v` (1 when `V = 1`).
///
/// # Shapes
/// - `exit_states`: `g` views of `[D]`, `exit_logits`: `[V]` (the logits at gate `g`)
///
/// # Errors
/// `Arla` without ARLA weights; `g` outside `1..=J`, or states not of length `D` (ARLA);
/// empty or NaN exit logits (confidence, entropy).
pub fn gate_score(
    kind: GateKind,
    arla: Option<&Arla>,
    exit_states: &[ArrayView1<f32>],
    exit_logits: &[f32],
    eps: f32,
) -> Result<f32> {
    match kind {
        GateKind::Arla => {
            let arla = arla.ok_or_else(|| {
                Error::Invalid(
                    "gate `arla` needs ARLA weights (arla.safetensors in the M2R2 weights \
                     folder), and none are loaded; use --gate confidence or --gate entropy, or \
                     create them with `m2r2 init-m2r2`"
                        .into(),
                )
            })?;
            let g = exit_states.len();
            if g == 0 || g > arla.n_gates() {
                return Err(Error::Invalid(format!(
                    "ARLA called with {g} exit states; its gates are 1..={}",
                    arla.n_gates()
                )));
            }
            if let Some(u) = exit_states.iter().find(|u| u.len() != arla.d_model()) {
                return Err(Error::Invalid(format!(
                    "ARLA exit state has length {}, expected the hidden size {}",
                    u.len(),
                    arla.d_model()
                )));
            }
            Ok(arla.exit_prob(exit_states, eps))
        }
        GateKind::Confidence => {
            let (_, sum) = softmax_stats(exit_logits)?;
            // p_max = exp(max - max) / sum
            Ok(1.0 / sum)
        }
        GateKind::Entropy => {
            let (max, sum) = softmax_stats(exit_logits)?;
            let v = exit_logits.len();
            if v == 1 {
                return Ok(1.0);
            }
            // ln p_v = x_v - max - ln(sum); H = -sum_v p_v ln p_v. Zero probabilities add nothing.
            let ln_sum = sum.ln();
            let mut h = 0.0f32;
            for &x in exit_logits {
                let ln_p = x - max - ln_sum;
                let p = ln_p.exp();
                if p > 0.0 {
                    h -= p * ln_p;
                }
            }
            Ok((1.0 - h / (v as f32).ln()).clamp(0.0, 1.0))
        }
    }
}

/// `(max_v x_v, sum_v exp(x_v - max))` of the logits, refusing empty or NaN logits.
fn softmax_stats(logits: &[f32]) -> Result<(f32, f32)> {
    if logits.is_empty() {
        return Err(Error::Invalid("exit logits are empty".into()));
    }
    if logits.iter().any(|x| x.is_nan()) {
        return Err(Error::Invalid("exit logits contain NaN".into()));
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Err(Error::Invalid("exit logits are all -inf".into()));
    }
    let sum = logits.iter().map(|&x| (x - max).exp()).sum();
    Ok((max, sum))
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_abs_diff_eq;
    use ndarray::{Array1, array};

    fn score(kind: GateKind, logits: &[f32]) -> f32 {
        gate_score(kind, None, &[], logits, 1e-5).unwrap()
    }

    #[test]
    fn names_round_trip() {
        for k in GateKind::ALL {
            assert_eq!(k.to_string().parse::<GateKind>().unwrap(), k);
        }
        let err = "calm".parse::<GateKind>().unwrap_err().to_string();
        assert!(
            err.contains("unknown gate `calm`") && err.contains("entropy"),
            "{err}"
        );
    }

    #[test]
    fn confidence_hand_computed() {
        // softmax([1, 2, 3]) = [0.0900306, 0.2447285, 0.6652410]
        assert_abs_diff_eq!(
            score(GateKind::Confidence, &[1.0, 2.0, 3.0]),
            0.665_241,
            epsilon = 1e-6
        );
        assert_eq!(score(GateKind::Confidence, &[5.0, 5.0]), 0.5);
        assert_eq!(score(GateKind::Confidence, &[1000.0, 0.0]), 1.0);
    }

    #[test]
    fn entropy_hand_computed() {
        // Uniform over 4: H = ln 4 -> score 0. One-hot (in f32): H = 0 -> score 1.
        assert_abs_diff_eq!(score(GateKind::Entropy, &[0.0; 4]), 0.0, epsilon = 1e-6);
        assert_eq!(
            score(GateKind::Entropy, &[0.0, -1000.0, f32::NEG_INFINITY]),
            1.0
        );
        // p = softmax([0, ln 3]) = [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351;
        // / ln 2 = 0.8112781; score = 0.1887219.
        let s = score(GateKind::Entropy, &[0.0, 3.0f32.ln()]);
        assert_abs_diff_eq!(s, 0.188_721_9, epsilon = 1e-5);
        assert_eq!(score(GateKind::Entropy, &[2.0]), 1.0);
    }

    #[test]
    fn arla_kind_needs_weights_and_checks_inputs() {
        let u = array![1.0f32, 2.0];
        let err = gate_score(GateKind::Arla, None, &[u.view()], &[0.0], 1e-5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs ARLA weights"), "{err}");

        let arla = Arla::random(2, 2, 3, 0);
        let p = gate_score(GateKind::Arla, Some(&arla), &[u.view()], &[], 1e-5).unwrap();
        assert_eq!(p, arla.exit_prob(&[u.view()], 1e-5));
        let err = gate_score(GateKind::Arla, Some(&arla), &[u.view(); 3], &[], 1e-5)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("3 exit states") && err.contains("1..=2"),
            "{err}"
        );
        let long = Array1::<f32>::zeros(5);
        let err = gate_score(GateKind::Arla, Some(&arla), &[long.view()], &[], 1e-5)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("length 5, expected the hidden size 2"),
            "{err}"
        );
    }

    #[test]
    fn bad_logits_are_errors() {
        for (logits, want) in [
            (vec![], "empty"),
            (vec![1.0, f32::NAN], "NaN"),
            (vec![f32::NEG_INFINITY], "all -inf"),
        ] {
            for kind in [GateKind::Confidence, GateKind::Entropy] {
                let err = gate_score(kind, None, &[], &logits, 0.0)
                    .unwrap_err()
                    .to_string();
                assert!(err.contains(want), "{err}");
            }
        }
    }

    #[test]
    fn threshold_rule() {
        assert!(should_exit(0.5, 0.5));
        assert!(!should_exit(0.49, 0.5));
        assert!(!should_exit(1.0, 1.01)); // a threshold above 1 never fires
    }
}
