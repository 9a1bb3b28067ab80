//! `m2r2 golden write | check`: record a decode (greedy, early-exit or speculative, with every
//! step's M2R2 decisions), and check a model against a recording tensor by tensor (OK / NOT OK with
//! the largest differences, as llm.c's `test_gpt2`). `check` takes the mode and its settings from
//! the file.

use crate::cli::args::m2r2::M2r2Args;
use crate::cli::args::model::{ModelArgs, PromptArgs, TokenIds, parse_token_ids};
use crate::cli::args::onnx::EpArgs;
use crate::cli::common;
use anyhow::{Context, Result, bail};
use onnx::OnnxEngine;
use reference::base::generate::ReferenceGreedy;
use reference::decode::early_exit::{EarlyExitOptions, KvPolicy};
use reference::decode::mode::Mode;
use reference::decode::speculative::{DraftLength, SpeculativeOptions};
use reference::golden::{CheckReport, DEFAULT_ATOL, Golden, M2r2Record, Tolerance};
use reference::io::load::LoadedModel;
use reference::io::tokenizer::Tokenizer;
use reference::m2r2::fast_stream::M2r2;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

mod onnx;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Record `--steps` tokens of `--mode` and the logits each was chosen from (M2R2 modes: also the
    /// gate scores, exits, drafts and accepted counts)
    Write(WriteArgs),
    /// Recompute a golden file and compare; exits 1 when a tensor differs beyond the tolerance
    Check(CheckArgs),
    /// Compare two golden files tensor by tensor (e.g. one written by a deployment's own harness);
    /// exits 1 when a tensor differs beyond the tolerance
    Compare(CompareArgs),
}

#[derive(clap::Args, Debug)]
pub struct WriteArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text, encoded with the model's tokenizer (adding its special tokens)
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["tokens", "prompts"])]
    pub prompt: Option<String>,
    /// Wrap each prompt as one user message in the tokenizer's chat template
    #[arg(long)]
    pub chat: bool,
    /// Prompt as comma-separated token ids, e.g. 1,2,3
    #[arg(long, value_name = "IDS", value_parser = parse_token_ids, conflicts_with = "prompts")]
    pub tokens: Option<TokenIds>,
    /// A suite: one golden per prompt of this file (`{"id", "prompt"}` per line), written as
    /// `OUT/<id>.golden.safetensors` (--out is then a folder)
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub m2r2: M2r2Args,
    /// Steps (tokens) to record
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub steps: usize,
    /// Golden file to write (safetensors), or with --prompts the folder of the suite
    #[arg(long, value_name = "FILE|DIR")]
    pub out: PathBuf,
    /// Print a JSON report
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Golden file written by `m2r2 golden write`
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Model to check (default: the model named in the golden file)
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// M2R2 weights folder for early-exit and speculative goldens, or `none` (default: the model's
    /// built-in M2R2 weights); they must be the ones recorded with
    #[arg(long = "m2r2", value_name = "DIR|none")]
    pub m2r2: Option<String>,
    #[command(flatten)]
    pub tol: ToleranceArgs,
    /// Replay the golden on this ONNX export with ONNX Runtime instead of recomputing it with the
    /// reference (greedy goldens: teacher forcing along the recorded tokens)
    #[arg(long, value_name = "DIR", conflicts_with_all = ["model", "m2r2"])]
    pub onnx: Option<PathBuf>,
    #[command(flatten)]
    pub ep: EpArgs,
    /// Also write a JUnit XML report (one test case per tensor) for CI systems
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Print a JSON report
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The expected golden (e.g. written by `m2r2 golden write`)
    #[arg(value_name = "EXPECTED")]
    pub expected: PathBuf,
    /// The golden to check against it (e.g. written by a deployment's harness)
    #[arg(value_name = "ACTUAL")]
    pub actual: PathBuf,
    #[command(flatten)]
    pub tol: ToleranceArgs,
    /// Also write a JUnit XML report (one test case per tensor) for CI systems
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Print a JSON report
    #[arg(long)]
    pub json: bool,
}

/// `--atol` / `--rtol` of `check` and `compare`.
#[derive(clap::Args, Debug)]
pub struct ToleranceArgs {
    /// Absolute tolerance of a logit: OK when |got - golden| <= atol + rtol |golden| (default
    /// 1e-4; with --onnx 2e-4 for an f32 export, 5e-2 for an f16 one: docs/GOLDEN.md has the
    /// measurements)
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub atol: Option<f32>,
    /// Relative tolerance of a logit (ONNX Runtime's convention, with --atol)
    #[arg(
        long,
        value_name = "X",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub rtol: f32,
}

