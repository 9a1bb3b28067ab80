//! How `golden check` / `compare` report: per golden a table (graph, tensor, status, largest
//! difference, where it first failed), a JSON object, a JUnit test suite; and the exit code of the
//! whole run (0 all OK, 1 a mismatch, 2 a golden that could not be checked).

use super::ChosenTolerance;
use crate::cli::common;
use crate::cli::report::decimal;
use anyhow::Result;
use reference::golden::{CheckReport, TensorCheck};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

/// A golden checked: its report with each line described (token ids with their text).
pub(super) struct Checked {
    tol: ChosenTolerance,
    report: CheckReport,
    /// One per entry: what was found, in words.
    lines: Vec<String>,
    /// One per entry: the entry as JSON.
    entries: Vec<Value>,
    /// The text of the token at the worst logit, when the logits are NOT OK.
    worst_text: Option<String>,
}

impl Checked {
    pub(super) fn new(
        tol: ChosenTolerance,
        report: CheckReport,
        text: &dyn Fn(i64) -> Option<String>,
    ) -> Self {
        let lines = report.entries.iter().map(|e| e.describe(text)).collect();
        let entries = report
            .entries
            .iter()
            .map(|e| entry_json(e, &e.describe(text), text))
            .collect();
        let worst_text = report
            .entries
            .iter()
            .find(|e| e.name == "logits" && !e.ok)
            .and_then(|e| match e.at.as_slice() {
                &[_, token] => text(token as i64),
                _ => None,
            });
        Checked {
            tol,
            report,
            lines,
            entries,
            worst_text,
        }
    }
}

/// One golden's outcome: checked (OK or a mismatch), or not checked and why.
pub(super) struct Outcome {
    /// `golden check of FILE`: the JUnit suite's name
    label: String,
    header: Vec<String>,
    fields: Value,
    result: std::result::Result<Checked, String>,
    seconds: f64,
}

impl Outcome {
    pub(super) fn new(
        label: String,
        header: Vec<String>,
        fields: Value,
        result: Result<Checked>,
        start: Instant,
    ) -> Self {
        Outcome {
            label,
            header,
            fields,
            result: result.map_err(|e| printable(&common::error_chain(&e))),
            seconds: start.elapsed().as_secs_f64(),
        }
    }

    /// A golden that could not be checked at all.
    pub(super) fn error(file: &Path, what: &str, error: &anyhow::Error) -> Self {
        Outcome {
            label: format!("{what} of {}", file.display()),
            header: vec![format!("golden {}", file.display())],
            fields: json!({ "file": file.display().to_string() }),
            result: Err(printable(&common::error_chain(error))),
            seconds: 0.0,
        }
    }

    fn status(&self) -> &'static str {
        match &self.result {
            Err(_) => "error",
            Ok(c) if c.report.ok() => "ok",
            Ok(_) => "mismatch",
        }
    }
}

