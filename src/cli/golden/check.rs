//! `m2r2 golden check | compare`: every golden of a suite checked (recomputed by the reference
//! or replayed on an export) or compared file to file, each ending in an [`Outcome`]: a report,
//! or the reason it could not be checked. Nothing here stops the suite early.

use super::onnx::OnnxEngine;
use super::report::{Checked, Outcome, report_all};
use super::{CheckArgs, CompareArgs, SUITE_SUFFIX, settings_line, stop_line};
use crate::cli::args::m2r2::M2r2Args;
use crate::cli::common;
use anyhow::{Context, Result, bail};
use reference::base::generate::ReferenceGreedy;
use reference::golden::{DEFAULT_ATOL, Golden, WeightsId, shown};
use reference::io::load::LoadedModel;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `check` runs the goldens on: an export (opened once; the reason when it cannot be), or
/// the reference models the files name (each loaded once, kept while consecutive files name the
/// same one).
struct Engine {
    onnx: Option<std::result::Result<OnnxEngine, String>>,
    reference: Option<(String, LoadedModel)>,
}

/// The files of a suite folder (`*.golden.safetensors`, sorted), refused when there are none.
fn suite_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(SUITE_SUFFIX))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{} holds no golden files (*{SUITE_SUFFIX})", dir.display());
    }
    Ok(files)
}

/// A golden to check or compare: one that records no step would pass with nothing compared.
fn read_golden(path: &Path) -> Result<Golden> {
    let golden =
        Golden::read(path).with_context(|| format!("cannot read golden {}", path.display()))?;
    if golden.tokens.is_empty() {
        bail!(
            "{} records no step: there is nothing to check (record it with --steps 1 or more)",
            path.display()
        );
    }
    Ok(golden)
}

/// Whether `weights` are the ones `recorded` names, with their pruned draft head or without it
/// (a golden recorded with `--draft-head off`): `Some(dropped)`, the head dropped when that made
/// them the recorded ones; `None` when neither is.
fn matching(weights: &mut M2r2Weights, recorded: &WeightsId) -> Option<bool> {
    if WeightsId::of(weights).matches(recorded) {
        return Some(false);
    }
    let head = weights.draft_head.take()?;
    if WeightsId::of(weights).matches(recorded) {
        return Some(true);
    }
    weights.draft_head = Some(head);
    None
}

/// Refuse M2R2 weights (`--m2r2 m2r2`, from `source` in words) other than the ones `golden` was
/// recorded with, naming where they came from and where the recorded ones are. A golden recorded
/// with `--draft-head off` names the weights without their pruned draft head: the head is dropped
/// when that makes them the recorded ones (and the header says so), so the same folder checks
/// both kinds of golden.
fn recorded_weights(
    golden: &Golden,
    loaded: &LoadedModel,
    m2r2: Option<&str>,
    weights: &mut M2r2Weights,
    header: &mut Vec<String>,
) -> Result<()> {
    let Some(recorded) = golden.m2r2.as_ref().map(|m| &m.weights) else {
        return Ok(());
    };
    let id = WeightsId::of(weights);
    match matching(weights, recorded) {
        Some(false) => return Ok(()),
        Some(true) => {
            header.push(
                "note: recorded without the pruned draft head (--draft-head off): checked so"
                    .into(),
            );
            return Ok(());
        }
        None => {}
    }
    let source = M2r2Args::weights_only(m2r2.map(String::from)).source(loaded);
    let advice = recorded_elsewhere(recorded, loaded, m2r2)
        .unwrap_or_else(|| "pass --m2r2 with the folder it was recorded with".into());
    bail!(
        "the M2R2 weights from {source}, {id}, are not the ones this golden was recorded with \
         ({recorded}): {advice}"
    )
}

