//! Recording the M2R2 modes' goldens: decode early-exit or self-speculatively with the reference and
//! keep every step's decisions and the logits each token was emitted from.

use super::{GraphOutputs, M2r2Golden, M2r2Record, RoundTensors, WeightsId};
use crate::base::ops::argmax;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
use crate::decode::speculative::{
    Draft, SpeculativeBackend, SpeculativeOptions, SpeculativeOutput, speculative_generate,
};
use crate::decode::tree_backend::tree_positions;
use crate::error::{Error, Result};
use crate::golden::Golden;
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array2, ArrayView1, Axis};

impl Golden {
    /// Record up to `steps` greedy early-exit tokens after `prompt` with the gate, threshold, KV
    /// policy and stop tokens of `options` (its token budget is replaced by `steps`).
    ///
    /// # Errors
    /// Sampling (goldens are greedy), the `fast-kv` policy (see [`early_exit_logits`]), and what
    /// [`early_exit_generate`] refuses.
    pub fn record_early_exit(
        m2r2: M2r2<'_>,
        name: &str,
        prompt: &[u32],
        steps: usize,
        options: &EarlyExitOptions,
    ) -> Result<Golden> {
        let options = golden_early_exit_options(options, steps)?;
        let out = early_exit_generate(m2r2, prompt, &options)?;
        let stops = options.stop_tokens.clone();
        let exit_gate: Vec<i64> = out
            .trace
            .iter()
            .map(|t| t.exit_gate.map_or(0, |g| g as i64))
            .collect();
        let mut gate_scores = Array2::from_elem((out.trace.len(), m2r2.num_gates()), f32::NAN);
        for (i, t) in out.trace.iter().enumerate() {
            for (g, &s) in t.scores.iter().enumerate() {
                gate_scores[[i, g]] = s;
            }
        }
        let logits = early_exit_logits(m2r2, prompt, &out.tokens, &exit_gate)?;
        // The recomputed rows must give back the decoder's tokens (greedy).
        if let Some(i) = (0..out.tokens.len()).find(|&i| {
            argmax(logits.row(i).as_slice().expect("contiguous")) as u32 != out.tokens[i]
        }) {
            return Err(Error::Invalid(format!(
                "early-exit golden: the recomputed logits of step {i} do not give the decoded token {}",
                out.tokens[i]
            )));
        }
        let mut golden = m2r2_golden(
            m2r2,
            name,
            "early-exit",
            prompt,
            out.tokens,
            logits,
            M2r2Record::EarlyExit {
                gate: options.gate,
                threshold: options.threshold.clone(),
                kv_policy: options.kv_policy,
                exit_gate,
                gate_scores,
            },
        );
        golden.stop_tokens = Some(stops);
        golden.max_steps = Some(steps);
        Ok(golden)
    }

    /// Record up to `steps` greedy self-speculative tokens after `prompt`, drafting at
    /// `draft_gate` (1-based) and scoring `gate` at each proposal, with the draft length and stop
    /// tokens of `options` (its token budget is replaced by `steps`). `logits` holds the verify
    /// logits each token was emitted from; `verify_logits` and `draft_logits` every verified row
    /// and every proposal's logits.
    ///
    /// # Errors
    /// Sampling, and what [`ReferenceSpeculation::new`] and [`speculative_generate`] refuse.
    pub fn record_speculative(
        m2r2: M2r2<'_>,
        name: &str,
        prompt: &[u32],
        steps: usize,
        draft_gate: usize,
        gate: Option<GateKind>,
        options: &SpeculativeOptions,
    ) -> Result<Golden> {
        let run = run_speculative(m2r2, prompt, steps, draft_gate, gate, options)?;
        let rounds = RoundTensors::from_output(&run.out, options.draft_length.max());
        let mut golden = m2r2_golden(
            m2r2,
            name,
            "speculative",
            prompt,
            run.out.tokens,
            run.logits,
            M2r2Record::Speculative {
                draft_gate,
                gate,
                draft_length: options.draft_length.clone(),
                rounds,
                graphs: Some(Box::new(run.graphs)),
            },
        );
        golden.stop_tokens = Some(options.stop_tokens.clone());
        golden.max_steps = Some(steps);
        Ok(golden)
    }
}

