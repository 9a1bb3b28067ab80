//! Token trees: several candidate continuations of one sequence, verified in one chunk with a
//! tree attention mask (SpecInfer, Medusa, EAGLE-2). The tree's shape only; the layer runs it
//! ([`DecoderLayer::forward_batch`](super::layer::DecoderLayer::forward_batch) with a
//! [`TreeRows`](super::layer::TreeRows)), [`Model::forward_tree`](super::model::Model::forward_tree)
//! runs a whole tree through the model.
//!
//! Nodes are numbered in breadth-first order: node 0 is the root (the newest token, the first one
//! not yet in the cache), every node's parent comes before it, and the nodes of one depth are
//! contiguous, children of an earlier parent first. With the root at position `n` (the cache holds
//! `0..n`):
//!
//! ```text
//! position(i) = n + depth(i)                            RoPE, the sliding window
//! slot(i)     = n + i                                   the cache row node i's K/V is written to
//! sees(i, j)  = j is an ancestor of i, or i itself      the tree mask
//! keys(i)     = cache[lo .. n] ++ [slot(a) for a in path(i) if position(a) >= lo]
//!               (lo = window start of position(i); path(i) = root .. i, depth by depth)
//! ```
//!
//! `keys(i)` are the keys a one-token-at-a-time decode of `path(i)` after the same cache reads at
//! `position(i)`, in the same order (the path holds exactly one node per position `n ..=
//! position(i)`), and the scratch slot of each holds the key that decode computes (same token,
//! same inputs, rotated for the same position). So node `i`'s logits are bitwise that decode's
//! (batch invariance, docs/ARCHITECTURE.md): invisible keys are skipped, not weighted by zero, so
//! the sums run over the same terms in the same order. After acceptance,
//! [`KvCache::compact`](super::kv_cache::KvCache::compact) moves the accepted path's slots to the
//! positions `n ..` (rows already rotated for those positions, so the copy is exact).
//!
//! Shape `W1,W2,...` **\[ours\]**: the root has `W1` children, each node at depth `d >= 1` has
//! `W_{d+1}`; `2,1,1` is two chains of three drafts (7 nodes), and `1,1,...,1` (m ones) the chain
//! of `--draft-len m`.

use crate::error::{Error, Result};
use std::ops::Range;

/// The most nodes (root and drafts) a tree may have: the rows of one verify chunk **\[ours\]**. The
/// batch-invariant product stays near a decode step's cost up to about 16 rows (`matmul.rs`); 64
/// leaves room for wide trees without letting a typo ask for millions of rows.
pub const MAX_TREE_NODES: usize = 64;

/// The shape of a token tree: parents and depths of its nodes in breadth-first order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenTree {
    /// `parent[i]` of node `i >= 1`; `parent[0]` is unused (the root).
    parent: Vec<usize>,
    /// `depth[i]`: edges from the root (the root 0).
    depth: Vec<usize>,
}

impl TokenTree {
    /// The tree of shape `W1,W2,...`: each node at depth `d` has `widths[d]` children (the
    /// root alone when `widths` is empty).
    ///
    /// # Errors
    /// A width of 0, or more than [`MAX_TREE_NODES`] nodes.
    pub fn from_widths(widths: &[usize]) -> Result<Self> {
        let shape = shape_text(widths);
        if let Some(d) = widths.iter().position(|&w| w == 0) {
            return Err(Error::Invalid(format!(
                "token tree {shape}: the width at depth {} is 0 (every width is at least 1)",
                d + 1
            )));
        }
        // nodes at each depth: 1, W1, W1 W2, ... (saturating: a huge shape is refused below)
        let mut nodes = 1usize;
        let mut total = 1usize;
        for &w in widths {
            nodes = nodes.saturating_mul(w);
            total = total.saturating_add(nodes);
        }
        check_size(total, &shape)?;
        let mut parent = vec![0];
        let mut level = 0..1;
        for &w in widths {
            let first = parent.len();
            for p in level.clone() {
                parent.extend(std::iter::repeat_n(p, w));
            }
            level = first..parent.len();
        }
        Ok(Self::with_parents(parent))
    }

