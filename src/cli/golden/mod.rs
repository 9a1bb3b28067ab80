//! `m2r2 golden write | check | compare`: record a decode (greedy, early-exit or speculative,
//! with every step's M2R2 decisions and what each graph produced), and check a model or an export
//! against a recording tensor by tensor (OK / NOT OK per graph and tensor, the first step over
//! the tolerance, as llm.c's `test_gpt2`). `check` takes the mode and its settings from the file.
//!
//! Outcomes for CI (docs/GOLDEN.md): every file of a suite is checked and reported; `--junit` and
//! `--json` are written whatever happens (a golden that could not be checked is an `<error>`
//! case with the reason, a mismatch a `<failure>`); exit 0 all OK, 1 a mismatch, 2 a golden that
//! could not be checked (which wins over a mismatch: the verdict is incomplete).

use crate::cli::args::m2r2::M2r2Args;
use crate::cli::args::model::{ModelArgs, TokenIds, parse_token_ids};
use crate::cli::args::onnx::EpArgs;
use crate::cli::report::decimal;
use anyhow::Result;
use reference::decode::speculative::DraftLength;
use reference::golden::{Golden, M2r2Record, Pins, Tolerance};
use std::path::PathBuf;

mod check;
mod onnx;
mod report;
mod write;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Record `--steps` tokens of `--mode` and the logits each was chosen from (M2R2 modes: also the
    /// gate scores, exits, drafts and accepted counts)
    Write(WriteArgs),
    /// Recompute a golden file (or every one of a suite folder) and compare, graph by graph; exits
    /// 1 when a tensor differs beyond the tolerance, 2 when a golden could not be checked
    Check(CheckArgs),
    /// Compare two golden files tensor by tensor (e.g. one written by a deployment's own harness);
    /// exits 1 when a tensor differs beyond the tolerance, 2 when a pair could not be compared
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
    #[arg(
        long,
        value_name = "IDS",
        value_parser = parse_token_ids,
        conflicts_with = "prompts"
    )]
    pub tokens: Option<TokenIds>,
    /// A suite: one golden per prompt of this file (`{"id", "prompt"}` per line), written as
    /// `OUT/<id>.golden.safetensors` (--out is then a folder)
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: Option<PathBuf>,
    #[command(flatten)]
    pub m2r2: M2r2Args,
    /// Speculative goldens: draft a token tree of widths W1,W2,... per depth (`2,1,1`), as
    /// `generate --draft-tree` does, grown per branch with --dynamic-draft; the golden records
    /// every round's tree, the accepted node and every node's verified row (format version 4; 5
    /// when rounds grow or carry a lookup branch). Without it a speculative golden drafts a chain
    /// (the M2R2 config's default tree and lookup branch are not taken: a golden records what it
    /// is asked for)
    #[arg(long, value_name = "W1,W2,...")]
    pub draft_tree: Option<String>,
    /// Speculative goldens: add a prompt-lookup branch of up to N tokens to every round that
    /// finds one, as `generate --prompt-lookup` does: beside --draft-tree, else beside the chain
    /// of the draft length, grown per branch when the drafting is dynamic (what `generate` runs
    /// by default on a config with `prompt_lookup`). Recorded as a token-tree golden of format
    /// version 5; 0: off (the default)
    #[arg(long, value_name = "N")]
    pub prompt_lookup: Option<usize>,
    /// Steps (tokens) to record
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub steps: usize,
    /// Golden file to write (safetensors), or with --prompts the folder of the suite
    #[arg(long, value_name = "FILE|DIR")]
    pub out: PathBuf,
    /// Keep decoding past the model's end-of-turn tokens (by default a golden stops after the
    /// first one, as deployments do)
    #[arg(long)]
    pub ignore_eos: bool,
    /// Pin this absolute tolerance in the golden: checks use it unless their own --atol says
    /// otherwise
    #[arg(long, value_name = "X")]
    pub atol: Option<Bound>,
    /// Pin this relative tolerance in the golden (greedy goldens)
    #[arg(long, value_name = "X")]
    pub rtol: Option<Bound>,
    /// Pin the export precision this golden is for: `check --onnx` refuses an export of other
    /// weights (f32 | f16)
    #[arg(long, value_name = "DTYPE", value_parser = ["f32", "f16"])]
    pub expect_dtype: Option<String>,
    /// Print a JSON report
    #[arg(long)]
    pub json: bool,
}