/// A golden of `m2r2`'s model and weights recording `record` (written as this format's version
/// for chains; the caller sets another where its record needs one).
pub(super) fn m2r2_golden(
    m2r2: M2r2<'_>,
    name: &str,
    mode: &str,
    prompt: &[u32],
    tokens: Vec<u32>,
    logits: Array2<f32>,
    record: M2r2Record,
) -> Golden {
    let model = m2r2.model;
    Golden {
        model: name.into(),
        config_hash: model.config.hash(),
        config_json: serde_json::to_string(&model.config).expect("config serialises"),
        mode: mode.into(),
        prompt_tokens: prompt.to_vec(),
        tokens,
        logits,
        m2r2: Some(M2r2Golden {
            config_json: serde_json::to_string(&m2r2.weights.config).expect("config serialises"),
            weights: WeightsId::of(m2r2.weights),
            record,
        }),
        writer: Some(env!("CARGO_PKG_VERSION").into()),
        stop_tokens: Some(vec![]),
        max_steps: None,
        pins: Default::default(),
        version: crate::golden::WRITTEN_FORMAT_VERSION,
    }
}

/// The options a golden decodes with: up to `steps` tokens, greedy, `exact` KV.
pub(super) fn golden_early_exit_options(
    options: &EarlyExitOptions,
    steps: usize,
) -> Result<EarlyExitOptions> {
    if options.sampling.is_some() {
        return Err(Error::Invalid(
            "golden files record greedy decodes: drop the sampling settings".into(),
        ));
    }
    if options.kv_policy != KvPolicy::Exact {
        return Err(Error::Invalid(format!(
            "early-exit goldens need --kv-policy exact: with {} the cache is approximate and the \
             exit logits cannot be recomputed independently of the decoder",
            options.kv_policy
        )));
    }
    Ok(EarlyExitOptions {
        max_new_tokens: steps,
        ..options.clone()
    })
}

/// The logits each early-exit token was emitted from, recomputed along `tokens` by teacher forcing:
/// the exit logits `LMHead(FinalNorm(u_g))` at gate `g = exit_gate[i]` from
/// [`M2r2::all_exit_states`], or the final logits when `exit_gate[i] == 0`.
///
/// Why this equals what the decoder saw (`exact` policy only): token i is emitted while position
/// `P - 1 + i` runs. Under `exact` every layer an exited token skipped is computed before a later
/// token reads it, so the KV cache any position attends to equals the base model's
/// (docs/m2r2/shared_kv.md), and the fast rows read that cache. The reference is batch invariant, so position
/// `P - 1 + i`'s slow and fast states in one teacher-forced chunk are bitwise those of the decoder.
/// With `fast-kv` the skipped layers hold approximate K/V, which a teacher-forced pass does not
/// reproduce: hence those goldens are refused.
///
/// # Shapes
/// - `prompt`: `[P]`, `tokens`: `[n]`, `exit_gate`: `[n]` -> `[n, V]`
///
/// # Errors
/// An exit gate outside `0..=J`.
pub fn early_exit_logits(
    m2r2: M2r2<'_>,
    prompt: &[u32],
    tokens: &[u32],
    exit_gate: &[i64],
) -> Result<Array2<f32>> {
    let model = m2r2.model;
    let (n, j) = (tokens.len(), m2r2.num_gates());
    if let Some((i, g)) = exit_gate
        .iter()
        .enumerate()
        .find(|&(_, &g)| g < 0 || g as usize > j)
    {
        return Err(Error::Invalid(format!(
            "exit gate {g} at step {i} does not exist (gates 1..={j}, 0 = all layers)"
        )));
    }
    let mut logits = Array2::zeros((n, model.config.vocab_size));
    if n == 0 {
        return Ok(logits);
    }
    // Position P - 1 + i emits token i.
    let seq: Vec<u32> = prompt.iter().chain(&tokens[..n - 1]).copied().collect();
    let full = model.teacher_forced_logits(&seq)?; // [P + n - 1, V]
    let states = if exit_gate.iter().any(|&g| g > 0) {
        m2r2.all_exit_states(&seq)? // J x ([P + n - 1, D], _)
    } else {
        vec![]
    };
    for (i, &gate) in exit_gate.iter().enumerate().take(n) {
        let pos = prompt.len() - 1 + i;
        match gate as usize {
            0 => logits.row_mut(i).assign(&full.row(pos)),
            g => {
                let u = states[g - 1].0.row(pos).insert_axis(Axis(0)); // [1, D]
                logits.row_mut(i).assign(&m2r2.exit_logits(u).row(0));
            }
        }
    }
    Ok(logits)
}

