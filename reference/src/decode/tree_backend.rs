//! What tree speculation needs from an engine ([`TreeBackend`]), apart from the loop that drives
//! it (`decode/tree_speculation.rs`) and the backends that implement it (the reference's
//! `decode/tree_draft_verify.rs`, the ONNX runner's), so neither imports the other.

use crate::base::generate::decode_positions;
use crate::base::tree::TokenTree;
use crate::error::Result;
use ndarray::Array2;

/// Cache positions a whole tree decode needs at most (what [`TreeBackend::check_tree`] is given
/// before it starts): `cached` positions before it, then the `prompt` tokens, then rounds until
/// `new_tokens` are emitted, each verifying a tree of at most `nodes` nodes (the root included).
///
/// A round starts after `t < new_tokens` emitted tokens with `cached + prompt + t - 1` positions
/// (every emitted token but the newest, the root, is cached), and writes one scratch slot per
/// node: the last round may start at `t = new_tokens - 1`, so at most
/// `cached + prompt + (new_tokens - 1) + (nodes - 1)`. Without new tokens only the prefill runs.
///
/// A chain of `d` drafts is a tree of `d + 1` nodes; greedy decoding a tree of one node
/// ([`decode_positions`]).
pub fn tree_positions(cached: usize, prompt: usize, new_tokens: usize, nodes: usize) -> usize {
    let scratch = if new_tokens == 0 {
        0
    } else {
        nodes.saturating_sub(1)
    };
    decode_positions(cached.saturating_add(prompt), new_tokens).saturating_add(scratch)
}

/// What tree speculation needs from an engine: the reference
/// (`ReferenceTreeSpeculation`) and the ONNX runner implement it. A round is
/// `draft_level(0..=D)`, `verify_tree`, `accept`; the root sits at position `len()`.
pub trait TreeBackend {
    fn vocab_size(&self) -> usize;
    /// Positions in the cache (accepted ones: the tree's scratch slots are not counted).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Refuse a tree the engine cannot verify, with its limits named (before any work).
    ///
    /// # Errors
    /// The engine's limits (rows per verification, a fixed cache's length).
    fn check_tree(&self, _tree: &TokenTree, _positions: usize) -> Result<()> {
        Ok(())
    }
    /// Run `tokens` through the whole model, appended to the cache; logits of the last position.
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// The nodes of depth `depth` (`tokens`, one per node of `tree.level(depth)`) through the
    /// draft layers as one tree chunk: their slow rows write their scratch slots and their slow
    /// states at the draft gate are kept for [`verify_tree`](Self::verify_tree). The rows
    /// `proposing` (indices into the level) also run the fast stream: their draft logits
    /// `[proposing.len(), V]`, and their gate scores when the engine was given a gate. Depth 0
    /// (the root) starts a round.
    ///
    /// `tree` holds at least depths `0..=depth` (breadth-first numbering never changes when
    /// deeper levels are added): dynamic drafting grows it a level at a time, giving children
    /// only to the nodes whose score passes, so the round's final tree is known at
    /// [`verify_tree`](Self::verify_tree) only.
    fn draft_level(
        &mut self,
        tree: &TokenTree,
        depth: usize,
        tokens: &[u32],
        proposing: &[usize],
    ) -> Result<LevelDraft>;
    /// Every node of the round through the remaining layers as one tree chunk: base logits
    /// `[T, V]`, row `i` bitwise (reference) what decoding node `i`'s path gives.
    fn verify_tree(&mut self, tree: &TokenTree) -> Result<Array2<f32>>;
    /// Keep the nodes of `path` (from the root, each the parent of the next) at positions
    /// `len()..`, drop the rest of the round.
    ///
    /// # Errors
    /// The engine's (moving rows in device memory).
    fn accept(&mut self, path: &[usize]) -> Result<()>;
    /// Forget every position: the next call is a [`prefill`](Self::prefill) of a new prompt (a
    /// golden check decodes, then replays the recorded rounds on the same engine).
    fn reset(&mut self);
    /// Drop the round drafted so far without accepting any of it: the cache holds what it held
    /// before the round (timing runs round after round from the same position).
    ///
    /// # Errors
    /// The engine's.
    fn abandon_round(&mut self) -> Result<()>;
}

/// What [`TreeBackend::draft_level`] returns for a level's proposing rows.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelDraft {
    /// `[P, V]` draft logits (a pruned draft head's rows, `-inf` elsewhere)
    pub logits: Array2<f32>,
    /// The draft gate's score of each proposing row (`--gate`: ARLA's `p_exit`, the confidence
    /// or the entropy score of its draft logits), when the engine was given a gate.
    pub scores: Option<Vec<f32>>,
}

impl LevelDraft {
    /// No proposing rows.
    pub fn empty(vocab: usize) -> Self {
        LevelDraft {
            logits: Array2::zeros((0, vocab)),
            scores: None,
        }
    }
}

