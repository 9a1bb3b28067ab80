//! The reference's tree draft / verify / accept, the [`TreeBackend`] that the tree loop
//! (`decode/tree_speculation.rs`) runs on, as `draft_verify.rs` is the chain loop's.
//!
//! - draft one depth: the depth's nodes as one tree chunk through intervals `0..g_d` (layers
//!   `0..e_gd`); slow rows write their scratch slots `n + i` and `s_{e_gd}` is kept; the nodes
//!   with children also run a fast row in interval `g_d - 1` (in every interval when ARLA scores
//!   them), whose exit logits (the full head, or the pruned draft head's `K` rows with `-inf`
//!   elsewhere) propose their children, and with a gate ([`ReferenceTreeSpeculation::with_gate`])
//!   each gets its score. With a
//!   bridge at `g_d` the fast row reads the state before it on its own path: the verified
//!   `s_N[n-1]` at the root, its parent's exit state `u_gd` below it.
//! - verify: the kept `s_{e_gd}` of all nodes through layers `e_gd..N` as one tree chunk; the
//!   final residuals are kept (the next root's bridge reads the accepted node's).
//! - accept: [`KvCache::compact`] keeps the path's slots at positions `n..`.

use crate::base::kv_cache::KvCache;
use crate::base::layer::TreeRows;
use crate::base::model::Output;
use crate::base::tree::TokenTree;
use crate::base::work::Work;
use crate::decode::drafting::check_draft_gate;
use crate::decode::tree_backend::{LevelDraft, TreeBackend, grow_rows};
use crate::error::Result;
use crate::m2r2::exit_gate::{GateKind, gate_score};
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array1, Array2, s};

pub struct ReferenceTreeSpeculation<'a> {
    m2r2: M2r2<'a>,
    cache: KvCache,
    /// g_d, 1-based
    draft_gate: usize,
    /// `[T, D]` slow residuals `s_{e_gd}` of the round's nodes (rows of depths drafted so far)
    kept: Array2<f32>,
    /// `[T, D]` the draft gate's exit states `u_gd` of the round's proposing nodes, with the
    /// bridge's gate term (kept only when drafting reads a bridge): their children's bridge reads
    exits: Array2<f32>,
    /// `[T, D]` final slow residuals `s_N` of the round's nodes, after the verification
    finals: Array2<f32>,
    /// `[D]` `s_N` of the newest verified position: the next root's bridge reads it
    verified_state: Array1<f32>,
    /// Work of draft and verify steps (prefill excluded), counted from the shapes multiplied.
    work: Work,
    /// Score the proposing rows with this gate (dynamic drafting per branch).
    gate: Option<GateKind>,
}

impl<'a> ReferenceTreeSpeculation<'a> {
    /// A backend drafting at gate `draft_gate` with a cache for `capacity` positions (the
    /// prompt, the budget and one tree's scratch slots).
    ///
    /// # Errors
    /// A draft gate outside `1..=J`, a capacity beyond the context.
    pub fn new(m2r2: M2r2<'a>, draft_gate: usize, capacity: usize) -> Result<Self> {
        check_draft_gate(&m2r2.weights.config, draft_gate, "draft gate")?;
        let d = m2r2.model.config.hidden_size;
        Ok(ReferenceTreeSpeculation {
            cache: m2r2.model.new_cache(capacity)?,
            m2r2,
            draft_gate,
            kept: Array2::zeros((0, d)),
            exits: Array2::zeros((0, d)),
            finals: Array2::zeros((0, d)),
            verified_state: Array1::zeros(d),
            work: Work::default(),
            gate: None,
        })
    }

    /// Score every proposing row with `gate` ([`LevelDraft::scores`]; ARLA's needs its weights).
    pub fn with_gate(mut self, gate: Option<GateKind>) -> Self {
        self.gate = gate;
        self
    }

    /// The KV cache (complete for the accepted positions).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Hand the cache over (the run is done).
    pub fn into_cache(self) -> KvCache {
        self.cache
    }

    /// Work of the draft and verify steps so far (the prompt's prefill excluded).
    pub fn work(&self) -> Work {
        self.work
    }

    /// Drafting at this gate reads a bridge.
    fn bridged(&self) -> bool {
        self.m2r2.weights.bridge_at(self.draft_gate).is_some()
    }
}

