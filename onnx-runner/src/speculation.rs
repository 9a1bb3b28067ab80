//! Self-speculative decoding over draft.onnx / verifier.onnx: the [`SpeculativeBackend`] that the
//! reference's own loop ([`reference::decode::speculative::speculative_generate`]) runs, mirroring
//! [`reference::decode::draft_verify::ReferenceSpeculation`] step for step.
//!
//! - prefill: the prompt through feed.onnx (layers `0..e`, slow stream only) and its
//!   `hidden_states` through verifier.onnx (layers `e..N`): the chained graphs equal model.onnx.
//! - draft: one token through draft.onnx; its presents extend the lower store, its slow residual
//!   `s_e` is kept, its `draft_logits` (fast exit state at gate g_d through the LM head) propose
//!   the next token, `exit_prob` is the ARLA score. A token nothing is proposed from (the last of a
//!   round) goes through feed.onnx instead: same presents and `s_e`, no fast row, no head. An
//!   export without feed.onnx (written before it existed, or `--graphs` without it) runs draft.onnx
//!   for those too and drops what it does not need. With a pruned draft head (the export's
//!   `draft_head.json`) `draft_logits` has `K` columns, scattered into `[V]` with `-inf` elsewhere
//!   exactly as the reference's pruned draft step.
//! - verify: the kept residuals of all drafted positions through verifier.onnx as one chunk.
//! - rollback: truncate both stores along the sequence axis and forget kept residuals.
//! - static exports (`export --static-cache`): the same runs on fixed buffers written in place
//!   ([`SpecCache`]), with the masks and write positions as inputs; a rollback moves lengths only.
//! - bridge (exports of M2R2 weights with one): draft.onnx reads `bridge_states`, the state before
//!   the row, chosen by the reference's own [`BridgeMemory`] from verifier.onnx's `final_states`
//!   and draft.onnx's earlier `exit_states`.
//!
//! Loading and checking the graphs: `speculation/load.rs`; one run of each graph:
//! `speculation/graphs.rs`; token trees: `speculation/tree.rs`.

use crate::error::{Result, into_reference};
use crate::kv_store::KvStore;
use crate::session::OnnxSession;
use crate::spec_cache::{Rows, SpecCache};

mod graphs;
mod load;
mod tree;

/// draft.onnx's input with a bridge: the state before each row.
pub const BRIDGE_STATES: &str = "bridge_states";
/// draft.onnx's output with a bridge: the draft gate's exit state of each row.
pub const EXIT_STATES: &str = "exit_states";
/// verifier.onnx's output with a bridge: the final slow residual of each row.
pub const FINAL_STATES: &str = "final_states";
/// draft.onnx's output with ARLA weights (`has_arla`): ARLA's exit probability of each row.
pub const EXIT_PROB: &str = "exit_prob";
use ndarray::{Array1, Array2, Axis};
use reference::ModelConfig;
use reference::decode::bridge_state::BridgeMemory;
use reference::decode::speculative::{Draft, SpeculativeBackend};
use reference::m2r2::draft_head::DraftHead;
use reference::m2r2::exit_gate::{GateKind, gate_score};

/// draft.onnx, verifier.onnx and feed.onnx with their KV stores (timed from outside, as any
/// backend, by `reference::decode::timed::Timed`).
pub struct OnnxSpeculation {
    draft: OnnxSession,
    verifier: OnnxSession,
    /// feed.onnx: the positions nothing is proposed from (the prompt, the last draft of a round)
    /// need only the slow stream; exports without it run draft.onnx for them.
    feed: Option<OnnxSession>,
    config: ModelConfig,
    /// e: draft.onnx holds layers `0..e`
    draft_layers: usize,
    has_arla: bool,
    /// The pruned draft head draft.onnx was exported with (its `draft_logits` are `[T, K]`).
    draft_head: Option<DraftHead>,
    /// The gate scored at each proposal (dynamic drafting, `--trace`).
    gate: Option<GateKind>,
    /// KV of layers `0..e` (positions `0..len`) and `e..N` (positions `0..verified`): ONNX
    /// Runtime values between runs (IoBinding; on the device for GPU providers), growing or in
    /// fixed buffers.
    cache: SpecCache,
    /// `[D]` slow residuals `s_e` of positions `verified..len`
    kept: Vec<Array1<f32>>,
    /// The export's M2R2 weights have a bridge: draft.onnx takes `bridge_states`.
    bridge: bool,
    /// What the bridge reads (the reference's rule).
    bridge_memory: BridgeMemory,
    verified: usize,
    len: usize,
    /// Rows per run at most (TensorRT's profile); a longer prompt is prefilled in chunks.
    max_rows: Option<usize>,
    /// The token tree round in progress (`speculation/tree.rs`).
    tree: tree::TreeState,
}