/// Where the weights `recorded` names are when they are no folder: the model's own (built-in or
/// shipped, what a check without `--m2r2` takes) or `--m2r2 none`'s zeros, whichever is not
/// `m2r2`, the choice that did not match; the advice that takes them. `None`: neither (a folder).
fn recorded_elsewhere(
    recorded: &WeightsId,
    loaded: &LoadedModel,
    m2r2: Option<&str>,
) -> Option<String> {
    [None, Some("none")]
        .into_iter()
        .filter(|&choice| choice != m2r2)
        .find_map(|choice| {
            let args = M2r2Args::weights_only(choice.map(String::from));
            let mut weights = args.weights(loaded).ok()?;
            matching(&mut weights, recorded)?;
            Some(match choice {
                None => format!(
                    "it was recorded with the model's own M2R2 weights, {}, not a folder: drop \
                     --m2r2",
                    args.source(loaded)
                ),
                Some(_) => "it was recorded with --m2r2 none (zeros): pass --m2r2 none".into(),
            })
        })
}

/// The text of a token id, when a tokenizer has one.
fn token_text(tokenizer: Option<&Tokenizer>) -> impl Fn(i64) -> Option<String> + '_ {
    move |id| tokenizer?.decode(&[u32::try_from(id).ok()?], false).ok()
}

pub(super) fn check(args: &CheckArgs) -> Result<()> {
    let suite = args.file.is_dir();
    // ONNX Runtime's flags without --onnx: the reference would run, and its OK read as the
    // provider's; bench's flags that ask for several sets of sessions
    let flags = args
        .ep
        .refuse_without_onnx(args.onnx.is_some(), "golden check")
        .and_then(|()| args.ep.check_one_config("golden check"));
    let files = match flags {
        Err(e) => Err(e),
        Ok(()) if suite => suite_files(&args.file),
        Ok(()) => Ok(vec![args.file.clone()]),
    };
    let files = match files {
        Ok(files) => files,
        Err(e) => {
            let outcome = Outcome::error(&args.file, "golden check", &e);
            return report_all(&[outcome], args.json, args.junit.as_deref(), suite);
        }
    };
    let mut engine = Engine {
        onnx: args.onnx.as_ref().map(|dir| {
            OnnxEngine::open(args, dir)
                .with_context(|| format!("cannot open export {}", dir.display()))
                .map_err(|e| common::error_chain(&e))
        }),
        reference: None,
    };
    let outcomes: Vec<Outcome> = files
        .iter()
        .map(|f| check_file(args, &mut engine, f))
        .collect();
    report_all(&outcomes, args.json, args.junit.as_deref(), suite)
}

