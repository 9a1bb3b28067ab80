//! The steps of a tree round on the reference, one at a time, to time them ([`time_tree_steps`]):
//! a draft level (one depth's nodes as one chunk through the draft layers; the nodes with children
//! run a fast row, the draft head and their top candidates) and the verification of every node.
//! [`TreeRoundSteps`] runs what `decode/tree_speculation.rs`'s round runs, in the same order, on
//! the same calls; a round run step by step drafts the same tokens and takes the same base tokens
//! as `tree_speculative_generate`'s first round (tested), so the timed steps are that round's.

use super::TreeCosts;
use super::tree::level_sizes;
use crate::base::kv_cache::KvCache;
use crate::base::layer::TreeRows;
use crate::base::ops::argmax;
use crate::base::tree::TokenTree;
use crate::decode::tree_speculation::top_candidates;
use crate::error::{Error, Result};
use crate::m2r2::fast_stream::M2r2;
use ndarray::{Array1, Array2, s};
use std::collections::BTreeSet;
use std::time::Instant;

/// One tree round after a prompt, step by step: [`start`](Self::start) a tree,
/// [`draft_level`](Self::draft_level) each depth in order, [`verify`](Self::verify). Every round
/// starts at the same position (the prompt's end): nodes write scratch slots, nothing is kept.
pub struct TreeRoundSteps<'a> {
    m2r2: M2r2<'a>,
    draft_gate: usize,
    cache: KvCache,
    /// `s_N[n-1]`: the final slow residual before the root (what the root's bridge reads).
    verified_state: Array1<f32>,
    tree: TokenTree,
    tokens: Vec<u32>,
    /// `[T, D]` each node's slow residual at the draft gate.
    kept: Array2<f32>,
    /// `[T, D]` the proposing nodes' exit states (with the bridge's gate term), when bridged.
    exits: Array2<f32>,
}

impl<'a> TreeRoundSteps<'a> {
    /// Prefill `prompt` into a cache with room for trees of up to `max_nodes` nodes after it.
    /// Returns the steps and the base model's greedy token after the prompt (the first root).
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
        let model = m2r2.model;
        if prompt.is_empty() {
            return Err(Error::Invalid("the prompt is empty".into()));
        }
        m2r2.weights.config.check_gate(draft_gate, "draft gate")?;
        let mut cache = model.new_cache(prompt.len() + max_nodes)?;
        model.check_input(prompt, 0, &cache)?;
        let mut s = model.embed(prompt);
        for l in 0..model.config.num_hidden_layers {
            model.layer_forward(l, &mut s, 0, &mut cache);
        }
        cache.set_len(prompt.len());
        let last = prompt.len() - 1;
        let logits = model.head(s.slice(s![last.., ..])).logits;
        let first = argmax(logits.row(0).as_slice().expect("contiguous")) as u32;
        let steps = TreeRoundSteps {
            m2r2,
            draft_gate,
            cache,
            verified_state: s.row(last).to_owned(),
            tree: TokenTree::from_widths(&[])?,
            tokens: vec![first],
            kept: Array2::zeros((1, model.config.hidden_size)),
            exits: Array2::zeros((0, model.config.hidden_size)),
        };
        Ok((steps, first))
    }

    /// Begin a round of `tree` whose root is `root`.
    ///
    /// # Errors
    /// A tree the cache has no room for.
    pub fn start(&mut self, tree: &TokenTree, root: u32) -> Result<()> {
        let d = self.m2r2.model.config.hidden_size;
        self.tree = tree.clone();
        self.tokens = vec![0; tree.nodes()];
        self.tokens[0] = root;
        self.m2r2
            .model
            .check_tree(&self.tokens, &self.tree, &self.cache)?;
        self.kept = Array2::zeros((tree.nodes(), d));
        let bridged = self.m2r2.weights.bridge_at(self.draft_gate).is_some();
        self.exits = Array2::zeros((if bridged { tree.nodes() } else { 0 }, d));
        Ok(())
    }

    /// Draft depth `d` (after depths `0..d`): its nodes as one chunk through the draft layers;
    /// the nodes with children run a fast row in the draft gate's interval (reading the bridge:
    /// the verified state at the root, the parent's exit state below), and the top candidates of
    /// their exit logits, best first, become their children's tokens.
    pub fn draft_level(&mut self, d: usize) {
        let m2r2 = self.m2r2;
        let model = m2r2.model;
        let tree = &self.tree;
        let n = self.cache.len();
        let level = tree.level(d);
        let rows = TreeRows {
            tree,
            first: level.start,
        };
        let mut s = model.embed(&self.tokens[level.clone()]); // [T_d, D]
        let proposing: Vec<usize> = level
            .clone()
            .filter(|&i| !tree.children(i).is_empty())
            .map(|i| i - level.start)
            .collect();
        let bridged = self.exits.nrows() > 0;
        let (entry, at_gate) = if bridged && !proposing.is_empty() {
            let h = Array2::from_shape_fn((proposing.len(), model.config.hidden_size), |(r, c)| {
                match tree.parent(level.start + proposing[r]) {
                    None => self.verified_state[c],
                    Some(parent) => self.exits[[parent, c]],
                }
            }); // [proposing, D]
            m2r2.bridge_terms(self.draft_gate, h.view())
        } else {
            (None, None)
        };
        let mut exit_states = Array2::zeros((0, 0));
        for j in 0..self.draft_gate {
            let last = j + 1 == self.draft_gate;
            let fast: &[usize] = if last { &proposing } else { &[] };
            let from = entry.as_ref().filter(|_| last);
            let out = m2r2.run_interval_tree_from(j, &mut s, n, rows, &mut self.cache, fast, from);
            exit_states = out.exit_states;
        }
        if let Some(t) = &at_gate {
            exit_states += t;
        }
        if bridged {
            for (row, &t) in proposing.iter().enumerate() {
                self.exits
                    .row_mut(level.start + t)
                    .assign(&exit_states.row(row));
            }
        }
        self.kept.slice_mut(s![level.clone(), ..]).assign(&s);
        if proposing.is_empty() {
            return;
        }
        let logits = match &m2r2.weights.draft_head {
            Some(pruned) => pruned.exit_logits(model, exit_states.view()).logits,
            None => model.head(exit_states.view()).logits,
        }; // [proposing, V]
        for (row, &t) in proposing.iter().enumerate() {
            let children = tree.children(level.start + t);
            let logits = logits.row(row);
            let best = top_candidates(logits.as_slice().expect("contiguous"), children.len());
            for (child, token) in children.zip(best) {
                self.tokens[child] = token;
            }
        }
    }

    /// Every node's token: the root, then the drafts of the depths drafted so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Verify the drafted tree: every node's kept residual through the layers above the draft
    /// gate as one tree chunk, then the head. Returns the base model's greedy token after each
    /// node.
    pub fn verify(&mut self) -> Vec<u32> {
        let model = self.m2r2.model;
        let n = self.cache.len();
        let first_upper = self.m2r2.weights.config.gate_layer(self.draft_gate);
        let all = TreeRows {
            tree: &self.tree,
            first: 0,
        };
        let mut kept = self.kept.clone();
        for l in first_upper..model.config.num_hidden_layers {
            model
                .layer(l)
                .forward_tree(&mut kept, n, all, &mut self.cache, None);
        }
        let base = model.head(kept.view()).logits; // [T, V]
        base.rows()
            .into_iter()
            .map(|row| argmax(row.as_slice().expect("contiguous")) as u32)
            .collect()
    }
}

