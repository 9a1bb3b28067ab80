//! `m2r2 train-arla`: train ARLA (docs/m2r2/arla.md) on top of trained adapters with binary
//! cross-entropy on "the exit token equals the base model's token", then calibrate its threshold on
//! held-out (development) data for a target agreement: one threshold shared by every gate
//! (`arla.threshold`), and one per gate for each of the three gate kinds; the kind with the
//! fewest layers per token becomes the folder's default early exit (`early_exit`).
//! Prints the early-exit sweep of ARLA next to the confidence and entropy gates on the same
//! tokens, and the calibration of each.

use crate::cli::args::trained::{Trained, TrainedArgs};
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Context, Result, bail};
use reference::m2r2::arla::Arla;
use reference::m2r2::config::EarlyExitConfig;
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::exit_threshold::ExitThreshold;
use std::path::PathBuf;
use std::time::Instant;
use train::arla_trainer::{
    ArlaOptions, SweepPoint, TokenGates, arla_accuracy, arla_scores, calibrate, calibrate_per_gate,
    collect, default_thresholds, sweep, train,
};
use train::data::{ContextNeed, DistillSample, check_context};

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("data", |a| a.help(
        "Distillation data ARLA is trained on, comma-separated or repeated folders"
    )),
    mut_arg("dev_data", |a| a.help(
        "Held-out distillation data the thresholds are calibrated on: validation data of the \
         training distribution (e.g. data/distill/smollm2-magpie-val), never the development \
         prompts (data made from dev_prompts.jsonl, or sharing a prompt with --data, is refused)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub trained: TrainedArgs,
    /// Optimizer steps (at most 10 000 000)
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub steps: usize,
    /// (token, gate) examples per step, drawn with replacement (at most the examples --data has)
    #[arg(long, value_name = "B", default_value_t = 256)]
    pub batch: usize,
    /// Peak learning rate (warm-up 5 %, cosine to lr / 10)
    #[arg(long, value_name = "X", default_value_t = 3e-3)]
    pub lr: f64,
    /// AdamW weight decay
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Seed of the initial ARLA weights and of the example sampling
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Agreement with the base model the calibrated threshold must reach on the --dev-data samples
    #[arg(long, value_name = "X", default_value_t = 0.95)]
    pub target_agreement: f64,
    /// Output folder: the M2R2 weights with ARLA and the calibrated threshold (the --m2r2 folder
    /// itself, or a folder without M2R2 weights unless --force)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Replace the M2R2 weights an --out other than --m2r2 holds (its ARLA, calibration, draft
    /// head, and a `train` checkpoint's trainer files; other files are kept)
    #[arg(long)]
    pub force: bool,
    /// Write the tensors as f16 (half the size; what ships in the repository)
    #[arg(long)]
    pub f16: bool,
}

fn print_sweep(name: &str, points: &[SweepPoint]) {
    println!("{name}:");
    println!("| threshold | agreement | layers/token | exits per gate |");
    println!("|---|---|---|---|");
    for p in points.iter().filter(|p| {
        let t = p.shared().unwrap_or(f32::NAN);
        ((t * 10.0).round() - t * 10.0).abs() < 1e-4 || t > 1.0
    }) {
        let exits: Vec<String> = p.exits.iter().map(|e| format!("{e:.2}")).collect();
        println!(
            "| {:.2} | {:.3} | {:.2} | {} |",
            p.thresholds[0],
            p.agreement,
            p.layers_per_token,
            exits.join(" / ")
        );
    }
}

/// Optimizer steps one run takes at most (`--steps`): the losses of every step are kept.
const MAX_STEPS: usize = 10_000_000;

fn scores_of(tokens: &[TokenGates], pick: impl Fn(&TokenGates) -> &Vec<f32>) -> Vec<Vec<f32>> {
    tokens.iter().map(|t| pick(t).clone()).collect()
}

/// Refuse a sample of `data` (from `--data`) or `dev` (from `--dev-data`) that the model's
/// `context` cannot hold, naming its file and line, before any exit state is collected: each runs
/// through the whole model once.
fn check_fit(
    trained: &TrainedArgs,
    context: usize,
    data: &[DistillSample],
    dev: &[DistillSample],
) -> Result<()> {
    let need = ContextNeed::exact(context);
    check_context(&trained.data, data, &need)?;
    check_context(std::slice::from_ref(&trained.dev_data), dev, &need)?;
    Ok(())
}

pub fn run(args: &Args) -> Result<()> {
    if args.steps == 0 || args.batch == 0 {
        bail!("--steps and --batch must be at least 1");
    }
    if args.steps > MAX_STEPS {
        bail!(
            "--steps {} is more than the {MAX_STEPS} steps one run takes",
            args.steps
        );
    }
    if !(args.target_agreement > 0.0 && args.target_agreement <= 1.0) {
        bail!(
            "--target-agreement must be in (0, 1], got {}",
            args.target_agreement
        );
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        bail!("--lr must be a finite number > 0, got {}", args.lr);
    }
    if !(args.weight_decay.is_finite() && args.weight_decay >= 0.0) {
        bail!(
            "--weight-decay must be a finite number >= 0, got {}",
            args.weight_decay
        );
    }
    common::check_out_folder(&args.out, "--out")?;
    // --out is replaced only when it is --m2r2 itself (ARLA written beside its adapters) or holds
    // no weights, unless --force
    let in_place = common::same_folder(&args.trained.m2r2, &args.out);
    let held = train::checkpoint_files::weights_files_in(&args.out);
    if !in_place && !held.is_empty() && !args.force {
        bail!(
            "--out {} holds M2R2 weights ({}) other than --m2r2 {}: pass --force to replace them \
             (their ARLA and calibration are lost), write into --m2r2 itself, or choose another \
             --out",
            args.out.display(),
            held.join(", "),
            args.trained.m2r2.display()
        );
    }
    let Trained {
        loaded,
        mut weights,
        data,
        dev,
    } = args.trained.load()?;
    let model = &loaded.model;
    check_fit(&args.trained, model.context_length(), &data, &dev)?;
    let config = &weights.config;
    // (token, gate) examples: every response row of --data at every gate
    let rows: usize = data.iter().map(|d| d.tokens.len() - d.first_row()).sum();
    let examples = rows.saturating_mul(config.num_gates());
    let batch = args.batch.min(examples).max(1);
    if batch < args.batch {
        eprintln!(
            "note: --batch {} is more than the {examples} (token, gate) examples of --data: each \
             step draws {batch}",
            args.batch
        );
    }
    let start = Instant::now();
    let mut counter = progress::Counter::new("exit states", data.len() + dev.len(), 0);
    let (mut done, mut tokens) = (0, 0);
    let mut on_sample = |sample: &DistillSample| {
        done += 1;
        tokens += sample.tokens.len();
        counter.update(done, tokens);
    };
    let train_tokens = collect(model, &weights, &data, &mut |i| on_sample(&data[i]))?;
    let dev_tokens = collect(model, &weights, &dev, &mut |i| on_sample(&dev[i]))?;
    counter.finish();
    eprintln!(
        "exit states of {} training and {} dev tokens in {:.1} s",
        train_tokens.len(),
        dev_tokens.len(),
        start.elapsed().as_secs_f64()
    );
    let eps = model.config.rms_norm_eps as f32;
    let init = Arla::random(
        model.config.hidden_size,
        config.num_gates(),
        config.arla.latent,
        args.seed,
    );
    let options = ArlaOptions {
        steps: args.steps,
        batch,
        lr: args.lr,
        weight_decay: args.weight_decay,
        seed: args.seed,
    };
    let start = Instant::now();
    // progress: steps done, and the (token, gate) examples they drew as the counter's tokens
    let mut counter = progress::Counter::new("ARLA steps", args.steps, 0);
    let trained = train(&init, &train_tokens, eps, &options, &mut |step| {
        counter.update(step, step * batch)
    });
    counter.finish();
    let (arla, losses) = trained?;
    if let Some(step) = losses.iter().position(|l| !l.is_finite()) {
        bail!(
            "ARLA training diverged at step {} (BCE {}): lower --lr; nothing was written",
            step + 1,
            losses[step]
        );
    }
    let tail = &losses[losses.len().saturating_sub(50)..];
    let (bce, acc) = arla_accuracy(&arla_scores(&arla, &dev_tokens, eps), &dev_tokens);
    println!(
        "trained ARLA {} steps in {:.1} s: train BCE (last {} steps) {:.4}; dev BCE {bce:.4}, accuracy {acc:.3}",
        args.steps,
        start.elapsed().as_secs_f64(),
        tail.len(),
        tail.iter().sum::<f64>() / tail.len() as f64
    );
    let thresholds = default_thresholds();
    let gates = &config.gates;
    let n = model.config.num_hidden_layers;
    // each gate kind's scores of the dev tokens, and its sweep of shared thresholds
    let kinds: Vec<(GateKind, Vec<Vec<f32>>)> = vec![
        (GateKind::Arla, arla_scores(&arla, &dev_tokens, eps)),
        (
            GateKind::Confidence,
            scores_of(&dev_tokens, |t| &t.confidence),
        ),
        (GateKind::Entropy, scores_of(&dev_tokens, |t| &t.entropy)),
    ];
    let sweeps: Vec<Vec<SweepPoint>> = kinds
        .iter()
        .map(|(_, scores)| sweep(&dev_tokens, scores, gates, n, &thresholds))
        .collect();
    for ((kind, _), points) in kinds.iter().zip(&sweeps) {
        let title = match kind {
            GateKind::Arla => "ARLA",
            other => other.name(),
        };
        print_sweep(title, points);
    }
    println!(
        "calibrated for agreement >= {} on the --dev-data samples:",
        args.target_agreement
    );
    // (gate kind, per-gate point) with the fewest layers, ARLA first on ties
    let mut best_exit: Option<(GateKind, SweepPoint)> = None;
    for ((kind, scores), points) in kinds.iter().zip(&sweeps) {
        let name = kind.name();
        match calibrate(points, args.target_agreement) {
            Some(p) => println!(
                "  {name}, one threshold: {:.2}, agreement {:.3}, layers/token {:.2}",
                p.thresholds[0], p.agreement, p.layers_per_token
            ),
            None => println!("  {name}: no threshold reaches the target"),
        }
        let per_gate = calibrate_per_gate(
            &dev_tokens,
            scores,
            gates,
            n,
            &thresholds,
            args.target_agreement,
        );
        let Some(p) = per_gate else { continue };
        let t: Vec<String> = p.thresholds.iter().map(|t| format!("{t:.2}")).collect();
        let exits: Vec<String> = p.exits.iter().map(|e| format!("{e:.2}")).collect();
        println!(
            "  {name}, one per gate: {}, agreement {:.3}, layers/token {:.2}, exits per gate {}",
            t.join(","),
            p.agreement,
            p.layers_per_token,
            exits.join(" / ")
        );
        if best_exit
            .as_ref()
            .is_none_or(|(_, b)| p.layers_per_token < b.layers_per_token)
        {
            best_exit = Some((*kind, p));
        }
    }
    let best = calibrate(&sweeps[0], args.target_agreement)
        .expect("the never-exit threshold reaches any target agreement <= 1");
    weights.config.arla.threshold = best.thresholds[0];
    // only when it exits at all: a folder whose early exit would never exit keeps the old default
    weights.config.early_exit = best_exit
        .filter(|(_, p)| p.layers_per_token < n as f64)
        .map(|(gate, p)| EarlyExitConfig {
            gate,
            thresholds: p.thresholds,
        });
    weights.arla = Some(arla);
    if !in_place && args.force {
        common::report_cleared(&args.out)?;
    }
    weights
        .save_dir(&args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    if args.f16 {
        train::ship::to_f16_in_place(&args.out)?;
    }
    let per_gate = match &weights.config.early_exit {
        Some(e) => format!(
            ", early exit: {} >= {}",
            e.gate,
            ExitThreshold::PerGate(e.thresholds.clone())
        ),
        None => String::new(),
    };
    println!(
        "wrote {} (arla.threshold = {:.2}{per_gate}{})",
        args.out.display(),
        best.thresholds[0],
        if args.f16 { ", f16" } else { "" }
    );
    Ok(())
}