/// A backend's per-node state `[T, D]` with zero rows appended up to `rows`: a round's tree may
/// grow a level at a time (dynamic drafting), so its rows are added as its levels are drafted.
pub fn grow_rows(a: &mut Array2<f32>, rows: usize) {
    if a.nrows() < rows {
        let more = Array2::zeros((rows - a.nrows(), a.ncols()));
        a.append(ndarray::Axis(0), more.view()).expect("same width");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::draft_verify::ReferenceSpeculation;
    use crate::decode::speculative::{DraftLength, SpeculativeOptions, speculative_generate};
    use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
    use crate::decode::tree_speculation::tree_speculate;
    use crate::io::builtin;
    use crate::m2r2::exit_gate::GateKind;
    use crate::m2r2::fast_stream::M2r2;
    use crate::m2r2::weights::M2r2Weights;

    /// By hand: the prefill alone without new tokens, then one position per new token but the
    /// newest and one scratch slot per node below the root.
    #[test]
    fn tree_positions_by_hand() {
        assert_eq!(tree_positions(0, 4, 0, 5), 4);
        assert_eq!(tree_positions(0, 4, 1, 5), 8);
        assert_eq!(tree_positions(0, 4, 2, 5), 9);
        assert_eq!(tree_positions(3, 4, 10, 1), 16);
        assert_eq!(decode_positions(4, 0), 4);
        assert_eq!(decode_positions(4, 1), 4);
        assert_eq!(decode_positions(4, 3), 6);
    }

    /// A cache of exactly `tree_positions` holds every round of tree decodes on tiny (the
    /// reference's cache refuses a round past its capacity), for several shapes and budgets;
    /// with a budget of 2 the one round starts a token before the budget and fills it exactly.
    #[test]
    fn tree_positions_hold_every_round_and_are_reached() {
        let model = builtin::builtin("tiny").unwrap();
        let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
        let m2r2 = M2r2::new(&model, &weights);
        let prompt = [3u32, 1, 4, 1, 5];
        for widths in [&[1][..], &[2, 1], &[3, 2, 1], &[1, 1, 1, 1]] {
            let tree = TokenTree::from_widths(widths).unwrap();
            for budget in 1..=14 {
                let capacity = tree_positions(0, prompt.len(), budget, tree.nodes());
                let mut backend = ReferenceTreeSpeculation::new(m2r2, 1, capacity).unwrap();
                let out = tree_speculate(&mut backend, &tree, &prompt, budget, &[], None)
                    .unwrap_or_else(|e| panic!("{widths:?}, {budget} tokens: {e}"));
                assert_eq!(out.tokens.len(), budget, "{widths:?}");
                let most = out.rounds.iter().map(|r| r.start + r.tree.nodes()).max();
                if budget == 2 {
                    assert_eq!(most, Some(capacity), "{widths:?}");
                }
                assert!(most.unwrap_or(0) <= capacity, "{widths:?}, {budget}");
            }
        }
    }

    /// The same for chains, a tree of `drafts + 1` nodes: a cache of exactly that many positions
    /// holds every round of fixed and dynamic drafting, and a budget of 2 fills it (the one round
    /// verifies all its drafts, starting a token before the budget).
    #[test]
    fn chain_positions_hold_every_round_and_are_reached() {
        let model = builtin::builtin("tiny").unwrap();
        let weights = M2r2Weights::builtin_for("tiny", &model.config).unwrap();
        let prompt = [3u32, 1, 4, 1, 5];
        let dynamic = DraftLength::Dynamic {
            max: 3,
            gate: GateKind::Confidence,
            threshold: 0.5,
        };
        for draft_length in [1, 2, 4]
            .map(DraftLength::Fixed)
            .into_iter()
            .chain([dynamic])
        {
            let drafts = draft_length.max();
            for budget in 1..=14 {
                let capacity = tree_positions(0, prompt.len(), budget, drafts + 1);
                let m2r2 = M2r2::new(&model, &weights);
                let gate = matches!(draft_length, DraftLength::Dynamic { .. })
                    .then_some(GateKind::Confidence);
                let mut backend = ReferenceSpeculation::new(m2r2, 1, gate, capacity).unwrap();
                let options = SpeculativeOptions {
                    max_new_tokens: budget,
                    stop_tokens: vec![],
                    draft_length: draft_length.clone(),
                    sampling: None,
                };
                let out = speculative_generate(&mut backend, &prompt, &options)
                    .unwrap_or_else(|e| panic!("{draft_length:?}, {budget} tokens: {e}"));
                assert_eq!(out.tokens.len(), budget, "{draft_length:?}");
                let most = out
                    .rounds
                    .iter()
                    .map(|r| r.start + r.drafted.len() + 1)
                    .max();
                if budget == 2 && matches!(draft_length, DraftLength::Fixed(_)) {
                    assert_eq!(most, Some(capacity), "{draft_length:?}");
                }
                assert!(most.unwrap_or(0) <= capacity, "{draft_length:?}, {budget}");
            }
        }
    }
}