impl ToleranceArgs {
    /// The tolerance, with `default_atol` where `--atol` is not given.
    fn get(&self, default_atol: f32) -> Result<Tolerance> {
        let atol = self.atol.unwrap_or(default_atol);
        for (name, x) in [("--atol", atol), ("--rtol", self.rtol)] {
            if !(x >= 0.0 && x.is_finite()) {
                bail!("{name} must be a finite number >= 0, got {x}");
            }
        }
        Ok(Tolerance {
            atol,
            rtol: self.rtol,
        })
    }
}

pub fn run(command: &Command) -> Result<()> {
    match command {
        Command::Write(args) => write(args),
        Command::Check(args) => check(args),
        Command::Compare(args) => compare(args),
    }
}

/// The file name of a suite member: the prompt id with anything but `[A-Za-z0-9._-]` replaced.
fn suite_file(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}{SUITE_SUFFIX}")
}

/// Suffix of the files of a golden suite folder.
const SUITE_SUFFIX: &str = ".golden.safetensors";

fn write(args: &WriteArgs) -> Result<()> {
    let loaded = common::load(&args.model.model)?;
    // (output path, prompt arguments) of every golden to write
    let jobs: Vec<(PathBuf, PromptArgs)> = match &args.prompts {
        Some(file) => {
            let prompts = common::read_prompts(file)?;
            std::fs::create_dir_all(&args.out)
                .with_context(|| format!("cannot create {}", args.out.display()))?;
            let mut seen = std::collections::HashSet::new();
            let mut jobs = Vec::new();
            for (id, text) in prompts {
                let name = suite_file(&id);
                if !seen.insert(name.clone()) {
                    bail!(
                        "{}: two prompts map to the file name {name}",
                        file.display()
                    );
                }
                let prompt = PromptArgs {
                    prompt: Some(text),
                    chat: args.chat,
                    tokens: None,
                };
                jobs.push((args.out.join(name), prompt));
            }
            jobs
        }
        None => {
            if args.prompt.is_none() && args.tokens.is_none() {
                bail!("give a prompt: --prompt TEXT, --tokens IDS or --prompts FILE.jsonl");
            }
            if args.chat && args.prompt.is_none() {
                bail!("--chat needs --prompt or --prompts");
            }
            let prompt = PromptArgs {
                prompt: args.prompt.clone(),
                chat: args.chat,
                tokens: args.tokens.clone(),
            };
            vec![(args.out.clone(), prompt)]
        }
    };
    let mut written = Vec::new();
    for (out, prompt) in &jobs {
        let tokens = common::prompt_tokens(&loaded, prompt)?;
        let golden = record(args, &loaded, &tokens)?;
        golden
            .write(out)
            .with_context(|| format!("cannot write golden {}", out.display()))?;
        if !args.json {
            println!(
                "wrote {}: {} {} steps of {} after {} prompt tokens (logits [{}, {}], config {})",
                out.display(),
                golden.tokens.len(),
                golden.mode,
                golden.model,
                golden.prompt_tokens.len(),
                golden.logits.nrows(),
                golden.logits.ncols(),
                golden.config_hash
            );
        }
        written.push(json!({
            "file": out.display().to_string(),
            "model": golden.model,
            "config_hash": golden.config_hash,
            "mode": golden.mode,
            "format_version": golden.format_version(),
            "prompt_tokens": golden.prompt_tokens,
            "tokens": golden.tokens,
            "logits_shape": golden.logits.shape(),
        }));
    }
    if args.json {
        match &args.prompts {
            Some(_) => common::print_json(&json!({ "files": written }))?,
            None => common::print_json(&written[0])?,
        }
    }
    Ok(())
}

