//! Comparing the rounds of two token-tree decodes (tree shape, node tokens, accepted node, base
//! token) and the graphs' rows along them, each row named by its round and node.

use super::GraphOutputs;
use super::tree_rounds::TreeRounds;
use crate::base::tree::TokenTree;
use crate::golden::report::{Divergence, TensorCheck, Tolerance, compare_rows};
use ndarray::{Array2, ArrayView1, s};

/// The parents of nodes `1..` of `tree`.
fn parents(tree: &TokenTree) -> Vec<i64> {
    (1..tree.nodes())
        .map(|i| tree.parent(i).map_or(-1, |p| p as i64))
        .collect()
}

/// The rounds of two tree decodes, round by round: the first round whose tree, node tokens,
/// accepted node or base token differ is the divergence (naming the node); every later round
/// follows from it and is not reported again.
pub(in crate::golden) fn compare_tree_rounds(
    graph: &str,
    want: &TreeRounds,
    got: &TreeRounds,
) -> TensorCheck {
    let differs = |r: usize| {
        let tree = &want.trees[r];
        let (pw, pg) = (parents(tree), parents(&got.trees[r]));
        let (tw, tg) = (want.tokens.row(r), got.tokens.row(r));
        // tokens past a round's tree are padding
        let token = |t: ArrayView1<i64>, i: usize| t.get(i).copied().filter(|&t| t >= 0);
        let parent_at = (0..pw.len().max(pg.len())).find(|&i| pw.get(i) != pg.get(i));
        let node_token =
            (0..tw.len().max(tg.len())).find(|&i| token(tw.view(), i) != token(tg.view(), i));
        let (what, golden, recomputed, tokens) = if let Some(i) = parent_at {
            (
                format!("tree: node {}'s parent", i + 1),
                pw.get(i).into_iter().copied().collect(),
                pg.get(i).into_iter().copied().collect(),
                false,
            )
        } else if let Some(i) = node_token {
            (
                match i < tree.nodes() {
                    true => format!("node {i} (depth {}) token", tree.depth(i)),
                    false => format!("node {i} token"),
                },
                token(tw.view(), i).into_iter().collect(),
                token(tg.view(), i).into_iter().collect(),
                true,
            )
        } else if want.node[r] != got.node[r] {
            (
                "accepted node".to_string(),
                vec![want.node[r]],
                vec![got.node[r]],
                false,
            )
        } else if want.base_token[r] != got.base_token[r] {
            (
                "base token".to_string(),
                vec![want.base_token[r]],
                vec![got.base_token[r]],
                true,
            )
        } else {
            return None;
        };
        Some(Divergence {
            row: r,
            what,
            golden,
            recomputed,
            tokens,
        })
    };
    // the node tokens of the first round one decode has and the other has not
    let extra = |t: &TreeRounds, r: usize| match r < t.len() {
        true => t
            .tokens
            .row(r)
            .iter()
            .copied()
            .filter(|&x| x >= 0)
            .collect(),
        false => vec![],
    };
    let past_the_end = |r: usize| Divergence {
        row: r,
        what: "node tokens".into(),
        golden: extra(want, r),
        recomputed: extra(got, r),
        tokens: true,
    };
    super::check::rounds_check(graph, (want.len(), got.len()), differs, past_the_end)
}

/// `verify_logits` (recomputed by `graphs.0`) and `draft_logits` (by `graphs.1`) of a tree
/// golden over the rows of the first `rounds_compared` recorded rounds (the prompt's verified
/// row included), each row named by its round and node.
pub(in crate::golden) fn compare_tree_graph_outputs(
    graphs: (&str, &str),
    want: &GraphOutputs,
    got: &GraphOutputs,
    rounds: &TreeRounds,
    rounds_compared: usize,
    tol: Tolerance,
) -> [TensorCheck; 2] {
    let compare = |name,
                   graph,
                   row_name,
                   of_row: Vec<Option<(usize, usize)>>,
                   w: &Array2<f32>,
                   g: &Array2<f32>| {
        let rows = of_row
            .iter()
            .take_while(|r| r.is_none_or(|(r, _)| r < rounds_compared))
            .count();
        let head = |x: &Array2<f32>| x.slice(s![..rows.min(x.nrows()), ..]).to_owned();
        compare_rows(name, graph, head(w).view(), head(g).view(), tol, false)
            .in_tree_rounds(row_name, &of_row)
    };
    let draft_rows = rounds.draft_rows().into_iter().map(Some).collect();
    [
        compare(
            "verify_logits",
            graphs.0,
            "verified row",
            rounds.verify_rows(),
            &want.verify_logits,
            &got.verify_logits,
        ),
        compare(
            "draft_logits",
            graphs.1,
            "proposal",
            draft_rows,
            &want.draft_logits,
            &got.draft_logits,
        ),
    ]
}
