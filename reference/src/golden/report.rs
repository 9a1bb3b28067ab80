//! What a golden check reports: one [`TensorCheck`] per recorded tensor, naming the graph (or
//! engine) that recomputed it, the first step over the tolerance, how many steps and values are
//! over it, and each step's largest difference; integer tensors (tokens, rounds) report their
//! first divergence once instead of a cascade of differences after it.

use crate::error::{Error, Result};
use ndarray::ArrayView2;

/// The result of comparing one recorded tensor with its recomputation.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCheck {
    pub name: String,
    /// What recomputed the tensor: a graph of an export (`model.onnx`, `draft.onnx`,
    /// `verifier.onnx`), `reference`, or for a file-to-file comparison the file it came from.
    pub graph: String,
    pub ok: bool,
    /// Not compared, and why (a golden written before the tensor was recorded). A skipped check
    /// is `ok` (it found nothing wrong) but reported as skipped, never as passed.
    pub skipped: Option<String>,
    pub max_abs: f32,
    pub max_rel: f32,
    /// Index of the largest difference (relative to what the tolerance allows there), or of the
    /// first differing value of an integer tensor.
    pub at: Vec<usize>,
    /// The first row (step) over the tolerance, or the first that differs.
    pub first_row: Option<usize>,
    /// The speculative round of `first_row`, for tensors whose rows belong to rounds.
    pub first_round: Option<usize>,
    /// The token-tree node of `first_row` within its round, for tensors whose rows are a tree's
    /// nodes (`verify_logits`, `draft_logits` of a tree golden).
    pub first_node: Option<usize>,
    /// What a row of this tensor is: `step` (an emitted token), `verified row`, `proposal`,
    /// `round`.
    pub row_name: &'static str,
    /// Rows with at least one value over the tolerance (or differing).
    pub rows_over: usize,
    /// Values over the tolerance (or differing).
    pub values_over: usize,
    /// Per row, the largest absolute difference (float tensors; empty for integer ones).
    pub row_max_abs: Vec<f32>,
    /// The first divergence of an integer tensor (tokens, drafts, rounds).
    pub divergence: Option<Divergence>,
    pub note: String,
    /// What the golden is compared with, in words: `recomputed`, or `actual` for another file.
    pub against: &'static str,
}

/// Where two integer records first part: what differs there, both sides' values (never padding).
#[derive(Clone, Debug, PartialEq)]
pub struct Divergence {
    /// The row (step, round) where they part.
    pub row: usize,
    /// What differs there: `token`, `drafted`, `accepted`, `base token`, `exit gate`, ...
    pub what: String,
    pub golden: Vec<i64>,
    pub recomputed: Vec<i64>,
    /// The values are token ids (a report shows their text).
    pub tokens: bool,
}

impl TensorCheck {
    fn new(name: &str, graph: &str, row_name: &'static str) -> Self {
        TensorCheck {
            name: name.into(),
            graph: graph.into(),
            ok: true,
            skipped: None,
            max_abs: 0.0,
            max_rel: 0.0,
            at: vec![],
            first_row: None,
            first_round: None,
            first_node: None,
            row_name,
            rows_over: 0,
            values_over: 0,
            row_max_abs: vec![],
            divergence: None,
            note: String::new(),
            against: "recomputed",
        }
    }

    /// A tensor that was not compared, and why.
    pub fn skipped(name: &str, graph: &str, why: impl Into<String>) -> Self {
        let why = why.into();
        TensorCheck {
            skipped: Some(why.clone()),
            note: why,
            ..TensorCheck::new(name, graph, "step")
        }
    }

    /// A verdict with no tensor behind it (where two decodes stopped, for example).
    pub fn verdict(name: &str, graph: &str, ok: bool, note: impl Into<String>) -> Self {
        TensorCheck {
            ok,
            max_abs: if ok { 0.0 } else { 1.0 },
            note: note.into(),
            ..TensorCheck::new(name, graph, "step")
        }
    }

    /// An exact comparison whose first divergence the caller found: `rows_over` rows (of
    /// `row_name`s) differ, the first at `first`.
    pub fn exact(
        name: &str,
        graph: &str,
        row_name: &'static str,
        first: Option<Divergence>,
        rows_over: usize,
        note: impl Into<String>,
    ) -> Self {
        TensorCheck {
            ok: first.is_none(),
            max_abs: if first.is_none() { 0.0 } else { 1.0 },
            first_row: first.as_ref().map(|d| d.row),
            first_round: first
                .as_ref()
                .map(|d| d.row)
                .filter(|_| row_name == "round"),
            at: first.as_ref().map_or(vec![], |d| vec![d.row]),
            rows_over,
            values_over: rows_over,
            divergence: first,
            note: note.into(),
            ..TensorCheck::new(name, graph, row_name)
        }
    }

