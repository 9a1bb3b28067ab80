//! The steps of a tree round on an engine, one at a time, to time them ([`time_tree_steps`]): a
//! draft level (one depth's nodes as one chunk through the draft layers; the nodes with children
//! run a fast row, the draft head and their top candidates) and the verification of every node.
//! [`TreeRoundSteps`] runs the tree loop's own steps (`tree_speculation::draft_depth` and
//! `TreeBackend::verify_tree`, on the reference's `ReferenceTreeSpeculation` or the ONNX runner's
//! backend) and abandons each round instead of accepting it, so every round starts at the prompt's
//! end (tested against `tree_speculative_generate`'s first round).

use super::TreeCosts;
use super::tree::level_sizes;
use crate::base::ops::argmax;
use crate::base::tree::TokenTree;
use crate::decode::prompt_lookup::with_lookup_branch;
use crate::decode::tree_draft_verify::ReferenceTreeSpeculation;
use crate::decode::tree_speculation::{TreeBackend, draft_depth};
use crate::error::{Error, Result};
use crate::m2r2::fast_stream::M2r2;
use std::collections::BTreeSet;
use std::time::Instant;

/// One tree round after a prompt, step by step: [`start`](Self::start) a tree,
/// [`draft_level`](Self::draft_level) each depth in order, [`verify`](Self::verify). Every round
/// starts at the same position (the prompt's end): the previous round is abandoned.
pub struct TreeRoundSteps<B: TreeBackend> {
    backend: B,
    tree: TokenTree,
    tokens: Vec<u32>,
}

impl<'a> TreeRoundSteps<ReferenceTreeSpeculation<'a>> {
    /// On the reference: prefill `prompt` into a cache with room for trees of up to `max_nodes`
    /// nodes after it. Returns the steps and the base model's greedy token after the prompt (the
    /// first root).
    ///
    /// # Errors
    /// An empty prompt, a draft gate outside `1..=J`, a cache beyond the context, the model's
    /// input errors.
    pub fn prefill(
        m2r2: M2r2<'a>,
        draft_gate: usize,
        prompt: &[u32],
        max_nodes: usize,
    ) -> Result<(Self, u32)> {
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        let backend = ReferenceTreeSpeculation::new(m2r2, draft_gate, prompt.len() + max_nodes)?;
        Self::prefill_on(backend, prompt)
    }
}

impl<B: TreeBackend> TreeRoundSteps<B> {
    /// Prefill `prompt` on `backend` (with room for the trees to time after it). Returns the
    /// steps and the base model's greedy token after the prompt (the first root).
    ///
    /// # Errors
    /// An empty prompt, the backend's.
    pub fn prefill_on(mut backend: B, prompt: &[u32]) -> Result<(Self, u32)> {
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        let first = argmax(&backend.prefill(prompt)?) as u32;
        let steps = TreeRoundSteps {
            backend,
            tree: TokenTree::from_widths(&[])?,
            tokens: vec![first],
        };
        Ok((steps, first))
    }

    /// Begin a round of `tree` whose root is `root`.
    ///
    /// # Errors
    /// A tree larger than the cache's room (checked when its root is drafted).
    pub fn start(&mut self, tree: &TokenTree, root: u32) -> Result<()> {
        self.backend.abandon_round()?;
        let positions = self.backend.len() + tree.nodes();
        self.backend.check_tree(tree, positions)?;
        self.tree = tree.clone();
        self.tokens = vec![0; tree.nodes()];
        self.tokens[0] = root;
        Ok(())
    }

    /// Draft depth `d` (after depths `0..d`): its nodes as one chunk through the draft layers;
    /// the nodes with children run a fast row in the draft gate's interval (reading the bridge:
    /// the verified state at the root, the parent's exit state below), and the top candidates of
    /// their exit logits, best first, become their children's tokens.
    ///
    /// # Errors
    /// The backend's (a tree the cache cannot hold, at depth 0).
    pub fn draft_level(&mut self, d: usize) -> Result<()> {
        let mut unused = vec![Vec::new(); self.tree.nodes()];
        draft_depth(
            &mut self.backend,
            &self.tree,
            d,
            &mut self.tokens,
            None,
            &mut unused,
        )
    }

    /// Every node's token: the root, then the drafts of the depths drafted so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Verify the drafted tree: every node's kept residual through the layers above the draft
    /// gate as one tree chunk, then the head. Returns the base model's greedy token after each
    /// node.
    ///
    /// # Errors
    /// The backend's.
    pub fn verify(&mut self) -> Result<Vec<u32>> {
        let base = self.backend.verify_tree(&self.tree)?; // [T, V]
        Ok(base
            .rows()
            .into_iter()
            .map(|row| argmax(row.as_slice().expect("contiguous")) as u32)
            .collect())
    }
}

/// [`time_tree_steps_on`] on the reference at `draft_gate`.
///
/// # Errors
/// [`time_tree_steps_on`]'s, and [`TreeRoundSteps::prefill`]'s.
pub fn time_tree_steps(
    m2r2: M2r2<'_>,
    draft_gate: usize,
    prompt: &[u32],
    (shapes, branches): (&[Vec<usize>], &[usize]),
    repeats: usize,
) -> Result<TreeCosts> {
    let max_nodes = timing_trees(shapes, branches)?.max_nodes;
    let backend = ReferenceTreeSpeculation::new(m2r2, draft_gate, prompt.len() + max_nodes)?;
    time_tree_steps_on(backend, prompt, (shapes, branches), repeats)
}

