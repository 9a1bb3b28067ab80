//! Checking a greedy golden: recompute along the recorded tokens and compare tensor by tensor
//! (logits within a tolerance, tokens exactly), and the comparisons the M2R2 modes share.

use super::report::{CheckReport, Tolerance};
use super::{Golden, shown};
use crate::base::config::ModelConfig;
use crate::base::generate::ReferenceGreedy;
use crate::base::model::Model;
use crate::error::{Error, Result};

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
            super::m2r2::REFERENCE,
        )
    }

    /// Refuse a model config that is not the recorded one.
    pub fn check_config(&self, config: &ModelConfig) -> Result<()> {
        if config.hash() != self.config_hash {
            return Err(Error::Invalid(format!(
                "the model's config (hash {}) is not the one this golden was recorded with (hash {}, model `{}`)",
                config.hash(),
                shown(&self.config_hash),
                shown(&self.model)
            )));
        }
        Ok(())
    }
}

/// Token ids as the golden file stores them (I64), for [`compare_ints`].
pub(super) fn token_ids(tokens: &[u32]) -> Vec<i64> {
    tokens.iter().map(|&t| i64::from(t)).collect()
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
