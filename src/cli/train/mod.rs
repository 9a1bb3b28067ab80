//! `m2r2 train`: train the accelerator adapters on self-distillation data (docs/TRAINING.md), base
//! model frozen, with the hand-written backward passes of the `train` crate. Checkpoints are M2R2
//! weights folders in the PEFT layout (usable as `--m2r2 DIR`) with the optimizer state for
//! `--resume`.

mod bridge;
mod flags;
mod held_out;
mod interrupt;
mod log;
mod out;
mod start;
mod validation;

use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Context, Result, bail};
use held_out::{held_out, report_cache};
use interrupt::Stop;
use log::{gate_summary, print_held_out, step_bar, what_is_trained, window_mean};
use reference::m2r2::arla::ARLA_FILE;
use std::path::PathBuf;
use std::time::Instant;
use train::align::AlignKind;
use train::base_digest::base_weights_sha256;
use train::checkpoint::{self, RunRecord, Saved};
use train::data::{ContextNeed, check_context};
use train::early_stop::Observation;
use train::slow_cache::SlowPass;
use train::trainer::StepLog;
use validation::Validation;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Distillation data folders (written by `m2r2 distill-data`), comma-separated or repeated:
    /// trained on as one set (never data made from dev_prompts.jsonl)
    #[arg(long, value_name = "DIR", required = true, num_args = 1.., value_delimiter = ',')]
    pub data: Vec<PathBuf>,
    /// Exit gates as comma-separated layer counts (default: 3 gates, 4 near-equal intervals)
    #[arg(long, value_name = "E1,E2,...")]
    pub gates: Option<String>,
    /// Gates (1-based) whose adapters are trained, comma-separated (default: all)
    #[arg(long, value_name = "G,...")]
    pub train_gates: Option<String>,
    /// Adapter rank r, or one per gate (R1,R2,...; default 16). Each gate's scale is alpha / r of
    /// the most common rank, so alpha grows with a gate's rank. With --init: the new rank of the
    /// trained gates (or one per gate), which widens their adapters: the same terms, with new
    /// directions to train
    #[arg(long, value_name = "R[,R2,...]", value_delimiter = ',', num_args = 1..)]
    pub rank: Vec<usize>,
    /// Adapter alpha (scale alpha / r; default 2 r)
    #[arg(long, value_name = "A")]
    pub alpha: Option<f32>,
    /// Adapted linear maps, comma-separated (default: all seven)
    #[arg(long, value_name = "LIST")]
    pub targets: Option<String>,
    /// Optimizer steps (each updates every trained gate once) [default: 1000; with --resume, the
    /// checkpoint's total]
    #[arg(long, value_name = "N")]
    pub steps: Option<usize>,
    /// Fast rows per gate per step
    #[arg(long, value_name = "B", default_value_t = 64)]
    pub batch_rows: usize,
    /// Peak learning rate
    #[arg(long, value_name = "X", default_value_t = 2e-3)]
    pub lr: f64,
    /// Final learning rate of the cosine decay (default lr / 10)
    #[arg(long, value_name = "X")]
    pub lr_min: Option<f64>,
    /// Warm-up steps (default steps / 20)
    #[arg(long, value_name = "N")]
    pub warmup: Option<usize>,
    /// AdamW decoupled weight decay
    #[arg(long, value_name = "X", default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Clip each gate's gradient to this global L2 norm
    #[arg(long, value_name = "X", default_value_t = 1.0)]
    pub clip: f64,
    /// Distillation temperature tau of the KL loss
    #[arg(long, value_name = "T", default_value_t = 1.0)]
    pub temperature: f64,
    /// Weight of a cross-entropy term on the teacher's argmax (the token greedy decoding emits)
    /// beside the KL; 0 trains on the KL alone
    #[arg(long, value_name = "W", default_value_t = 0.0)]
    pub hard_label_weight: f64,
    /// Alignment of the exit state with the final slow residual: cosine | mse
    #[arg(long, value_name = "KIND")]
    pub align: Option<AlignKind>,
    /// Weight of the alignment term
    #[arg(long, value_name = "X", default_value_t = 0.1, requires = "align")]
    pub align_weight: f64,
    /// Also align the fast state after each inner layer i of the interval with the slow residual at
    /// depth d_j(i) = e_j + round(i (N - e_j) / k_j) it estimates, with --align's kind and weight;
    /// keeps k_j - 1 more rows of D per position in memory
    #[arg(long, requires = "align")]
    pub align_intermediate: bool,
    /// Seed of the adapter initialisation and of the row sampling
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Add a bridge of this rank (docs/m2r2/bridge.md): the draft gate's fast stream also reads the
    /// last verified final slow state, through low-rank maps trained with that gate's adapters
    /// (the draft gate must be among --train-gates). With --init, a folder that has a bridge keeps
    /// training it
    #[arg(long, value_name = "R")]
    pub bridge_rank: Option<usize>,
    /// Where the bridge's term joins the draft: `entry` (the start of the draft gate's interval),
    /// `gate` (the exit state), or both
    #[arg(long, value_name = "SITES", value_delimiter = ',', num_args = 1.., default_value = "entry", requires = "bridge_rank")]
    pub bridge_sites: Vec<String>,
    /// Train only the bridge's maps, keeping the adapters as they are (early exit, which never
    /// reads the bridge, is then unchanged); needs a bridge (--bridge-rank, or an --init folder
    /// with one). Only the bridge's gate is run (the default --train-gates)
    #[arg(long)]
    pub bridge_only: bool,
    /// Output folder (checkpoint: M2R2 weights + optimizer state). A folder holding a checkpoint
    /// or M2R2 weights is refused, unless --resume continues that same folder or --force is given
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Start a new run in an --out that holds a checkpoint or M2R2 weights: its M2R2 and trainer
    /// files are replaced and its best/ removed
    #[arg(long)]
    pub force: bool,
    /// Start from trained M2R2 weights (a folder, e.g. reference/assets/smollm2-m2r2): their
    /// gates, ranks and targets (--rank may raise the trained gates' ranks); the trained gates
    /// continue from their adapters, the other gates'
    /// adapters are kept as they are. ARLA is dropped (it was fitted to the old exit states:
    /// retrain it with train-arla), and so is the pruned draft head (rerun draft-head)
    #[arg(long, value_name = "DIR", conflicts_with_all = ["resume", "gates", "alpha", "targets"])]
    pub init: Option<PathBuf>,
    /// Continue from a checkpoint folder (its settings are used, so the flags that set them are
    /// refused beside it; --steps sets the new total)
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with_all = [
            "gates", "train_gates", "rank", "alpha", "targets", "batch_rows", "lr", "lr_min",
            "warmup", "weight_decay", "clip", "temperature", "hard_label_weight", "align",
            "align_weight", "align_intermediate", "seed", "bridge_rank", "bridge_sites",
            "bridge_only",
        ]
    )]
    pub resume: Option<PathBuf>,
    /// Keep the slow stream (the frozen base model's pass over the data, the first and longest phase)
    /// in this folder, one file per model, gates and data folder (about 15 KB per token for
    /// SmolLM2's gate 1); a later run, `--resume` or evaluation on the same model, gates and data
    /// folders (in any combination) reads them instead of recomputing them
    #[arg(long, value_name = "DIR")]
    pub slow_cache: Option<PathBuf>,
    /// Also write the checkpoint every N steps
    #[arg(long, value_name = "N")]
    pub save_every: Option<usize>,
    /// Held-out distillation data (e.g. from dev prompts): per-gate agreement before and after
    /// (refused when it shares a prompt with --data)
    #[arg(long, value_name = "DIR")]
    pub eval_data: Option<PathBuf>,
    /// Validation data from the training distribution (never the development prompts, nor prompts
    /// of --data) for early stopping: evaluated every --eval-every steps; the best weights are
    /// written to OUT/best
    #[arg(long, value_name = "DIR")]
    pub val_data: Option<PathBuf>,
    /// With --val-data: steps between evaluations (default 100; with --resume, the checkpoint's)
    #[arg(long, value_name = "N", requires = "val_data")]
    pub eval_every: Option<usize>,
    /// With --val-data: stop after this many evaluations in a row without a lower mean KL
    /// (default 3; with --resume, the checkpoint's)
    #[arg(long, value_name = "P", requires = "val_data")]
    pub patience: Option<usize>,
    /// Print one line per N steps on stderr (always when stderr is not a terminal)
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub log_every: usize,
}