// `--ort-compare` (of the flattened ONNX Runtime flags) is bench's: refused here, not offered
#[derive(clap::Args, Debug)]
#[command(mut_arg("ort_compare", |a| a.hide(true)))]
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
    /// The weights precision the export must have (f32 | f16; default: the golden's pin, if
    /// any): an export of other weights is not checked (exit 2)
    // `conflicts_with_all`: clap waives `requires` when `--onnx` conflicts with a flag given.
    #[arg(long, value_name = "DTYPE", value_parser = ["f32", "f16"], requires = "onnx", conflicts_with_all = ["model", "m2r2"])]
    pub expect_dtype: Option<String>,
    /// Also write a JUnit XML report (one test case per graph and tensor; `<error>` for a golden
    /// that could not be checked) for CI systems
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Print a JSON report
    #[arg(long)]
    pub json: bool,
}

// `--atol` without what `check --onnx` defaults to: compare has no export
#[derive(clap::Args, Debug)]
#[command(mut_arg("atol", |a| a.help(COMPARE_ATOL_HELP)))]
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

/// `compare`'s `--atol` (`check`'s is [`ToleranceArgs::atol`]'s doc).
const COMPARE_ATOL_HELP: &str = "Absolute tolerance of a logit: OK when |actual - expected| <= \
    atol + rtol |expected| (default: the expected golden's pin, else 1e-4). The report says which \
    applied and why";

/// `--atol` / `--rtol` of `check` and `compare`.
#[derive(clap::Args, Debug)]
pub struct ToleranceArgs {
    /// Absolute tolerance of a logit: OK when |got - golden| <= atol + rtol |golden| (default:
    /// the golden's pin, else 1e-4; with --onnx 2e-4 for an f32 export, 5e-2 for an f16 one:
    /// docs/GOLDEN.md has the measurements). The report says which applied and why
    #[arg(long, value_name = "X")]
    pub atol: Option<Bound>,
    /// Relative tolerance of a logit (ONNX Runtime's convention, with --atol; default: the
    /// golden's pin, else 0)
    #[arg(long, value_name = "X")]
    pub rtol: Option<Bound>,
}

/// A tolerance as given on the command line: its value as the golden pins it (an f32) and the
/// text typed, which a refusal quotes (`1e308` is inf as an f32: quoting the f32 would say the
/// user typed `inf`).
#[derive(Clone, Debug)]
pub struct Bound {
    pub value: f32,
    text: String,
}

impl std::str::FromStr for Bound {
    type Err = std::num::ParseFloatError;

    fn from_str(text: &str) -> std::result::Result<Self, Self::Err> {
        Ok(Bound {
            value: text.parse()?,
            text: text.into(),
        })
    }
}

impl Bound {
    /// The value of `name` (`--atol`), refused unless a finite number >= 0 that an f32 holds
    /// ([`Tolerance::check_bound`]'s rule), quoting what was typed.
    pub fn checked(&self, name: &str) -> Result<f32> {
        if Tolerance::check_bound(name, self.value).is_ok() {
            return Ok(self.value);
        }
        let beyond = match self.text.parse::<f64>() {
            Ok(x) if x.is_finite() && x.abs() > f64::from(f32::MAX) => {
                format!(", beyond what an f32 holds (at most {:e})", f32::MAX)
            }
            _ => String::new(),
        };
        anyhow::bail!(
            "{name} must be a finite number >= 0, got {}{beyond}",
            self.text
        )
    }
}