    /// Name the rows (`step`, `verified row`, ...) and the round each belongs to, so that the
    /// first row over the tolerance is reported with its round.
    pub fn in_rounds(mut self, row_name: &'static str, round_of_row: &[Option<usize>]) -> Self {
        self.row_name = row_name;
        self.first_round = self
            .first_row
            .and_then(|r| round_of_row.get(r).copied().flatten());
        self
    }

    /// Name the rows and the (round, node) of a token tree each belongs to, so that the first
    /// row over the tolerance is reported with its round and node.
    pub fn in_tree_rounds(
        mut self,
        row_name: &'static str,
        node_of_row: &[Option<(usize, usize)>],
    ) -> Self {
        self.row_name = row_name;
        let at = self
            .first_row
            .and_then(|r| node_of_row.get(r).copied().flatten());
        (self.first_round, self.first_node) = (at.map(|a| a.0), at.map(|a| a.1));
        self
    }

    /// Where the check first failed, in words: `step 7`, `verified row 5 (round 2)`,
    /// `verified row 9 (round 1, node 2)`.
    pub fn first_failure(&self) -> Option<String> {
        let row = self.first_row?;
        Some(match (self.first_round, self.first_node) {
            (Some(round), Some(node)) if self.row_name != "round" => {
                format!("{} {row} (round {round}, node {node})", self.row_name)
            }
            (Some(round), None) if self.row_name != "round" => {
                format!("{} {row} (round {round})", self.row_name)
            }
            // the verifier's first row is the prompt's last position, before any round
            (None, _) if self.row_name == "verified row" && row == 0 => {
                "verified row 0 (the prompt's)".into()
            }
            _ => format!("{} {row}", self.row_name),
        })
    }

    /// The status word of a report line.
    pub fn status(&self) -> &'static str {
        match (&self.skipped, self.ok) {
            (Some(_), _) => "SKIPPED",
            (None, true) => "OK",
            (None, false) => "NOT OK",
        }
    }

    /// One line on what was found, with `text` naming tokens (`None`: ids alone).
    pub fn describe(&self, text: &dyn Fn(i64) -> Option<String>) -> String {
        if self.skipped.is_some() || (self.ok && self.divergence.is_none()) {
            return self.note.clone();
        }
        if let Some(d) = &self.divergence {
            let show = |values: &[i64]| -> String {
                let one = |&v: &i64| match (d.tokens, text(v)) {
                    (true, Some(t)) => format!("{t:?} ({v})"),
                    _ => v.to_string(),
                };
                match values {
                    [] => "(nothing: ended)".into(),
                    [v] => one(v),
                    _ => format!(
                        "[{}]",
                        values.iter().map(one).collect::<Vec<_>>().join(", ")
                    ),
                }
            };
            let at = match self.first_round {
                Some(round) if self.row_name != "round" => {
                    format!("{} {} (round {round})", self.row_name, d.row)
                }
                _ => format!("{} {}", self.row_name, d.row),
            };
            let more = if self.rows_over > 1 {
                format!("; {} {}s differ", self.rows_over, self.row_name)
            } else {
                String::new()
            };
            return format!(
                "first divergence at {at}: {} golden {} vs {} {}{more}{}",
                d.what,
                show(&d.golden),
                self.against,
                show(&d.recomputed),
                if self.note.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", self.note)
                }
            );
        }
        let first = self.first_failure().unwrap_or_else(|| "?".into());
        format!(
            "first over tolerance at {first}; {} of {} {}s and {} values over; worst {:.3e} at {:?} ({})",
            self.rows_over,
            self.row_max_abs.len(),
            self.row_name,
            self.values_over,
            self.max_abs,
            self.at,
            self.note
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    pub entries: Vec<TensorCheck>,
}

impl CheckReport {
    /// Every compared tensor within tolerance (skipped ones found nothing wrong).
    pub fn ok(&self) -> bool {
        self.entries.iter().all(|e| e.ok)
    }
}

/// How close two values must be: `|got - want| <= atol + rtol * |want|`, ONNX Runtime's (and
/// numpy's `allclose`) convention with the golden as the reference value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub atol: f32,
    pub rtol: f32,
}

impl Tolerance {
    /// An absolute tolerance alone.
    pub fn absolute(atol: f32) -> Self {
        Tolerance { atol, rtol: 0.0 }
    }