impl OnnxSpeculation {
    /// Whether draft.onnx reads the verified state (`bridge_states`, from verifier.onnx's
    /// `final_states`): then a verifier that is off moves the drafts too.
    pub fn has_bridge(&self) -> bool {
        self.bridge
    }

    /// The graphs' sessions (draft, verifier), e.g. for `ep_used`.
    pub fn sessions(&self) -> (&OnnxSession, &OnnxSession) {
        (&self.draft, &self.verifier)
    }

    /// Runs of the decode-time steps as CUDA graphs (static exports on CUDA, `--cuda-graph`) and
    /// of the uncaptured prefill runs; `None` when the steps are no CUDA graphs.
    pub fn cuda_graph_runs(&self) -> Option<crate::static_kv::GraphRuns> {
        self.cache.graph_runs()
    }

    /// feed.onnx's session, when the export has one.
    pub fn feed_session(&self) -> Option<&OnnxSession> {
        self.feed.as_ref()
    }

    /// The sessions (draft, verifier), e.g. to end their profiles.
    pub fn sessions_mut(&mut self) -> (&mut OnnxSession, &mut OnnxSession) {
        (&mut self.draft, &mut self.verifier)
    }

    /// KV of the draft layers and of the verifier layers, on the host (copies when they live on
    /// the device).
    pub fn kv(&mut self) -> Result<(KvStore, KvStore)> {
        self.cache.to_host()
    }

    pub fn draft_layers(&self) -> usize {
        self.draft_layers
    }

    /// The pruned draft head in use, if the export has one.
    pub fn draft_head(&self) -> Option<&DraftHead> {
        self.draft_head.as_ref()
    }

    /// Forget everything (cache, kept residuals, timings) for a new prompt.
    pub fn reset(&mut self) {
        self.rollback(0);
    }
}

impl SpeculativeBackend for OnnxSpeculation {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn len(&self) -> usize {
        self.len
    }

    fn prefill(&mut self, tokens: &[u32]) -> reference::Result<Vec<f32>> {
        debug_assert!(self.kept.is_empty(), "prefill after an unverified draft");
        let chunk = self.max_rows.unwrap_or(tokens.len()).max(1);
        let mut last = Vec::new();
        for part in tokens.chunks(chunk) {
            // the prefill: never a bound (captured) step
            let hidden = self
                .run_feed(part, Rows::Next { bound: false })
                .map_err(into_reference)?;
            let logits = self.verify_next(hidden, false).map_err(into_reference)?;
            last = logits.row(logits.nrows() - 1).to_vec();
        }
        self.len = self.cache.lower_len();
        self.verified = self.len;
        Ok(last)
    }

    fn draft(&mut self, token: u32, propose: bool) -> reference::Result<Option<Draft>> {
        let (proposal, hidden) = if propose {
            let bridge_states = match self.bridge {
                true => self
                    .bridge_memory
                    .state(self.len, self.verified)?
                    .map(|h| h.to_owned().insert_axis(Axis(0))), // [1, D]
                false => None,
            };
            let (logits, exit_prob, hidden, exits) = self
                .run_draft(&[token], bridge_states, Rows::Next { bound: true })
                .map_err(into_reference)?;
            if self.bridge {
                self.bridge_memory
                    .drafted(exits.map(|u| u.row(0).to_owned()));
            }
            (Some((logits, exit_prob)), hidden)
        } else {
            if self.bridge {
                self.bridge_memory.drafted(None);
            }
            let hidden = self
                .run_feed(&[token], Rows::Next { bound: true })
                .map_err(into_reference)?;
            (None, hidden)
        };
        self.kept.push(hidden.row(0).to_owned());
        self.len += 1;
        let Some((logits, exit_prob)) = proposal else {
            return Ok(None);
        };
        let row = logits.row(0).to_vec();
        let logits = match &self.draft_head {
            Some(head) => head.scatter(&row, self.config.vocab_size),
            None => row,
        };
        let score = match self.gate {
            None => None,
            Some(GateKind::Arla) => {
                Some(exit_prob.expect("checked at load: the export has ARLA")[0])
            }
            Some(kind) => Some(gate_score(
                kind,
                None,
                &[],
                &logits,
                self.config.rms_norm_eps as f32,
            )?),
        };
        Ok(Some(Draft { logits, score }))
    }

    fn verify(&mut self) -> reference::Result<Array2<f32>> {
        let d = self.config.hidden_size;
        let mut chunk = Array2::zeros((self.kept.len(), d)); // [m, D] slow residuals at e
        for (row, state) in self.kept.iter().enumerate() {
            chunk.row_mut(row).assign(state);
        }
        let logits = self.verify_next(chunk, true).map_err(into_reference)?;
        self.verified += self.kept.len();
        self.kept.clear();
        Ok(logits)
    }

    fn rollback(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.verified = self.verified.min(self.len);
        self.kept.truncate(self.len - self.verified);
        self.bridge_memory.truncate(self.len, self.verified);
        self.cache.truncate(self.len, self.verified);
    }
}
