//! Golden files of the M2R2 modes (format version 2): an early-exit or self-speculative greedy
//! decode with every step's decisions, so a deployment can check its M2R2 behaviour against the
//! reference.
//!
//! Dimensions: `n` emitted tokens, `J` gates, `V` vocabulary, `R` verification rounds, `M` the
//! longest draft (`draft_max`).
//!
//! | mode          | tensor             | dtype | shape      | meaning                                         |
//! |---------------|--------------------|-------|------------|-------------------------------------------------|
//! | both          | `logits`           | F32   | `[n, V]`   | the logits token i was emitted from             |
//! | `early-exit`  | `exit_gate`        | I64   | `[n]`      | gate token i exited at (1-based), 0 = all layers |
//! | `early-exit`  | `gate_scores`      | F32   | `[n, J]`   | gate scores, NaN where a gate was not evaluated |
//! | `speculative` | `round_drafted`    | I64   | `[R, M]`   | drafted tokens, padded with -1                  |
//! | `speculative` | `round_accepted`   | I64   | `[R]`      | drafted tokens accepted                         |
//! | `speculative` | `round_base_token` | I64   | `[R]`      | the base token after them (correction or bonus) |
//! | `speculative` | `round_scores`     | F32   | `[R, M+1]` | draft gate scores (dynamic drafting), NaN pad   |
//!
//! Metadata of both modes: `m2r2_config` (the [`M2r2Config`](crate::m2r2::config::M2r2Config) as
//! JSON), `m2r2_hash` ([`weights_hash`]). Early exit: `gate`, `threshold`, `kv_policy`.
//! Speculative: `draft_gate` (1-based), `gate` (scored at each proposal, or `none`),
//! `draft_length` (`fixed` or `dynamic`), `draft_max`, and `draft_threshold` when dynamic.
//!
//! Logits. Early exit: row i is the exit logits `LMHead(FinalNorm(u_g))` of the gate token i exited
//! at, or the final logits when it ran all layers. Speculative: the base model's (verify) logits
//! each token was emitted from (row 0: the prompt's).

use super::{
    CheckReport, Golden, GoldenFile, compare, compare_ints, compare_padded, f32_bytes, replay,
};
use crate::base::ops::argmax;
use crate::decode::draft_verify::ReferenceSpeculation;
use crate::decode::early_exit::{EarlyExitOptions, KvPolicy, early_exit_generate};
use crate::decode::speculative::{
    Draft, DraftLength, SpeculativeBackend, SpeculativeOptions, SpeculativeOutput,
    speculative_generate,
};
use crate::error::{Error, Result};
use crate::m2r2::exit_gate::GateKind;
use crate::m2r2::fast_stream::M2r2;
use crate::m2r2::weights::M2r2Weights;
use ndarray::{Array2, Axis};
use safetensors::Dtype;
use sha2::{Digest, Sha256};

/// What an M2R2 golden records besides the greedy fields.
#[derive(Clone, Debug, PartialEq)]
pub struct M2r2Golden {
    /// `m2r2_config`: the M2R2 settings as JSON
    pub config_json: String,
    /// `m2r2_hash`: [`weights_hash`] of the M2R2 weights recorded with
    pub weights_hash: String,
    pub record: M2r2Record,
}

#[derive(Clone, Debug, PartialEq)]
pub enum M2r2Record {
    EarlyExit {
        gate: GateKind,
        threshold: f32,
        kv_policy: KvPolicy,
        /// `[n]` 1-based exit gate, 0 = all layers
        exit_gate: Vec<i64>,
        /// `[n, J]` NaN where not evaluated
        gate_scores: Array2<f32>,
    },
    Speculative {
        /// 1-based
        draft_gate: usize,
        /// The gate scored at each proposal (needed by dynamic drafting).
        gate: Option<GateKind>,
        draft_length: DraftLength,
        rounds: RoundTensors,
    },
}

/// The speculative rounds as padded tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundTensors {
    /// `[R, M]` padded with -1
    pub drafted: Array2<i64>,
    /// `[R]`
    pub accepted: Vec<i64>,
    /// `[R]`
    pub base_token: Vec<i64>,
    /// `[R, M+1]` padded with NaN
    pub scores: Array2<f32>,
}