fn check_file(args: &CheckArgs, engine: &mut Engine, file: &Path) -> Outcome {
    let start = Instant::now();
    let golden = match read_golden(file) {
        Ok(golden) => golden,
        Err(e) => return Outcome::error(file, "golden check", &e),
    };
    let mut header = vec![format!(
        "golden {} (recorded with {}, {}; format {}, {}): {} prompt tokens, {} steps",
        file.display(),
        shown(&golden.model),
        settings_line(&golden),
        golden.format_version(),
        stop_line(&golden),
        golden.prompt_tokens.len(),
        golden.tokens.len(),
    )];
    let (tree_grown, prompt_lookup) = super::tree_policy_json(&golden);
    let mut fields = json!({
        "file": file.display().to_string(),
        "golden_model": golden.model,
        "mode": golden.mode,
        "draft_tree": golden.draft_tree(),
        "tree_grown": tree_grown,
        "prompt_lookup": prompt_lookup,
        "format_version": golden.format_version(),
        "stop_tokens": golden.stop_tokens,
    });
    let result = (|| -> Result<Checked> {
        match &mut engine.onnx {
            Some(Err(reason)) => bail!("{reason}"),
            Some(Ok(onnx)) => {
                let (expected, from) = match (&args.expect_dtype, &golden.pins.expect_dtype) {
                    (Some(d), _) => (Some(d), "--expect-dtype"),
                    (None, Some(d)) => (Some(d), "pinned in the golden"),
                    (None, None) => (None, ""),
                };
                if let Some(want) = expected
                    && *want != onnx.dtype
                {
                    bail!(
                        "the export holds {} weights, the suite expects {want} ({from}); \
                         export with --weights-dtype {want}, or pass --expect-dtype {} and a \
                         tolerance for it",
                        onnx.dtype,
                        onnx.dtype
                    );
                }
                let tol = args.tol.choose(&golden.pins, onnx.default_atol())?;
                fields["model"] = json!(onnx.name);
                fields["onnxruntime"] = json!(onnx.ort_version);
                fields["execution_provider"] = json!(onnx.ep_name);
                fields["export_dtype"] = json!(onnx.dtype);
                header.push(format!("checking {}", onnx.name));
                // the header's `checking` line and the label name the export
                let report = onnx.check(&golden, &tol)?;
                Ok(Checked::new(
                    tol,
                    report,
                    &token_text(onnx.tokenizer.as_ref()),
                ))
            }
            None => {
                let spec = args.model.as_deref().unwrap_or(&golden.model);
                let loaded = match &mut engine.reference {
                    Some((name, loaded)) if name == spec => loaded,
                    slot => &mut slot.insert((spec.to_string(), common::load(spec)?)).1,
                };
                fields["model"] = json!(loaded.name);
                header.push(format!("checking the reference on {}", loaded.name));
                // a model of another config is refused as such, before any weights are read
                let config = golden.check_config(&loaded.model.config);
                match &args.model {
                    Some(model) => config.with_context(|| format!("--model {model}"))?,
                    None => config?,
                }
                let tol = args
                    .tol
                    .choose(&golden.pins, (DEFAULT_ATOL, "reference default"))?;
                let report = if golden.m2r2.is_some() {
                    // the reader refuses an rtol pinned in an M2R2 golden: this one is the flag's
                    if tol.tol.rtol != 0.0 {
                        bail!("--rtol is for greedy goldens; M2R2 goldens are checked with --atol");
                    }
                    let choice = M2r2Args::weights_only(args.m2r2.clone());
                    let mut weights = choice.weights(loaded)?;
                    let m2r2 = args.m2r2.as_deref();
                    recorded_weights(&golden, loaded, m2r2, &mut weights, &mut header)?;
                    golden.check_m2r2(M2r2::new(&loaded.model, &weights), tol.tol.atol)?
                } else {
                    if let Some(dir) = &args.m2r2 {
                        // a suite may mix greedy and M2R2 goldens: said, not refused
                        header.push(format!(
                            "note: a greedy golden reads no M2R2 weights: --m2r2 {dir} is not \
                             used for it"
                        ));
                    }
                    golden.check_on(
                        &mut ReferenceGreedy::new(&loaded.model),
                        &loaded.model.config,
                        tol.tol,
                        "reference",
                    )?
                };
                Ok(Checked::new(
                    tol,
                    report,
                    &token_text(loaded.tokenizer().ok()),
                ))
            }
        }
    })();
    let label = match &args.onnx {
        Some(dir) => format!(
            "golden check of {} on export {}",
            file.display(),
            dir.display()
        ),
        None => format!("golden check of {} on the reference", file.display()),
    };
    Outcome::new(label, header, fields, result, start)
}

pub(super) fn compare(args: &CompareArgs) -> Result<()> {
    let suite = args.expected.is_dir() || args.actual.is_dir();
    let pairs = match compare_pairs(args, suite) {
        Ok(pairs) => pairs,
        Err(e) => {
            let outcome = Outcome::error(&args.actual, "golden compare", &e);
            return report_all(&[outcome], args.json, args.junit.as_deref(), suite);
        }
    };
    // Token text from the model each golden names, loaded once (when it loads without a
    // download; ids alone otherwise).
    let mut tokenizers: HashMap<String, Option<Tokenizer>> = HashMap::new();
    let outcomes: Vec<Outcome> = pairs
        .iter()
        .map(|(e, a)| match (e, a) {
            (Some(e), Some(a)) => compare_files(args, e, a, &mut tokenizers),
            (Some(e), None) => Outcome::error(
                e,
                "golden compare",
                &anyhow::anyhow!(
                    "{} has no counterpart in {}",
                    e.display(),
                    args.actual.display()
                ),
            ),
            (None, Some(a)) => Outcome::error(
                a,
                "golden compare",
                &anyhow::anyhow!(
                    "{} has no counterpart in {}",
                    a.display(),
                    args.expected.display()
                ),
            ),
            (None, None) => unreachable!("a pair has a side"),
        })
        .collect();
    report_all(&outcomes, args.json, args.junit.as_deref(), suite)
}

