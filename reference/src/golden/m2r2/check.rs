//! Checking the M2R2 modes' goldens: recompute with the recorded settings and compare every
//! recorded tensor (logits and scores within a tolerance, tokens, exits and rounds exactly), each
//! against the graph (or engine part) that recomputed it.

use super::record::{
    early_exit_logits, golden_early_exit_options, replay_rounds, run_speculative_on,
};
use super::tree_replay::TreeEngine;
use super::{GraphOutputs, M2r2Golden, M2r2Record, RoundTensors, WeightsId};
use crate::base::config::ModelConfig;
use crate::base::generate::{GreedyBackend, ReferenceGreedy};
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, early_exit_generate};
use crate::decode::speculative::{SpeculativeBackend, SpeculativeOptions};
use crate::decode::tree_backend::tree_positions;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::error::{Error, Result};
use crate::golden::Golden;
use crate::golden::check::token_ids;
use crate::golden::report::{
    CheckReport, Divergence, TensorCheck, Tolerance, compare_int_rows, compare_rows, compare_stops,
};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array2, s};

/// The name the reference goes by in reports.
pub const REFERENCE: &str = "reference";

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
                    compare_rows(
                        "logits",
                        REFERENCE,
                        self.logits.view(),
                        logits.view(),
                        tol,
                        false,
                    ),
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
                    true,
                ));
                Ok(CheckReport { entries })
            }
            M2r2Record::Speculative {
                draft_gate, gate, ..
            } => {
                let capacity = tree_positions(0, self.prompt_tokens.len(), n, self.draft_max() + 1);
                let mut speculation =
                    ReferenceSpeculation::new(m2r2, *draft_gate, *gate, capacity)?;
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
                let capacity =
                    tree_positions(0, self.prompt_tokens.len(), n, recipe.largest()?.nodes());
                let mut speculation =
                    ReferenceTreeSpeculation::new(m2r2, recipe.draft_gate, capacity)?
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

    /// `M` of a speculative golden's padded round tensors (0 for other modes).
    fn draft_max(&self) -> usize {
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
        compare_stops(
            graph,
            "recomputed",
            &token_ids(&self.tokens),
            &token_ids(got),
            &stops,
            true,
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
        entries.push(compare_rounds(graphs.decode, rounds, &got));
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

/// `verify_logits` (recomputed by `graphs.0`) and `draft_logits` (by `graphs.1`) over the rows of
/// the first `rounds_compared` of the recorded `rounds` (the prompt's verified row included), each
/// row named by its round.
pub(in crate::golden) fn compare_graph_outputs(
    graphs: (&str, &str),
    want: &GraphOutputs,
    got: &GraphOutputs,
    rounds: &RoundTensors,
    rounds_compared: usize,
    tol: Tolerance,
) -> [TensorCheck; 2] {
    let compare =
        |name, graph, row_name, of_row: Vec<Option<usize>>, w: &Array2<f32>, g: &Array2<f32>| {
            let rows = of_row
                .iter()
                .take_while(|r| r.is_none_or(|r| r < rounds_compared))
                .count();
            let head = |x: &Array2<f32>| x.slice(s![..rows.min(x.nrows()), ..]).to_owned();
            compare_rows(name, graph, head(w).view(), head(g).view(), tol, false)
                .in_rounds(row_name, &of_row)
        };
    [
        compare(
            "verify_logits",
            graphs.0,
            "verified row",
            rounds.verify_rounds(),
            &want.verify_logits,
            &got.verify_logits,
        ),
        compare(
            "draft_logits",
            graphs.1,
            "proposal",
            rounds.proposal_rounds(),
            &want.draft_logits,
            &got.draft_logits,
        ),
    ]
}

/// The draft gate's scores of the recorded rounds (rows: rounds) against the replay's; skipped
/// when none were recorded (fixed-length drafts score nothing).
pub(in crate::golden) fn compare_scores(
    graph: &str,
    want: &Array2<f32>,
    got: &Array2<f32>,
    tol: Tolerance,
) -> TensorCheck {
    if want.iter().all(|s| s.is_nan()) && got.iter().all(|s| s.is_nan()) {
        return TensorCheck::skipped(
            "round_scores",
            graph,
            "no scores recorded (fixed-length drafts score no gate)",
        );
    }
    let rounds: Vec<Option<usize>> = (0..want.nrows()).map(Some).collect();
    let common = want.nrows().min(got.nrows());
    compare_rows(
        "round_scores",
        graph,
        want.slice(s![..common, ..]),
        got.slice(s![..common, ..]),
        tol,
        true,
    )
    .in_rounds("round", &rounds)
}

/// The rounds of two speculative decodes, round by round: the first round whose drafts,
/// accepted count or base token differ is the divergence (every later round follows from it and
/// is not reported again); padding is never shown.
pub(in crate::golden) fn compare_rounds(
    graph: &str,
    want: &RoundTensors,
    got: &RoundTensors,
) -> TensorCheck {
    let differs = |r: usize| {
        let parts = [
            ("drafted", want.drafted_in(r), got.drafted_in(r), true),
            (
                "accepted",
                vec![want.accepted[r]],
                vec![got.accepted[r]],
                false,
            ),
            (
                "base token",
                vec![want.base_token[r]],
                vec![got.base_token[r]],
                true,
            ),
        ];
        let (what, golden, recomputed, tokens) = parts.into_iter().find(|(_, w, g, _)| w != g)?;
        Some(Divergence {
            row: r,
            what: what.into(),
            golden,
            recomputed,
            tokens,
        })
    };
    let extra = |t: &RoundTensors, r: usize| (r < t.len()).then(|| t.drafted_in(r));
    let past_the_end = |r: usize| Divergence {
        row: r,
        what: "drafted".into(),
        golden: extra(want, r).unwrap_or_default(),
        recomputed: extra(got, r).unwrap_or_default(),
        tokens: true,
    };
    rounds_check(graph, (want.len(), got.len()), differs, past_the_end)
}

/// The `rounds` line of two decodes of `rounds` (golden, recomputed) rounds, a chain's and a
/// tree's alike: `differs(r)` compares round `r` of both; the first round that differs is the
/// divergence (every later round follows from it and is not reported again). When they agree as
/// far as both go and one has more, `past_the_end(r)` names the first extra round `r`.
pub(in crate::golden) fn rounds_check(
    graph: &str,
    (want, got): (usize, usize),
    differs: impl Fn(usize) -> Option<Divergence>,
    past_the_end: impl Fn(usize) -> Divergence,
) -> TensorCheck {
    let common = want.min(got);
    let mut first: Option<Divergence> = None;
    let mut rows_over = 0;
    for d in (0..common).filter_map(differs) {
        rows_over += 1;
        first.get_or_insert(d);
    }
    if first.is_none() && want != got {
        first = Some(past_the_end(common));
        rows_over = 1;
    }
    let note = if first.is_none() {
        format!("{want} rounds equal")
    } else {
        format!("golden {want} rounds, recomputed {got}")
    };
    TensorCheck::exact("rounds", graph, "round", first, rows_over, note)
}

/// An engine a speculative golden is replayed on, and what it was built from (checked against
/// the golden before anything runs).
pub struct SpeculativeEngine<'a> {
    /// Runs the speculative loop: drafts and verifies.
    pub speculation: &'a mut dyn SpeculativeBackend,
    /// Recomputes the logits along the recorded tokens.
    pub greedy: &'a mut dyn GreedyBackend,
    pub config: &'a ModelConfig,
    /// The M2R2 weights the engine runs ([`WeightsId`]; `None`: unknown, refused).
    pub weights: Option<&'a WeightsId>,
    /// The gate it drafts at, 1-based.
    pub draft_gate: usize,
    /// What the engine calls the parts that recompute each tensor.
    pub graphs: EngineGraphs<'a>,
}

/// What an engine calls the parts that recompute a golden's tensors, named on every report line
/// (an export: its graph files).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineGraphs<'a> {
    /// The base model alone (greedy logits).
    pub greedy: &'a str,
    /// The draft (its logits and gate scores).
    pub draft: &'a str,
    /// The verifier (verified rows, and the prompt's row).
    pub verify: &'a str,
    /// The whole speculative loop (tokens, rounds).
    pub decode: &'a str,
}

impl EngineGraphs<'static> {
    pub const REFERENCE: EngineGraphs<'static> = EngineGraphs {
        greedy: REFERENCE,
        draft: REFERENCE,
        verify: REFERENCE,
        decode: REFERENCE,
    };
}