impl RoundTensors {
    fn from_output(out: &SpeculativeOutput, max: usize) -> RoundTensors {
        let r = out.rounds.len();
        let mut drafted = Array2::from_elem((r, max), -1i64);
        let mut scores = Array2::from_elem((r, max + 1), f32::NAN);
        for (i, round) in out.rounds.iter().enumerate() {
            for (k, &t) in round.drafted.iter().enumerate() {
                drafted[[i, k]] = i64::from(t);
            }
            for (k, &s) in round.scores.iter().enumerate() {
                scores[[i, k]] = s;
            }
        }
        RoundTensors {
            drafted,
            accepted: out.rounds.iter().map(|r| r.accepted as i64).collect(),
            base_token: out.rounds.iter().map(|r| i64::from(r.base_token)).collect(),
            scores,
        }
    }
}

/// SHA-256 (first 8 bytes, hex) of the M2R2 settings, every adapter and ARLA tensor's bytes and
/// the pruned draft head's token ids (when there is one), in a fixed order: a check with other
/// adapters, gates or draft head is refused.
pub fn weights_hash(weights: &M2r2Weights) -> String {
    let mut h = Sha256::new();
    let mut tensor = |name: &str, values: &mut dyn Iterator<Item = &f32>| {
        h.update(name.as_bytes());
        for v in values {
            h.update(v.to_le_bytes());
        }
    };
    let config = serde_json::to_string(&weights.config).expect("config serialises");
    tensor(&config, &mut std::iter::empty());
    let acc = &weights.accelerator;
    let header = format!(
        "accelerator rank {} alpha {} rslora {} targets {:?}",
        acc.rank, acc.alpha, acc.use_rslora, acc.targets
    );
    tensor(&header, &mut std::iter::empty());
    for (l, layer) in acc.layers.iter().enumerate() {
        for (target, lora) in layer.iter().flat_map(|a| &a.loras) {
            tensor(&format!("{l}.{target}.a"), &mut lora.a.iter());
            tensor(&format!("{l}.{target}.b"), &mut lora.b.iter());
        }
    }
    if let Some(arla) = &weights.arla {
        tensor("arla.norm", &mut arla.norm.iter());
        tensor("arla.proj", &mut arla.proj.iter());
        tensor("arla.gate_embed", &mut arla.gate_embed.iter());
        tensor("arla.wq", &mut arla.wq.iter());
        tensor("arla.wk", &mut arla.wk.iter());
        tensor("arla.wv", &mut arla.wv.iter());
        tensor("arla.wo", &mut arla.wo.iter());
        tensor("arla.bo", &mut std::iter::once(&arla.bo));
    }
    if let Some(head) = &weights.draft_head {
        // The pruned draft head changes the drafts (and so the rounds) of speculative decoding.
        h.update(format!("draft_head {:?}", head.tokens).as_bytes());
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Golden {
    /// Record `steps` greedy early-exit tokens after `prompt` with the gate, threshold and KV
    /// policy of `options` (its token budget and stop tokens are replaced by `steps` and none).
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
        Ok(m2r2_golden(
            m2r2,
            name,
            "early-exit",
            prompt,
            out.tokens,
            logits,
            M2r2Record::EarlyExit {
                gate: options.gate,
                threshold: options.threshold,
                kv_policy: options.kv_policy,
                exit_gate,
                gate_scores,
            },
        ))
    }

    /// Record `steps` greedy self-speculative tokens after `prompt`, drafting at `draft_gate`
    /// (1-based) and scoring `gate` at each proposal, with the draft length of `options` (its token
    /// budget and stop tokens are replaced by `steps` and none). `logits` holds the verify logits
    /// each token was emitted from.
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
        let (out, logits) = run_speculative(m2r2, prompt, steps, draft_gate, gate, options)?;
        let rounds = RoundTensors::from_output(&out, options.draft_length.max());
        Ok(m2r2_golden(
            m2r2,
            name,
            "speculative",
            prompt,
            out.tokens,
            logits,
            M2r2Record::Speculative {
                draft_gate,
                gate,
                draft_length: options.draft_length.clone(),
                rounds,
            },
        ))
    }

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
        self.check_config(m2r2.model)?;
        let hash = weights_hash(m2r2.weights);
        if hash != recorded.weights_hash {
            return Err(Error::Invalid(format!(
                "the M2R2 weights (hash {hash}) are not the ones this golden was recorded with (hash {})",
                recorded.weights_hash
            )));
        }
        let n = self.tokens.len();
        let tokens = |t: &[u32]| -> Vec<i64> { t.iter().map(|&t| i64::from(t)).collect() };
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
                    &tokens(&self.tokens),
                    &tokens(&out.tokens),
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
                    &tokens(&self.tokens),
                    &tokens(&out.tokens),
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

fn m2r2_golden(
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
            weights_hash: weights_hash(m2r2.weights),
            record,
        }),
    }
}

