//! Checking the M2R2 modes' goldens: recompute with the recorded settings and compare every recorded
//! tensor (logits and scores within a tolerance, tokens, exits and rounds exactly).

use super::record::{early_exit_logits, golden_early_exit_options, run_speculative_on};
use super::{M2r2Record, RoundTensors, weights_hash};
use crate::base::config::ModelConfig;
use crate::base::generate::{GreedyBackend, ReferenceGreedy};
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, early_exit_generate};
use crate::decode::speculative::{SpeculativeBackend, SpeculativeOptions};
use crate::error::{Error, Result};
use crate::golden::Golden;
use crate::golden::check::{
    CheckReport, Tolerance, compare, compare_ints, compare_padded, compare_within, token_ids,
};
use crate::golden::record::replay_on;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use ndarray::Array2;

impl Golden {
    /// Recompute this golden with `m2r2` in its recorded mode and settings and compare every
    /// recorded tensor: logits and scores within `atol`, integer tensors exactly. A greedy golden is
    /// checked as by [`Golden::check`] (the M2R2 weights are not used).
    ///
    /// # Errors
    /// Another model config or other M2R2 weights than recorded; an exit gate that does not exist.
    pub fn check_m2r2(&self, m2r2: M2r2<'_>, atol: f32) -> Result<CheckReport> {
        let Some(recorded) = &self.m2r2 else {
            return self.check(m2r2.model, atol);
        };
        self.check_config(&m2r2.model.config)?;
        let hash = weights_hash(m2r2.weights);
        if hash != recorded.weights_hash {
            return Err(Error::Invalid(format!(
                "the M2R2 weights (hash {hash}) are not the ones this golden was recorded with (hash {})",
                recorded.weights_hash
            )));
        }
        let n = self.tokens.len();
        let mut entries = Vec::new();
        match &recorded.record {
            M2r2Record::EarlyExit {
                gate,
                threshold,
                kv_policy,
                exit_gate,
                gate_scores,
            } => {
                let options = EarlyExitOptions {
                    max_new_tokens: n,
                    stop_tokens: vec![],
                    gate: *gate,
                    threshold: *threshold,
                    kv_policy: *kv_policy,
                    sampling: None,
                };
                let options = golden_early_exit_options(&options, n)?;
                let out = early_exit_generate(m2r2, &self.prompt_tokens, &options)?;
                // Logits along the recorded tokens and exits, so they stay comparable after a
                // mismatch (which `tokens` / `exit_gate` then report).
                let logits = early_exit_logits(m2r2, &self.prompt_tokens, &self.tokens, exit_gate)?;
                let got_gates: Vec<i64> = out
                    .trace
                    .iter()
                    .map(|t| t.exit_gate.map_or(0, |g| g as i64))
                    .collect();
                let mut got_scores =
                    Array2::from_elem((out.trace.len(), m2r2.num_gates()), f32::NAN);
                for (i, t) in out.trace.iter().enumerate() {
                    for (g, &s) in t.scores.iter().enumerate() {
                        got_scores[[i, g]] = s;
                    }
                }
                entries.push(compare("logits", self.logits.view(), logits.view(), atol));
                entries.push(compare_ints(
                    "tokens",
                    &token_ids(&self.tokens),
                    &token_ids(&out.tokens),
                    1,
                ));
                entries.push(compare_ints("exit_gate", exit_gate, &got_gates, 1));
                entries.push(compare_padded(
                    "gate_scores",
                    gate_scores.view(),
                    got_scores.view(),
                    atol,
                ));
            }
            M2r2Record::Speculative {
                draft_gate, gate, ..
            } => {
                let capacity = self.prompt_tokens.len() + n + self.draft_max() + 1;
                let mut speculation =
                    ReferenceSpeculation::new(m2r2, *draft_gate, *gate, capacity)?;
                let engine = SpeculativeEngine {
                    speculation: &mut speculation,
                    greedy: &mut ReferenceGreedy::new(m2r2.model),
                    config: &m2r2.model.config,
                    weights_hash: Some(&hash),
                    draft_gate: *draft_gate,
                };
                return self.check_speculative_on(engine, Tolerance::absolute(atol));
            }
        }
        Ok(CheckReport { entries })
    }

