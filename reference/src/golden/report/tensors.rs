//! Comparing a recorded tensor with its recomputation into a [`TensorCheck`]: float rows within a
//! [`Tolerance`], integer rows exactly (their first divergence), and where two decodes stopped.

use super::tolerance::Tolerance;
use super::{Divergence, TensorCheck};
use ndarray::ArrayView2;

/// Compare two tensors elementwise: OK when every `|a - b| <= atol` (rows are steps; no graph
/// named).
pub fn compare(name: &str, want: ArrayView2<f32>, got: ArrayView2<f32>, atol: f32) -> TensorCheck {
    compare_within(name, want, got, Tolerance::absolute(atol))
}

/// [`compare_rows`] with no graph named.
pub fn compare_within(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    tol: Tolerance,
) -> TensorCheck {
    compare_rows(name, "", want, got, tol)
}

/// Compare two tensors whose rows are steps, elementwise within `tol`. `at` is the worst element
/// (the largest difference relative to what `tol` allows there; with `rtol = 0` the largest
/// difference), `first_row` the first row with a value over `tol`. Non-finite values: the same
/// one in both is equal (NaN and NaN too: a value not evaluated, such as padding, or the same
/// fault reproduced; `inf` and `inf`, a pruned draft head's `-inf`); a NaN in one only is a
/// difference of NaN (reported so, beside any number), an infinity against anything else one of
/// `inf`. Tensors of other widths are a mismatch; of other lengths, the common rows are compared
/// and the note says so (where two decodes stop is judged on its own, see [`compare_stops`]).
pub fn compare_rows(
    name: &str,
    graph: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    tol: Tolerance,
) -> TensorCheck {
    let mut check = TensorCheck::new(name, graph, "step");
    if want.ncols() != got.ncols() {
        return TensorCheck {
            ok: false,
            max_abs: f32::INFINITY,
            max_rel: f32::INFINITY,
            note: format!("shape {:?} vs {:?}", want.shape(), got.shape()),
            ..check
        };
    }
    // the larger difference, NaN (a NaN against a number) larger than any
    let larger = |a: f32, b: f32| {
        if a.is_nan() || b.is_nan() {
            f32::NAN
        } else {
            a.max(b)
        }
    };
    let rows = want.nrows().min(got.nrows());
    let mut worst = 0.0f32;
    check.at = vec![0, 0];
    for r in 0..rows {
        let mut row_max = 0.0f32;
        let mut row_over = false;
        for (c, (&w, &g)) in want.row(r).iter().zip(got.row(r)).enumerate() {
            if w == g || (w.is_nan() && g.is_nan()) {
                continue;
            }
            let diff = (w - g).abs();
            let excess = tol.excess(w, g);
            if excess > worst || (excess == worst && diff > check.max_abs && tol.rtol == 0.0) {
                worst = excess;
                check.at = vec![r, c];
            }
            if excess > 1.0 {
                row_over = true;
                check.values_over += 1;
            }
            row_max = larger(row_max, diff);
            check.max_abs = larger(check.max_abs, diff);
            check.max_rel = larger(check.max_rel, diff / w.abs().max(1e-6));
        }
        if row_over {
            check.rows_over += 1;
            check.first_row.get_or_insert(r);
        }
        check.row_max_abs.push(row_max);
    }
    check.ok = worst <= 1.0;
    check.note = tol.describe();
    if want.nrows() != got.nrows() {
        check.note += &format!(
            "; the first {rows} of {} vs {} {}s compared",
            want.nrows(),
            got.nrows(),
            check.row_name
        );
    }
    check
}

