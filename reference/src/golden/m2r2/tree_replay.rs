//! Running and replaying token-tree goldens on an engine: the engine's own tree loop with a
//! recorded recipe ([`run_tree_on`]), and the recorded rounds fed back through its draft and
//! verifier ([`replay_tree_rounds`]), every prefill, draft and verify output kept
//! ([`TreeRecording`]).

use super::tree_rounds::{TreeRecipe, TreeRounds};
use super::{EngineGraphs, GraphOutputs, WeightsId};
use crate::base::config::ModelConfig;
use crate::base::generate::GreedyBackend;
use crate::base::tree::TokenTree;
use crate::decode::tree_backend::{LevelDraft, tree_positions};
use crate::decode::tree_speculation::{
    TreeBackend, TreeSpeculativeOutput, tree_speculate_drafting,
};
use crate::error::{Error, Result};
use ndarray::{Array2, ArrayView1, Axis};

/// An engine a token-tree golden is replayed on, and what it was built from (checked against
/// the golden before anything runs).
pub struct TreeEngine<'a> {
    /// Runs the tree loop: drafts depth by depth, verifies the tree, keeps the accepted path; for
    /// a grown tree it scores proposing rows with the recorded gate.
    pub speculation: &'a mut dyn TreeBackend,
    /// Recomputes the logits along the recorded tokens.
    pub greedy: &'a mut dyn GreedyBackend,
    pub config: &'a ModelConfig,
    /// The M2R2 weights the engine runs (`WeightsId`; `None`: unknown, refused).
    pub weights: Option<&'a WeightsId>,
    /// The gate it drafts at, 1-based.
    pub draft_gate: usize,
    /// What the engine calls the parts that recompute each tensor.
    pub graphs: EngineGraphs<'a>,
}

/// A tree decode and what each graph produced along it.
pub(super) struct TreeRun {
    pub(super) out: TreeSpeculativeOutput,
    /// `[n, V]` the logits each token was emitted from
    pub(super) logits: Array2<f32>,
    pub(super) graphs: GraphOutputs,
}

/// Greedy token-tree speculation on any engine drafting as `recipe` says, for up to `steps`
/// tokens (stopping after the first of `stops`), collecting the logits each token was emitted
/// from (the prompt's last row, then per round the verified rows of the accepted path), every
/// node's verified row and every proposing node's draft logits.
pub(super) fn run_tree_on(
    backend: &mut dyn TreeBackend,
    recipe: &TreeRecipe,
    prompt: &[u32],
    steps: usize,
    stops: &[u32],
) -> Result<TreeRun> {
    let vocab = backend.vocab_size();
    let mut recording = TreeRecording::new(backend);
    let request = (prompt, steps, stops);
    let shape = recipe.shape()?;
    let out = tree_speculate_drafting(&mut recording, &shape, recipe.drafting(), request, None)?;
    let mut logits = Array2::zeros((out.tokens.len(), vocab));
    if !out.tokens.is_empty() {
        logits
            .row_mut(0)
            .assign(&ArrayView1::from(&recording.prefill[..]));
    }
    // Round r emits the drafts on its accepted path, then the base token (cut at the budget or a
    // stop token): token k of the round from the verified row of the path's node at depth k.
    let mut row = 1;
    for (round, verified) in out.rounds.iter().zip(&recording.verified) {
        let path = round.tree.path(round.node);
        let emitted = (round.accepted + 1).min(out.tokens.len() - row);
        for (k, &node) in path.iter().enumerate().take(emitted) {
            logits.row_mut(row + k).assign(&verified.row(node));
        }
        row += emitted;
    }
    debug_assert_eq!(row, out.tokens.len().max(1));
    let graphs = recording.graph_outputs(vocab)?;
    Ok(TreeRun {
        out,
        logits,
        graphs,
    })
}

/// What a replay of recorded rounds produced: the graphs' rows, and the draft gate's scores of
/// each round's proposing nodes (empty where the engine scored none).
pub(super) struct Replayed {
    pub(super) graphs: GraphOutputs,
    pub(super) scores: Vec<Vec<f32>>,
}

impl Replayed {
    /// The scores as a `[R, S]` tensor as wide as `like` (NaN past each round's), to compare.
    pub(super) fn scores_like(&self, like: &Array2<f32>) -> Array2<f32> {
        let width = self
            .scores
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
            .max(like.ncols());
        let mut out = Array2::from_elem((self.scores.len(), width), f32::NAN);
        for (r, row) in self.scores.iter().enumerate() {
            for (i, &x) in row.iter().enumerate() {
                out[[r, i]] = x;
            }
        }
        out
    }
}

