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

use crate::ep::{Ep, EpConfig};
use crate::error::{Error, Result, into_reference};
use crate::greedy::logits_rows;
use crate::kv::Kv;
use crate::kv_store::KvStore;
use crate::manifest::{ExportDir, GraphKind};
use crate::session::{Input, OnnxSession};
use crate::spec_cache::{BoundSteps, Rows, SpecCache};
use crate::static_kv::StaticKv;
use crate::step::check_tokens;

mod tree;

/// draft.onnx's input with a bridge: the state before each row.
pub const BRIDGE_STATES: &str = "bridge_states";
/// draft.onnx's output with a bridge: the draft gate's exit state of each row.
pub const EXIT_STATES: &str = "exit_states";
/// verifier.onnx's output with a bridge: the final slow residual of each row.
pub const FINAL_STATES: &str = "final_states";
use ndarray::{Array1, Array2, Array3, Axis};
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

    /// Load draft.onnx and verifier.onnx of an export on `ep`. `gate` as in
    /// [`ReferenceSpeculation::new`](reference::decode::draft_verify::ReferenceSpeculation::new); the draft
    /// gate is the one the export was split at.
    pub fn load(export: &ExportDir, ep: &EpConfig, gate: Option<GateKind>) -> Result<Self> {
        let m = &export.manifest;
        if gate == Some(GateKind::Arla) && !m.has_arla {
            return Err(reference::Error::Invalid(
                "the ARLA gate needs ARLA weights, and this export has none (draft.onnx has no \
                 exit_prob output): use --gate confidence or --gate entropy"
                    .into(),
            )
            .into());
        }
        // CUDA graphs: on by default for a static export on CUDA, refused by name where they
        // cannot apply (`EpConfig::resolve_cuda_graph`)
        let static_l = export.static_l_max(GraphKind::Draft);
        let draft_path = export.graph(GraphKind::Draft)?;
        let cuda_graph =
            ep.resolve_cuda_graph(&draft_path.display().to_string(), static_l.is_some())?;
        let load = |kind| OnnxSession::load_with_cuda_graph(&export.graph(kind)?, ep, cuda_graph);
        let draft = load(GraphKind::Draft)?;
        let verifier = load(GraphKind::Verifier)?;
        let c = &m.config;
        let e = m.draft_layers;
        let (hkv, dh) = (c.num_key_value_heads, c.head_dim);
        // draft.onnx and feed.onnx both hold layers `0..e` and hand `s_e` to the verifier.
        let check_lower = |session: &OnnxSession| {
            crate::kv::check_layers(session, &(0..e))?;
            crate::kv::check_width(session, "hidden_states", c.hidden_size, "hidden_size")
        };
        check_lower(&draft)?;
        crate::kv::check_layers(&verifier, &(e..c.num_hidden_layers))?;
        crate::kv::check_width(&verifier, "logits", c.vocab_size, "vocab_size")?;
        // the bridge is read when the export's draft gate is the one it was trained at
        let bridge = m
            .m2r2
            .bridge
            .as_ref()
            .is_some_and(|b| b.gate == m.draft_gate);
        if bridge {
            // the manifest's M2R2 settings name a bridge: its tensors must be in the graphs
            for (session, tensor, names) in [
                (&draft, BRIDGE_STATES, draft.inputs()),
                (&draft, EXIT_STATES, draft.outputs()),
                (&verifier, FINAL_STATES, verifier.outputs()),
            ] {
                if !names.iter().any(|t| t.name == tensor) {
                    return Err(Error::Export {
                        file: session.file().to_string(),
                        msg: format!(
                            "m2r2_export.json's M2R2 settings name a bridge, but the graph has \
                             no `{tensor}` (export the folder again)"
                        ),
                    });
                }
            }
            crate::kv::check_width(&draft, EXIT_STATES, c.hidden_size, "hidden_size")?;
            crate::kv::check_width(&verifier, FINAL_STATES, c.hidden_size, "hidden_size")?;
        }
        let feed = if export.has(GraphKind::Feed) {
            let feed = load(GraphKind::Feed)?;
            check_lower(&feed)?;
            if ep.binds_kv(feed.ep_used()) != ep.binds_kv(draft.ep_used()) {
                return Err(Error::Export {
                    file: feed.file().to_string(),
                    msg: format!(
                        "runs on {} and draft.onnx on {}: the two share one KV cache and must \
                         run on one provider",
                        feed.ep_used(),
                        draft.ep_used()
                    ),
                });
            }
            Some(feed)
        } else {
            None
        };
        let n = c.num_hidden_layers;
        let cache = match static_l {
            // the manifest names draft, verifier and feed static together (ExportDir::open)
            Some(l_max) => {
                if verifier.ep_used() != draft.ep_used() {
                    return Err(Error::Export {
                        file: verifier.file().to_string(),
                        msg: format!(
                            "runs on {} and draft.onnx on {}: the two share one set of static \
                             KV buffers and must run on one provider",
                            verifier.ep_used(),
                            draft.ep_used()
                        ),
                    });
                }
                let kv = StaticKv::new(&draft, c, l_max)?;
                StaticKv::check_graph(&verifier, l_max)?;
                if let Some(feed) = &feed {
                    StaticKv::check_graph(feed, l_max)?;
                }
                SpecCache::Static {
                    kv,
                    split: (0..e, e..n),
                    lower: 0,
                    upper: 0,
                    // --ep-fallback onto the CPU: the sessions were built without graphs
                    bound: BoundSteps::new(cuda_graph && draft.ep_used() == Ep::Cuda)?,
                }
            }
            None => SpecCache::Dynamic {
                lower: Kv::new(0..e, hkv, dh, ep.binds_kv(draft.ep_used()))?,
                upper: Kv::new(e..n, hkv, dh, ep.binds_kv(verifier.ep_used()))?,
                sliding_window: c.sliding_window,
            },
        };
        Ok(OnnxSpeculation {
            cache,
            draft,
            verifier,
            feed,
            config: c.clone(),
            draft_layers: e,
            has_arla: m.has_arla,
            draft_head: export.draft_head.clone(),
            gate,
            kept: Vec::new(),
            bridge,
            bridge_memory: BridgeMemory::default(),
            verified: 0,
            len: 0,
            max_rows: ep.trt_max_rows(),
            tree: tree::TreeState::default(),
        })
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

    /// Run draft.onnx on `tokens` at the next positions, with `bridge_states` `[T, D]` when the
    /// export has a bridge (zeros where nothing is read): `(draft_logits [T, V] (or [T, K] with a
    /// pruned draft head), exit_prob [T] when exported, hidden_states [T, D], exit_states [T, D]
    /// with a bridge)`; the lower store grows by `T`.
    #[allow(clippy::type_complexity)]
    fn run_draft(
        &mut self,
        tokens: &[u32],
        bridge_states: Option<Array2<f32>>,
        at: Rows<'_>,
    ) -> Result<(
        Array2<f32>,
        Option<Array1<f32>>,
        Array2<f32>,
        Option<Array2<f32>>,
    )> {
        check_tokens(
            &self.config,
            tokens,
            at.first_position(self.cache.lower_len()),
        )?;
        let t = tokens.len();
        let c = &self.config;
        let bridge_states: Option<Array3<f32>> = self.bridge.then(|| {
            bridge_states
                .unwrap_or_else(|| Array2::zeros((t, c.hidden_size)))
                .insert_axis(Axis(0)) // [1, T, D]
        });
        let extra: Vec<(&str, Input<'_>)> = bridge_states
            .iter()
            .map(|b| (BRIDGE_STATES, Input::F32(b.view().into_dyn())))
            .collect();
        let mut out = self.cache.run_lower(&mut self.draft, tokens, &extra, at)?;
        let file = self.draft.file().to_string();
        let scored = self
            .draft_head
            .as_ref()
            .map_or(c.vocab_size, DraftHead::len);
        let logits = logits_rows(out.take("draft_logits")?, t, scored, &file, "draft_logits")?;
        let hidden = logits_rows(
            out.take("hidden_states")?,
            t,
            c.hidden_size,
            &file,
            "hidden_states",
        )?;
        let exit_states = match self.bridge {
            true => Some(logits_rows(
                out.take(EXIT_STATES)?,
                t,
                c.hidden_size,
                &file,
                EXIT_STATES,
            )?),
            false => None,
        };
        let exit_prob = if self.has_arla {
            let p = out.take("exit_prob")?;
            if p.shape() != [1, t] {
                return Err(Error::WrongShape {
                    file,
                    tensor: "exit_prob".into(),
                    expected: format!("[1, {t}]"),
                    actual: p.shape().to_vec(),
                });
            }
            Some(
                p.index_axis_move(Axis(0), 0)
                    .into_dimensionality()
                    .expect("rank 1"),
            )
        } else {
            None
        };
        Ok((logits, exit_prob, hidden, exit_states))
    }

    /// The slow residuals `[T, D]` at the draft gate of `tokens` at the next positions, through
    /// feed.onnx (or draft.onnx, whose other outputs are dropped, in an export without it); the
    /// lower store grows by `T`.
    fn run_feed(&mut self, tokens: &[u32], at: Rows<'_>) -> Result<Array2<f32>> {
        let Some(feed) = &mut self.feed else {
            return Ok(self.run_draft(tokens, None, at)?.2);
        };
        check_tokens(
            &self.config,
            tokens,
            at.first_position(self.cache.lower_len()),
        )?;
        let mut out = self.cache.run_lower(feed, tokens, &[], at)?;
        let hidden = out.take("hidden_states")?;
        logits_rows(
            hidden,
            tokens.len(),
            self.config.hidden_size,
            feed.file(),
            "hidden_states",
        )
    }

    /// Run verifier.onnx on slow residuals `[m, D]` after the verified positions (or on tree
    /// nodes): logits `[m, V]`, and with a bridge the final residuals (`final_states`, `[m, D]`);
    /// the upper store grows by `m` (not for tree nodes).
    fn run_verifier(
        &mut self,
        hidden: Array2<f32>,
        at: Rows<'_>,
    ) -> Result<(Array2<f32>, Option<Array2<f32>>)> {
        let m = hidden.nrows();
        let hidden: Array3<f32> = hidden.insert_axis(Axis(0)); // [1, m, D]
        let mut out = self
            .cache
            .run_upper(&mut self.verifier, hidden.view(), at)?;
        let file = self.verifier.file().to_string();
        let logits = logits_rows(
            out.take("logits")?,
            m,
            self.config.vocab_size,
            &file,
            "logits",
        )?;
        let finals = match self.bridge {
            true => {
                let d = self.config.hidden_size;
                Some(logits_rows(
                    out.take(FINAL_STATES)?,
                    m,
                    d,
                    &file,
                    FINAL_STATES,
                )?)
            }
            false => None,
        };
        Ok((logits, finals))
    }

    /// [`run_verifier`](Self::run_verifier) on the next positions, its final residuals handed
    /// to the bridge's memory.
    fn verify_next(&mut self, hidden: Array2<f32>, bound: bool) -> Result<Array2<f32>> {
        let start = self.cache.upper_len();
        let (logits, finals) = self.run_verifier(hidden, Rows::Next { bound })?;
        if let Some(finals) = finals {
            self.bridge_memory.verified(start, finals);
        }
        Ok(logits)
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