/// The trees [`time_tree_steps_on`] runs for `shapes`.
struct TimingTrees {
    /// sizes of draft levels that propose, and of leaf levels
    proposing: BTreeSet<usize>,
    leaves: BTreeSet<usize>,
    /// `W,1` per proposing size (its second level proposes), `W` per leaf size
    propose_trees: Vec<TokenTree>,
    leaf_trees: Vec<TokenTree>,
    /// one tree per size of verification
    verify: Vec<TokenTree>,
    max_nodes: usize,
}

fn timing_trees(shapes: &[Vec<usize>], branches: &[usize]) -> Result<TimingTrees> {
    if shapes.is_empty() || shapes.iter().any(Vec::is_empty) {
        return Err(Error::Invalid(
            "timing tree steps needs at least one shape with a width, and one repeat".into(),
        ));
    }
    let (mut proposing, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    let mut verify: Vec<TokenTree> = Vec::new();
    let mut add_verify = |tree: TokenTree| {
        if !verify.iter().any(|t| t.nodes() == tree.nodes()) {
            verify.push(tree);
        }
    };
    for widths in shapes {
        let tree = TokenTree::from_widths(widths)?;
        let levels = level_sizes(widths);
        let (&leaf, above) = levels.split_last().expect("the root");
        proposing.extend(above.iter().copied());
        leaves.insert(leaf);
        add_verify(tree);
    }
    // with a lookup branch of `b` tokens (`draft_sim::lookup`): each depth `1..=b` one more row,
    // depths past the tree the branch's node alone; the shape drafted whole, or grown and stopped
    // at any depth (every level of a prefix proposing), or at the root alone
    let root_only: Vec<usize> = Vec::new();
    for &b in branches.iter().filter(|&&b| b > 0) {
        for widths in shapes.iter().chain([&root_only]) {
            let shape = TokenTree::from_widths(widths)?;
            let merged = with_lookup_branch(&shape, b).tree;
            let b = merged.nodes() - shape.nodes();
            let levels = level_sizes(widths);
            let depth = widths.len();
            for d in 0..=depth.max(b) {
                let rows = levels.get(d).copied().unwrap_or(0) + usize::from((1..=b).contains(&d));
                if d <= depth {
                    proposing.insert(rows);
                }
                if d >= depth {
                    leaves.insert(rows);
                }
            }
            add_verify(merged);
        }
    }
    let propose_trees = proposing
        .iter()
        .map(|&w| TokenTree::from_widths(&[w, 1]))
        .collect::<Result<Vec<_>>>()?;
    let leaf_trees = leaves
        .iter()
        .map(|&w| TokenTree::from_widths(&[w]))
        .collect::<Result<Vec<_>>>()?;
    let max_nodes = propose_trees
        .iter()
        .chain(&leaf_trees)
        .chain(&verify)
        .map(TokenTree::nodes)
        .max()
        .expect("a shape");
    Ok(TimingTrees {
        proposing,
        leaves,
        propose_trees,
        leaf_trees,
        verify,
        max_nodes,
    })
}

/// Time the steps the tree shapes `shapes` need on `backend` (at its draft gate), after `prompt`:
/// each size of draft level that proposes (a level of `W` nodes with children: the second level of
/// the tree `W,1`), each size of leaf level (the second level of `W`), and each shape's
/// verification (after drafting it); with lookup branches of `branches` tokens beside them
/// (`draft_sim::lookup`), also the levels and verifications those rounds run. Measured in rounds, one of each per round, after one warm-up
/// round; each figure is the median of `repeats` rounds (as `m2r2 bench --cost-shape` times chain
/// steps). Levels are timed below the root: one more key than at the root, the same rows.
///
/// # Errors
/// No shape or `repeats == 0`, a shape [`TokenTree::from_widths`] refuses or without widths, and
/// [`TreeRoundSteps::prefill`]'s.
pub fn time_tree_steps_on<B: TreeBackend>(
    backend: B,
    prompt: &[u32],
    (shapes, branches): (&[Vec<usize>], &[usize]),
    repeats: usize,
) -> Result<TreeCosts> {
    let TimingTrees {
        proposing,
        leaves,
        propose_trees,
        leaf_trees,
        verify,
        ..
    } = timing_trees(shapes, branches)?;
    if repeats == 0 {
        return Err(Error::Invalid(
            "timing tree steps needs at least one shape with a width, and one repeat".into(),
        ));
    }
    let (mut steps, root) = TreeRoundSteps::prefill_on(backend, prompt)?;
    let mut times = vec![Vec::new(); propose_trees.len() + leaf_trees.len() + verify.len()];
    for round in 0..=repeats {
        let mut slot = times.iter_mut();
        for tree in propose_trees.iter().chain(&leaf_trees) {
            steps.start(tree, root)?;
            steps.draft_level(0)?;
            let start = Instant::now();
            steps.draft_level(1)?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let slot = slot.next().expect("a slot per step");
            if round > 0 {
                slot.push(ms);
            }
        }
        for tree in &verify {
            steps.start(tree, root)?;
            for d in 0..=tree.max_depth() {
                steps.draft_level(d)?;
            }
            let start = Instant::now();
            steps.verify()?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let slot = slot.next().expect("a slot per step");
            if round > 0 {
                slot.push(ms);
            }
        }
    }
    let mut medians = times.iter().map(|t| median(t));
    let mut costs = TreeCosts::default();
    let set = |v: &mut Vec<Option<f64>>, rows: usize, ms: f64| {
        if v.len() < rows {
            v.resize(rows, None);
        }
        v[rows - 1] = Some(ms);
    };
    for &w in &proposing {
        set(&mut costs.propose, w, medians.next().expect("timed"));
    }
    for &w in &leaves {
        set(&mut costs.leaves, w, medians.next().expect("timed"));
    }
    for tree in &verify {
        set(
            &mut costs.verify,
            tree.nodes(),
            medians.next().expect("timed"),
        );
    }
    Ok(costs)
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
