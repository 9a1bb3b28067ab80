//! Token trees on the exported graphs: the [`TreeBackend`] that the reference's tree loop
//! (`reference::decode::tree_speculation`) runs, mirroring the reference's
//! `ReferenceTreeSpeculation` step for step.
//!
//! - draft one depth: the depth's nodes through draft.onnx (feed.onnx when none of them
//!   proposes) as one chunk, written to their scratch slots with the tree's masks and positions
//!   (`tree_mask.rs`); each proposing node's `bridge_states` is the state before it on its path:
//!   the verified final state of the position before the root, or its parent's `exit_states`.
//! - verify: the kept `s_e` of every node through verifier.onnx as one tree chunk.
//! - accept: the path's rows move from their scratch slots into place, the rest is dropped.
//!
//! Static exports write the nodes to scratch slots of their fixed buffers; dynamic exports append
//! them to the growing caches breadth-first (so cache row `root + i` holds node `i` there too)
//! and take the tree's visibility as `tree_mask`; an export written before that input existed is
//! refused by name.

use super::OnnxSpeculation;
use crate::error::{Error, into_reference};
use crate::spec_cache::{Rows, SpecCache, TreeChunk};
use ndarray::{Array2, Axis};
use reference::base::tree::TokenTree;
use reference::decode::tree_backend::{LevelDraft, grow_rows};
use reference::decode::tree_speculation::TreeBackend;
use reference::m2r2::exit_gate::{GateKind, gate_score};

/// One round's states, node by node (`[T, D]` each).
#[derive(Default)]
pub(super) struct TreeState {
    /// `s_e` of the nodes drafted so far
    kept: Array2<f32>,
    /// `exit_states` of the proposing nodes (with a bridge): their children's bridge reads them
    exits: Array2<f32>,
    /// `final_states` of every node after the verification (with a bridge)
    finals: Option<Array2<f32>>,
}

impl TreeBackend for OnnxSpeculation {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn len(&self) -> usize {
        self.len
    }

    fn check_tree(&self, tree: &TokenTree, positions: usize) -> reference::Result<()> {
        let file = self.verifier.file().to_string();
        if let SpecCache::Static { kv, .. } = &self.cache
            && positions > kv.l_max()
        {
            return Err(into_reference(Error::Export {
                file,
                // the budget is the caller's: name the levers, not a count of tokens that
                // may exceed it
                msg: format!(
                    "the prompt, the budget and a token tree of {} nodes (the drafts and any \
                     --prompt-lookup branch, one scratch slot per node) need {positions} \
                     positions, {} more than the static KV buffers hold (L = {}): export again \
                     with a larger --static-cache, or ask for fewer new tokens, a smaller tree \
                     or a shorter --prompt-lookup",
                    tree.nodes(),
                    positions - kv.l_max(),
                    kv.l_max(),
                ),
            }));
        }
        if let Some(max) = self.max_rows.filter(|&m| tree.nodes() > m) {
            return Err(into_reference(Error::Export {
                file,
                msg: format!(
                    "a token tree of {} nodes is verified in one run of {} rows, but the \
                     TensorRT profile allows {max} rows per run",
                    tree.nodes(),
                    tree.nodes()
                ),
            }));
        }
        Ok(())
    }

    fn prefill(&mut self, tokens: &[u32]) -> reference::Result<Vec<f32>> {
        reference::decode::speculative::SpeculativeBackend::prefill(self, tokens)
    }