/// A speculative decode and what each graph produced along it.
pub(super) struct SpeculativeRun {
    pub(super) out: SpeculativeOutput,
    /// `[n, V]` the logits each token was emitted from
    pub(super) logits: Array2<f32>,
    pub(super) graphs: GraphOutputs,
}

/// Run greedy speculative decoding with the reference: [`run_speculative_on`] over a
/// [`ReferenceSpeculation`].
fn run_speculative(
    m2r2: M2r2<'_>,
    prompt: &[u32],
    steps: usize,
    draft_gate: usize,
    gate: Option<GateKind>,
    options: &SpeculativeOptions,
) -> Result<SpeculativeRun> {
    // a chain of drafts is a tree of drafts + 1 nodes
    let capacity = tree_positions(0, prompt.len(), steps, options.draft_length.max() + 1);
    let mut backend = ReferenceSpeculation::new(m2r2, draft_gate, gate, capacity)?;
    run_speculative_on(&mut backend, prompt, steps, options)
}

/// Run greedy speculative decoding on any engine for up to `steps` tokens (stopping at the stop
/// tokens of `options`) and collect the logits each token was emitted from (the prompt's last
/// row, then per round the verify rows of its emitted tokens), every verified row and every
/// proposal's logits.
pub(super) fn run_speculative_on(
    backend: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    steps: usize,
    options: &SpeculativeOptions,
) -> Result<SpeculativeRun> {
    if options.sampling.is_some() {
        return Err(Error::Invalid(
            "golden files record greedy decodes: drop the sampling settings".into(),
        ));
    }
    let options = SpeculativeOptions {
        max_new_tokens: steps,
        ..options.clone()
    };
    let vocab = backend.vocab_size();
    let mut backend = Recording {
        inner: backend,
        prefill: vec![],
        verified: vec![],
        drafts: vec![],
    };
    let out = speculative_generate(&mut backend, prompt, &options)?;
    let mut logits = Array2::zeros((out.tokens.len(), vocab));
    if !out.tokens.is_empty() {
        logits.row_mut(0).assign(&ndarray::aview1(&backend.prefill));
    }
    // Round r emits its accepted drafts and the base token (cut at the budget or a stop token),
    // from verify rows 0..=accepted.
    let mut row = 1;
    for (round, verified) in out.rounds.iter().zip(&backend.verified) {
        let emitted = (round.accepted + 1).min(out.tokens.len() - row);
        for k in 0..emitted {
            logits.row_mut(row + k).assign(&verified.row(k));
        }
        row += emitted;
    }
    debug_assert_eq!(row, out.tokens.len().max(1));
    let graphs = backend.graph_outputs(vocab)?;
    Ok(SpeculativeRun {
        out,
        logits,
        graphs,
    })
}