impl TreeBackend for ReferenceTreeSpeculation<'_> {
    fn vocab_size(&self) -> usize {
        self.m2r2.model.config.vocab_size
    }

    fn len(&self) -> usize {
        self.cache.len()
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (logits, s) = self.m2r2.model.prefill_states(tokens, &mut self.cache)?;
        self.verified_state = s.row(s.nrows() - 1).to_owned();
        Ok(logits)
    }

    fn draft_level(
        &mut self,
        tree: &TokenTree,
        depth: usize,
        tokens: &[u32],
        proposing: &[usize],
    ) -> Result<LevelDraft> {
        let model = self.m2r2.model;
        let d_model = model.config.hidden_size;
        let n = self.cache.len();
        let level = tree.level(depth);
        // the tree so far (dynamic drafting adds a level at a time): its slots fit the cache
        let mut ids = vec![0u32; tree.nodes()];
        ids[level.clone()].copy_from_slice(tokens);
        model.check_tree(&ids, tree, &self.cache)?;
        if depth == 0 {
            self.kept = Array2::zeros((0, d_model));
            self.exits = Array2::zeros((0, d_model));
        }
        grow_rows(&mut self.kept, level.end);
        if self.bridged() {
            grow_rows(&mut self.exits, level.end);
        }
        let rows = TreeRows {
            tree,
            first: level.start,
        };
        let mut s = model.embed(tokens); // [T_d, D]
        self.work += Work::read(d_model);
        // the bridge's terms: each proposing node reads the state before it on its path
        let (entry, at_gate) = if self.bridged() && !proposing.is_empty() {
            let h = Array2::from_shape_fn((proposing.len(), d_model), |(r, c)| {
                match tree.parent(level.start + proposing[r]) {
                    None => self.verified_state[c],
                    Some(parent) => self.exits[[parent, c]],
                }
            }); // [P, D]
            let bridge = self
                .m2r2
                .weights
                .bridge_at(self.draft_gate)
                .expect("bridged");
            for _ in proposing {
                self.work += bridge.work(d_model);
            }
            self.m2r2.bridge_terms(self.draft_gate, h.view())
        } else {
            (None, None)
        };
        // ARLA reads the exit state of every interval; otherwise only the draft gate's is kept
        let all_states = self.gate == Some(GateKind::Arla);
        let mut exit_states: Vec<Array2<f32>> = Vec::with_capacity(self.draft_gate);
        for j in 0..self.draft_gate {
            let last = j + 1 == self.draft_gate;
            let fast: &[usize] = if last || all_states { proposing } else { &[] };
            let from = entry.as_ref().filter(|_| last);
            let out =
                self.m2r2
                    .run_interval_tree_from(j, &mut s, n, rows, &mut self.cache, fast, from);
            self.work += out.work;
            if !fast.is_empty() {
                exit_states.push(out.exit_states);
            }
        }
        self.kept.slice_mut(s![level.clone(), ..]).assign(&s);
        let Some(mut u) = exit_states.pop() else {
            return Ok(LevelDraft::empty(self.vocab_size()));
        };
        if let Some(t) = &at_gate {
            u += t;
        }
        if self.bridged() {
            for (row, &t) in proposing.iter().enumerate() {
                self.exits.row_mut(level.start + t).assign(&u.row(row));
            }
        }
        let Output { logits, work } = match &self.m2r2.weights.draft_head {
            Some(pruned) => pruned.exit_logits(model, u.view()),
            None => model.head(u.view()),
        }; // [P, V]
        self.work += work;
        exit_states.push(u);
        let scores = match self.gate {
            None => None,
            Some(kind) => {
                let eps = model.config.rms_norm_eps as f32;
                let arla = self.m2r2.weights.arla.as_ref();
                let score = |r: usize| {
                    let views: Vec<_> = exit_states.iter().map(|u| u.row(r)).collect();
                    let row = logits.row(r);
                    gate_score(kind, arla, &views, row.as_slice().expect("contiguous"), eps)
                };
                Some(
                    (0..proposing.len())
                        .map(score)
                        .collect::<Result<Vec<f32>>>()?,
                )
            }
        };
        Ok(LevelDraft { logits, scores })
    }

    fn verify_tree(&mut self, tree: &TokenTree) -> Result<Array2<f32>> {
        let model = self.m2r2.model;
        let n = self.cache.len();
        let first_upper = self.m2r2.weights.config.gate_layer(self.draft_gate);
        let all = TreeRows { tree, first: 0 };
        let mut chunk = std::mem::replace(&mut self.kept, Array2::zeros((0, 0)));
        for l in first_upper..model.config.num_hidden_layers {
            self.work += model
                .layer(l)
                .forward_tree(&mut chunk, n, all, &mut self.cache, None)
                .work;
        }
        let Output { logits, work } = model.head(chunk.view()); // [T, V]
        self.work += work;
        self.finals = chunk;
        Ok(logits)
    }

    fn accept(&mut self, path: &[usize]) -> Result<()> {
        let last = *path.last().expect("a path holds the root");
        self.verified_state = self.finals.row(last).to_owned();
        self.cache.compact(path);
        Ok(())
    }

    fn abandon_round(&mut self) -> Result<()> {
        // the nodes wrote scratch slots past the cache's length, which the next round overwrites
        Ok(())
    }

    fn reset(&mut self) {
        let d = self.m2r2.model.config.hidden_size;
        self.cache.truncate(0);
        self.kept = Array2::zeros((0, d));
        self.exits = Array2::zeros((0, d));
        self.finals = Array2::zeros((0, d));
        self.verified_state = Array1::zeros(d);
        self.work = Work::default();
    }
}