/// The options a golden decodes with: `steps` tokens, no stop tokens, greedy, `exact` KV.
fn golden_early_exit_options(options: &EarlyExitOptions, steps: usize) -> Result<EarlyExitOptions> {
    if options.sampling.is_some() {
        return Err(Error::Invalid(
            "golden files record greedy decodes: drop the sampling settings".into(),
        ));
    }
    if options.kv_policy != KvPolicy::Exact {
        return Err(Error::Invalid(format!(
            "early-exit golden files need the `exact` KV policy: with `{}` the cache differs from \
             the base model's, and the exit logits cannot be recomputed independently of the decoder",
            options.kv_policy
        )));
    }
    Ok(EarlyExitOptions {
        max_new_tokens: steps,
        stop_tokens: vec![],
        ..options.clone()
    })
}

/// The logits each early-exit token was emitted from, recomputed along `tokens` by teacher forcing:
/// the exit logits `LMHead(FinalNorm(u_g))` at gate `g = exit_gate[i]` from
/// [`M2r2::all_exit_states`], or the final logits when `exit_gate[i] == 0`.
///
/// Why this equals what the decoder saw (`exact` policy only): token i is emitted while position
/// `P - 1 + i` runs. Under `exact` every layer an exited token skipped is computed before a later
/// token reads it, so the KV cache any position attends to equals the base model's (spec section
/// 2), and the fast rows read that cache. The reference is batch invariant, so position
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

/// Run greedy speculative decoding and collect the logits each token was emitted from: the
/// prompt's last row, then per round the verify rows of its emitted tokens.
fn run_speculative(
    m2r2: M2r2<'_>,
    prompt: &[u32],
    steps: usize,
    draft_gate: usize,
    gate: Option<GateKind>,
    options: &SpeculativeOptions,
) -> Result<(SpeculativeOutput, Array2<f32>)> {
    if options.sampling.is_some() {
        return Err(Error::Invalid(
            "golden files record greedy decodes: drop the sampling settings".into(),
        ));
    }
    let options = SpeculativeOptions {
        max_new_tokens: steps,
        stop_tokens: vec![],
        ..options.clone()
    };
    let capacity = prompt.len() + steps + options.draft_length.max() + 1;
    let mut backend = Recording {
        inner: ReferenceSpeculation::new(m2r2, draft_gate, gate, capacity)?,
        prefill: vec![],
        verified: vec![],
    };
    let out = speculative_generate(&mut backend, prompt, &options)?;
    let mut logits = Array2::zeros((out.tokens.len(), m2r2.model.config.vocab_size));
    if !out.tokens.is_empty() {
        logits.row_mut(0).assign(&ndarray::aview1(&backend.prefill));
    }
    // Round r emits its accepted drafts and the base token (cut at the budget), from verify rows
    // 0..=accepted.
    let mut row = 1;
    for (round, verified) in out.rounds.iter().zip(&backend.verified) {
        let emitted = (round.accepted + 1).min(out.tokens.len() - row);
        for k in 0..emitted {
            logits.row_mut(row + k).assign(&verified.row(k));
        }
        row += emitted;
    }
    debug_assert_eq!(row, out.tokens.len().max(1));
    Ok((out, logits))
}

/// A [`ReferenceSpeculation`] that keeps the prefill and verify logits it returns.
struct Recording<'a> {
    inner: ReferenceSpeculation<'a>,
    /// `[V]`
    prefill: Vec<f32>,
    /// One `[m, V]` per verify.
    verified: Vec<Array2<f32>>,
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
        self.inner.draft(token, propose)
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