    /// The draft gate (1-based) and the scored gate of a speculative golden, to build the engine
    /// that replays it; `None` for other modes.
    pub fn speculative_gates(&self) -> Option<(usize, Option<GateKind>)> {
        match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::Speculative {
                draft_gate, gate, ..
            }) => Some((*draft_gate, *gate)),
            _ => None,
        }
    }

    /// `M` of a speculative golden's padded round tensors (0 for other modes).
    fn draft_max(&self) -> usize {
        match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::Speculative { draft_length, .. }) => draft_length.max(),
            _ => 0,
        }
    }

    /// Replay this speculative golden on `engine` (the reference, or an ONNX Runtime deployment's
    /// draft and verifier graphs): run its speculative loop with the recorded draft length for
    /// the recorded number of tokens and compare tokens, drafts, accepted counts and base tokens
    /// round by round exactly, the draft-gate scores within `tol.atol`; the logits are
    /// recomputed on `engine.greedy` along the recorded tokens (teacher forcing, so they stay
    /// comparable after a divergence; speculation is lossless, so the verify logits are the base
    /// model's) and compared within `tol`.
    ///
    /// # Errors
    /// Not a speculative golden; another model config, other M2R2 weights (or an engine that
    /// cannot say which it runs) or another draft gate than recorded; an engine error.
    pub fn check_speculative_on(
        &self,
        engine: SpeculativeEngine<'_>,
        tol: Tolerance,
    ) -> Result<CheckReport> {
        let (Some(recorded), Some((draft_gate, _))) = (&self.m2r2, self.speculative_gates()) else {
            return Err(Error::Invalid(format!(
                "this golden records mode `{}`, not `speculative`",
                self.mode
            )));
        };
        let M2r2Record::Speculative {
            draft_length,
            rounds,
            ..
        } = &recorded.record
        else {
            unreachable!("speculative_gates matched the record");
        };
        self.check_config(engine.config)?;
        match engine.weights_hash {
            Some(hash) if hash == recorded.weights_hash => {}
            Some(hash) => {
                return Err(Error::Invalid(format!(
                    "the engine's M2R2 weights (hash {hash}) are not the ones this golden was \
                     recorded with (hash {})",
                    recorded.weights_hash
                )));
            }
            None => {
                return Err(Error::Invalid(format!(
                    "the engine does not say which M2R2 weights it runs, so a golden recorded with \
                     M2R2 weights {} cannot be checked on it",
                    recorded.weights_hash
                )));
            }
        }
        if engine.draft_gate != draft_gate {
            return Err(Error::Invalid(format!(
                "this golden drafts at gate {draft_gate}, the engine at gate {}",
                engine.draft_gate
            )));
        }
        let n = self.tokens.len();
        let options = SpeculativeOptions {
            max_new_tokens: n,
            stop_tokens: vec![],
            draft_length: draft_length.clone(),
            sampling: None,
        };
        let (out, _) = run_speculative_on(engine.speculation, &self.prompt_tokens, n, &options)?;
        let got = RoundTensors::from_output(&out, draft_length.max());
        let (_, logits) = replay_on(
            engine.greedy,
            self.logits.ncols(),
            &self.prompt_tokens,
            n,
            Some(&self.tokens),
        )?;
        let cols = draft_length.max();
        let flat = |a: &Array2<i64>| a.iter().copied().collect::<Vec<i64>>();
        Ok(CheckReport {
            entries: vec![
                compare_within("logits", self.logits.view(), logits.view(), tol),
                compare_ints(
                    "tokens",
                    &token_ids(&self.tokens),
                    &token_ids(&out.tokens),
                    1,
                ),
                compare_ints(
                    "round_drafted",
                    &flat(&rounds.drafted),
                    &flat(&got.drafted),
                    cols,
                ),
                compare_ints("round_accepted", &rounds.accepted, &got.accepted, 1),
                compare_ints("round_base_token", &rounds.base_token, &got.base_token, 1),
                compare_padded(
                    "round_scores",
                    rounds.scores.view(),
                    got.scores.view(),
                    tol.atol,
                ),
            ],
        })
    }
}

/// An engine a speculative golden is replayed on, and what it was built from (checked against
/// the golden before anything runs).
pub struct SpeculativeEngine<'a> {
    /// Runs the speculative loop: drafts and verifies.
    pub speculation: &'a mut dyn SpeculativeBackend,
    /// Recomputes the logits along the recorded tokens.
    pub greedy: &'a mut dyn GreedyBackend,
    pub config: &'a ModelConfig,
    /// [`weights_hash`] of the M2R2 weights the engine runs (`None`: unknown, refused).
    pub weights_hash: Option<&'a str>,
    /// The gate it drafts at, 1-based.
    pub draft_gate: usize,
}