/// Compare two integer tensors exactly over their common rows: `want` and `got` are row-major
/// with rows of `cols` values (`cols = 1` for a vector). `at` and `divergence` are the first
/// differing row; every row after it usually differs too, so one line reports it. With `tokens`,
/// the values are token ids.
pub fn compare_int_rows(
    name: &str,
    graph: &str,
    want: &[i64],
    got: &[i64],
    cols: usize,
    tokens: bool,
) -> TensorCheck {
    let cols = cols.max(1);
    let mut check = TensorCheck::new(name, graph, "step");
    let want_rows: Vec<&[i64]> = want.chunks(cols).collect();
    let got_rows: Vec<&[i64]> = got.chunks(cols).collect();
    for (r, (w, g)) in want_rows.iter().zip(&got_rows).enumerate() {
        let differing = w.iter().zip(*g).filter(|(a, b)| a != b).count();
        if differing == 0 {
            continue;
        }
        check.rows_over += 1;
        check.values_over += differing;
        if check.first_row.is_none() {
            let c = w.iter().zip(*g).position(|(a, b)| a != b).unwrap_or(0);
            check.first_row = Some(r);
            check.at = if cols == 1 { vec![r] } else { vec![r, c] };
            check.divergence = Some(Divergence {
                row: r,
                what: if tokens { "token" } else { "value" }.into(),
                golden: w.to_vec(),
                recomputed: g.to_vec(),
                tokens,
            });
        }
    }
    check.ok = check.first_row.is_none();
    check.max_abs = if check.ok { 0.0 } else { 1.0 };
    let common = want_rows.len().min(got_rows.len());
    check.note = if want_rows.len() == got_rows.len() {
        format!("{} values equal", want.len() - check.values_over)
    } else {
        format!(
            "the first {common} of {} vs {} {}s compared",
            want_rows.len(),
            got_rows.len(),
            check.row_name
        )
    };
    check
}

/// [`compare_int_rows`] of a vector.
pub fn compare_ints(name: &str, want: &[i64], got: &[i64], cols: usize) -> TensorCheck {
    compare_int_rows(name, "", want, got, cols, false)
}

/// How the two decodes of [`compare_stops`] were allowed to end.
#[derive(Clone, Copy, Debug)]
pub struct StopRules {
    /// The longer decode stopped at end of turn (false: recorded without stopping, it ran on).
    pub longer_stopped: bool,
    /// The shorter decode's step budget, when known (a golden's `max_steps`).
    pub shorter_budget: Option<usize>,
}

/// Where two decodes of the same prompt stopped. `None` when both emitted the same number of
/// tokens. Otherwise a `stop` verdict: OK when the shorter one ended on one of `stops` (an
/// end-of-turn token) and the longer one, recorded without stopping (`rules.longer_stopped`
/// false), has the same token there and ran on, or when the shorter one ran its whole budget
/// (`rules.shorter_budget`) without a stop token; NOT OK for any other difference.
///
/// # Shapes
/// - `want`, `got`: the emitted tokens of the golden and of the recomputation
pub fn compare_stops(
    graph: &str,
    against: &'static str,
    (want, got): (&[i64], &[i64]),
    stops: &[i64],
    rules: StopRules,
    text: &dyn Fn(i64) -> Option<String>,
) -> Option<TensorCheck> {
    if want.len() == got.len() {
        return None;
    }
    let (short, long, short_side) = if want.len() < got.len() {
        (want, got, "the golden")
    } else {
        (got, want, against)
    };
    let ended_on = short.last().copied();
    let name = |id: Option<i64>| match id {
        Some(id) => match text(id) {
            Some(t) => format!("{t:?} ({id})"),
            None => id.to_string(),
        },
        None => "nothing".into(),
    };
    let at_stop = ended_on.is_some_and(|t| stops.contains(&t));
    let shared_end = at_stop && long.get(short.len() - 1).copied() == ended_on;
    let budget_ran_out = !at_stop && rules.shorter_budget == Some(short.len());
    let ok = (shared_end && !rules.longer_stopped) || budget_ran_out;
    let ended = match (at_stop, budget_ran_out) {
        (true, _) => "stopped",
        (false, true) => "ran its whole budget and ended",
        (false, false) => "ended without a stop token",
    };
    let note = format!(
        "golden {} tokens, {against} {}: {short_side} {ended} after {} at {}{}",
        want.len(),
        got.len(),
        short.len(),
        name(ended_on),
        match (ok, budget_ran_out) {
            (true, true) => " (the common tokens are compared above)",
            (true, false) => {
                "; the other was recorded without stopping at end of turn and ran on (the common \
                 tokens are compared above)"
            }
            (false, _) => "",
        }
    );
    let mut check = TensorCheck::verdict("stop", graph, ok, note);
    check.against = against;
    check.first_row = (!ok).then_some(short.len().saturating_sub(1));
    Some(check)
}
