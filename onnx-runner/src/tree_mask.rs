//! The masks of a token tree's rows on a static export (`export --static-cache`), whose graphs
//! take their masks as inputs: the tree attention of the reference (`reference::base::tree`)
//! written as the additive masks of [`attn_mask`](crate::static_kv::attn_mask) and
//! [`fast_attn_mask`](crate::static_kv::fast_attn_mask).
//!
//! With the root at position `n` (the buffers hold `0..n`), node `i` at position `p = n +
//! depth(i)` in scratch slot `n + i`:
//!
//! ```text
//! slow row of i:  sees buffer slots  lo..n  and  n + a for a in path(i) at positions >= lo
//! fast row of i:  the same without n + i, and its own key (column L + row)
//! lo = p + 1 - w with a sliding window w, else 0
//! ```
//!
//! Those are the keys a one-token-at-a-time decode of `path(i)` reads at `p`, so the rows compute
//! what that decode computes (the reference's tree rows bitwise; ONNX Runtime's within the
//! runner's tolerance).

use crate::static_kv::HIDDEN;
use ndarray::{Array2, Array4};
use reference::base::tree::TokenTree;

/// Key window start of a row at position `p` (the reference's `attention::window_start`).
fn window_start(p: usize, sliding_window: Option<usize>) -> usize {
    sliding_window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// The additive mask of the slow rows of `tree`'s nodes `first..first + rows`, the root at
/// position `root`, over `l_max` buffer keys.
///
/// # Shapes
/// - returns `[1, 1, rows, l_max]`
pub fn tree_attn_mask(
    tree: &TokenTree,
    first: usize,
    rows: usize,
    root: usize,
    l_max: usize,
    sliding_window: Option<usize>,
) -> Array4<f32> {
    let mut mask = Array4::from_elem((1, 1, rows, l_max), HIDDEN);
    for t in 0..rows {
        let i = first + t;
        let lo = window_start(tree.position(i, root), sliding_window);
        for j in tree.key_slots(i, root, lo, true) {
            mask[[0, 0, t, j]] = 0.0;
        }
    }
    mask
}

/// The additive mask of the fast rows of draft.onnx for `tree`'s nodes `first..first + rows`
/// (`fast_attn_mask`): the buffer keys of the node's path before it, then its own key at column
/// `l_max + t`, never another row's.
///
/// # Shapes
/// - returns `[1, 1, rows, l_max + rows]`
pub fn tree_fast_attn_mask(
    tree: &TokenTree,
    first: usize,
    rows: usize,
    root: usize,
    l_max: usize,
    sliding_window: Option<usize>,
) -> Array4<f32> {
    let mut mask = Array4::from_elem((1, 1, rows, l_max + rows), HIDDEN);
    for t in 0..rows {
        let i = first + t;
        let lo = window_start(tree.position(i, root), sliding_window);
        for j in tree.key_slots(i, root, lo, false) {
            mask[[0, 0, t, j]] = 0.0;
        }
        mask[[0, 0, t, l_max + t]] = 0.0;
    }
    mask
}

/// The `tree_mask` input of a dynamic export's speculative graphs (int64, 1 = visible) for
/// `tree`'s nodes `first..first + rows` appended after `root + first` cached positions (the
/// nodes before them, breadth-first, are the cache rows `root..root + first`).
///
/// # Shapes
/// - returns `[rows, root + first + rows]`
pub fn tree_visibility(
    tree: &TokenTree,
    first: usize,
    rows: usize,
    root: usize,
    sliding_window: Option<usize>,
) -> Array2<i64> {
    let mut mask = Array2::zeros((rows, root + first + rows));
    for t in 0..rows {
        let i = first + t;
        let lo = window_start(tree.position(i, root), sliding_window);
        for j in tree.key_slots(i, root, lo, true) {
            mask[[t, j]] = 1;
        }
    }
    mask
}

/// The `tree_mask` input for `rows` rows of one sequence after `past` cached positions: causal,
/// with the sliding window.
///
/// # Shapes
/// - returns `[rows, past + rows]`
pub fn causal_visibility(past: usize, rows: usize, sliding_window: Option<usize>) -> Array2<i64> {
    Array2::from_shape_fn((rows, past + rows), |(t, j)| {
        let p = past + t;
        i64::from(j <= p && j >= window_start(p, sliding_window))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::static_kv::{attn_mask, fast_attn_mask};

    /// Visible columns of each row, written out.
    fn visible(mask: &Array4<f32>) -> Vec<Vec<usize>> {
        let (rows, keys) = (mask.shape()[2], mask.shape()[3]);
        (0..rows)
            .map(|t| (0..keys).filter(|&j| mask[[0, 0, t, j]] == 0.0).collect())
            .collect()
    }

    /// Tree 2,1 after 3 positions (root at 3): nodes 0 (root, slot 3), 1 and 2 (depth 1, slots
    /// 4 and 5), 3 (child of 1, slot 6) and 4 (child of 2, slot 7); hand-written key sets.
    #[test]
    fn tree_rows_see_the_cache_and_their_path() {
        let tree = TokenTree::parse("2,1").unwrap();
        let slow = tree_attn_mask(&tree, 0, 5, 3, 10, None);
        assert_eq!(
            visible(&slow),
            [
                vec![0, 1, 2, 3],
                vec![0, 1, 2, 3, 4],
                vec![0, 1, 2, 3, 5],
                vec![0, 1, 2, 3, 4, 6],
                vec![0, 1, 2, 3, 5, 7],
            ]
        );
        // depth 2 alone (nodes 3 and 4), fast rows: the path before the node, then its own key
        let fast = tree_fast_attn_mask(&tree, 3, 2, 3, 10, None);
        assert_eq!(
            visible(&fast),
            [vec![0, 1, 2, 3, 4, 10], vec![0, 1, 2, 3, 5, 11]]
        );
        // a window of 3 at position 5 (nodes 3, 4): keys at positions 3..=5 only
        let windowed = tree_attn_mask(&tree, 3, 2, 3, 10, Some(3));
        assert_eq!(visible(&windowed), [vec![3, 4, 6], vec![3, 5, 7]]);
        // the dynamic export's input: depth 1 (nodes 1, 2) after 4 cache rows, int64 [2, 6]
        let dynamic = tree_visibility(&tree, 1, 2, 3, None);
        assert_eq!(
            dynamic,
            ndarray::array![[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]]
        );
    }

    /// A chain's tree masks are the causal masks of the same rows.
    #[test]
    fn a_chain_is_causal() {
        let chain = TokenTree::chain(4).unwrap();
        for w in [None, Some(2), Some(4)] {
            for (first, rows) in [(0, 5), (2, 1), (1, 3)] {
                let pos = 6 + first;
                assert_eq!(
                    tree_attn_mask(&chain, first, rows, 6, 16, w),
                    attn_mask(pos, rows, 16, w)
                );
                assert_eq!(
                    tree_fast_attn_mask(&chain, first, rows, 6, 16, w),
                    fast_attn_mask(pos, rows, 16, w)
                );
                assert_eq!(
                    tree_visibility(&chain, first, rows, 6, w),
                    causal_visibility(pos, rows, w)
                );
            }
        }
    }
}
