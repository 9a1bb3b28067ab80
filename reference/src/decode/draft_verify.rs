//! The reference's draft / verify / rollback (docs/m2r2/speculative.md), the [`SpeculativeBackend`]
//! that the speculative loop runs on. The ONNX runner implements the same trait with `draft.onnx`
//! and `verifier.onnx`, which split the model at the same layer.
//!
//! - draft: one token through intervals `0..g_d` (layers `0..e_gd`, 0-based, half-open); slow
//!   rows write the cache, the slow residual `s_{e_gd}` is kept, and (when proposing) the fast
//!   rows give the exit logits at gate `g_d`: the full head, or the pruned draft head's `K` rows
//!   (`-inf` elsewhere) when the M2R2 weights carry one ([`crate::m2r2::draft_head`]; drop it
//!   from the weights for the full head).
//!   The fast stream runs only in the interval ending at `g_d`, or in all of them when ARLA needs
//!   `u_1..u_gd`.
//!   With a bridge ([`crate::m2r2::bridge`]) the proposal also reads the state before it: the
//!   final slow residual of the previous position when it is verified, else the previous draft's
//!   exit state.
//! - verify: the kept residuals of all drafted positions through layers `e_gd..N` as one chunk;
//!   its final residuals are kept for the bridge.
//! - rollback: truncate the cache; kept residuals of dropped positions are forgotten.

use crate::base::kv_cache::KvCache;
use crate::base::model::Output;
use crate::base::work::Work;
use crate::decode::bridge_state::BridgeMemory;
use crate::decode::drafting::check_draft_gate;
use crate::decode::speculative::{Draft, SpeculativeBackend};
use crate::error::Result;
use crate::m2r2::exit_gate::{GateKind, gate_score};
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array1, Array2, ArrayView1, Axis};

pub struct ReferenceSpeculation<'a> {
    m2r2: M2r2<'a>,
    cache: KvCache,
    /// g_d, 1-based
    draft_gate: usize,
    /// The gate scored at each proposal (dynamic drafting, `--trace`).
    gate: Option<GateKind>,
    /// `[D]` slow residuals at `e_gd` of positions `verified..len`
    kept: Vec<Array1<f32>>,
    /// What the bridge reads: the verified positions' final residuals and this round's exit
    /// states (kept only when drafting at this gate reads a bridge).
    bridge_memory: BridgeMemory,
    /// Positions complete in every layer.
    verified: usize,
    /// Positions fed (verified plus drafted).
    len: usize,
    /// Work of draft and verify steps (prefill excluded), counted from the shapes multiplied.
    work: Work,
}

impl<'a> ReferenceSpeculation<'a> {
    /// A backend with a cache for `capacity` positions.
    pub fn new(
        m2r2: M2r2<'a>,
        draft_gate: usize,
        gate: Option<GateKind>,
        capacity: usize,
    ) -> Result<Self> {
        let config = &m2r2.weights.config;
        check_draft_gate(config, draft_gate, "draft gate")?;
        if gate == Some(GateKind::Arla) && m2r2.weights.arla.is_none() {
            return Err(crate::Error::Invalid(
                "the ARLA gate needs ARLA weights (arla.safetensors)".into(),
            ));
        }
        Ok(ReferenceSpeculation {
            cache: m2r2.model.new_cache(capacity)?,
            m2r2,
            draft_gate,
            gate,
            kept: Vec::new(),
            bridge_memory: BridgeMemory::default(),
            verified: 0,
            len: 0,
            work: Work::default(),
        })
    }

    /// Work of the draft and verify steps so far (the prompt's prefill excluded).
    pub fn work(&self) -> Work {
        self.work
    }

    /// The KV cache (complete for the verified positions).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Drafting at this gate reads a bridge.
    fn bridged(&self) -> bool {
        self.m2r2.weights.bridge_at(self.draft_gate).is_some()
    }
}

