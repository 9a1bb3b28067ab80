//! The early-stopping record a checkpoint keeps (`train --val-data`): every evaluation so far on
//! which validation data, with which interval and patience, so that a resumed run restores the
//! best loss and the evaluations without improvement by replaying them through [`EarlyStop`], and
//! goes on exactly as an uninterrupted run.

use crate::checkpoint::data_digest;
use crate::data::DistillSample;
use crate::early_stop::{EarlyStop, Observation};
use serde::{Deserialize, Serialize};

/// Early stopping so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidationRecord {
    /// SHA-256 of the validation data (as `data_sha256` of the training data): the record holds
    /// only on the same data.
    pub data_sha256: String,
    /// Steps between evaluations.
    pub eval_every: usize,
    /// Evaluations without a lower loss that stop training.
    pub patience: usize,
    /// Every evaluation so far, in order.
    pub evaluations: Vec<Evaluation>,
}

/// One evaluation: the row-weighted mean KL over the trained gates after `step` steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub step: usize,
    /// Stored as text in Rust's shortest round-trip form, read back bit for bit (a JSON number
    /// is read back to within an ulp, which could turn a tie into an improvement).
    #[serde(with = "exact_f64")]
    pub mean_kl: f64,
}

impl ValidationRecord {
    /// No evaluation yet on `data`.
    pub fn new(data: &[DistillSample], eval_every: usize, patience: usize) -> Self {
        ValidationRecord {
            data_sha256: data_digest(data),
            eval_every,
            patience,
            evaluations: Vec::new(),
        }
    }

    /// Whether the record was made on `data`.
    pub fn is_on(&self, data: &[DistillSample]) -> bool {
        self.data_sha256 == data_digest(data)
    }

    /// The early-stopping state after the recorded evaluations, with the record's patience, and
    /// what the last evaluation meant (`None` before the first).
    pub fn early_stop(&self) -> (EarlyStop, Option<Observation>) {
        let mut early = EarlyStop::new(self.patience);
        let mut last = None;
        for e in &self.evaluations {
            last = Some(early.observe(e.step, e.mean_kl));
        }
        (early, last)
    }

    /// Record an evaluation and pass it to `early`.
    pub fn observe(&mut self, early: &mut EarlyStop, step: usize, mean_kl: f64) -> Observation {
        self.evaluations.push(Evaluation { step, mean_kl });
        early.observe(step, mean_kl)
    }
}

/// An `f64` as the text of its shortest round-trip form (`NaN`, `inf` included).
mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&x.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map_err(|_| D::Error::custom(format!("`{text}` is not a number")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record passes through JSON bit for bit, and its replay is the state of the evaluations
    /// observed one by one.
    #[test]
    fn replay_restores_early_stopping() {
        let mut record = ValidationRecord {
            data_sha256: "x".into(),
            eval_every: 2,
            patience: 3,
            evaluations: Vec::new(),
        };
        let mut early = EarlyStop::new(3);
        let losses = [0.1f64 + 0.2, 0.25, 1.0 / 3.0, f64::NAN, 0.26];
        for (i, &kl) in losses.iter().enumerate() {
            record.observe(&mut early, 2 * (i + 1), kl);
        }
        let text = serde_json::to_string(&record).unwrap();
        let back: ValidationRecord = serde_json::from_str(&text).unwrap();
        for (a, b) in back.evaluations.iter().zip(&record.evaluations) {
            assert_eq!(a.mean_kl.to_bits(), b.mean_kl.to_bits(), "{text}");
        }
        let (replayed, last) = back.early_stop();
        assert_eq!(replayed, early);
        assert_eq!(replayed.best(), Some((4, 0.25)));
        assert_eq!(last, Some(Observation::Stop));
    }
}
