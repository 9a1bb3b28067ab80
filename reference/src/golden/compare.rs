//! Goldens against other engines (issue 15): a greedy golden replayed on any [`GreedyBackend`]
//! (an ONNX Runtime deployment), and two golden files compared tensor by tensor (one of them
//! written by a deployment's own harness).

use super::Golden;
use super::check::{
    CheckReport, TensorCheck, Tolerance, compare_ints, compare_within, token_ids as ids,
};
use super::m2r2::M2r2Record;
use super::record::replay_on;
use crate::base::config::ModelConfig;
use crate::base::generate::GreedyBackend;
use crate::error::{Error, Result};

impl Golden {
    /// Replay this greedy golden on `backend`, an engine running the model of `config`: the prompt,
    /// then the **recorded** tokens (teacher forcing), and compare each step's logits within `tol`
    /// and each step's argmax with the recorded token.
    ///
    /// # Errors
    /// Another model config than recorded; an M2R2 golden (early-exit and speculative goldens need
    /// the engine's M2R2 decoding loop, which this does not drive); an engine error.
    pub fn check_on(
        &self,
        backend: &mut dyn GreedyBackend,
        config: &ModelConfig,
        tol: Tolerance,
    ) -> Result<CheckReport> {
        if self.m2r2.is_some() {
            return Err(Error::Invalid(format!(
                "this golden records mode `{}`; replaying it on another engine is implemented for \
                 greedy goldens only (record one with `golden write --mode greedy`, or check this \
                 one with the reference)",
                self.mode
            )));
        }
        self.check_config(config)?;
        let (greedy, logits) = replay_on(
            backend,
            self.logits.ncols(),
            &self.prompt_tokens,
            self.tokens.len(),
            Some(&self.tokens),
        )?;
        Ok(CheckReport {
            entries: vec![
                compare_within("logits", self.logits.view(), logits.view(), tol),
                compare_ints("tokens", &ids(&self.tokens), &ids(&greedy), 1),
            ],
        })
    }

    /// Compare `actual` (for example a deployment's own recording) with this golden, tensor by
    /// tensor: the prompt and tokens exactly, logits within `tol`, and the M2R2 records (exits and
    /// gate scores, or rounds) where both have them.
    ///
    /// # Errors
    /// Goldens of different model configs, modes or M2R2 weights (nothing to compare).
    pub fn compare_to(&self, actual: &Golden, tol: Tolerance) -> Result<CheckReport> {
        if actual.config_hash != self.config_hash {
            return Err(Error::Invalid(format!(
                "the goldens were recorded with different model configs (hash {} of `{}` vs {} of \
                 `{}`)",
                self.config_hash, self.model, actual.config_hash, actual.model
            )));
        }
        if actual.mode != self.mode {
            return Err(Error::Invalid(format!(
                "the goldens record different modes (`{}` vs `{}`)",
                self.mode, actual.mode
            )));
        }
        let mut entries = vec![
            compare_ints(
                "prompt_tokens",
                &ids(&self.prompt_tokens),
                &ids(&actual.prompt_tokens),
                1,
            ),
            compare_ints("tokens", &ids(&self.tokens), &ids(&actual.tokens), 1),
            compare_within("logits", self.logits.view(), actual.logits.view(), tol),
        ];
        if let (Some(want), Some(got)) = (&self.m2r2, &actual.m2r2) {
            if want.weights_hash != got.weights_hash {
                return Err(Error::Invalid(format!(
                    "the goldens were recorded with different M2R2 weights (hash {} vs {})",
                    want.weights_hash, got.weights_hash
                )));
            }
            entries.extend(compare_records(&want.record, &got.record, tol)?);
        }
        Ok(CheckReport { entries })
    }
}