    /// Check one bound, `atol` or `rtol`, named `name` in the message: a finite number `>= 0`.
    /// The one rule for the command line's `--atol` / `--rtol` and a golden file's pinned ones.
    pub fn check_bound(name: &str, x: f32) -> Result<()> {
        if x.is_finite() && x >= 0.0 {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "{name} must be a finite number >= 0, got {x}"
            )))
        }
    }

    /// How far `got` is past what is allowed around `want`, as a multiple of the allowance (`<= 1`:
    /// within; NaN anywhere is infinitely far).
    pub(super) fn excess(&self, want: f32, got: f32) -> f32 {
        if want == got {
            // equal infinities too (a pruned draft head's -inf outside its tokens)
            return 0.0;
        }
        let diff = (want - got).abs();
        if diff.is_nan() {
            return f32::INFINITY;
        }
        let allowed = self.atol + self.rtol * want.abs();
        if allowed > 0.0 {
            diff / allowed
        } else if diff == 0.0 {
            0.0
        } else {
            f32::INFINITY
        }
    }

    /// `atol 1e-4`, or `atol 1e-4 rtol 1e-2`.
    pub fn describe(&self) -> String {
        if self.rtol == 0.0 {
            format!("atol {:e}", self.atol)
        } else {
            format!("atol {:e} rtol {:e}", self.atol, self.rtol)
        }
    }
}

/// Compare two tensors elementwise: OK when every `|a - b| <= atol` (rows are steps; no graph
/// named).
pub fn compare(name: &str, want: ArrayView2<f32>, got: ArrayView2<f32>, atol: f32) -> TensorCheck {
    compare_within(name, want, got, Tolerance::absolute(atol))
}

/// [`compare_rows`] with no graph named and no padding.
pub fn compare_within(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    tol: Tolerance,
) -> TensorCheck {
    compare_rows(name, "", want, got, tol, false)
}

