//! Goldens against other engines (docs/GOLDEN.md): a greedy golden replayed on any
//! [`GreedyBackend`] (an ONNX Runtime deployment), and two golden files compared tensor by tensor
//! (one of them written by a deployment's own harness).

use super::check::token_ids as ids;
use super::m2r2::{
    Against, DraftTies, M2r2Record, compare_graph_outputs, compare_rounds, compare_scores,
    compare_tree_graph_outputs, compare_tree_rounds,
};
use super::record::replay_on;
use super::report::{
    CheckReport, Divergence, StopRules, TensorCheck, Tolerance, compare_int_rows, compare_rows,
    compare_stops,
};
use super::{Golden, shown};
use crate::base::config::ModelConfig;
use crate::base::generate::GreedyBackend;
use crate::error::{Error, Result};
use ndarray::s;

impl Golden {
    /// Replay this greedy golden on `backend`, an engine running the model of `config` (called
    /// `graph` in the report, e.g. `model.onnx`): the prompt, then the **recorded** tokens
    /// (teacher forcing), and compare each step's logits within `tol` and each step's argmax with
    /// the recorded token.
    ///
    /// # Errors
    /// Another model config than recorded; an M2R2 golden (early-exit and speculative goldens need
    /// the engine's M2R2 decoding loop, which this does not drive); an engine error.
    pub fn check_on(
        &self,
        backend: &mut dyn GreedyBackend,
        config: &ModelConfig,
        tol: Tolerance,
        graph: &str,
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
        let (greedy, logits) = self.replay_logits(backend, graph, tol)?;
        Ok(CheckReport {
            entries: vec![
                logits,
                compare_int_rows("tokens", graph, &ids(&self.tokens), &ids(&greedy), 1, true),
            ],
        })
    }

    /// The base model's logits recomputed on `greedy` (called `graph`) along the recorded tokens
    /// (teacher forcing) against the recorded ones, and the tokens greedy decoding chose there.
    ///
    /// # Errors
    /// The engine's.
    pub(in crate::golden) fn replay_logits(
        &self,
        greedy: &mut dyn GreedyBackend,
        graph: &str,
        tol: Tolerance,
    ) -> Result<(Vec<u32>, TensorCheck)> {
        let (chosen, logits) = replay_on(
            greedy,
            self.logits.ncols(),
            &self.prompt_tokens,
            self.tokens.len(),
            Some(&self.tokens),
            &[],
        )?;
        let check = compare_rows("logits", graph, self.logits.view(), logits.view(), tol);
        Ok((chosen, check))
    }