    /// The tree of a shape written `W1,W2,...` (`"2,1,1"`), as [`TokenTree::from_widths`].
    ///
    /// # Errors
    /// An empty shape, a width that is not a whole number, and [`TokenTree::from_widths`]'s.
    pub fn parse(spec: &str) -> Result<Self> {
        let widths = spec
            .split(',')
            .map(|w| {
                w.trim().parse::<usize>().map_err(|_| {
                    Error::Invalid(format!(
                        "token tree `{spec}`: `{}` is not a width (give widths per depth, \
                         like 2,1,1)",
                        w.trim()
                    ))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        Self::from_widths(&widths)
    }

    /// A chain: the root and `drafts` nodes, each the child of the one before (shape `1,1,...`).
    ///
    /// # Errors
    /// More than [`MAX_TREE_NODES`] nodes.
    pub fn chain(drafts: usize) -> Result<Self> {
        Self::from_widths(&vec![1; drafts])
    }

    /// The tree whose node `i >= 1` has parent `parents[i - 1]`.
    ///
    /// # Errors
    /// Parents not in breadth-first order (each before its child, never decreasing), or more than
    /// [`MAX_TREE_NODES`] nodes.
    pub fn from_parents(parents: &[usize]) -> Result<Self> {
        check_size(
            parents.len() + 1,
            &format!("of {} nodes", parents.len() + 1),
        )?;
        let mut previous = 0;
        for (i, &p) in parents.iter().enumerate() {
            let node = i + 1;
            if p >= node || p < previous {
                return Err(Error::Invalid(format!(
                    "token tree: node {node} has parent {p}, but nodes are in breadth-first \
                     order (each parent before its child, parents never decreasing: here \
                     {previous}..{node})"
                )));
            }
            previous = p;
        }
        let mut parent = vec![0];
        parent.extend_from_slice(parents);
        Ok(Self::with_parents(parent))
    }

    fn with_parents(parent: Vec<usize>) -> Self {
        let mut depth = vec![0; parent.len()];
        for i in 1..parent.len() {
            depth[i] = depth[parent[i]] + 1;
        }
        TokenTree { parent, depth }
    }

    /// Nodes, the root included (at least 1).
    pub fn nodes(&self) -> usize {
        self.parent.len()
    }

    /// The parent of node `i`; `None` for the root.
    pub fn parent(&self, i: usize) -> Option<usize> {
        (i > 0).then(|| self.parent[i])
    }

    /// Edges from the root to node `i`.
    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    /// The depth of the deepest node.
    pub fn max_depth(&self) -> usize {
        *self.depth.last().expect("the root")
    }

    /// The nodes at depth `d` (contiguous in breadth-first order; empty past the deepest).
    pub fn level(&self, d: usize) -> Range<usize> {
        let first = self.depth.partition_point(|&x| x < d);
        let end = self.depth.partition_point(|&x| x <= d);
        first..end
    }

    /// The children of node `i`, best candidate first.
    pub fn children(&self, i: usize) -> Range<usize> {
        let first = 1 + self.parent[1..].partition_point(|&p| p < i);
        let end = 1 + self.parent[1..].partition_point(|&p| p <= i);
        first..end
    }

    /// The nodes from the root to `i`, depth by depth: `path(i)[d]` is at depth `d`.
    pub fn path(&self, i: usize) -> Vec<usize> {
        let mut path = vec![i];
        let mut node = i;
        while let Some(p) = self.parent(node) {
            path.push(p);
            node = p;
        }
        path.reverse();
        path
    }

    /// The tree mask: whether node `i` sees node `j` (`j` is an ancestor of `i`, or `i`).
    pub fn sees(&self, i: usize, j: usize) -> bool {
        j <= i && self.path(i).get(self.depth[j]) == Some(&j)
    }

    /// The position of node `i` when the root sits at position `root`: `root + depth(i)`.
    pub fn position(&self, i: usize, root: usize) -> usize {
        root + self.depth[i]
    }

    /// The cache rows a row of node `i` attends to, in key order, with the root at position
    /// `root` and the window starting at `lo`: `lo..root`, then the slots `root + a` of the
    /// nodes `a` of `path(i)` at positions `>= lo`; node `i`'s own slot only `with_self` (a slow
    /// row, which wrote its key; a fast row brings its own).
    pub fn key_slots(&self, i: usize, root: usize, lo: usize, with_self: bool) -> Vec<usize> {
        let mut path = self.path(i);
        if !with_self {
            path.pop();
        }
        (lo..root)
            .chain(
                path.into_iter()
                    .filter(|&a| self.position(a, root) >= lo)
                    .map(|a| root + a),
            )
            .collect()
    }
}

/// `W1,W2,...` as written.
/// A shape as it is written: `2,1,1`.
pub fn shape_text(widths: &[usize]) -> String {
    let text: Vec<String> = widths.iter().map(usize::to_string).collect();
    text.join(",")
}

fn check_size(nodes: usize, what: &str) -> Result<()> {
    if nodes > MAX_TREE_NODES {
        let nodes = if nodes == usize::MAX {
            "too many".to_string()
        } else {
            nodes.to_string()
        };
        return Err(Error::Invalid(format!(
            "token tree {what} has {nodes} nodes (the root and its drafts): one verify chunk \
             takes at most {MAX_TREE_NODES} (MAX_TREE_NODES)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod verify_tests;