/// The (expected, actual) files to compare; a file of a suite without its counterpart is a pair
/// with one side (reported as not checked).
fn compare_pairs(
    args: &CompareArgs,
    suite: bool,
) -> Result<Vec<(Option<PathBuf>, Option<PathBuf>)>> {
    if !suite {
        return Ok(vec![(
            Some(args.expected.clone()),
            Some(args.actual.clone()),
        )]);
    }
    if !(args.expected.is_dir() && args.actual.is_dir()) {
        bail!("compare a folder with a folder, or a file with a file");
    }
    let name = |f: &PathBuf| f.file_name().map(|n| n.to_string_lossy().into_owned());
    let expected = suite_files(&args.expected)?;
    let actual = suite_files(&args.actual)?;
    let mut names: Vec<String> = expected.iter().chain(&actual).filter_map(name).collect();
    names.sort();
    names.dedup();
    Ok(names
        .iter()
        .map(|n| {
            let side = |dir: &Path, files: &[PathBuf]| {
                files
                    .iter()
                    .any(|f| name(f).as_ref() == Some(n))
                    .then(|| dir.join(n))
            };
            (side(&args.expected, &expected), side(&args.actual, &actual))
        })
        .collect())
}

fn compare_files(
    args: &CompareArgs,
    expected_path: &Path,
    actual_path: &Path,
    tokenizers: &mut HashMap<String, Option<Tokenizer>>,
) -> Outcome {
    let start = Instant::now();
    let (expected, actual) = match (read_golden(expected_path), read_golden(actual_path)) {
        (Ok(e), Ok(a)) => (e, a),
        (Err(e), _) | (_, Err(e)) => return Outcome::error(actual_path, "golden compare", &e),
    };
    let header = vec![format!(
        "golden {} (recorded with {}, {}; written by {}; {}) against {} (recorded with {}, {}; \
         written by {}; {}): {} prompt tokens, {} steps",
        expected_path.display(),
        shown(&expected.model),
        settings_line(&expected),
        writer(&expected),
        stop_line(&expected),
        actual_path.display(),
        shown(&actual.model),
        settings_line(&actual),
        writer(&actual),
        stop_line(&actual),
        expected.prompt_tokens.len(),
        expected.tokens.len(),
    )];
    let fields = json!({
        "expected": expected_path.display().to_string(),
        "actual": actual_path.display().to_string(),
        "mode": expected.mode,
        "golden_model": expected.model,
        "expected_writer": writer(&expected),
        "actual_writer": writer(&actual),
    });
    let result = (|| -> Result<Checked> {
        let tol = args.tol.choose(&expected.pins, (DEFAULT_ATOL, "default"))?;
        let tokenizer = tokenizers.entry(expected.model.clone()).or_insert_with(|| {
            reference::io::load::load_model(&expected.model)
                .ok()
                .and_then(|l| l.tokenizer)
        });
        let text = token_text(tokenizer.as_ref());
        let report = expected
            .compare_to(&actual, tol.tol, &text)
            .with_context(|| {
                format!(
                    "cannot compare {} with {}",
                    expected_path.display(),
                    actual_path.display()
                )
            })?;
        Ok(Checked::new(tol, report, &text))
    })();
    let label = format!(
        "golden compare of {} against {}",
        actual_path.display(),
        expected_path.display()
    );
    Outcome::new(label, header, fields, result, start)
}

/// Who wrote a golden file, from its `m2r2_version`: the reference records its bare version
/// (`0.1.0` -> `m2r2 0.1.0`), other writers their own name (`m2r2-golden-python 0.1.0`); escaped
/// as the file's free text it is ([`shown`]).
fn writer(golden: &Golden) -> String {
    match golden.writer.as_deref().map(shown) {
        Some(v) if v.starts_with(|c: char| c.is_ascii_digit()) => format!("m2r2 {v}"),
        Some(v) => v,
        None => "an unknown writer (no m2r2_version)".into(),
    }
}