/// A tolerance and why it applies (printed with every report).
#[derive(Clone, Debug)]
pub struct ChosenTolerance {
    pub tol: Tolerance,
    /// e.g. `--atol`, `pinned in the golden`, `f16 export default`
    pub reason: String,
}

impl ToleranceArgs {
    /// The tolerance of checking `golden`: the command line's, else the golden's pins, else
    /// `derived` (a default and its reason, e.g. the export's precision).
    fn choose(&self, pins: &Pins, derived: (f32, &str)) -> Result<ChosenTolerance> {
        let (atol, atol_from) = match (&self.atol, pins.atol) {
            (Some(x), _) => (x.checked("--atol")?, "--atol"),
            (None, Some(x)) => (x, "pinned in the golden"),
            (None, None) => (derived.0, derived.1),
        };
        let (rtol, rtol_from) = match (&self.rtol, pins.rtol) {
            (Some(x), _) => (x.checked("--rtol")?, Some("--rtol")),
            (None, Some(x)) => (x, Some("pinned in the golden")),
            (None, None) => (0.0, None),
        };
        Tolerance::check_bound("--atol", atol)?;
        Tolerance::check_bound("--rtol", rtol)?;
        let reason = match rtol_from {
            Some(from) if from != atol_from => format!("atol: {atol_from}; rtol: {from}"),
            _ => atol_from.to_string(),
        };
        Ok(ChosenTolerance {
            tol: Tolerance { atol, rtol },
            reason,
        })
    }
}

pub fn run(command: &Command) -> Result<()> {
    match command {
        Command::Write(args) => write::write(args),
        Command::Check(args) => check::check(args),
        Command::Compare(args) => check::compare(args),
    }
}

/// Suffix of the files of a golden suite folder.
const SUITE_SUFFIX: &str = ".golden.safetensors";

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
            reference::golden::shown(&m2r2.weights.hash)
        ),
        M2r2Record::SpeculativeTree { recipe, .. } => {
            let nodes = recipe
                .shape()
                .map(|t| format!(" ({} nodes)", t.nodes()))
                .unwrap_or_default();
            format!(
                "speculative (draft gate {}, token tree {}{nodes}{}, m2r2 {})",
                recipe.draft_gate,
                reference::golden::tree::widths_text(&recipe.widths),
                recipe.policy(),
                reference::golden::shown(&m2r2.weights.hash)
            )
        }
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
                reference::golden::shown(&m2r2.weights.hash)
            )
        }
    }
}

/// A token-tree golden's drafting policy as JSON fields: `tree_grown` (`{gate, threshold}` or
/// null) and `prompt_lookup` (the branch's most tokens, or null); null for other goldens.
fn tree_policy_json(golden: &Golden) -> (serde_json::Value, serde_json::Value) {
    let recipe = golden.tree_recipe();
    let grown = recipe.and_then(|r| r.grown).map(|(gate, threshold)| {
        serde_json::json!({ "gate": gate.to_string(), "threshold": decimal(threshold) })
    });
    let lookup = recipe.and_then(|r| r.lookup).map(|l| l.max_tokens);
    (serde_json::json!(grown), serde_json::json!(lookup))
}

/// How a golden's decode ended, in words: `stopped at end of turn`, `ran the whole budget`, or
/// for files before format version 3 what they lack.
fn stop_line(golden: &Golden) -> String {
    match &golden.stop_tokens {
        // the header's `format N` says which version
        None => "ran the whole budget (stop tokens recorded from version 3 on)".into(),
        Some(stops) if stops.is_empty() => "recorded without stopping (--ignore-eos)".into(),
        Some(stops) => match golden.tokens.last() {
            Some(t) if stops.contains(t) => "stopped at end of turn".into(),
            _ => "did not reach end of turn".into(),
        },
    }
}
