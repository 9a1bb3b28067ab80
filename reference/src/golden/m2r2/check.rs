//! Checking the M2R2 modes' goldens: recompute with the recorded settings and compare every
//! recorded tensor (logits and scores within a tolerance, tokens, exits and rounds exactly), each
//! against the graph (or engine part) that recomputed it.

use super::record::{
    early_exit_logits, golden_early_exit_options, replay_rounds, run_speculative_on,
};
use super::tree_replay::TreeEngine;
use super::{M2r2Golden, M2r2Record, RoundTensors, WeightsId};
use crate::base::config::ModelConfig;
use crate::base::generate::{GreedyBackend, ReferenceGreedy};
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, early_exit_generate};
use crate::decode::speculative::SpeculativeOptions;
use crate::decode::tree_backend::tree_positions;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::error::{Error, Result};
use crate::golden::Golden;
use crate::golden::check::token_ids;
use crate::golden::report::{
    CheckReport, StopRules, TensorCheck, Tolerance, compare_int_rows, compare_rows, compare_stops,
};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use ndarray::Array2;

// the engine and the round comparisons, at the paths `golden::m2r2` and `tree_compare.rs` use
pub use super::engine::{EngineGraphs, REFERENCE, SpeculativeEngine};
pub(in crate::golden) use super::rounds_compare::{
    Against, DraftTies, compare_graph_outputs, compare_rounds, compare_scores, rounds_check,
    ties_note,
};

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
        let id = WeightsId::of(m2r2.weights);
        if !id.matches(&recorded.weights) {
            return Err(Error::Invalid(format!(
                "the M2R2 weights ({id}) are not the ones this golden was recorded with ({})",
                recorded.weights
            )));
        }
        // the settings the golden describes its weights by are the ones its hashes cover
        recorded.check_settings(m2r2.weights)?;
        let tol = Tolerance::absolute(atol);
        let n = self.tokens.len();
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
                    stop_tokens: self.stops().to_vec(),
                    gate: *gate,
                    threshold: threshold.clone(),
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
                let mut exits =
                    compare_int_rows("exit_gate", REFERENCE, exit_gate, &got_gates, 1, false);
                if let Some(d) = &mut exits.divergence {
                    d.what = "exit gate".into();
                }
                let mut entries = vec![
                    compare_rows("logits", REFERENCE, self.logits.view(), logits.view(), tol),
                    compare_int_rows(
                        "tokens",
                        REFERENCE,
                        &token_ids(&self.tokens),
                        &token_ids(&out.tokens),
                        1,
                        true,
                    ),
                ];
                entries.extend(self.stop_check(REFERENCE, &out.tokens));
                entries.push(exits);
                entries.push(compare_rows(
                    "gate_scores",
                    REFERENCE,
                    gate_scores.view(),
                    got_scores.view(),
                    tol,
                ));
                Ok(CheckReport { entries })
            }
            M2r2Record::Speculative {
                draft_gate, gate, ..
            } => {
                let mut speculation =
                    ReferenceSpeculation::new(m2r2, *draft_gate, *gate, self.positions()?)?;
                let engine = SpeculativeEngine {
                    speculation: &mut speculation,
                    greedy: &mut ReferenceGreedy::new(m2r2.model),
                    config: &m2r2.model.config,
                    weights: Some(&id),
                    draft_gate: *draft_gate,
                    graphs: EngineGraphs::REFERENCE,
                };
                self.check_speculative_on(engine, tol)
            }
            M2r2Record::SpeculativeTree { recipe, .. } => {
                let mut speculation =
                    ReferenceTreeSpeculation::new(m2r2, recipe.draft_gate, self.positions()?)?
                        .with_gate(recipe.grown.map(|g| g.0));
                let engine = TreeEngine {
                    speculation: &mut speculation,
                    greedy: &mut ReferenceGreedy::new(m2r2.model),
                    config: &m2r2.model.config,
                    weights: Some(&id),
                    draft_gate: recipe.draft_gate,
                    graphs: EngineGraphs::REFERENCE,
                };
                self.check_tree_on(engine, tol)
            }
        }
    }

    /// The draft gate (1-based) and the scored gate of a speculative golden, chain or token tree
    /// (a grown tree's gate; a fixed tree scores none), to build the engine that replays it;
    /// `None` for other modes.
    pub fn speculative_gates(&self) -> Option<(usize, Option<GateKind>)> {
        match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::Speculative {
                draft_gate, gate, ..
            }) => Some((*draft_gate, *gate)),
            Some(M2r2Record::SpeculativeTree { recipe, .. }) => {
                Some((recipe.draft_gate, recipe.grown.map(|g| g.0)))
            }
            _ => None,
        }
    }

    /// Refuse an engine of another model config, other M2R2 weights (or weights it cannot name)
    /// or another draft gate than `recorded` (drafting at `draft_gate`).
    pub(in crate::golden) fn check_engine(
        &self,
        recorded: &M2r2Golden,
        config: &ModelConfig,
        weights: Option<&WeightsId>,
        draft_gate: usize,
        engine_gate: usize,
    ) -> Result<()> {
        self.check_config(config)?;
        match weights {
            Some(id) if id.matches(&recorded.weights) => {}
            Some(id) => {
                return Err(Error::Invalid(format!(
                    "the engine's M2R2 weights ({id}) are not the ones this golden was recorded \
                     with ({})",
                    recorded.weights
                )));
            }
            None => {
                return Err(Error::Invalid(format!(
                    "the engine does not say which M2R2 weights it runs, so a golden recorded with \
                     M2R2 weights ({}) cannot be checked on it",
                    recorded.weights
                )));
            }
        }
        if engine_gate != draft_gate {
            return Err(Error::Invalid(format!(
                "this golden drafts at gate {draft_gate}, the engine at gate {engine_gate}"
            )));
        }
        Ok(())
    }

    /// The cache positions a decode of this golden may need: the prompt and every step but the
    /// last, and past them the drafts of a speculative round, which drafts in full even when it
    /// starts one token before the end ([`tree_positions`] of a chain of `draft_max + 1` nodes,
    /// or of the largest tree a round verifies).
    ///
    /// # Errors
    /// A token-tree golden whose recorded shape is invalid.
    pub fn positions(&self) -> Result<usize> {
        let nodes = match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::SpeculativeTree { recipe, .. }) => recipe.largest()?.nodes(),
            _ => self.draft_max() + 1,
        };
        Ok(tree_positions(
            0,
            self.prompt_tokens.len(),
            self.tokens.len(),
            nodes,
        ))
    }

    /// `M` of a speculative golden's padded round tensors (0 for other modes).
    pub fn draft_max(&self) -> usize {
        match self.m2r2.as_ref().map(|m| &m.record) {
            Some(M2r2Record::Speculative { draft_length, .. }) => draft_length.max(),
            Some(M2r2Record::SpeculativeTree { recipe, .. }) => recipe.widths.len(),
            _ => 0,
        }
    }

    /// The `stop` verdict when a decode by `graph` emitted another number of tokens than
    /// recorded (both stop at the golden's stop tokens).
    pub(in crate::golden) fn stop_check(&self, graph: &str, got: &[u32]) -> Option<TensorCheck> {
        let stops = token_ids(self.stops());
        // the recomputation runs the golden's own budget: a shorter one stopped
        let rules = StopRules {
            longer_stopped: true,
            shorter_budget: None,
        };
        compare_stops(
            graph,
            "recomputed",
            (&token_ids(&self.tokens), &token_ids(got)),
            &stops,
            rules,
            &|_| None,
        )
    }

    /// The `tokens` verdict of a speculative decode by `graph` that emitted `got` (its rows named
    /// by `step_rounds`), then its `stop` verdict: the first entries of a chain's and a tree's
    /// check alike.
    pub(in crate::golden) fn decoded_checks(
        &self,
        graph: &str,
        got: &[u32],
        step_rounds: &[Option<usize>],
    ) -> Vec<TensorCheck> {
        let tokens = compare_int_rows(
            "tokens",
            graph,
            &token_ids(&self.tokens),
            &token_ids(got),
            1,
            true,
        )
        .in_rounds("step", step_rounds);
        std::iter::once(tokens)
            .chain(self.stop_check(graph, got))
            .collect()
    }

    /// The `logits` verdict: the base model's logits recomputed on `greedy` (called `graph`)
    /// along the recorded tokens (teacher forcing), rows named by `step_rounds`.
    ///
    /// # Errors
    /// The engine's.
    pub(in crate::golden) fn base_logits_check(
        &self,
        greedy: &mut dyn GreedyBackend,
        graph: &str,
        step_rounds: &[Option<usize>],
        tol: Tolerance,
    ) -> Result<TensorCheck> {
        let (_, logits) = self.replay_logits(greedy, graph, tol)?;
        Ok(logits.in_rounds("step", step_rounds))
    }

    /// Replay this speculative golden on `engine` (the reference, or an ONNX Runtime deployment's
    /// draft and verifier graphs) and check every graph on its own:
    /// - `tokens`, `stop` and `rounds`: the engine's own speculative loop for the recorded budget
    ///   and stop tokens, its first divergence from the recorded rounds (drafts, accepted counts,
    ///   base tokens) reported once;
    /// - `logits`: the base model's logits recomputed on `engine.greedy` along the recorded tokens
    ///   (teacher forcing; speculation is lossless, so the verify logits are the base model's);
    /// - `verify_logits`, `draft_logits`, `round_scores`: the recorded rounds replayed with the
    ///   recorded tokens fed (see `replay_rounds`), so what the verifier and the draft produce is
    ///   compared row by row even after the engine's own decode has parted from the recording.
    ///
    /// Floats within `tol`, integers exactly. Files before format version 3 do not record the
    /// verifier's and the draft's logits: those lines are skipped, saying so.
    ///
    /// # Errors
    /// Not a speculative golden drafting a chain (a token-tree golden is checked by
    /// [`Golden::check_tree_on`]); another model config, other M2R2 weights (or an engine that
    /// cannot say which it runs) or another draft gate than recorded; an engine error.
    pub fn check_speculative_on(
        &self,
        engine: SpeculativeEngine<'_>,
        tol: Tolerance,
    ) -> Result<CheckReport> {
        let Some((
            recorded,
            M2r2Record::Speculative {
                draft_gate,
                draft_length,
                rounds,
                graphs: recorded_graphs,
                ..
            },
        )) = self.m2r2.as_ref().map(|m| (m, &m.record))
        else {
            let what = match self.draft_tree() {
                Some(_) => "a token tree: check it with check_tree_on on a tree engine".into(),
                None => format!("mode `{}`, not `speculative`", self.mode),
            };
            return Err(Error::Invalid(format!("this golden records {what}")));
        };
        self.check_engine(
            recorded,
            engine.config,
            engine.weights,
            *draft_gate,
            engine.draft_gate,
        )?;
        let graphs = engine.graphs;
        let n = self.tokens.len();
        let options = SpeculativeOptions {
            max_new_tokens: n,
            stop_tokens: self.stops().to_vec(),
            draft_length: draft_length.clone(),
            sampling: None,
        };
        // the engine's own decode
        let run = run_speculative_on(engine.speculation, &self.prompt_tokens, n, &options)?;
        let got = RoundTensors::from_output(&run.out, draft_length.max());
        let step_rounds = rounds.step_rounds(n);
        let mut entries = self.decoded_checks(graphs.decode, &run.out.tokens, &step_rounds);
        let ties = recorded_graphs.as_ref().map(|want| DraftTies {
            draft_logits: &want.draft_logits,
            tol,
        });
        entries.push(compare_rounds(
            graphs.decode,
            rounds,
            &got,
            ties.as_ref(),
            Against::Recomputed,
        ));
        // the base model along the recorded tokens
        entries.push(self.base_logits_check(engine.greedy, graphs.greedy, &step_rounds, tol)?);

        // the verifier and the draft along the recorded rounds
        engine.speculation.rollback(0);
        let (replayed, scores) = replay_rounds(
            engine.speculation,
            &self.prompt_tokens,
            &self.tokens,
            rounds,
        )?;
        match recorded_graphs {
            Some(want) => entries.extend(compare_graph_outputs(
                (graphs.verify, graphs.draft),
                want,
                &replayed,
                rounds,
                rounds.len(),
                tol,
            )),
            None => {
                let why = format!(
                    "not recorded: the golden is format version {} (the verifier's and the \
                     draft's logits are recorded from version 3 on; write it again to check them)",
                    self.version
                );
                entries.push(TensorCheck::skipped("verify_logits", graphs.verify, &why));
                entries.push(TensorCheck::skipped("draft_logits", graphs.draft, &why));
            }
        }
        entries.push(compare_scores(graphs.draft, &rounds.scores, &scores, tol));
        Ok(CheckReport { entries })
    }
}