/// Replay recorded tree rounds on `backend` with the recorded trees and tokens fed (teacher
/// forcing): the prompt, then per round the root (the last emitted token) and the recorded node
/// tokens depth by depth (the recorded proposing nodes asking for draft rows), the tree verified,
/// and the recorded path kept as far as the round emitted. What the engine's graphs produce is
/// comparable with the recording even after its own decode has parted from it. `largest` is the
/// largest tree a round may verify, checked with the engine first.
///
/// # Errors
/// An engine error (a tree the engine cannot hold, named by it); an engine that returns another
/// number of rows than the tree's nodes or proposing nodes; a recorded node token outside the
/// vocabulary.
pub(super) fn replay_tree_rounds(
    backend: &mut dyn TreeBackend,
    largest: &TokenTree,
    prompt: &[u32],
    tokens: &[u32],
    rounds: &TreeRounds,
) -> Result<Replayed> {
    let vocab = backend.vocab_size();
    let positions = tree_positions(backend.len(), prompt.len(), tokens.len(), largest.nodes());
    backend.check_tree(largest, positions)?;
    let mut recording = TreeRecording::new(backend);
    recording.prefill(prompt)?;
    let mut scores = Vec::with_capacity(rounds.len());
    let (mut last, mut row) = (tokens.first().copied(), 1);
    for r in 0..rounds.len() {
        let Some(root) = last else { break };
        let tree = &rounds.trees[r];
        let mut fed = rounds
            .tokens
            .row(r)
            .iter()
            .take(tree.nodes())
            .enumerate()
            .map(|(i, &t)| {
                u32::try_from(t)
                    .ok()
                    .filter(|&t| (t as usize) < vocab)
                    .ok_or_else(|| {
                        Error::Invalid(format!(
                            "round {r}: node {i} holds token {t}, not an id of the vocabulary of \
                             {vocab}"
                        ))
                    })
            })
            .collect::<Result<Vec<u32>>>()?;
        if fed.len() != tree.nodes() {
            return Err(Error::Invalid(format!(
                "round {r} records {} node tokens for a tree of {} nodes",
                fed.len(),
                tree.nodes()
            )));
        }
        fed[0] = root;
        let mut round_scores = Vec::new();
        for d in 0..=tree.max_depth() {
            let level = tree.level(d);
            let proposing: Vec<usize> = rounds.proposing[r]
                .iter()
                .filter(|i| level.contains(i))
                .map(|i| i - level.start)
                .collect();
            let drafted = recording.draft_level(tree, d, &fed[level], &proposing)?;
            if drafted.logits.nrows() != proposing.len() {
                return Err(Error::Invalid(format!(
                    "round {r}, depth {d}: the engine drafted {} rows for {} proposing nodes",
                    drafted.logits.nrows(),
                    proposing.len()
                )));
            }
            round_scores.extend(drafted.scores.into_iter().flatten());
        }
        scores.push(round_scores);
        let verified = recording.verify_tree(tree)?.nrows();
        if verified != tree.nodes() {
            return Err(Error::Invalid(format!(
                "round {r}: the engine verified {verified} rows for a tree of {} nodes",
                tree.nodes()
            )));
        }
        let node = usize::try_from(rounds.node[r])
            .ok()
            .filter(|&i| i < tree.nodes())
            .ok_or_else(|| Error::Invalid(format!("round {r} accepts node {}", rounds.node[r])))?;
        let path = tree.path(node);
        let emitted = (rounds.accepted[r].max(0) as usize + 1)
            .min(path.len())
            .min(tokens.len() - row);
        if emitted == 0 {
            break;
        }
        recording.accept(&path[..emitted])?;
        last = tokens.get(row + emitted - 1).copied();
        row += emitted;
    }
    Ok(Replayed {
        graphs: recording.graph_outputs(vocab)?,
        scores,
    })
}

/// A tree engine that keeps the prefill, draft and verify logits it returns.
struct TreeRecording<'a> {
    inner: &'a mut dyn TreeBackend,
    /// `[V]`
    prefill: Vec<f32>,
    /// One `[T, V]` per round.
    verified: Vec<Array2<f32>>,
    /// One `[P_d, V]` per drafted depth.
    drafts: Vec<Array2<f32>>,
}

impl<'a> TreeRecording<'a> {
    fn new(inner: &'a mut dyn TreeBackend) -> Self {
        TreeRecording {
            inner,
            prefill: vec![],
            verified: vec![],
            drafts: vec![],
        }
    }

    /// Everything recorded, as [`GraphOutputs`] of `vocab` columns.
    fn graph_outputs(&self, vocab: usize) -> Result<GraphOutputs> {
        let stacked = |rows: Vec<ArrayView1<f32>>, what: &str| -> Result<Array2<f32>> {
            if rows.is_empty() {
                return Ok(Array2::zeros((0, vocab)));
            }
            if rows.iter().any(|r| r.len() != vocab) {
                return Err(Error::Invalid(format!(
                    "the engine's {what} rows are not all {vocab} wide"
                )));
            }
            Ok(ndarray::stack(Axis(0), &rows).expect("rows of one width"))
        };
        let verified = std::iter::once(ArrayView1::from(&self.prefill[..]))
            .chain(self.verified.iter().flat_map(|v| v.rows()))
            .collect();
        let drafts = self.drafts.iter().flat_map(|d| d.rows()).collect();
        Ok(GraphOutputs {
            verify_logits: stacked(verified, "verify logits")?,
            draft_logits: stacked(drafts, "draft logits")?,
        })
    }
}

impl TreeBackend for TreeRecording<'_> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn check_tree(&self, tree: &TokenTree, positions: usize) -> Result<()> {
        self.inner.check_tree(tree, positions)
    }

    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.prefill = self.inner.prefill(tokens)?;
        Ok(self.prefill.clone())
    }

    fn draft_level(
        &mut self,
        tree: &TokenTree,
        depth: usize,
        tokens: &[u32],
        proposing: &[usize],
    ) -> Result<LevelDraft> {
        let drafted = self.inner.draft_level(tree, depth, tokens, proposing)?;
        self.drafts.push(drafted.logits.clone());
        Ok(drafted)
    }

    fn verify_tree(&mut self, tree: &TokenTree) -> Result<Array2<f32>> {
        let logits = self.inner.verify_tree(tree)?;
        self.verified.push(logits.clone());
        Ok(logits)
    }

    fn accept(&mut self, path: &[usize]) -> Result<()> {
        self.inner.accept(path)
    }

    fn abandon_round(&mut self) -> Result<()> {
        self.inner.abandon_round()
    }

    fn reset(&mut self) {
        self.inner.reset();
        (self.prefill, self.verified, self.drafts) = (vec![], vec![], vec![]);
    }
}
