//! Comparing the rounds of two chain-drafting decodes (drafts, accepted count, base token), the
//! draft gate's scores and the graphs' rows along them; the `rounds` line a chain's and a tree's
//! check alike report ([`rounds_check`]).

use super::{GraphOutputs, RoundTensors};
use crate::golden::report::{Divergence, TensorCheck, Tolerance, compare_rows};
use ndarray::{Array2, s};

/// The golden's draft logits, to tell a near tie of the draft from a fault: a drafted token that
/// differs is a near tie when the golden draft row it was drafted from scores both tokens within
/// what `tol` allows the two together (either may move by its own allowance, so the order of two
/// candidates that close may flip in a lower-precision export).
pub(in crate::golden) struct DraftTies<'a> {
    pub draft_logits: &'a Array2<f32>,
    pub tol: Tolerance,
}

impl DraftTies<'_> {
    /// Tokens `a` and `b` are a near tie in row `row` of the golden's draft logits: their
    /// distance there, when within the allowance.
    pub(super) fn gap_in_row(&self, row: usize, a: i64, b: i64) -> Option<f32> {
        let row = (row < self.draft_logits.nrows()).then(|| self.draft_logits.row(row))?;
        let logit = |t: i64| row.get(usize::try_from(t).ok()?).copied();
        let (a, b) = (logit(a)?, logit(b)?);
        let allowed = 2.0 * self.tol.atol + self.tol.rtol * (a.abs() + b.abs());
        let gap = (a - b).abs();
        (gap <= allowed).then_some(gap)
    }

    /// Draft `j` of round `r` is a near tie: the golden's token and the other decode's, in the
    /// golden's proposal row they were drafted from.
    fn chain_gap(
        &self,
        want: &RoundTensors,
        got: &RoundTensors,
        r: usize,
        j: usize,
    ) -> Option<f32> {
        let row = (0..r).map(|q| want.proposals(q)).sum::<usize>() + j;
        let token = |t: &RoundTensors| t.drafted.get((r, j)).copied().filter(|&t| t >= 0);
        self.gap_in_row(row, token(want)?, token(got)?)
    }
}

/// The note a `rounds` line that is equal but for near ties of the draft adds, `tied` naming
/// each such round and its tied drafts.
pub(in crate::golden) fn ties_note(tied: &[String]) -> String {
    match tied.is_empty() {
        true => String::new(),
        false => format!(
            "; equal but for near ties of the draft (candidates whose golden draft logits are \
             within the tolerance swapped, the same tokens emitted): {}",
            tied.join("; ")
        ),
    }
}

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
/// is not reported again); padding is never shown. With `ties` (the golden's draft logits), a
/// round whose drafts first differ at a near tie of the draft, emitting the same tokens (the
/// tie lies past the accepted drafts), is equal and named in the note; a divergence at a near tie
/// says so. Rounds past the shorter decode's are compared as `against` says.
pub(in crate::golden) fn compare_rounds(
    graph: &str,
    want: &RoundTensors,
    got: &RoundTensors,
    ties: Option<&DraftTies<'_>>,
    against: Against,
) -> TensorCheck {
    // the first draft of round `r` that differs, and its distance when it is a near tie
    let first_draft = |r: usize| {
        let (w, g) = (want.drafted_in(r), got.drafted_in(r));
        let j = (0..w.len().max(g.len())).find(|&j| w.get(j) != g.get(j))?;
        Some((j, ties.and_then(|t| t.chain_gap(want, got, r, j))))
    };
    // round `r` differs only past a near tie its accepted drafts do not reach
    let tied = |r: usize| match first_draft(r) {
        Some((j, Some(gap)))
            if want.accepted[r] == got.accepted[r]
                && want.base_token[r] == got.base_token[r]
                && usize::try_from(want.accepted[r]).is_ok_and(|a| a <= j) =>
        {
            Some((j, gap))
        }
        _ => None,
    };
    let differs = |r: usize| {
        if tied(r).is_some() {
            return None;
        }
        let drafted = match first_draft(r) {
            Some((j, Some(gap))) => format!(
                "drafted (draft {j}, a near tie of the draft: {gap:.1e} apart in the golden's \
                 draft row)"
            ),
            _ => "drafted".into(),
        };
        let parts = [
            (drafted, want.drafted_in(r), got.drafted_in(r), true),
            (
                "accepted".into(),
                vec![want.accepted[r]],
                vec![got.accepted[r]],
                false,
            ),
            (
                "base token".into(),
                vec![want.base_token[r]],
                vec![got.base_token[r]],
                true,
            ),
        ];
        let (what, golden, recomputed, tokens) = parts.into_iter().find(|(_, w, g, _)| w != g)?;
        Some(Divergence {
            row: r,
            what,
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
    let mut check = rounds_check(
        graph,
        (want.len(), got.len()),
        against,
        differs,
        past_the_end,
    );
    if check.ok {
        let tied: Vec<String> = (0..want.len().min(got.len()))
            .filter_map(|r| Some((r, tied(r)?)))
            .map(|(r, (j, gap))| format!("round {r} draft {j} ({gap:.1e} apart)"))
            .collect();
        check.note += &ties_note(&tied);
    }
    check
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