/// Record `args.steps` tokens in `args.m2r2.mode` (greedy; no stop tokens).
fn record(
    args: &WriteArgs,
    loaded: &reference::io::load::LoadedModel,
    prompt: &[u32],
) -> Result<Golden> {
    let model = &loaded.model;
    if Mode::from(args.m2r2.mode) == Mode::Greedy {
        return Ok(Golden::record_greedy(
            model,
            &loaded.name,
            prompt,
            args.steps,
        )?);
    }
    let weights = args.m2r2.weights(loaded)?;
    let settings = args.m2r2.settings(loaded, &weights)?;
    let m2r2 = M2r2::new(model, &weights);
    let golden = match settings.mode {
        Mode::Greedy => unreachable!("handled above"),
        Mode::EarlyExit => {
            if settings.kv_policy != KvPolicy::Exact {
                bail!(
                    "early-exit goldens need --kv-policy exact: with {} the cache is approximate \
                     and the exit logits cannot be recomputed independently of the decoder",
                    settings.kv_policy
                );
            }
            let options = EarlyExitOptions {
                max_new_tokens: args.steps,
                stop_tokens: vec![],
                gate: settings.gate,
                threshold: settings.threshold,
                kv_policy: settings.kv_policy,
                sampling: None,
            };
            Golden::record_early_exit(m2r2, &loaded.name, prompt, args.steps, &options)?
        }
        Mode::Speculative => {
            // The draft gate's score is recorded when it decides the draft length.
            let gate = matches!(settings.draft_length, DraftLength::Dynamic { .. })
                .then_some(settings.gate);
            let options = SpeculativeOptions {
                max_new_tokens: args.steps,
                stop_tokens: vec![],
                draft_length: settings.draft_length.clone(),
                sampling: None,
            };
            Golden::record_speculative(
                m2r2,
                &loaded.name,
                prompt,
                args.steps,
                settings.draft_gate,
                gate,
                &options,
            )?
        }
    };
    Ok(golden)
}

/// The mode's settings, in words, as recorded.
fn settings_line(golden: &Golden) -> String {
    let Some(m2r2) = &golden.m2r2 else {
        return "greedy".into();
    };
    match &m2r2.record {
        M2r2Record::EarlyExit {
            gate,
            threshold,
            kv_policy,
            ..
        } => format!(
            "early-exit (gate {gate} >= {threshold}, kv {kv_policy}, m2r2 {})",
            m2r2.weights_hash
        ),
        M2r2Record::Speculative {
            draft_gate,
            draft_length,
            ..
        } => {
            let length = match draft_length {
                DraftLength::Fixed(n) => format!("{n} drafts"),
                DraftLength::Dynamic {
                    max,
                    gate,
                    threshold,
                } => format!("up to {max} drafts while {gate} >= {threshold}"),
            };
            format!(
                "speculative (draft gate {draft_gate}, {length}, m2r2 {})",
                m2r2.weights_hash
            )
        }
    }
}

/// What `check` runs the goldens on: an export (opened once), or the reference models the files
/// name (each loaded once, kept while consecutive files name the same one).
struct Engine {
    onnx: Option<OnnxEngine>,
    reference: Option<(String, LoadedModel)>,
}