impl SpeculativeBackend for ReferenceSpeculation<'_> {
    fn vocab_size(&self) -> usize {
        self.m2r2.model.config.vocab_size
    }

    fn len(&self) -> usize {
        self.len
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        debug_assert!(self.kept.is_empty(), "prefill after an unverified draft");
        let pos0 = self.cache.len();
        let (logits, s) = self.m2r2.model.prefill_states(tokens, &mut self.cache)?;
        if self.bridged() {
            self.bridge_memory.verified(pos0, s);
        }
        self.len = self.cache.len();
        self.verified = self.len;
        Ok(logits)
    }

    fn draft(&mut self, token: u32, propose: bool) -> Result<Option<Draft>> {
        let model = self.m2r2.model;
        let p = self.len;
        model.check_input(&[token], p, &self.cache)?;
        let mut s = model.embed(&[token]); // [1, D]
        self.work += Work::read(model.config.hidden_size);
        let all_states = self.gate == Some(GateKind::Arla);
        // the bridge's terms from h_{p-1} (proposing steps only)
        let (mut entry, mut at_gate) = (None, None);
        if let Some(bridge) = self.m2r2.weights.bridge_at(self.draft_gate)
            && propose
            && let Some(h) = self.bridge_memory.state(p, self.verified)?
        {
            self.work += bridge.work(model.config.hidden_size);
            (entry, at_gate) = self
                .m2r2
                .bridge_terms(self.draft_gate, h.insert_axis(Axis(0)));
        }
        let mut exit_states: Vec<Array1<f32>> = Vec::new();
        for j in 0..self.draft_gate {
            let last = j + 1 == self.draft_gate;
            let fast = propose && (all_states || last);
            let slots: &[usize] = if fast { &[0] } else { &[] };
            let from = entry.as_ref().filter(|_| fast && last);
            let out = self
                .m2r2
                .run_interval_from(j, &mut s, p, &mut self.cache, slots, from);
            self.work += out.work;
            if fast {
                let mut u = out.exit_states.row(0).to_owned();
                if last && let Some(t) = &at_gate {
                    u += &t.row(0);
                }
                exit_states.push(u);
            }
        }
        self.kept.push(s.row(0).to_owned());
        self.len += 1;
        if !propose {
            if self.bridged() {
                self.bridge_memory.drafted(None);
            }
            return Ok(None);
        }
        let u = exit_states
            .last()
            .expect("the draft gate's interval ran with a fast row");
        if self.bridged() {
            self.bridge_memory.drafted(Some(u.clone()));
        }
        let u_row = u.view().insert_axis(ndarray::Axis(0)); // [1, D]
        let Output { logits, work: head } = match &self.m2r2.weights.draft_head {
            Some(pruned) => pruned.exit_logits(model, u_row),
            None => model.head(u_row),
        };
        self.work += head;
        let logits = logits.row(0).to_vec();
        let score = match self.gate {
            None => None,
            Some(kind) => {
                let views: Vec<ArrayView1<f32>> = exit_states.iter().map(|u| u.view()).collect();
                let eps = model.config.rms_norm_eps as f32;
                Some(gate_score(
                    kind,
                    self.m2r2.weights.arla.as_ref(),
                    &views,
                    &logits,
                    eps,
                )?)
            }
        };
        Ok(Some(Draft { logits, score }))
    }

    fn verify(&mut self) -> Result<Array2<f32>> {
        let model = self.m2r2.model;
        let d = model.config.hidden_size;
        let mut chunk = Array2::zeros((self.kept.len(), d)); // [m, D] slow residuals at e_gd
        for (row, state) in self.kept.iter().enumerate() {
            chunk.row_mut(row).assign(state);
        }
        let first_upper = self.m2r2.weights.config.gate_layer(self.draft_gate);
        for l in first_upper..model.config.num_hidden_layers {
            self.work += model
                .layer_forward(l, &mut chunk, self.verified, &mut self.cache)
                .work;
        }
        let start = self.verified;
        self.verified += self.kept.len();
        self.kept.clear();
        self.cache.set_len(self.verified);
        let Output { logits, work: head } = model.head(chunk.view());
        self.work += head;
        if self.bridged() {
            self.bridge_memory.verified(start, chunk);
        }
        Ok(logits)
    }

    fn rollback(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.verified = self.verified.min(self.len);
        self.kept.truncate(self.len - self.verified);
        self.bridge_memory.truncate(self.len, self.verified);
        self.cache.truncate(self.verified);
    }
}
