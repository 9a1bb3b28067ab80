//! Comparing the rounds of two chain-drafting decodes (drafts, accepted count, base token), the
//! draft gate's scores and the graphs' rows along them; the `rounds` line a chain's and a tree's
//! check alike report ([`rounds_check`]).

use super::{GraphOutputs, RoundTensors};
use crate::golden::report::{Divergence, TensorCheck, Tolerance, compare_rows};
use ndarray::{Array2, s};

/// `verify_logits` (recomputed by `graphs.0`) and `draft_logits` (by `graphs.1`) over the rows of
/// the first `rounds_compared` of the recorded `rounds` (the prompt's verified row included), each
/// row named by its round.
pub(in crate::golden) fn compare_graph_outputs(
    graphs: (&str, &str),
    want: &GraphOutputs,
    got: &GraphOutputs,
    rounds: &RoundTensors,
    rounds_compared: usize,
    tol: Tolerance,
) -> [TensorCheck; 2] {
    let compare =
        |name, graph, row_name, of_row: Vec<Option<usize>>, w: &Array2<f32>, g: &Array2<f32>| {
            let rows = of_row
                .iter()
                .take_while(|r| r.is_none_or(|r| r < rounds_compared))
                .count();
            let head = |x: &Array2<f32>| x.slice(s![..rows.min(x.nrows()), ..]).to_owned();
            compare_rows(name, graph, head(w).view(), head(g).view(), tol)
                .in_rounds(row_name, &of_row)
        };
    [
        compare(
            "verify_logits",
            graphs.0,
            "verified row",
            rounds.verify_rounds(),
            &want.verify_logits,
            &got.verify_logits,
        ),
        compare(
            "draft_logits",
            graphs.1,
            "proposal",
            rounds.proposal_rounds(),
            &want.draft_logits,
            &got.draft_logits,
        ),
    ]
}

/// The draft gate's scores of the recorded rounds (rows: rounds) against the replay's; skipped
/// when none were recorded (fixed-length drafts score nothing).
pub(in crate::golden) fn compare_scores(
    graph: &str,
    want: &Array2<f32>,
    got: &Array2<f32>,
    tol: Tolerance,
) -> TensorCheck {
    if want.iter().all(|s| s.is_nan()) && got.iter().all(|s| s.is_nan()) {
        return TensorCheck::skipped(
            "round_scores",
            graph,
            "no scores recorded (fixed-length drafts score no gate)",
        );
    }
    let rounds: Vec<Option<usize>> = (0..want.nrows()).map(Some).collect();
    let common = want.nrows().min(got.nrows());
    compare_rows(
        "round_scores",
        graph,
        want.slice(s![..common, ..]),
        got.slice(s![..common, ..]),
        tol,
    )
    .in_rounds("round", &rounds)
}

/// What a golden's rounds are compared with, which decides what rounds past the shorter decode's
/// last mean.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::golden) enum Against {
    /// The engine's decode of the golden's own budget and stop tokens (`check`): a round one
    /// decode has and the other has not is a difference.
    Recomputed,
    /// Another golden file (`compare`), which may have run another budget or stopped at end of
    /// turn where the golden ran on: where the two stopped is the `stop` line's verdict, and
    /// the rounds both have are compared. A decode's rounds do not depend on its budget or stop
    /// tokens (a round drafts in full even next to the budget, which cuts only what the round
    /// emits), so the shorter decode's last round is compared whole.
    Actual,
}

impl Against {
    /// The other side, in a report's words.
    pub(in crate::golden) fn word(self) -> &'static str {
        match self {
            Against::Recomputed => "recomputed",
            Against::Actual => "actual",
        }
    }
}

/// The rounds of two speculative decodes, round by round: the first round whose drafts,
/// accepted count or base token differ is the divergence (every later round follows from it and
/// is not reported again); padding is never shown. Rounds past the shorter decode's are compared
/// as `against` says.
pub(in crate::golden) fn compare_rounds(
    graph: &str,
    want: &RoundTensors,
    got: &RoundTensors,
    against: Against,
) -> TensorCheck {
    let differs = |r: usize| {
        let parts = [
            ("drafted", want.drafted_in(r), got.drafted_in(r), true),
            (
                "accepted",
                vec![want.accepted[r]],
                vec![got.accepted[r]],
                false,
            ),
            (
                "base token",
                vec![want.base_token[r]],
                vec![got.base_token[r]],
                true,
            ),
        ];
        let (what, golden, recomputed, tokens) = parts.into_iter().find(|(_, w, g, _)| w != g)?;
        Some(Divergence {
            row: r,
            what: what.into(),
            golden,
            recomputed,
            tokens,
        })
    };
    let extra = |t: &RoundTensors, r: usize| (r < t.len()).then(|| t.drafted_in(r));
    let past_the_end = |r: usize| Divergence {
        row: r,
        what: "drafted".into(),
        golden: extra(want, r).unwrap_or_default(),
        recomputed: extra(got, r).unwrap_or_default(),
        tokens: true,
    };
    rounds_check(
        graph,
        (want.len(), got.len()),
        against,
        differs,
        past_the_end,
    )
}

/// The `rounds` line of two decodes of `rounds` (golden, other) rounds, a chain's and a tree's
/// alike: `differs(r)` compares round `r` of both; the first round that differs is the
/// divergence (every later round follows from it and is not reported again). When they agree as
/// far as both go and one has more, against a recomputation `past_the_end(r)` names the first
/// extra round `r`; against another file the rounds both have are all that is compared.
pub(in crate::golden) fn rounds_check(
    graph: &str,
    (want, got): (usize, usize),
    against: Against,
    differs: impl Fn(usize) -> Option<Divergence>,
    past_the_end: impl Fn(usize) -> Divergence,
) -> TensorCheck {
    let common = want.min(got);
    let mut first: Option<Divergence> = None;
    let mut rows_over = 0;
    for d in (0..common).filter_map(differs) {
        rows_over += 1;
        first.get_or_insert(d);
    }
    if first.is_none() && want != got && against == Against::Recomputed {
        first = Some(past_the_end(common));
        rows_over = 1;
    }
    let note = match first {
        None if want == got => format!("{want} rounds equal"),
        None => format!("the first {common} of {want} vs {got} rounds compared, equal"),
        Some(_) => format!("golden {want} rounds, {} {got}", against.word()),
    };
    TensorCheck::exact("rounds", graph, "round", first, rows_over, note)
}
