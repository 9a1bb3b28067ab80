//! What a golden check reports: one [`TensorCheck`] per recorded tensor, naming the graph (or
//! engine) that recomputed it, the first step over the tolerance, how many steps and values are
//! over it, and each step's largest difference; integer tensors (tokens, rounds) report their
//! first divergence once instead of a cascade of differences after it.

mod tensors;
#[cfg(test)]
mod tests;
mod tolerance;

pub use tensors::{
    StopRules, compare, compare_int_rows, compare_ints, compare_rows, compare_stops, compare_within,
};
pub use tolerance::Tolerance;

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
        if self.row_max_abs.is_empty() && self.at.is_empty() {
            // a verdict (`stop`, tensors of other widths): no values were compared, the note
            // says what differs (and where, when a row is known)
            return match self.first_failure() {
                Some(first) => format!("at {first}: {}", self.note),
                None => self.note.clone(),
            };
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