/// A new run's steps when `--steps` is not given.
const DEFAULT_STEPS: usize = 1000;

impl Args {
    /// A new run's total steps: `--steps`, else [`DEFAULT_STEPS`]. (A resumed run's default is its
    /// checkpoint's total, [`total_steps`].)
    pub fn steps(&self) -> usize {
        self.steps.unwrap_or(DEFAULT_STEPS)
    }
}

/// The run's total steps: `--steps` when given, else a resumed checkpoint's own total (so that the
/// `--resume DIR --out DIR` an interrupted run prints continues that run), else the default.
fn total_steps(args: &Args, saved: Option<&Saved>) -> usize {
    match (args.steps, saved) {
        (Some(steps), _) => steps,
        (None, Some(saved)) => saved.steps,
        (None, None) => DEFAULT_STEPS,
    }
}

pub fn run(args: &Args) -> Result<()> {
    common::check_out_folder(&args.out, "--out")?;
    flags::check(args)?;
    out::check(&args.out, args.resume.as_deref(), args.force)?;
    let saved = match &args.resume {
        Some(dir) => {
            let saved = checkpoint::inspect(dir)
                .with_context(|| format!("cannot resume from {}", dir.display()))?;
            let total = total_steps(args, Some(&saved));
            if saved.step >= total {
                bail!(
                    "{} has already done {} of {total} steps: give a larger --steps to train on",
                    dir.display(),
                    saved.step,
                );
            }
            if saved.finished_save {
                eprintln!(
                    "note: completed the save of step {} in {}, which was stopped while its files \
                     were renamed into place",
                    saved.step,
                    dir.display()
                );
            }
            if !saved.files_checked {
                eprintln!(
                    "note: {} was saved before checkpoints recorded their files' SHA-256: its \
                     files are not checked against each other",
                    dir.display()
                );
            }
            Some(saved)
        }
        None => None,
    };
    let done = saved.as_ref().map_or(0, |s| s.step);
    let total = total_steps(args, saved.as_ref());
    let loaded = common::load(&args.model.model)?;
    let model = &loaded.model;
    for &rank in &args.rank {
        common::check_low_rank("--rank", rank, model.config.hidden_size)?;
    }
    let (data, metas, parts) = train::data::read_all(&args.data, model.config.vocab_size)?;
    for (dir, meta) in args.data.iter().zip(&metas) {
        train::data::refuse_dev_prompts("--data", dir, meta, "training fits the adapters to it")?;
        let hash = model.config.hash();
        if meta.from_other_model(&loaded.name, &hash) {
            // Not an error: the targets are the trained model's own slow stream; only the inputs
            // are another model's responses.
            eprintln!(
                "note: {} was generated with model `{}`{}, training `{}` (config {hash}): its \
                 responses are not this model's own",
                dir.display(),
                meta.model,
                meta.config_hash
                    .as_ref()
                    .map_or(String::new(), |h| format!(" (config {h})")),
                loaded.name
            );
        }
    }
    // rows are drawn with replacement: a batch above the rows there are draws them again, and
    // memory grows with the batch
    let rows: usize = data.iter().map(|s| s.tokens.len() - s.first_row()).sum();
    let batch_rows = args.batch_rows.min(rows.max(1));
    if args.resume.is_none() && batch_rows < args.batch_rows {
        eprintln!(
            "note: --batch-rows {} is more than the {rows} trainable rows of the data: each step \
             draws {batch_rows} rows per gate",
            args.batch_rows
        );
    }
    // held-out data, read and checked before the slow stream (the longest phase)
    let vocab = model.config.vocab_size;
    let eval_data = match &args.eval_data {
        Some(dir) => Some(train::data::read(dir, vocab)?.0),
        None => None,
    };
    let val_data = match &args.val_data {
        Some(dir) => {
            let (samples, meta) = train::data::read(dir, vocab)?;
            let purpose = "early stopping tunes on it (use --eval-data for them)";
            train::data::refuse_dev_prompts("--val-data", dir, &meta, purpose)?;
            Some(samples)
        }
        None => None,
    };
    for (flag, dir, held) in [
        ("--eval-data", &args.eval_data, &eval_data),
        ("--val-data", &args.val_data, &val_data),
    ] {
        if let (Some(dir), Some(held)) = (dir, held) {
            train::data::refuse_shared_prompts(&data, &args.data, held, flag, dir)?;
            let need = ContextNeed::exact(model.context_length());
            check_context(std::slice::from_ref(dir), held, &need)?;
        }
    }
    let resumed_record = args
        .resume
        .as_deref()
        .zip(saved.as_ref().and_then(|s| s.record.validation.as_ref()));
    let val_record = match &val_data {
        Some(samples) => Some(validation::start_record(
            samples,
            args.eval_every,
            args.patience,
            resumed_record,
            done,
            total,
        )?),
        None => None,
    };
    let start = Instant::now();
    let mut precompute = progress::Counter::new("slow stream", data.len(), 0);
    let (mut samples_done, mut tokens_done) = (0, 0);
    let mut on_sample = |i: usize| {
        samples_done += 1;
        tokens_done += data[i].tokens.len();
        precompute.update(samples_done, tokens_done);
    };
    let mut slow = SlowPass::new(args.slow_cache.as_deref(), &mut on_sample);
    slow.parts = parts;
    // the base weights' SHA-256 for the checkpoint: a resume has just checked the recorded one
    let (mut trainer, base_weights) = match &args.resume {
        Some(dir) => {
            let (trainer, record) =
                checkpoint::resume_with(model, dir, &data, Some(total), &mut slow)
                    .with_context(|| format!("cannot resume from {}", dir.display()))?;
            if dir.join(ARLA_FILE).is_file() {
                eprintln!(
                    "note: {} holds ARLA ({ARLA_FILE}, with its calibrated thresholds), fitted to \
                     the adapters as they were: kept, but retrain it with `m2r2 train-arla` after \
                     this run",
                    dir.display()
                );
            }
            (trainer, record.base_weights_sha256)
        }
        None => (
            start::new_trainer(args, model, &loaded.name, &data, batch_rows, &mut slow)?,
            Some(base_weights_sha256(model)),
        ),
    };
    let cached = std::mem::take(&mut slow.used);
    precompute.finish();
    report_cache("the training data", cached);
    eprintln!(
        "slow stream of {} samples ({} trainable rows) in {:.1} s; {}",
        data.len(),
        trainer.rows_available(),
        start.elapsed().as_secs_f64(),
        what_is_trained(&trainer)
    );
    let cache = args.slow_cache.as_deref();
    let eval = match &eval_data {
        Some(data) => Some(held_out(model, &trainer, data, cache, "--eval-data")?),
        None => None,
    };
    let before = eval.as_ref().map(|e| trainer.evaluate_held_out(e));
    let mut val = match (&val_data, val_record) {
        (Some(data), Some(record)) => Some(Validation::new(
            held_out(model, &trainer, data, cache, "--val-data")?,
            record,
        )),
        _ => None,
    };
    // without --val-data, a resumed run keeps the checkpoint's record for a later resume with it
    let kept = saved.and_then(|s| s.record.validation);
    let record = |val: &Option<Validation>| RunRecord {
        model_config_hash: Some(model.config.hash()),
        base_weights_sha256: base_weights.clone(),
        validation: val.as_ref().map(|v| v.record.clone()).or(kept.clone()),
    };
    out::prepare(&args.out, args.resume.as_deref(), args.force)?;

    let stop = Stop::install()?;
    let bar = step_bar(trainer.options.steps as u64);
    bar.set_position(trainer.step as u64);
    let log_to_stderr = !progress::enabled();
    let train_start = Instant::now();
    let first_step = trainer.step;
    let mut window: Vec<StepLog> = Vec::new();
    while trainer.step < trainer.options.steps {
        let log = trainer.train_step();
        if let Some(g) = log
            .gates
            .iter()
            .find(|g| !(g.kl.is_finite() && g.align.is_finite()))
        {
            bail!(
                "training diverged at step {}: gate {}'s loss is {} (lower --lr); {} keeps what \
                 was last written there, if anything",
                trainer.step,
                g.gate,
                if g.kl.is_finite() { g.align } else { g.kl },
                args.out.display()
            );
        }
        window.push(log);
        bar.inc(1);
        if window.len() >= args.log_every || trainer.step == trainer.options.steps {
            let mean = window_mean(&window);
            let line = format!(
                "step {} lr {:.2e} | {}",
                trainer.step,
                window.last().map_or(0.0, |l| l.lr),
                gate_summary(&mean)
            );
            bar.set_message(gate_summary(&mean));
            if log_to_stderr {
                eprintln!("{line}");
            }
            window.clear();
        }
        // evaluated before the checkpoint is written, so that it records this step's evaluation
        let seen = match &mut val {
            Some(v) => v.step(&trainer, &args.out, |line| {
                bar.suspend(|| eprintln!("{line}"))
            })?,
            None => None,
        };
        let last = seen == Some(Observation::Stop)
            || stop.asked()
            || trainer.step == trainer.options.steps;
        if let Some(n) = args.save_every
            && trainer.step % n == 0
            && !last
        {
            checkpoint::save_with(&trainer, &args.out, &record(&val))
                .with_context(|| format!("cannot write {}", args.out.display()))?;
        }
        if last {
            break;
        }
    }
    bar.finish_and_clear();
    let seconds = train_start.elapsed().as_secs_f64();
    let steps = trainer.step - first_step;
    checkpoint::save_with(&trainer, &args.out, &record(&val))
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    if stop.asked() && trainer.step < trainer.options.steps {
        let out = args.out.display();
        return Err(common::Exit {
            code: interrupt::EXIT_CODE,
            message: format!(
                "stopped at step {}: checkpoint in {out}, continue with --resume {out} --out {out}",
                trainer.step
            ),
        }
        .into());
    }
    println!(
        "trained {steps} steps in {seconds:.1} s ({:.3} s/step, {} rows per gate per step); wrote {}",
        seconds / steps.max(1) as f64,
        trainer.options.batch_rows,
        args.out.display()
    );
    if let Some((step, kl)) = val.as_ref().and_then(|v| v.early.best()) {
        println!(
            "best validation mean KL {kl:.4} at step {step}: weights in {}",
            args.out.join(train::checkpoint_files::BEST_DIR).display()
        );
    }
    if let (Some(e), Some(dir), Some(before)) = (&eval, &args.eval_data, before) {
        print_held_out(dir, &before, &trainer.evaluate_held_out(e));
    }
    Ok(())
}