fn check_file(args: &CheckArgs, engine: &mut Engine, file: &Path) -> Result<Checked> {
    let golden =
        Golden::read(file).with_context(|| format!("cannot read golden {}", file.display()))?;
    let start = Instant::now();
    let tol: Tolerance;
    let (engine, report, worst_text) = match &mut engine.onnx {
        Some(onnx) => {
            tol = onnx.tol;
            let report = onnx
                .check(&golden)
                .with_context(|| format!("golden check on {}", onnx.name))?;
            let text = worst_token_text(&report, onnx.tokenizer.as_ref());
            (onnx.name.clone(), report, text)
        }
        None => {
            tol = args.tol.get(DEFAULT_ATOL)?;
            let spec = args.model.as_deref().unwrap_or(&golden.model);
            let loaded = match &mut engine.reference {
                Some((name, loaded)) if name == spec => loaded,
                slot => &mut slot.insert((spec.to_string(), common::load(spec)?)).1,
            };
            let report = if golden.m2r2.is_some() {
                if tol.rtol != 0.0 {
                    bail!("--rtol is for greedy goldens; M2R2 goldens are checked with --atol");
                }
                let choice = M2r2Args::weights_only(args.m2r2.clone());
                let weights = choice.weights(loaded)?;
                golden
                    .check_m2r2(M2r2::new(&loaded.model, &weights), tol.atol)
                    .with_context(|| format!("M2R2 weights: {}", choice.source(loaded)))?
            } else {
                golden.check_on(
                    &mut ReferenceGreedy::new(&loaded.model),
                    &loaded.model.config,
                    tol,
                )?
            };
            let text = worst_token_text(&report, loaded.tokenizer().ok());
            (loaded.name.clone(), report, text)
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let header = format!(
        "golden {} (recorded with {}, {}): {} prompt tokens, {} steps; checking {engine}",
        file.display(),
        golden.model,
        settings_line(&golden),
        golden.prompt_tokens.len(),
        golden.tokens.len(),
    );
    let fields = json!({
        "file": file.display().to_string(),
        "golden_model": golden.model,
        "mode": golden.mode,
        "model": engine,
        "worst_token_text": worst_text,
    });
    let header = match &worst_text {
        Some(text) => format!("{header}\n(the worst logit's token, at `logits` below: {text:?})"),
        None => header,
    };
    Ok(Checked {
        label: format!("golden check of {engine} against {}", file.display()),
        header,
        fields,
        tol,
        report,
        seconds,
    })
}

/// One checked or compared golden: what the report shows.
struct Checked {
    label: String,
    header: String,
    fields: serde_json::Value,
    tol: Tolerance,
    report: CheckReport,
    seconds: f64,
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

fn check(args: &CheckArgs) -> Result<()> {
    let files = if args.file.is_dir() {
        suite_files(&args.file)?
    } else {
        vec![args.file.clone()]
    };
    let mut engine = Engine {
        onnx: match &args.onnx {
            Some(dir) => Some(OnnxEngine::open(args, dir)?),
            None => None,
        },
        reference: None,
    };
    let checked = files
        .iter()
        .map(|f| check_file(args, &mut engine, f))
        .collect::<Result<Vec<_>>>()?;
    report_all(
        &checked,
        args.json,
        args.junit.as_deref(),
        args.file.is_dir(),
    )
}

fn compare(args: &CompareArgs) -> Result<()> {
    let suite = args.expected.is_dir() || args.actual.is_dir();
    let pairs: Vec<(PathBuf, PathBuf)> = if suite {
        if !(args.expected.is_dir() && args.actual.is_dir()) {
            bail!("compare a folder with a folder, or a file with a file");
        }
        let expected = suite_files(&args.expected)?;
        let names = |files: &[PathBuf]| -> Vec<String> {
            files
                .iter()
                .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect()
        };
        let actual_names = names(&suite_files(&args.actual)?);
        let expected_names = names(&expected);
        let missing: Vec<&String> = expected_names
            .iter()
            .filter(|n| !actual_names.contains(n))
            .collect();
        let extra: Vec<&String> = actual_names
            .iter()
            .filter(|n| !expected_names.contains(n))
            .collect();
        if !missing.is_empty() || !extra.is_empty() {
            bail!(
                "the suites differ: missing from {}: {missing:?}; only in {}: {extra:?}",
                args.actual.display(),
                args.actual.display()
            );
        }
        expected_names
            .iter()
            .map(|n| (args.expected.join(n), args.actual.join(n)))
            .collect()
    } else {
        vec![(args.expected.clone(), args.actual.clone())]
    };
    let tol = args.tol.get(DEFAULT_ATOL)?;
    let checked = pairs
        .iter()
        .map(|(e, a)| compare_files(e, a, tol))
        .collect::<Result<Vec<_>>>()?;
    report_all(&checked, args.json, args.junit.as_deref(), suite)
}

fn compare_files(expected_path: &Path, actual_path: &Path, tol: Tolerance) -> Result<Checked> {
    let read = |path: &Path| {
        Golden::read(path).with_context(|| format!("cannot read golden {}", path.display()))
    };
    let (expected, actual) = (read(expected_path)?, read(actual_path)?);
    let start = Instant::now();
    let report = expected.compare_to(&actual, tol).with_context(|| {
        format!(
            "cannot compare {} with {}",
            expected_path.display(),
            actual_path.display()
        )
    })?;
    let header = format!(
        "golden {} (recorded with {}, {}; written by {}) against {} (recorded with {}; written by {}): {} prompt tokens, {} steps",
        expected_path.display(),
        expected.model,
        settings_line(&expected),
        writer(&expected),
        actual_path.display(),
        actual.model,
        writer(&actual),
        expected.prompt_tokens.len(),
        expected.tokens.len(),
    );
    Ok(Checked {
        label: format!(
            "golden compare of {} against {}",
            actual_path.display(),
            expected_path.display()
        ),
        header,
        fields: json!({
            "expected": expected_path.display().to_string(),
            "actual": actual_path.display().to_string(),
            "mode": expected.mode,
            "golden_model": expected.model,
            "expected_writer": writer(&expected),
            "actual_writer": writer(&actual),
        }),
        tol,
        report,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Who wrote a golden file, from its `m2r2_version`: the reference records its bare version
/// (`0.1.0` -> `m2r2 0.1.0`), other writers their own name (`m2r2-golden-python 0.1.0`).
fn writer(golden: &Golden) -> String {
    match golden.writer.as_deref() {
        Some(v) if v.starts_with(|c: char| c.is_ascii_digit()) => format!("m2r2 {v}"),
        Some(v) => v.to_string(),
        None => "an unknown writer (no m2r2_version)".into(),
    }
}

/// Print every report (tables, or JSON: the one object of a single file, `{"ok", "files"}` for a
/// suite), write the JUnit file, and fail naming every NOT OK tensor.
fn report_all(
    checked: &[Checked],
    json_out: bool,
    junit: Option<&Path>,
    suite: bool,
) -> Result<()> {
    write_junit(junit, checked)?;
    let objects: Vec<serde_json::Value> = checked.iter().map(|c| render(json_out, c)).collect();
    let ok = checked.iter().all(|c| c.report.ok());
    if json_out {
        if suite {
            common::print_json(&json!({ "ok": ok, "files": objects }))?;
        } else {
            common::print_json(&objects[0])?;
        }
    } else if suite {
        println!(
            "suite: {} of {} files OK",
            checked.iter().filter(|c| c.report.ok()).count(),
            checked.len()
        );
    }
    let failed: Vec<String> = checked
        .iter()
        .filter(|c| !c.report.ok())
        .map(|c| {
            let bad: Vec<&str> = c
                .report
                .entries
                .iter()
                .filter(|e| !e.ok)
                .map(|e| e.name.as_str())
                .collect();
            format!("{} failed: {} NOT OK", c.label, bad.join(", "))
        })
        .collect();
    if !failed.is_empty() {
        bail!("{}", failed.join("; "));
    }
    Ok(())
}

/// The text of the token at the worst logit (`at = [step, token]` of the `logits` entry), when
/// any logit differs at all.
fn worst_token_text(report: &CheckReport, tokenizer: Option<&Tokenizer>) -> Option<String> {
    let logits = report
        .entries
        .iter()
        .find(|e| e.name == "logits" && e.max_abs > 0.0)?;
    let &[_, token] = logits.at.as_slice() else {
        return None;
    };
    tokenizer?.decode(&[u32::try_from(token).ok()?], false).ok()
}

/// Write the reports as JUnit XML to `path`: one test suite per golden file (its label), one test
/// case per tensor, a failure (with the differences and where) for each NOT OK one.
fn write_junit(path: Option<&Path>, checked: &[Checked]) -> Result<()> {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let Some(path) = path else {
        return Ok(());
    };
    let mut junit = Report::new("m2r2 golden");
    for c in checked {
        let mut suite = TestSuite::new(c.label.clone());
        suite.set_time(std::time::Duration::from_secs_f64(c.seconds));
        for e in &c.report.entries {
            let details = format!(
                "max abs diff {:e}, max rel diff {:e}, at {:?}: {}",
                e.max_abs, e.max_rel, e.at, e.note
            );
            let status = if e.ok {
                TestCaseStatus::success()
            } else {
                let mut failed = TestCaseStatus::non_success(NonSuccessKind::Failure);
                failed.set_message(format!("{} NOT OK", e.name));
                failed.set_description(details.clone());
                failed
            };
            let mut case = TestCase::new(e.name.clone(), status);
            case.set_classname("m2r2.golden");
            case.set_system_out(details);
            suite.add_test_case(case);
        }
        junit.add_test_suite(suite);
    }
    let xml = junit.to_string().context("cannot write the JUnit report")?;
    std::fs::write(path, xml).with_context(|| format!("cannot write {}", path.display()))
}

/// Print one report's table (unless `json_out`) and return its JSON object.
fn render(json_out: bool, c: &Checked) -> serde_json::Value {
    // JSON has no infinity: a NaN or shape mismatch reports `null` differences.
    let finite = |x: f32| x.is_finite().then_some(x);
    let mut fields = c.fields.clone();
    let extra = json!({
        "atol": c.tol.atol,
        "rtol": c.tol.rtol,
        "ok": c.report.ok(),
        "seconds": c.seconds,
        "entries": c.report.entries.iter().map(|e| json!({
            "name": e.name,
            "ok": e.ok,
            "max_abs": finite(e.max_abs),
            "max_rel": finite(e.max_rel),
            "at": e.at,
            "note": e.note,
        })).collect::<Vec<_>>(),
    });
    if let (Some(f), Some(e)) = (fields.as_object_mut(), extra.as_object()) {
        f.extend(e.clone());
    }
    if !json_out {
        println!("{}", c.header);
        for e in &c.report.entries {
            println!(
                "{:<16} {:<6}  max abs diff {:<10.3e}  max rel diff {:<10.3e}  at {:<10}  {}",
                e.name,
                if e.ok { "OK" } else { "NOT OK" },
                e.max_abs,
                e.max_rel,
                format!("{:?}", e.at),
                e.note
            );
        }
        println!(
            "overall: {} ({:.2} s)",
            if c.report.ok() { "OK" } else { "NOT OK" },
            c.seconds
        );
    }
    fields
}