impl M2r2Golden {
    /// Extra tensors of this mode, `(name, dtype, shape, bytes)`.
    pub(super) fn tensors(&self) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
        let ints = |v: &mut dyn Iterator<Item = &i64>| -> Vec<u8> {
            v.flat_map(|x| x.to_le_bytes()).collect()
        };
        match &self.record {
            M2r2Record::EarlyExit {
                exit_gate,
                gate_scores,
                ..
            } => vec![
                (
                    "exit_gate".into(),
                    Dtype::I64,
                    vec![exit_gate.len()],
                    ints(&mut exit_gate.iter()),
                ),
                (
                    "gate_scores".into(),
                    Dtype::F32,
                    gate_scores.shape().to_vec(),
                    f32_bytes(gate_scores.iter()),
                ),
            ],
            M2r2Record::Speculative { rounds, .. } => vec![
                (
                    "round_drafted".into(),
                    Dtype::I64,
                    rounds.drafted.shape().to_vec(),
                    ints(&mut rounds.drafted.iter()),
                ),
                (
                    "round_accepted".into(),
                    Dtype::I64,
                    vec![rounds.accepted.len()],
                    ints(&mut rounds.accepted.iter()),
                ),
                (
                    "round_base_token".into(),
                    Dtype::I64,
                    vec![rounds.base_token.len()],
                    ints(&mut rounds.base_token.iter()),
                ),
                (
                    "round_scores".into(),
                    Dtype::F32,
                    rounds.scores.shape().to_vec(),
                    f32_bytes(rounds.scores.iter()),
                ),
            ],
        }
    }

    /// Extra metadata of this mode.
    pub(super) fn metadata(&self) -> Vec<(String, String)> {
        let mut meta = vec![
            ("m2r2_config".to_string(), self.config_json.clone()),
            ("m2r2_hash".to_string(), self.weights_hash.clone()),
        ];
        match &self.record {
            M2r2Record::EarlyExit {
                gate,
                threshold,
                kv_policy,
                ..
            } => {
                meta.push(("gate".into(), gate.to_string()));
                // f32's Display is the shortest text that parses back to the same value.
                meta.push(("threshold".into(), threshold.to_string()));
                meta.push(("kv_policy".into(), kv_policy.to_string()));
            }
            M2r2Record::Speculative {
                draft_gate,
                gate,
                draft_length,
                ..
            } => {
                meta.push(("draft_gate".into(), draft_gate.to_string()));
                meta.push(("gate".into(), gate.map_or("none".into(), |g| g.to_string())));
                meta.push(("draft_max".into(), draft_length.max().to_string()));
                match draft_length {
                    DraftLength::Fixed(_) => meta.push(("draft_length".into(), "fixed".into())),
                    DraftLength::Dynamic { threshold, .. } => {
                        meta.push(("draft_length".into(), "dynamic".into()));
                        meta.push(("draft_threshold".into(), threshold.to_string()));
                    }
                }
            }
        }
        meta
    }

    /// Read the mode's tensors and metadata; `n` is the number of tokens.
    pub(super) fn read(file: &GoldenFile<'_>, mode: &str, n: usize) -> Result<M2r2Golden> {
        let bad = |key: &str, value: &str| {
            Error::format(
                &file.label,
                format!("metadata `{key}` = `{value}` is not valid"),
            )
        };
        let parsed = |key: &str| -> Result<String> { file.field(key) };
        let number = |key: &str| -> Result<f32> {
            let v = parsed(key)?;
            v.parse().map_err(|_| bad(key, &v))
        };
        let config_json = parsed("m2r2_config")?;
        let config: crate::m2r2::config::M2r2Config = serde_json::from_str(&config_json)
            .map_err(|e| Error::format(&file.label, format!("metadata `m2r2_config`: {e}")))?;
        let j = config.num_gates();
        let record = match mode {
            "early-exit" => {
                let (shape, exit_gate) = file.i64s("exit_gate")?;
                file.expect_shape("exit_gate", &shape, &[n])?;
                let (shape, scores) = file.f32s("gate_scores")?;
                file.expect_shape("gate_scores", &shape, &[n, j])?;
                let gate = parsed("gate")?;
                let policy = parsed("kv_policy")?;
                M2r2Record::EarlyExit {
                    gate: gate.parse().map_err(|_| bad("gate", &gate))?,
                    threshold: number("threshold")?,
                    kv_policy: policy.parse().map_err(|_| bad("kv_policy", &policy))?,
                    exit_gate,
                    gate_scores: Array2::from_shape_vec((n, j), scores).expect("shape checked"),
                }
            }
            "speculative" => {
                let draft_gate = parsed("draft_gate")?;
                let draft_gate: usize = draft_gate
                    .parse()
                    .map_err(|_| bad("draft_gate", &draft_gate))?;
                let gate = match parsed("gate")?.as_str() {
                    "none" => None,
                    g => Some(g.parse().map_err(|_| bad("gate", g))?),
                };
                let max = parsed("draft_max")?;
                let max: usize = max.parse().map_err(|_| bad("draft_max", &max))?;
                let draft_length = match parsed("draft_length")?.as_str() {
                    "fixed" => DraftLength::Fixed(max),
                    "dynamic" => DraftLength::Dynamic {
                        max,
                        gate: gate.ok_or_else(|| bad("gate", "none"))?,
                        threshold: number("draft_threshold")?,
                    },
                    other => return Err(bad("draft_length", other)),
                };
                let (shape, accepted) = file.i64s("round_accepted")?;
                let r = accepted.len();
                file.expect_shape("round_accepted", &shape, &[r])?;
                let (shape, base_token) = file.i64s("round_base_token")?;
                file.expect_shape("round_base_token", &shape, &[r])?;
                let (shape, drafted) = file.i64s("round_drafted")?;
                file.expect_shape("round_drafted", &shape, &[r, max])?;
                let (shape, scores) = file.f32s("round_scores")?;
                file.expect_shape("round_scores", &shape, &[r, max + 1])?;
                M2r2Record::Speculative {
                    draft_gate,
                    gate,
                    draft_length,
                    rounds: RoundTensors {
                        drafted: Array2::from_shape_vec((r, max), drafted).expect("shape checked"),
                        accepted,
                        base_token,
                        scores: Array2::from_shape_vec((r, max + 1), scores)
                            .expect("shape checked"),
                    },
                }
            }
            other => {
                return Err(Error::format(
                    &file.label,
                    format!("unknown golden mode `{other}` (greedy, early-exit, speculative)"),
                ));
            }
        };
        Ok(M2r2Golden {
            config_json,
            weights_hash: parsed("m2r2_hash")?,
            record,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_ATOL;
    use super::*;
    use crate::base::model::Model;
    use crate::io::builtin;
    use crate::m2r2::exit_gate::gate_score;
    use ndarray::ArrayView1;

    fn setup(name: &str) -> (Model, M2r2Weights) {
        let model = builtin::builtin(name).unwrap();
        let weights = M2r2Weights::builtin_for(name, &model.config).unwrap();
        (model, weights)
    }

    /// A threshold that makes the built-in models exit at some steps and not at others.
    fn ee_options(threshold: f32) -> EarlyExitOptions {
        EarlyExitOptions {
            max_new_tokens: 0,
            stop_tokens: vec![],
            gate: GateKind::Arla,
            threshold,
            kv_policy: KvPolicy::Exact,
            sampling: None,
        }
    }

    fn spec_options(draft_length: DraftLength) -> SpeculativeOptions {
        SpeculativeOptions {
            max_new_tokens: 0,
            stop_tokens: vec![],
            draft_length,
            sampling: None,
        }
    }

    fn round_trip(g: &Golden) -> Golden {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("g.safetensors");
        g.write(&path).unwrap();
        let back = Golden::read(&path).unwrap();
        // NaN padding: compare through Debug, where NaN prints as NaN.
        assert_eq!(format!("{back:?}"), format!("{g:?}"));
        back
    }

    /// A threshold at the median over steps of the best ARLA score (never exiting), so that exits
    /// and full runs both occur.
    fn mixed_threshold(m2r2: M2r2<'_>, prompt: &[u32]) -> f32 {
        let g = Golden::record_early_exit(m2r2, "x", prompt, 12, &ee_options(2.0)).unwrap();
        let M2r2Record::EarlyExit { gate_scores, .. } = &g.m2r2.unwrap().record else {
            unreachable!()
        };
        let mut best: Vec<f32> = gate_scores
            .rows()
            .into_iter()
            .skip(1)
            .map(|r| r.fold(f32::MIN, |a, &b| a.max(b)))
            .collect();
        best.sort_by(f32::total_cmp);
        best[best.len() / 2]
    }

    #[test]
    fn early_exit_round_trip_and_self_check() {
        for name in builtin::BUILTIN_NAMES {
            let (model, weights) = setup(name);
            let m2r2 = M2r2::new(&model, &weights);
            let prompt = [1, 2, 3];
            let tau = mixed_threshold(m2r2, &prompt);
            let g = Golden::record_early_exit(m2r2, name, &prompt, 12, &ee_options(tau)).unwrap();
            assert_eq!(g.format_version(), 2);
            let back = round_trip(&g);
            let M2r2Record::EarlyExit { exit_gate, .. } = &back.m2r2.as_ref().unwrap().record
            else {
                unreachable!()
            };
            assert!(
                exit_gate[1..].iter().any(|&e| e > 0),
                "{name}: some tokens exit"
            );
            assert!(exit_gate[1..].contains(&0), "{name}: some run all layers");
            let report = back.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
            assert!(report.ok(), "{report:?}");
            assert!(
                report.entries.iter().all(|e| e.max_abs == 0.0),
                "{report:?}"
            );
        }
    }

    /// Under `exact`, teacher-forced exit states give back the decoder's gate scores bit for bit:
    /// the recomputation of `early_exit_logits` sees what the decoder saw.
    #[test]
    fn exact_policy_teacher_forcing_reproduces_the_decoder() {
        let (model, weights) = setup("tiny");
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [4, 5, 6];
        let tau = mixed_threshold(m2r2, &prompt);
        let mut options = golden_early_exit_options(&ee_options(tau), 12).unwrap();
        options.max_new_tokens = 12;
        let out = early_exit_generate(m2r2, &prompt, &options).unwrap();
        let seq: Vec<u32> = prompt.iter().chain(&out.tokens[..11]).copied().collect();
        let states = m2r2.all_exit_states(&seq).unwrap();
        let eps = model.config.rms_norm_eps as f32;
        for (i, t) in out.trace.iter().enumerate().skip(1) {
            let pos = prompt.len() - 1 + i;
            let us: Vec<ArrayView1<f32>> = states.iter().map(|(u, _)| u.row(pos)).collect();
            for (g, &score) in t.scores.iter().enumerate() {
                let logits = m2r2.exit_logits(us[g].insert_axis(Axis(0)));
                let again = gate_score(
                    GateKind::Arla,
                    weights.arla.as_ref(),
                    &us[..=g],
                    logits.row(0).as_slice().unwrap(),
                    eps,
                )
                .unwrap();
                assert_eq!(again.to_bits(), score.to_bits(), "step {i} gate {}", g + 1);
            }
        }
    }

    #[test]
    fn tampered_exit_gate_is_reported_at_its_step() {
        let (model, weights) = setup("tiny");
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [1, 2, 3];
        let tau = mixed_threshold(m2r2, &prompt);
        let mut g = Golden::record_early_exit(m2r2, "tiny", &prompt, 12, &ee_options(tau)).unwrap();
        let Some(M2r2Golden {
            record: M2r2Record::EarlyExit { exit_gate, .. },
            ..
        }) = &mut g.m2r2
        else {
            unreachable!()
        };
        let step = exit_gate.iter().rposition(|&e| e == 0).unwrap();
        exit_gate[step] = 1;
        let report = g.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
        let entry = report
            .entries
            .iter()
            .find(|e| e.name == "exit_gate")
            .unwrap();
        assert!(!entry.ok && entry.at == vec![step], "{entry:?}");
        assert!(!report.ok());
    }

    #[test]
    fn fast_kv_and_sampling_are_refused() {
        let (model, weights) = setup("tiny");
        let m2r2 = M2r2::new(&model, &weights);
        let mut options = ee_options(0.5);
        options.kv_policy = KvPolicy::FastKv;
        let err = Golden::record_early_exit(m2r2, "tiny", &[1], 4, &options).unwrap_err();
        assert!(err.to_string().contains("exact"), "{err}");
        let mut options = spec_options(DraftLength::Fixed(4));
        options.sampling = Some(crate::base::sampling::SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: 0,
        });
        let err = Golden::record_speculative(m2r2, "tiny", &[1], 4, 1, None, &options).unwrap_err();
        assert!(err.to_string().contains("greedy"), "{err}");
    }

    #[test]
    fn speculative_round_trip_and_self_check() {
        for name in builtin::BUILTIN_NAMES {
            let (model, weights) = setup(name);
            let m2r2 = M2r2::new(&model, &weights);
            let prompt = [7, 8, 9];
            let lengths = [
                DraftLength::Fixed(4),
                DraftLength::Dynamic {
                    max: 4,
                    gate: GateKind::Arla,
                    threshold: 0.5,
                },
            ];
            for draft_length in lengths {
                let gate =
                    matches!(draft_length, DraftLength::Dynamic { .. }).then_some(GateKind::Arla);
                let options = spec_options(draft_length);
                let g =
                    Golden::record_speculative(m2r2, name, &prompt, 13, 1, gate, &options).unwrap();
                let back = round_trip(&g);
                // Lossless: the verify logits are the base model's greedy ones, bit for bit.
                let greedy = Golden::record_greedy(&model, name, &prompt, 13).unwrap();
                assert_eq!(back.tokens, greedy.tokens);
                assert!(
                    back.logits
                        .iter()
                        .zip(&greedy.logits)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
                let report = back.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
                assert!(report.ok(), "{report:?}");
                assert!(
                    report.entries.iter().all(|e| e.max_abs == 0.0),
                    "{report:?}"
                );
            }
        }
    }

    #[test]
    fn tampered_accepted_count_is_reported_at_its_round() {
        let (model, weights) = setup("tiny");
        let m2r2 = M2r2::new(&model, &weights);
        let options = spec_options(DraftLength::Fixed(4));
        let mut g =
            Golden::record_speculative(m2r2, "tiny", &[1, 2], 12, 1, None, &options).unwrap();
        let Some(M2r2Golden {
            record: M2r2Record::Speculative { rounds, .. },
            ..
        }) = &mut g.m2r2
        else {
            unreachable!()
        };
        assert!(rounds.accepted.len() >= 3);
        rounds.accepted[2] += 1;
        let report = g.check_m2r2(m2r2, DEFAULT_ATOL).unwrap();
        let entry = report
            .entries
            .iter()
            .find(|e| e.name == "round_accepted")
            .unwrap();
        assert!(!entry.ok && entry.at == vec![2], "{entry:?}");
        let others_ok = report
            .entries
            .iter()
            .filter(|e| e.name != "round_accepted")
            .all(|e| e.ok);
        assert!(others_ok, "{report:?}");
    }

    #[test]
    fn other_m2r2_weights_are_refused() {
        let (model, weights) = setup("tiny");
        let g = Golden::record_speculative(
            M2r2::new(&model, &weights),
            "tiny",
            &[1],
            4,
            1,
            None,
            &spec_options(DraftLength::Fixed(2)),
        )
        .unwrap();
        let zeros = M2r2Weights::zeros(&model.config);
        let err = g
            .check_m2r2(M2r2::new(&model, &zeros), DEFAULT_ATOL)
            .unwrap_err();
        assert!(
            err.to_string().contains("not the ones this golden"),
            "{err}"
        );
        // The same weights with a pruned draft head draft differently: a golden of its own, which
        // checks with that head and is refused without it.
        let head = crate::m2r2::draft_head::DraftHead::new(vec![1, 2, 3, 5, 8], 320, "t").unwrap();
        let pruned = M2r2Weights {
            draft_head: Some(head),
            ..weights.clone()
        };
        let gp = Golden::record_speculative(
            M2r2::new(&model, &pruned),
            "tiny",
            &[1],
            4,
            1,
            None,
            &spec_options(DraftLength::Fixed(2)),
        )
        .unwrap();
        assert_eq!(gp.tokens, g.tokens, "lossless");
        let report = gp
            .check_m2r2(M2r2::new(&model, &pruned), DEFAULT_ATOL)
            .unwrap();
        assert!(report.ok());
        let err = gp
            .check_m2r2(M2r2::new(&model, &weights), DEFAULT_ATOL)
            .unwrap_err();
        assert!(
            err.to_string().contains("not the ones this golden"),
            "{err}"
        );
    }

    /// A version-1 greedy file (as older m2r2 wrote it) still reads and checks.
    #[test]
    fn version_1_greedy_files_still_read_and_check() {
        let (model, weights) = setup("tiny");
        let g = Golden::record_greedy(&model, "tiny", &[3, 1, 4], 5).unwrap();
        assert_eq!(g.format_version(), 1);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.safetensors");
        g.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(meta.metadata().as_ref().unwrap()["format_version"], "1");
        let back = Golden::read(&path).unwrap();
        assert_eq!(back, g);
        assert!(back.check(&model, DEFAULT_ATOL).unwrap().ok());
        let report = back
            .check_m2r2(M2r2::new(&model, &weights), DEFAULT_ATOL)
            .unwrap();
        assert!(report.ok());
    }
}