    /// Compare `actual` (for example a deployment's own recording) with this golden, tensor by
    /// tensor: the prompt exactly; the tokens and logits over the steps both recorded, and where
    /// each stopped (`stop`: OK when one stopped at an end-of-turn token where the other, recorded
    /// without stopping, ran on); the M2R2 records (exits and gate scores, or the rounds both
    /// decoded and what the verifier and the draft produced up to the first round that differs)
    /// where both have them.
    /// `text` names tokens in the report.
    ///
    /// # Errors
    /// Goldens of different model configs, modes or M2R2 weights (nothing to compare).
    pub fn compare_to(
        &self,
        actual: &Golden,
        tol: Tolerance,
        text: &dyn Fn(i64) -> Option<String>,
    ) -> Result<CheckReport> {
        if actual.config_hash != self.config_hash {
            return Err(Error::Invalid(format!(
                "the goldens were recorded with different model configs (hash {} of `{}` vs {} of \
                 `{}`)",
                shown(&self.config_hash),
                shown(&self.model),
                shown(&actual.config_hash),
                shown(&actual.model)
            )));
        }
        if actual.mode != self.mode {
            return Err(Error::Invalid(format!(
                "the goldens record different modes (`{}` vs `{}`)",
                self.mode, actual.mode
            )));
        }
        // The header of a comparison names both files; its lines name no graph.
        const ACTUAL: &str = "";
        let mut entries = vec![
            compare_prompts(&self.prompt_tokens, &actual.prompt_tokens),
            compare_int_rows(
                "tokens",
                ACTUAL,
                &ids(&self.tokens),
                &ids(&actual.tokens),
                1,
                true,
            ),
        ];
        // Where the decodes stop: the stop tokens either recorded, else the model's EOS.
        let mut stops: Vec<i64> = ids(self.stops());
        stops.extend(ids(actual.stops()));
        if stops.is_empty() {
            stops = self
                .config()
                .map(|c| ids(&c.eos_token_ids))
                .unwrap_or_default();
        }
        let (longer, shorter) = match self.tokens.len() > actual.tokens.len() {
            true => (self, actual),
            false => (actual, self),
        };
        let rules = StopRules {
            longer_stopped: !longer.stops().is_empty(),
            shorter_budget: shorter.max_steps,
        };
        entries.extend(compare_stops(
            ACTUAL,
            "actual",
            (&ids(&self.tokens), &ids(&actual.tokens)),
            &stops,
            rules,
            text,
        ));
        entries.push(compare_rows(
            "logits",
            ACTUAL,
            self.logits.view(),
            actual.logits.view(),
            tol,
        ));
        if let (Some(want), Some(got)) = (&self.m2r2, &actual.m2r2) {
            if !got.weights.matches(&want.weights) {
                return Err(Error::Invalid(format!(
                    "the goldens were recorded with different M2R2 weights ({} vs {})",
                    want.weights, got.weights
                )));
            }
            // one hash covers one set of settings: other settings under it were edited
            if let Some(differ) = want.settings_differ(got) {
                return Err(Error::Invalid(format!(
                    "the goldens record {differ}; the hash covers the settings, so one of them \
                     was edited after recording"
                )));
            }
            entries.extend(compare_records(&want.record, &got.record, tol)?);
        }
        for e in &mut entries {
            e.against = "actual";
        }
        Ok(CheckReport { entries })
    }
}

/// The `prompt_tokens` line of a comparison, by position (a prompt has no steps). Prompts of
/// other lengths are NOT OK: at the first position where they differ, else at the first one the
/// shorter lacks (`first divergence at position 3: token golden (nothing: ended) vs actual ...`),
/// the lengths in the note.
fn compare_prompts(want: &[u32], got: &[u32]) -> TensorCheck {
    let mut check = compare_int_rows("prompt_tokens", "", &ids(want), &ids(got), 1, true);
    check.row_name = "position";
    if want.len() == got.len() {
        return check;
    }
    let common = want.len().min(got.len());
    let extra = want.len().max(got.len()) - common;
    if check.divergence.is_none() {
        let at = |tokens: &[u32]| ids(&tokens[common..(common + 1).min(tokens.len())]);
        check.first_row = Some(common);
        check.at = vec![common];
        check.divergence = Some(Divergence {
            row: common,
            what: "token".into(),
            golden: at(want),
            recomputed: at(got),
            tokens: true,
        });
    }
    // the positions one prompt has and the other lacks differ too
    check.rows_over += extra;
    check.values_over += extra;
    check.ok = false;
    check.max_abs = 1.0;
    check.note = format!("prompts of {} and {} tokens", want.len(), got.len());
    check
}