/// Time the steps the tree shapes `shapes` need on the reference at `draft_gate`, after `prompt`:
/// each size of draft level that proposes (a level of `W` nodes with children: the second level of
/// the tree `W,1`), each size of leaf level (the second level of `W`), and each shape's
/// verification (after drafting it). Measured in rounds, one of each per round, after one warm-up
/// round; each figure is the median of `repeats` rounds (as `m2r2 bench --cost-shape` times chain
/// steps). Levels are timed below the root: one more key than at the root, the same rows.
///
/// # Errors
/// No shape or `repeats == 0`, a shape [`TokenTree::from_widths`] refuses or without widths, and
/// [`TreeRoundSteps::prefill`]'s.
pub fn time_tree_steps(
    m2r2: M2r2<'_>,
    draft_gate: usize,
    prompt: &[u32],
    shapes: &[Vec<usize>],
    repeats: usize,
) -> Result<TreeCosts> {
    if shapes.is_empty() || repeats == 0 || shapes.iter().any(Vec::is_empty) {
        return Err(Error::Invalid(
            "timing tree steps needs at least one shape with a width, and one repeat".into(),
        ));
    }
    let (mut proposing, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    let mut verify: Vec<TokenTree> = Vec::new();
    for widths in shapes {
        let tree = TokenTree::from_widths(widths)?;
        let levels = level_sizes(widths);
        let (&leaf, above) = levels.split_last().expect("the root");
        proposing.extend(above.iter().copied());
        leaves.insert(leaf);
        if !verify.iter().any(|t| t.nodes() == tree.nodes()) {
            verify.push(tree);
        }
    }
    // the timing trees: `W,1` (its second level proposes), `W` (its second level is leaves)
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
    let (mut steps, root) = TreeRoundSteps::prefill(m2r2, draft_gate, prompt, max_nodes)?;
    let mut times = vec![Vec::new(); propose_trees.len() + leaf_trees.len() + verify.len()];
    for round in 0..=repeats {
        let mut slot = times.iter_mut();
        for tree in propose_trees.iter().chain(&leaf_trees) {
            steps.start(tree, root)?;
            steps.draft_level(0);
            let start = Instant::now();
            steps.draft_level(1);
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let slot = slot.next().expect("a slot per step");
            if round > 0 {
                slot.push(ms);
            }
        }
        for tree in &verify {
            steps.start(tree, root)?;
            for d in 0..=tree.max_depth() {
                steps.draft_level(d);
            }
            let start = Instant::now();
            steps.verify();
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