/// `reason` with its control characters escaped as `{:?}` does (`\u{1}`): a reason may quote
/// what a file holds from code that does not escape it (a model name the loader refuses), and
/// the terminal must not get it raw, nor JUnit XML (which cannot hold it) drop it silently.
fn printable(reason: &str) -> String {
    reason
        .chars()
        .map(|c| match c.is_control() {
            true => c.escape_debug().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// Write the JUnit file, print every report (tables, or JSON: the one object of a single file,
/// `{"ok", "status", "files"}` for a suite), and end with the exit code of the worst outcome.
/// The JUnit file is written first: one that cannot be written makes the JSON say `error` with
/// the reason, as the exit code (2) does, never `ok`.
pub(super) fn report_all(
    outcomes: &[Outcome],
    json_out: bool,
    junit: Option<&Path>,
    suite: bool,
) -> Result<()> {
    let junit_error = write_junit(junit, outcomes)
        .err()
        .map(|e| printable(&common::error_chain(&e)));
    let objects: Vec<Value> = outcomes.iter().map(|o| render(json_out, o)).collect();
    let count = |status: &str| outcomes.iter().filter(|o| o.status() == status).count();
    let (ok, mismatched, errors) = (count("ok"), count("mismatch"), count("error"));
    let status = match (errors, mismatched, &junit_error) {
        (0, 0, None) => "ok",
        (0, _, None) => "mismatch",
        _ => "error",
    };
    if json_out {
        let mut report = match suite {
            true => json!({ "ok": status == "ok", "status": status, "files": objects }),
            false => objects[0].clone(),
        };
        if let Some(reason) = &junit_error {
            unwritten_junit(&mut report, reason);
        }
        common::print_json(&report)?;
    } else if suite {
        println!(
            "suite: {ok} of {} files OK, {mismatched} NOT OK, {errors} not checked",
            outcomes.len()
        );
    }
    let mut problems: Vec<String> = outcomes
        .iter()
        .filter_map(|o| match &o.result {
            Err(reason) => Some(format!("{}: not checked: {reason}", o.label)),
            Ok(c) if !c.report.ok() => {
                let bad: Vec<String> = c
                    .report
                    .entries
                    .iter()
                    .filter(|e| !e.ok)
                    .map(|e| format!("{} NOT OK", case_name(e)))
                    .collect();
                Some(format!("{} failed: {}", o.label, bad.join(", ")))
            }
            Ok(_) => None,
        })
        .collect();
    problems.truncate(20);
    // a report CI cannot read is an error of the check (2), whatever the goldens' outcome
    if let Some(reason) = junit_error {
        problems.insert(0, reason);
        return Err(common::Exit {
            code: 2,
            message: problems.join("; "),
        }
        .into());
    }
    match status {
        "ok" => Ok(()),
        _ => Err(common::Exit {
            code: if errors > 0 { 2 } else { 1 },
            message: problems.join("; "),
        }
        .into()),
    }
}

/// Make a JSON report (one golden's object, or a suite's) say what the exit code says when the
/// JUnit file could not be written: `status` `error`, `ok` false, and `error` the reason (before
/// a golden's own reason, when it was not checked either), as stderr says it.
fn unwritten_junit(report: &mut Value, reason: &str) {
    let error = match report["error"].as_str() {
        Some(own) => format!("{reason}; {own}"),
        None => reason.to_string(),
    };
    report["status"] = json!("error");
    report["ok"] = json!(false);
    report["error"] = json!(error);
}

/// A report line's and JUnit case's name: `verifier.onnx verify_logits`.
fn case_name(e: &TensorCheck) -> String {
    if e.graph.is_empty() {
        e.name.clone()
    } else {
        format!("{} {}", e.graph, e.name)
    }
}

/// Write the reports as JUnit XML to `path`: one test suite per golden (its label), one test case
/// per graph and tensor (a `<failure>` with the first failing step for each NOT OK one, skipped
/// ones `<skipped>`), and for a golden that could not be checked one `<error>` case with the
/// reason.
fn write_junit(path: Option<&Path>, outcomes: &[Outcome]) -> Result<()> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let Some(path) = path else {
        return Ok(());
    };
    let mut junit = Report::new("m2r2 golden");
    for o in outcomes {
        let mut suite = TestSuite::new(o.label.clone());
        suite.set_time(std::time::Duration::from_secs_f64(o.seconds));
        match &o.result {
            Err(reason) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
                status.set_message(format!("not checked: {reason}"));
                status.set_description(reason.clone());
                let mut case = TestCase::new("check", status);
                case.set_classname("m2r2.golden");
                suite.add_test_case(case);
            }
            Ok(c) => {
                for (e, line) in c.report.entries.iter().zip(&c.lines) {
                    let details = format!(
                        "max abs diff {:e}, max rel diff {:e}: {line}",
                        e.max_abs, e.max_rel
                    );
                    let status = match (&e.skipped, e.ok) {
                        (Some(why), _) => {
                            let mut s = TestCaseStatus::skipped();
                            s.set_message(why.clone());
                            s
                        }
                        (None, true) => TestCaseStatus::success(),
                        (None, false) => {
                            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                            s.set_message(format!("{} NOT OK: {line}", case_name(e)));
                            s.set_description(details.clone());
                            s
                        }
                    };
                    let details = format!("{details} ({}: {})", c.tol.tol.describe(), c.tol.reason);
                    let mut case = TestCase::new(case_name(e), status);
                    case.set_classname("m2r2.golden");
                    case.set_system_out(details);
                    suite.add_test_case(case);
                }
            }
        }
        junit.add_test_suite(suite);
    }
    let xml = junit
        .to_string()
        .map_err(|e| anyhow::anyhow!("cannot write the JUnit report: {e}"))?;
    common::create_parent(path)?;
    std::fs::write(path, xml).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}

/// JSON has no infinity: a NaN or shape mismatch reports `null`.
fn finite(x: f32) -> Option<f32> {
    x.is_finite().then_some(x)
}

fn entry_json(e: &TensorCheck, line: &str, text: &dyn Fn(i64) -> Option<String>) -> Value {
    let divergence = e.divergence.as_ref().map(|d| {
        let texts = |values: &[i64]| -> Value {
            match d.tokens {
                true => json!(values.iter().map(|&v| text(v)).collect::<Vec<_>>()),
                false => Value::Null,
            }
        };
        json!({
            "row": d.row,
            "what": d.what,
            "golden": d.golden,
            "recomputed": d.recomputed,
            "golden_text": texts(&d.golden),
            "recomputed_text": texts(&d.recomputed),
        })
    });
    json!({
        "name": e.name,
        "graph": e.graph,
        "status": e.status(),
        "ok": e.ok,
        "skipped": e.skipped,
        "max_abs": finite(e.max_abs),
        "max_rel": finite(e.max_rel),
        "at": e.at,
        "row_name": e.row_name,
        "first_row": e.first_row,
        "first_round": e.first_round,
        "first_node": e.first_node,
        "first": e.first_failure(),
        "rows_over": e.rows_over,
        "values_over": e.values_over,
        "row_max_abs": e.row_max_abs.iter().map(|&x| finite(x)).collect::<Vec<_>>(),
        "divergence": divergence,
        "note": e.note,
        "description": line,
    })
}

/// Print one outcome's table (unless `json_out`) and return its JSON object.
fn render(json_out: bool, o: &Outcome) -> Value {
    let mut fields = o.fields.clone();
    let extra = match &o.result {
        Err(reason) => json!({
            "status": "error",
            "ok": false,
            "error": reason,
            "seconds": o.seconds,
            "entries": [],
        }),
        Ok(c) => json!({
            "status": o.status(),
            "ok": c.report.ok(),
            "atol": decimal(c.tol.tol.atol),
            "rtol": decimal(c.tol.tol.rtol),
            "tolerance_reason": c.tol.reason,
            "worst_token_text": c.worst_text,
            "seconds": o.seconds,
            "entries": c.entries,
        }),
    };
    if let (Some(f), Some(e)) = (fields.as_object_mut(), extra.as_object()) {
        f.extend(e.clone());
    }
    if json_out {
        return fields;
    }
    for line in &o.header {
        println!("{line}");
    }
    match &o.result {
        Err(reason) => println!("overall: NOT CHECKED: {reason}"),
        Ok(c) => {
            println!("tolerance: {} ({})", c.tol.tol.describe(), c.tol.reason);
            if let Some(text) = &c.worst_text {
                println!("(the worst logit's token, at `logits` below: {text:?})");
            }
            for (e, line) in c.report.entries.iter().zip(&c.lines) {
                println!(
                    "{:<24} {:<14} {:<8} max abs diff {:<10.3e} {line}",
                    e.graph,
                    e.name,
                    e.status(),
                    e.max_abs,
                );
            }
            println!(
                "overall: {} ({:.2} s)",
                if c.report.ok() { "OK" } else { "NOT OK" },
                o.seconds
            );
        }
    }
    fields
}