/// Replay recorded rounds on `backend` with the recorded tokens fed (teacher forcing): the
/// prompt, then per round the round's first token and its recorded drafts, proposing exactly as
/// often as the round did, verifying, and keeping what the round emitted. What the engine's
/// graphs produce along the way is comparable with the recording even after the engine's own
/// decode has parted from it. Returns `(graphs, scores [R, M+1])`.
///
/// # Errors
/// An engine error, or an engine that verifies another number of rows than were fed.
pub(in crate::golden) fn replay_rounds(
    backend: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    tokens: &[u32],
    rounds: &RoundTensors,
) -> Result<(GraphOutputs, Array2<f32>)> {
    let vocab = backend.vocab_size();
    let mut recording = Recording {
        inner: backend,
        prefill: vec![],
        verified: vec![],
        drafts: vec![],
    };
    let mut scores = Array2::from_elem(rounds.scores.dim(), f32::NAN);
    recording.prefill(prompt)?;
    let (mut last, mut row) = (tokens.first().copied(), 1);
    for r in 0..rounds.len() {
        let Some(first) = last else { break };
        let start = recording.len();
        let drafted = rounds.drafted_in(r);
        let proposals = rounds.proposals(r);
        let (mut feed, mut fed_drafts, mut proposed) = (first, 0, 0);
        while let Some(draft) = recording.draft(feed, proposed < proposals)? {
            if let Some(score) = draft.score {
                scores[[r, proposed]] = score;
            }
            proposed += 1;
            match drafted.get(fed_drafts) {
                Some(&token) => {
                    feed = u32::try_from(token)
                        .map_err(|_| Error::Invalid(format!("round {r} drafted token {token}")))?;
                    fed_drafts += 1;
                }
                None => break,
            }
        }
        let verified = recording.verify()?.nrows();
        if verified != drafted.len() + 1 {
            return Err(Error::Invalid(format!(
                "round {r}: the engine verified {verified} rows for {} fed tokens",
                drafted.len() + 1
            )));
        }
        let emitted = (rounds.accepted[r].max(0) as usize + 1).min(tokens.len() - row);
        recording.rollback(start + emitted);
        last = tokens
            .get(row + emitted - 1)
            .copied()
            .filter(|_| emitted > 0);
        row += emitted;
    }
    Ok((recording.graph_outputs(vocab)?, scores))
}

/// A speculative engine that keeps the prefill, verify and draft logits it returns.
struct Recording<'a> {
    inner: &'a mut dyn SpeculativeBackend,
    /// `[V]`
    prefill: Vec<f32>,
    /// One `[m, V]` per verify.
    verified: Vec<Array2<f32>>,
    /// One `[V]` per proposal.
    drafts: Vec<Vec<f32>>,
}

impl Recording<'_> {
    /// Everything recorded, as [`GraphOutputs`] of `vocab` columns.
    fn graph_outputs(&self, vocab: usize) -> Result<GraphOutputs> {
        let rows: Vec<ArrayView1<f32>> = std::iter::once(ArrayView1::from(&self.prefill[..]))
            .chain(self.verified.iter().flat_map(|v| v.rows()))
            .collect();
        let drafts: Vec<ArrayView1<f32>> = self
            .drafts
            .iter()
            .map(|d| ArrayView1::from(&d[..]))
            .collect();
        let stacked = |rows: &[ArrayView1<f32>], what: &str| -> Result<Array2<f32>> {
            if rows.is_empty() {
                return Ok(Array2::zeros((0, vocab)));
            }
            ndarray::stack(Axis(0), rows).map_err(|_| {
                Error::Invalid(format!("the engine's {what} rows are not all {vocab} wide"))
            })
        };
        Ok(GraphOutputs {
            verify_logits: stacked(&rows, "verify logits")?,
            draft_logits: stacked(&drafts, "draft logits")?,
        })
    }
}

impl SpeculativeBackend for Recording<'_> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.prefill = self.inner.prefill(tokens)?;
        Ok(self.prefill.clone())
    }

    fn draft(&mut self, token: u32, propose: bool) -> Result<Option<Draft>> {
        let draft = self.inner.draft(token, propose)?;
        if let Some(d) = &draft {
            self.drafts.push(d.logits.clone());
        }
        Ok(draft)
    }

    fn verify(&mut self) -> Result<Array2<f32>> {
        let logits = self.inner.verify()?;
        self.verified.push(logits.clone());
        Ok(logits)
    }

    fn rollback(&mut self, len: usize) {
        self.inner.rollback(len)
    }
}