/// Compare two tensors whose rows are steps, elementwise within `tol`. `at` is the worst element
/// (the largest difference relative to what `tol` allows there; with `rtol = 0` the largest
/// difference), `first_row` the first row with a value over `tol`. With `padded`, NaN in both is
/// equal (not evaluated) and NaN in one only is a mismatch. Tensors of other widths are a
/// mismatch; of other lengths, the common rows are compared and the note says so (where two
/// decodes stop is judged on its own, see [`compare_stops`]).
pub fn compare_rows(
    name: &str,
    graph: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    tol: Tolerance,
    padded: bool,
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
    let rows = want.nrows().min(got.nrows());
    let mut worst = 0.0f32;
    check.at = vec![0, 0];
    for r in 0..rows {
        let mut row_max = 0.0f32;
        let mut row_over = false;
        for (c, (&w, &g)) in want.row(r).iter().zip(got.row(r)).enumerate() {
            if padded && w.is_nan() && g.is_nan() {
                continue;
            }
            let diff = if w == g { 0.0 } else { (w - g).abs() };
            // NaN anywhere (or padding on one side only) is a mismatch.
            let diff = if diff.is_nan() { f32::INFINITY } else { diff };
            let excess = tol.excess(w, g);
            if excess > worst || (excess == worst && diff > check.max_abs && tol.rtol == 0.0) {
                worst = excess;
                check.at = vec![r, c];
            }
            if excess > 1.0 {
                row_over = true;
                check.values_over += 1;
            }
            row_max = row_max.max(diff);
            check.max_abs = check.max_abs.max(diff);
            check.max_rel = check.max_rel.max(diff / w.abs().max(1e-6));
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

/// [`compare_rows`] with NaN padding and no graph named (gate scores).
pub fn compare_padded(
    name: &str,
    want: ArrayView2<f32>,
    got: ArrayView2<f32>,
    atol: f32,
) -> TensorCheck {
    compare_rows(name, "", want, got, Tolerance::absolute(atol), true)
}

/// Where two decodes of the same prompt stopped. `None` when both emitted the same number of
/// tokens. Otherwise a `stop` verdict: OK when the shorter one ended on one of `stops` (an
/// end-of-turn token) and the longer one, recorded without stopping (`longer_stopped` false), has
/// the same token there and ran on; NOT OK for any other difference.
///
/// # Shapes
/// - `want`, `got`: the emitted tokens of the golden and of the recomputation
pub fn compare_stops(
    graph: &str,
    against: &'static str,
    want: &[i64],
    got: &[i64],
    stops: &[i64],
    longer_stopped: bool,
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
    let shared_end = ended_on.is_some_and(|t| stops.contains(&t))
        && long.get(short.len() - 1).copied() == ended_on;
    let ok = shared_end && !longer_stopped;
    let note = format!(
        "golden {} tokens, {against} {}: {short_side} stopped after {} at {}{}",
        want.len(),
        got.len(),
        short.len(),
        name(ended_on),
        if ok {
            "; the other was recorded without stopping at end of turn and ran on (the common \
             tokens are compared above)"
        } else {
            ""
        }
    );
    let mut check = TensorCheck::verdict("stop", graph, ok, note);
    check.against = against;
    check.first_row = (!ok).then_some(short.len().saturating_sub(1));
    Some(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn rows_over_tolerance_are_counted_and_the_first_named() {
        let want = array![[0.0f32, 1.0], [2.0, 3.0], [4.0, 5.0]];
        let got = array![[0.0f32, 1.0], [2.5, 3.0], [4.0, 5.2]];
        let c = compare_rows(
            "logits",
            "model.onnx",
            want.view(),
            got.view(),
            Tolerance::absolute(0.1),
            false,
        );
        assert!(!c.ok);
        assert_eq!((c.first_row, c.rows_over, c.values_over), (Some(1), 2, 2));
        assert_eq!(c.at, vec![1, 0]);
        assert!((c.row_max_abs[2] - 0.2).abs() < 1e-6 && c.row_max_abs[0] == 0.0);
        let c = c.in_rounds("verified row", &[None, Some(0), Some(1)]);
        assert_eq!(c.first_failure().unwrap(), "verified row 1 (round 0)");
        let inf = array![[f32::NEG_INFINITY, 1.0]];
        assert!(
            compare_rows(
                "d",
                "",
                inf.view(),
                inf.view(),
                Tolerance::absolute(0.0),
                false
            )
            .ok
        );
        assert!(
            c.describe(&|_| None)
                .contains("2 of 3 verified rows and 2 values over")
        );
    }

    #[test]
    fn integer_rows_report_one_divergence_without_padding() {
        // rounds of two drafts, the second round drafted one (padding -1 never shown)
        let want = [5, 6, 7, -1, 8, 9];
        let got = [5, 6, 7, 4, 1, 2];
        let c = compare_int_rows("round_drafted", "draft.onnx", &want, &got, 2, true);
        assert_eq!((c.first_row, c.rows_over, c.values_over), (Some(1), 2, 3));
        let d = c.divergence.as_ref().unwrap();
        assert_eq!(
            (d.golden.clone(), d.recomputed.clone()),
            (vec![7, -1], vec![7, 4])
        );
        let text = |id: i64| (id == 7).then(|| "seven".to_string());
        let c = c.in_rounds("round", &[Some(0), Some(1), Some(2)]);
        let line = c.describe(&text);
        assert!(
            line.starts_with("first divergence at round 1: token golden"),
            "{line}"
        );
        assert!(line.contains("\"seven\" (7)"), "{line}");
    }

    #[test]
    fn stops_at_end_of_turn_against_a_golden_that_ran_on() {
        let none = |_: i64| None;
        // the golden ran on past end of turn (2); the deployment stopped there
        let c =
            compare_stops("", "recomputed", &[4, 2, 9, 9], &[4, 2], &[2], false, &none).unwrap();
        assert!(c.ok, "{c:?}");
        // both stop at end of turn but at different places
        let c = compare_stops("", "recomputed", &[4, 2], &[4, 5, 2], &[2], true, &none).unwrap();
        assert!(
            !c.ok && c.note.contains("golden 2 tokens, recomputed 3"),
            "{c:?}"
        );
        assert!(compare_stops("", "recomputed", &[1], &[1], &[2], true, &none).is_none());
    }

    #[test]
    fn tolerance_follows_onnx_runtimes_convention() {
        let t = Tolerance {
            atol: 1e-3,
            rtol: 1e-2,
        };
        // |got - want| <= atol + rtol |want|
        assert!(t.excess(100.0, 101.0) <= 1.0); // 1 <= 0.001 + 1
        assert!(t.excess(100.0, 101.1) > 1.0);
        assert!(t.excess(0.0, 0.0009) <= 1.0);
        assert!(t.excess(0.0, 0.0011) > 1.0);
        assert_eq!(t.excess(1.0, f32::NAN), f32::INFINITY);
        let exact = Tolerance::absolute(0.0);
        assert_eq!(exact.excess(2.0, 2.0), 0.0);
        assert_eq!(exact.excess(2.0, 2.0 + 1e-6), f32::INFINITY);
    }

    #[test]
    fn a_bound_is_a_finite_number_at_least_zero() {
        for x in [0.0, 1e-4, 5e-2, 1e30] {
            Tolerance::check_bound("--atol", x).unwrap();
        }
        for x in [-1e-4, f32::NAN, f32::INFINITY] {
            let err = Tolerance::check_bound("--rtol", x).unwrap_err().to_string();
            assert_eq!(err, format!("--rtol must be a finite number >= 0, got {x}"));
        }
    }
}