    fn draft_level(
        &mut self,
        tree: &TokenTree,
        depth: usize,
        tokens: &[u32],
        proposing: &[usize],
    ) -> reference::Result<LevelDraft> {
        let d = self.config.hidden_size;
        let root = self.len;
        if depth == 0 {
            self.tree = TreeState {
                kept: Array2::zeros((0, d)),
                exits: Array2::zeros((0, d)),
                finals: None,
            };
        }
        let level = tree.level(depth);
        // the tree so far: dynamic drafting adds a level at a time
        grow_rows(&mut self.tree.kept, level.end);
        if self.bridge {
            grow_rows(&mut self.tree.exits, level.end);
        }
        let chunk = TreeChunk {
            tree,
            first: level.start,
            root,
        };
        let at = Rows::Tree(chunk);
        if proposing.is_empty() {
            let hidden = self.run_feed(tokens, at).map_err(into_reference)?;
            self.tree
                .kept
                .slice_mut(ndarray::s![level, ..])
                .assign(&hidden);
            return Ok(LevelDraft::empty(self.config.vocab_size));
        }
        // each proposing node reads the state before it on its path (zeros elsewhere)
        let bridge_states = match self.bridge {
            true => {
                let mut h = Array2::zeros((tokens.len(), d));
                for &r in proposing {
                    match tree.parent(level.start + r) {
                        None => {
                            if let Some(v) = self.bridge_memory.state(root, self.verified)? {
                                h.row_mut(r).assign(&v);
                            }
                        }
                        Some(p) => h.row_mut(r).assign(&self.tree.exits.row(p)),
                    }
                }
                Some(h)
            }
            false => None,
        };
        let (logits, exit_prob, hidden, exits) = self
            .run_draft(tokens, bridge_states, at)
            .map_err(into_reference)?;
        self.tree
            .kept
            .slice_mut(ndarray::s![level.clone(), ..])
            .assign(&hidden);
        if let Some(exits) = exits {
            for &r in proposing {
                self.tree
                    .exits
                    .row_mut(level.start + r)
                    .assign(&exits.row(r));
            }
        }
        let logits = logits.select(Axis(0), proposing); // [P, V] or [P, K]
        let logits = match &self.draft_head {
            None => logits,
            Some(head) => {
                let v = self.config.vocab_size;
                let mut full = Array2::zeros((proposing.len(), v));
                for (r, row) in logits.rows().into_iter().enumerate() {
                    let row = head.scatter(&row.to_vec(), v);
                    full.row_mut(r).assign(&ndarray::ArrayView1::from(&row));
                }
                full
            }
        };
        // the gate's score of each proposing row, as the chain's draft step scores its row
        let scores = match self.gate {
            None => None,
            Some(GateKind::Arla) => {
                let p = exit_prob.expect("checked at load: the export has ARLA");
                Some(proposing.iter().map(|&r| p[r]).collect())
            }
            Some(kind) => {
                let eps = self.config.rms_norm_eps as f32;
                let score = |r: usize| {
                    let row = logits.row(r);
                    gate_score(kind, None, &[], row.as_slice().expect("contiguous"), eps)
                };
                Some(
                    (0..proposing.len())
                        .map(score)
                        .collect::<reference::Result<_>>()?,
                )
            }
        };
        Ok(LevelDraft { logits, scores })
    }

    fn verify_tree(&mut self, tree: &TokenTree) -> reference::Result<Array2<f32>> {
        let chunk = TreeChunk {
            tree,
            first: 0,
            root: self.len,
        };
        let kept = std::mem::take(&mut self.tree.kept);
        let (logits, finals) = self
            .run_verifier(kept, Rows::Tree(chunk))
            .map_err(into_reference)?;
        self.tree.finals = finals;
        Ok(logits)
    }

    fn accept(&mut self, path: &[usize]) -> reference::Result<()> {
        let root = self.len;
        self.cache.compact(root, path).map_err(into_reference)?;
        if let Some(finals) = self.tree.finals.take() {
            self.bridge_memory
                .verified(root, finals.select(Axis(0), path));
        }
        self.len = root + path.len();
        self.verified = self.len;
        Ok(())
    }

    fn abandon_round(&mut self) -> reference::Result<()> {
        // a dynamic export appended the round's nodes to its caches: cut them off again
        self.tree = TreeState::default();
        reference::decode::speculative::SpeculativeBackend::rollback(self, self.len);
        Ok(())
    }

    fn reset(&mut self) {
        self.tree = TreeState::default();
        reference::decode::speculative::SpeculativeBackend::rollback(self, 0);
    }
}