fn compare_records(
    want: &M2r2Record,
    got: &M2r2Record,
    tol: Tolerance,
) -> Result<Vec<TensorCheck>> {
    const ACTUAL: &str = "";
    match (want, got) {
        (
            M2r2Record::EarlyExit {
                gate: gate_a,
                threshold: ta,
                kv_policy: pa,
                exit_gate: a,
                gate_scores: sa,
            },
            M2r2Record::EarlyExit {
                gate: gate_b,
                threshold: tb,
                kv_policy: pb,
                exit_gate: b,
                gate_scores: sb,
            },
        ) => {
            if (gate_a, ta, pa) != (gate_b, tb, pb) {
                return Err(Error::Invalid(format!(
                    "the goldens exit by different rules (gate {gate_a} at {ta}, {pa} KV vs gate \
                     {gate_b} at {tb}, {pb} KV)"
                )));
            }
            let common = sa.nrows().min(sb.nrows());
            Ok(vec![
                compare_int_rows("exit_gate", ACTUAL, a, b, 1, false),
                compare_rows(
                    "gate_scores",
                    ACTUAL,
                    sa.slice(s![..common, ..]),
                    sb.slice(s![..common, ..]),
                    tol,
                ),
            ])
        }
        (
            M2r2Record::Speculative {
                draft_gate: da,
                gate: gate_a,
                rounds: a,
                draft_length: la,
                graphs: ga,
            },
            M2r2Record::Speculative {
                draft_gate: db,
                gate: gate_b,
                rounds: b,
                draft_length: lb,
                graphs: gb,
            },
        ) => {
            if da != db {
                return Err(Error::Invalid(format!(
                    "the goldens draft at different gates ({da} vs {db})"
                )));
            }
            if gate_a != gate_b {
                return Err(Error::Invalid(format!(
                    "the goldens score drafts with different gates ({gate_a:?} vs {gate_b:?})"
                )));
            }
            if la != lb {
                return Err(Error::Invalid(format!(
                    "the goldens record different draft lengths ({la:?} vs {lb:?})"
                )));
            }
            // the first file is the golden: its draft logits tell near ties of the draft
            let ties = ga.as_ref().map(|ga| DraftTies {
                draft_logits: &ga.draft_logits,
                tol,
            });
            let rounds = compare_rounds(ACTUAL, a, b, ties.as_ref(), Against::Actual);
            // Rows are comparable up to the first round that differs.
            let same = rounds.first_row.unwrap_or(a.len().min(b.len()));
            let scores = compare_scores(
                ACTUAL,
                &a.scores.slice(s![..same, ..]).to_owned(),
                &b.scores.slice(s![..same, ..]).to_owned(),
                tol,
            );
            let mut entries = vec![rounds, scores];
            match (ga, gb) {
                (Some(ga), Some(gb)) => entries.extend(compare_graph_outputs(
                    (ACTUAL, ACTUAL),
                    ga,
                    gb,
                    a,
                    same,
                    tol,
                )),
                _ => {
                    let why = "not recorded in both files (format version 3 records them)";
                    entries.push(TensorCheck::skipped("verify_logits", ACTUAL, why));
                    entries.push(TensorCheck::skipped("draft_logits", ACTUAL, why));
                }
            }
            Ok(entries)
        }
        (
            M2r2Record::SpeculativeTree {
                recipe: ra,
                rounds: a,
                graphs: ga,
            },
            M2r2Record::SpeculativeTree {
                recipe: rb,
                rounds: b,
                graphs: gb,
            },
        ) => {
            if ra.draft_gate != rb.draft_gate {
                return Err(Error::Invalid(format!(
                    "the goldens draft at different gates ({} vs {})",
                    ra.draft_gate, rb.draft_gate
                )));
            }
            if ra != rb {
                return Err(Error::Invalid(format!(
                    "the goldens draft different token trees ({} vs {})",
                    ra.describe(),
                    rb.describe()
                )));
            }
            let ties = DraftTies {
                draft_logits: &ga.draft_logits,
                tol,
            };
            let rounds = compare_tree_rounds(ACTUAL, a, b, Some(&ties), Against::Actual);
            // Rows are comparable up to the first round that differs.
            let same = rounds.first_row.unwrap_or(a.len().min(b.len()));
            let mut entries = vec![rounds];
            entries.extend(compare_tree_graph_outputs(
                (ACTUAL, ACTUAL),
                ga,
                gb,
                a,
                same,
                tol,
            ));
            if ra.grown.is_some() {
                // the gate scores that grew each round, as wide as the wider file's
                let width = a.scores.ncols().max(b.scores.ncols());
                let widen = |x: &ndarray::Array2<f32>| {
                    let rows = x.nrows().min(same);
                    let mut out = ndarray::Array2::from_elem((rows, width), f32::NAN);
                    out.slice_mut(ndarray::s![.., ..x.ncols()])
                        .assign(&x.slice(ndarray::s![..rows, ..]));
                    out
                };
                entries.push(compare_scores(
                    ACTUAL,
                    &widen(&a.scores),
                    &widen(&b.scores),
                    tol,
                ));
            }
            Ok(entries)
        }
        (M2r2Record::SpeculativeTree { .. }, M2r2Record::Speculative { .. })
        | (M2r2Record::Speculative { .. }, M2r2Record::SpeculativeTree { .. }) => {
            Err(Error::Invalid(
                "one golden drafts a token tree, the other a chain: their rounds are not \
                 comparable"
                    .into(),
            ))
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
            .check_on(
                &mut ReferenceGreedy::new(&model),
                &model.config,
                tol,
                "reference",
            )
            .unwrap();
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.entries[0].max_abs, 0.0);
        assert!(g.compare_to(&g, tol, &|_| None).unwrap().ok());

        // a perturbed copy: logits beyond atol at [2, 9]; within rtol when the logit is large
        let mut other = g.clone();
        let want = g.logits[[2, 9]];
        other.logits[[2, 9]] = want + 0.01;
        let report = g.compare_to(&other, tol, &|_| None).unwrap();
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
        assert!(g.compare_to(&other, loose, &|_| None).unwrap().entries[2].ok);
        // a token that differs: the first step named
        other.tokens[4] = other.tokens[4].wrapping_add(1) % model.config.vocab_size as u32;
        let report = g.compare_to(&other, loose, &|_| None).unwrap();
        assert_eq!(report.entries[1].at, vec![4]);
        assert!(!report.entries[1].ok);

        // prompts that differ: named by position, where they part or where the shorter ended
        let longer = Golden::record_greedy(&model, "tiny", &[1, 2, 3, 4], 6).unwrap();
        let other = Golden::record_greedy(&model, "tiny", &[1, 2, 4], 6).unwrap();
        for (a, b, says) in [
            (
                &g,
                &longer,
                "first divergence at position 3: token golden (nothing: ended) vs actual 4 \
                 (prompts of 3 and 4 tokens)",
            ),
            (
                &longer,
                &g,
                "first divergence at position 3: token golden 4 vs actual (nothing: ended) \
                 (prompts of 4 and 3 tokens)",
            ),
            (
                &g,
                &other,
                "first divergence at position 2: token golden 3 vs actual 4 (2 values equal)",
            ),
        ] {
            let prompt = &a.compare_to(b, tol, &|_| None).unwrap().entries[0];
            assert_eq!(prompt.name, "prompt_tokens");
            assert!(!prompt.ok, "{prompt:?}");
            assert_eq!(prompt.describe(&|_| None), says);
            assert_eq!(prompt.first_failure().unwrap(), says[20..30]);
        }

        // refusals: another model, another mode, an M2R2 golden on another engine
        let moe = builtin::builtin("tiny-moe").unwrap();
        let err = g
            .check_on(
                &mut ReferenceGreedy::new(&moe),
                &moe.config,
                tol,
                "reference",
            )
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not the one this golden was recorded with"),
            "{err}"
        );
        let h = Golden::record_greedy(&moe, "tiny-moe", &[1, 2, 3], 6).unwrap();
        let err = g.compare_to(&h, tol, &|_| None).unwrap_err().to_string();
        assert!(err.contains("different model configs"), "{err}");
        let mut spec = g.clone();
        spec.mode = "speculative".into();
        assert!(
            g.compare_to(&spec, tol, &|_| None)
                .unwrap_err()
                .to_string()
                .contains("different modes")
        );
    }
}