fn compare_records(
    want: &M2r2Record,
    got: &M2r2Record,
    tol: Tolerance,
) -> Result<Vec<TensorCheck>> {
    use super::check::compare_padded;
    let tol_abs = tol.atol.max(0.0);
    match (want, got) {
        (
            M2r2Record::EarlyExit {
                exit_gate: a,
                gate_scores: sa,
                ..
            },
            M2r2Record::EarlyExit {
                exit_gate: b,
                gate_scores: sb,
                ..
            },
        ) => Ok(vec![
            compare_ints("exit_gate", a, b, 1),
            compare_padded("gate_scores", sa.view(), sb.view(), tol_abs),
        ]),
        (
            M2r2Record::Speculative {
                rounds: a,
                draft_length: la,
                ..
            },
            M2r2Record::Speculative {
                rounds: b,
                draft_length: lb,
                ..
            },
        ) => {
            if la != lb {
                return Err(Error::Invalid(format!(
                    "the goldens record different draft lengths ({la:?} vs {lb:?})"
                )));
            }
            let cols = a.drafted.ncols();
            let flat = |x: &ndarray::Array2<i64>| x.iter().copied().collect::<Vec<_>>();
            Ok(vec![
                compare_ints("round_drafted", &flat(&a.drafted), &flat(&b.drafted), cols),
                compare_ints("round_accepted", &a.accepted, &b.accepted, 1),
                compare_ints("round_base_token", &a.base_token, &b.base_token, 1),
                compare_padded("round_scores", a.scores.view(), b.scores.view(), tol_abs),
            ])
        }
        _ => Err(Error::Invalid(
            "the goldens record different M2R2 modes".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::generate::ReferenceGreedy;
    use crate::golden::DEFAULT_ATOL;
    use crate::io::builtin;

    #[test]
    fn replayed_on_a_backend_and_compared_file_to_file() {
        let model = builtin::builtin("tiny").unwrap();
        let g = Golden::record_greedy(&model, "tiny", &[1, 2, 3], 6).unwrap();
        let tol = Tolerance::absolute(DEFAULT_ATOL);
        // the reference as "another engine": bit for bit
        let report = g
            .check_on(&mut ReferenceGreedy::new(&model), &model.config, tol)
            .unwrap();
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.entries[0].max_abs, 0.0);
        assert!(g.compare_to(&g, tol).unwrap().ok());

        // a perturbed copy: logits beyond atol at [2, 9]; within rtol when the logit is large
        let mut other = g.clone();
        let want = g.logits[[2, 9]];
        other.logits[[2, 9]] = want + 0.01;
        let report = g.compare_to(&other, tol).unwrap();
        assert!(!report.ok());
        let logits = &report.entries[2];
        assert_eq!(
            (logits.name.as_str(), logits.at.clone()),
            ("logits", vec![2, 9])
        );
        let loose = Tolerance {
            atol: 0.0,
            rtol: 0.011 / want.abs().max(1e-3),
        };
        assert!(g.compare_to(&other, loose).unwrap().entries[2].ok);
        // a token that differs: the first step named
        other.tokens[4] = other.tokens[4].wrapping_add(1) % model.config.vocab_size as u32;
        let report = g.compare_to(&other, loose).unwrap();
        assert_eq!(report.entries[1].at, vec![4]);
        assert!(!report.entries[1].ok);

        // refusals: another model, another mode, an M2R2 golden on another engine
        let moe = builtin::builtin("tiny-moe").unwrap();
        let err = g
            .check_on(&mut ReferenceGreedy::new(&moe), &moe.config, tol)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not the one this golden was recorded with"),
            "{err}"
        );
        let h = Golden::record_greedy(&moe, "tiny-moe", &[1, 2, 3], 6).unwrap();
        let err = g.compare_to(&h, tol).unwrap_err().to_string();
        assert!(err.contains("different model configs"), "{err}");
        let mut spec = g.clone();
        spec.mode = "speculative".into();
        assert!(
            g.compare_to(&spec, tol)
                .unwrap_err()
                .to_string()
                .contains("different modes")
        );
    }

    #[test]
    fn tolerance_follows_onnx_runtimes_convention() {
        let t = Tolerance {
            atol: 1e-3,
            rtol: 1e-2,
        };
        // |got - want| <= atol + rtol |want|
        assert!(t.excess(100.0, 101.0) <= 1.0); // 1 <= 0.001 + 1
        assert!(t.excess(100.0, 101.1) > 1.0);
        assert!(t.excess(0.0, 0.0009) <= 1.0);
        assert!(t.excess(0.0, 0.0011) > 1.0);
        assert_eq!(t.excess(1.0, f32::NAN), f32::INFINITY);
        let exact = Tolerance::absolute(0.0);
        assert_eq!(exact.excess(2.0, 2.0), 0.0);
        assert_eq!(exact.excess(2.0, 2.0 + 1e-6), f32::INFINITY);
    }
}
