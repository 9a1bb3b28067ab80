//! Checking the M2R2 modes' goldens: recompute with the recorded settings and compare every recorded
//! tensor (logits and scores within a tolerance, tokens, exits and rounds exactly).

use super::record::{early_exit_logits, golden_early_exit_options, run_speculative};
use super::{M2r2Record, RoundTensors, weights_hash};
use crate::decode::early_exit::{EarlyExitOptions, early_exit_generate};
use crate::decode::speculative::SpeculativeOptions;
use crate::error::{Error, Result};
use crate::golden::Golden;
use crate::golden::check::{CheckReport, compare, compare_ints, compare_padded, token_ids};
use crate::golden::record::replay;
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
                draft_gate,
                gate,
                draft_length,
                rounds,
            } => {
                let options = SpeculativeOptions {
                    max_new_tokens: n,
                    stop_tokens: vec![],
                    draft_length: draft_length.clone(),
                    sampling: None,
                };
                let (out, _) =
                    run_speculative(m2r2, &self.prompt_tokens, n, *draft_gate, *gate, &options)?;
                let got = RoundTensors::from_output(&out, draft_length.max());
                // Lossless: the verify logits are the base model's greedy logits bit for bit
                // (batch invariance), recomputed along the recorded tokens.
                let (_, logits) = replay(m2r2.model, &self.prompt_tokens, n, Some(&self.tokens))?;
                let cols = draft_length.max();
                entries.push(compare("logits", self.logits.view(), logits.view(), atol));
                entries.push(compare_ints(
                    "tokens",
                    &token_ids(&self.tokens),
                    &token_ids(&out.tokens),
                    1,
                ));
                entries.push(compare_ints(
                    "round_drafted",
                    rounds.drafted.as_slice().expect("standard layout"),
                    got.drafted.as_slice().expect("standard layout"),
                    cols,
                ));
                entries.push(compare_ints(
                    "round_accepted",
                    &rounds.accepted,
                    &got.accepted,
                    1,
                ));
                entries.push(compare_ints(
                    "round_base_token",
                    &rounds.base_token,
                    &got.base_token,
                    1,
                ));
                entries.push(compare_padded(
                    "round_scores",
                    rounds.scores.view(),
                    got.scores.view(),
                    atol,
                ));
            }
        }
        Ok(CheckReport { entries })
    }
}
