//! `m2r2 golden write | check`: record a greedy decode, and check a model against a recording tensor
//! by tensor (OK / NOT OK with the largest differences, as llm.c's `test_gpt2`).

use super::common::{self, ModelArgs, PromptArgs};
use anyhow::{Context, Result, bail};
use reference::golden::{CheckReport, DEFAULT_ATOL, Golden};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Record `--steps` greedy tokens and the logits each was chosen from
    Write(WriteArgs),
    /// Recompute a golden file and compare; exits 1 when a tensor differs beyond the tolerance
    Check(CheckArgs),
}

#[derive(clap::Args, Debug)]
pub struct WriteArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Greedy steps to record
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub steps: usize,
    /// Golden file to write (safetensors)
    #[arg(long, value_name = "FILE")]
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
    /// Largest allowed absolute difference of a logit
    #[arg(long, value_name = "X", default_value_t = DEFAULT_ATOL, allow_negative_numbers = true)]
    pub atol: f32,
    /// Print a JSON report
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: &Command) -> Result<()> {
    match command {
        Command::Write(args) => write(args),
        Command::Check(args) => check(args),
    }
}

fn write(args: &WriteArgs) -> Result<()> {
    let loaded = common::load(&args.model.model)?;
    let prompt = common::prompt_tokens(&loaded, &args.prompt)?;
    let golden = Golden::record_greedy(&loaded.model, &loaded.name, &prompt, args.steps)?;
    golden
        .write(&args.out)
        .with_context(|| format!("cannot write golden {}", args.out.display()))?;
    if args.json {
        common::print_json(&json!({
            "file": args.out.display().to_string(),
            "model": golden.model,
            "config_hash": golden.config_hash,
            "prompt_tokens": golden.prompt_tokens,
            "tokens": golden.tokens,
            "logits_shape": golden.logits.shape(),
        }));
    } else {
        println!(
            "wrote {}: {} greedy steps of {} after {} prompt tokens (logits [{}, {}], config {})",
            args.out.display(),
            golden.tokens.len(),
            golden.model,
            golden.prompt_tokens.len(),
            golden.logits.nrows(),
            golden.logits.ncols(),
            golden.config_hash
        );
    }
    Ok(())
}

fn check(args: &CheckArgs) -> Result<()> {
    if args.atol.is_nan() || args.atol < 0.0 {
        bail!("--atol must be >= 0, got {}", args.atol);
    }
    let golden = Golden::read(&args.file)
        .with_context(|| format!("cannot read golden {}", args.file.display()))?;
    let spec = args.model.as_deref().unwrap_or(&golden.model);
    let loaded = common::load(spec)?;
    let start = Instant::now();
    let report = golden.check(&loaded.model, args.atol)?;
    let seconds = start.elapsed().as_secs_f64();
    if args.json {
        common::print_json(&report_json(args, &golden, &loaded.name, &report, seconds));
    } else {
        print_report(args, &golden, &loaded.name, &report, seconds);
    }
    if !report.ok() {
        let bad: Vec<&str> = report
            .entries
            .iter()
            .filter(|e| !e.ok)
            .map(|e| e.name.as_str())
            .collect();
        bail!(
            "golden check of {} against {} failed: {} NOT OK",
            loaded.name,
            args.file.display(),
            bad.join(", ")
        );
    }
    Ok(())
}

fn print_report(
    args: &CheckArgs,
    golden: &Golden,
    model: &str,
    report: &CheckReport,
    seconds: f64,
) {
    println!(
        "golden {} (recorded with {}): {} prompt tokens, {} steps; checking {model} at atol {:e}",
        args.file.display(),
        golden.model,
        golden.prompt_tokens.len(),
        golden.tokens.len(),
        args.atol
    );
    for e in &report.entries {
        println!(
            "{:<8} {:<6}  max abs diff {:<10.3e}  max rel diff {:<10.3e}  at {:<10}  {}",
            e.name,
            if e.ok { "OK" } else { "NOT OK" },
            e.max_abs,
            e.max_rel,
            format!("{:?}", e.at),
            e.note
        );
    }
    println!(
        "overall: {} ({seconds:.2} s)",
        if report.ok() { "OK" } else { "NOT OK" }
    );
}

fn report_json(
    args: &CheckArgs,
    golden: &Golden,
    model: &str,
    report: &CheckReport,
    seconds: f64,
) -> serde_json::Value {
    // JSON has no infinity: a NaN or shape mismatch reports `null` differences.
    let finite = |x: f32| x.is_finite().then_some(x);
    json!({
        "file": args.file.display().to_string(),
        "golden_model": golden.model,
        "model": model,
        "atol": args.atol,
        "ok": report.ok(),
        "seconds": seconds,
        "entries": report.entries.iter().map(|e| json!({
            "name": e.name,
            "ok": e.ok,
            "max_abs": finite(e.max_abs),
            "max_rel": finite(e.max_rel),
            "at": e.at,
            "note": e.note,
        })).collect::<Vec<_>>(),
    })
}
