//! Comparing the rounds of two token-tree decodes (tree shape, node tokens, accepted node, base
//! token) and the graphs' rows along them, each row named by its round and node.

use super::GraphOutputs;
use super::check::{Against, DraftTies, rounds_check, ties_note};
use super::tree_rounds::TreeRounds;
use crate::base::tree::TokenTree;
use crate::golden::report::{Divergence, TensorCheck, Tolerance, compare_rows};
use ndarray::{Array2, ArrayView1, s};
use std::collections::HashMap;

/// A round whose trees differ only below near ties of the draft, and emitted the same tokens.
struct TiedRound {
    /// `(node, gap)`: the topmost differing nodes, each a near tie, with its two tokens' distance
    /// in the golden's draft row
    ties: Vec<(usize, f32)>,
}

impl DraftTies<'_> {
    /// Node `i` of round `r` is a near tie: a drafted (not looked-up) node whose golden token and
    /// recomputed token its parent's golden draft row scores within the allowance; the distance.
    fn gap(
        &self,
        want: &TreeRounds,
        got: &TreeRounds,
        rows: &HashMap<(usize, usize), usize>,
        r: usize,
        i: usize,
    ) -> Option<f32> {
        if want.lookup[r].contains(&i) {
            return None;
        }
        let parent = want.trees[r].parent(i)?;
        let token = |t: &TreeRounds| t.tokens.get((r, i)).copied();
        self.gap_in_row(*rows.get(&(r, parent))?, token(want)?, token(got)?)
    }

    /// Round `r` of two decodes with the same tree shape, when every node whose token differs
    /// lies below a near tie and both emitted the same tokens (the accepted path's and the base
    /// token): the draft's order of two near-equal candidates changed nothing the round emitted.
    fn tied_round(
        &self,
        want: &TreeRounds,
        got: &TreeRounds,
        rows: &HashMap<(usize, usize), usize>,
        r: usize,
    ) -> Option<TiedRound> {
        let tree = &want.trees[r];
        let differs = |i: usize| want.tokens.get((r, i)) != got.tokens.get((r, i));
        let emitted = |t: &TreeRounds| {
            let path = t.trees[r].path(usize::try_from(t.node[r]).ok()?);
            let tokens: Vec<i64> = path[1..].iter().map(|&i| t.tokens[[r, i]]).collect();
            Some((tokens, t.base_token[r]))
        };
        if emitted(want)? != emitted(got)? {
            return None;
        }
        // the topmost differing nodes (no differing ancestor) must each be a near tie
        let mut ties = vec![];
        for i in (1..tree.nodes()).filter(|&i| differs(i)) {
            let path = tree.path(i);
            if path[..path.len() - 1].iter().any(|&a| differs(a)) {
                continue;
            }
            ties.push((i, self.gap(want, got, rows, r, i)?));
        }
        (!ties.is_empty()).then_some(TiedRound { ties })
    }
}

/// The parents of nodes `1..` of `tree`.
fn parents(tree: &TokenTree) -> Vec<i64> {
    (1..tree.nodes())
        .map(|i| tree.parent(i).map_or(-1, |p| p as i64))
        .collect()
}

/// The rounds of two tree decodes, round by round: the first round whose tree, node tokens,
/// accepted node or base token differ is the divergence (naming the node); every later round
/// follows from it and is not reported again. With `ties` (the golden's draft logits), a round
/// whose node tokens differ only below near ties of the draft, emitting the same tokens, is equal
/// and named in the note; a divergence at a near tie says so. Rounds past the shorter decode's are
/// compared as `against` says.
pub(in crate::golden) fn compare_tree_rounds(
    graph: &str,
    want: &TreeRounds,
    got: &TreeRounds,
    ties: Option<&DraftTies<'_>>,
    against: Against,
) -> TensorCheck {
    let rows: HashMap<(usize, usize), usize> = match ties {
        Some(_) => want
            .draft_rows()
            .into_iter()
            .enumerate()
            .map(|(k, rn)| (rn, k))
            .collect(),
        None => HashMap::new(),
    };
    let tied = |r: usize| ties.and_then(|t| t.tied_round(want, got, &rows, r));
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
            if tied(r).is_some() {
                return None;
            }
            let tie =
                ties.and_then(|t| t.gap(want, got, &rows, r, i))
                    .map_or(String::new(), |gap| {
                        format!(
                            ", a near tie of the draft ({gap:.1e} apart in the golden's draft row)"
                        )
                    });
            (
                match i < tree.nodes() {
                    true => format!("node {i} (depth {}) token{tie}", tree.depth(i)),
                    false => format!("node {i} token{tie}"),
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
    let counts = (want.len(), got.len());
    let mut check = rounds_check(graph, counts, against, differs, past_the_end);
    if check.ok {
        let tied: Vec<String> = (0..want.len().min(got.len()))
            .filter_map(|r| Some((r, tied(r)?)))
            .map(|(r, t)| {
                let nodes: Vec<String> = t
                    .ties
                    .iter()
                    .map(|(i, gap)| format!("node {i} ({gap:.1e} apart)"))
                    .collect();
                format!("round {r} {}", nodes.join(", "))
            })
            .collect();
        check.note += &ties_note(&tied);
    }
    check
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
        compare_rows(name, graph, head(w).view(), head(g).view(), tol)
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
