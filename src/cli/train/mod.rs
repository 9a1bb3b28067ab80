//! `m2r2 train`: train the accelerator adapters on self-distillation data (docs/TRAINING.md), base
//! model frozen, with the hand-written backward passes of the `train` crate. Checkpoints are M2R2
//! weights folders in the PEFT layout (usable as `--m2r2 DIR`) with the optimizer state for
//! `--resume`.

mod bridge;
mod held_out;
mod log;
mod start;

use crate::cli::args::m2r2::parse_targets;
use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Context, Result, bail};
use bridge::add_bridge;
use held_out::{held_out, report_cache};
use log::{gate_summary, step_bar};
use reference::m2r2::config::{M2r2Config, parse_gates};
use reference::m2r2::weights::M2r2Weights;
use start::{default_rank, per_gate, starting_weights};
use std::path::PathBuf;
use std::time::Instant;
use train::align::AlignKind;
use train::checkpoint;
use train::early_stop::{EarlyStop, Observation};
use train::slow_cache::SlowPass;
use train::trainer::{GateStats, StepLog, TrainOptions, Trainer, mean_kl};

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
    /// Optimizer steps (each updates every trained gate once)
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub steps: usize,
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
    #[arg(
        long,
        value_name = "W",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
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
    /// with one)
    #[arg(long)]
    pub bridge_only: bool,
    /// Output folder (checkpoint: M2R2 weights + optimizer state)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
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
    /// With --val-data: steps between evaluations
    #[arg(long, value_name = "N", default_value_t = 100, requires = "val_data")]
    pub eval_every: usize,
    /// With --val-data: stop after this many evaluations in a row without a lower mean KL
    #[arg(long, value_name = "P", default_value_t = 3, requires = "val_data")]
    pub patience: usize,
    /// Print one line per N steps on stderr (always when stderr is not a terminal)
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub log_every: usize,
}

pub fn run(args: &Args) -> Result<()> {
    common::check_out_folder(&args.out, "--out")?;
    for (flag, value) in [
        ("--save-every", args.save_every),
        ("--eval-every", Some(args.eval_every)),
        ("--patience", Some(args.patience)),
        ("--log-every", Some(args.log_every)),
    ] {
        if value == Some(0) {
            bail!("{flag} must be at least 1");
        }
    }
    if let Some(warmup) = args.warmup
        && warmup > args.steps
    {
        bail!(
            "--warmup {warmup} is longer than the run (--steps {}): the learning rate would never \
             reach its peak",
            args.steps
        );
    }
    if let Some(alpha) = args.alpha
        && !(alpha.is_finite() && alpha > 0.0)
    {
        bail!(
            "--alpha must be a finite number > 0 (the adapters' scale is alpha / r), got {alpha}"
        );
    }
    if let Some(dir) = &args.resume {
        let done = train::checkpoint::steps_done(dir)
            .with_context(|| format!("cannot resume from {}", dir.display()))?;
        if done >= args.steps {
            bail!(
                "{} has already done {done} of {} steps: give a larger --steps",
                dir.display(),
                args.steps
            );
        }
    }
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
        }
    }
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
    let mut trainer = match &args.resume {
        Some(dir) => checkpoint::resume(model, dir, &data, Some(args.steps), &mut slow)
            .with_context(|| format!("cannot resume from {}", dir.display()))?,
        None => {
            let init = match &args.init {
                Some(dir) => {
                    let mut w = M2r2Weights::load_dir(dir, &model.config).with_context(|| {
                        format!("cannot load the --init weights folder {}", dir.display())
                    })?;
                    w.arla = None;
                    w.draft_head = None;
                    Some(w)
                }
                None => None,
            };
            let mut config = match &init {
                Some(w) => w.config.clone(),
                None => M2r2Config::default_for(&model.config),
            };
            if let Some(g) = &args.gates {
                config.gates = parse_gates(g)?;
            }
            let train_gates = match &args.train_gates {
                Some(list) => list
                    .split(',')
                    .map(|g| {
                        g.trim()
                            .parse::<usize>()
                            .with_context(|| format!("--train-gates: `{g}` is not a gate number"))
                    })
                    .collect::<Result<Vec<_>>>()?,
                None => (1..=config.gates.len()).collect(),
            };
            let ranks = per_gate(
                &args.rank,
                config.num_gates(),
                args.init.is_some(),
                &train_gates,
            )?;
            if args.init.is_none() {
                config.rank = default_rank(&ranks.iter().flatten().copied().collect::<Vec<_>>());
                config.alpha = args.alpha.unwrap_or(2.0 * config.rank as f32);
                if let Some(t) = &args.targets {
                    config.targets = parse_targets(t)?;
                }
            }
            let options = TrainOptions {
                train_gates,
                steps: args.steps,
                batch_rows: args.batch_rows,
                lr: args.lr,
                lr_min: args.lr_min.unwrap_or(args.lr / 10.0),
                warmup: args.warmup.unwrap_or(args.steps / 20),
                weight_decay: args.weight_decay,
                clip: args.clip,
                temperature: args.temperature,
                hard_label_weight: args.hard_label_weight,
                align: args.align,
                align_weight: args.align_weight,
                align_intermediate: args.align_intermediate,
                seed: args.seed,
                bridge_only: args.bridge_only,
            };
            let mut weights =
                starting_weights(model, config, init, &ranks, &options.train_gates, args.seed)
                    .with_context(|| format!("invalid M2R2 settings for {}", loaded.name))?;
            if let Some(rank) = args.bridge_rank {
                let sample = data.first().map(|d| d.tokens.as_slice());
                weights = add_bridge(model, weights, rank, &args.bridge_sites, args.seed, sample)?;
            }
            // the bridge trains with the adapters of the gate it is read at
            if let Some(b) = &weights.config.bridge
                && !options.train_gates.contains(&b.gate)
            {
                bail!(
                    "the bridge trains with its draft gate's adapters: add gate {} to --train-gates",
                    b.gate
                );
            }
            Trainer::new(model, weights, &data, options, &mut slow)?
        }
    };
    let cached = std::mem::take(&mut slow.used);
    precompute.finish();
    report_cache("the training data", cached);
    eprintln!(
        "slow stream of {} samples ({} trainable rows) in {:.1} s; training gates {:?}, {} adapter parameters",
        data.len(),
        trainer.rows_available(),
        start.elapsed().as_secs_f64(),
        trainer.options.train_gates,
        trainer
            .gates
            .iter()
            .map(|g| g.adapters.len())
            .sum::<usize>()
    );
    if trainer.step >= trainer.options.steps {
        bail!(
            "the checkpoint has already done {} of {} steps: give a larger --steps",
            trainer.step,
            trainer.options.steps
        );
    }
    let cache = args.slow_cache.as_deref();
    let eval = match &eval_data {
        Some(data) => Some(held_out(model, &trainer, data, cache, "--eval-data")?),
        None => None,
    };
    let before = eval.as_ref().map(|e| trainer.evaluate_held_out(e));

    let val = match &val_data {
        Some(data) => Some(held_out(model, &trainer, data, cache, "--val-data")?),
        None => None,
    };
    let mut early = EarlyStop::new(args.patience);

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
            let mut mean: Vec<GateStats> = window[0]
                .gates
                .iter()
                .map(|g| GateStats {
                    gate: g.gate,
                    ..GateStats::default()
                })
                .collect();
            for log in &window {
                for (m, g) in mean.iter_mut().zip(&log.gates) {
                    m.add(g);
                }
            }
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
        if let Some(n) = args.save_every
            && trainer.step % n == 0
        {
            checkpoint::save(&trainer, &args.out)?;
        }
        if let Some(val) = &val
            && trainer.step % args.eval_every == 0
        {
            let stats = trainer.evaluate_held_out(val);
            let kl = mean_kl(&stats);
            let seen = early.observe(trainer.step, kl);
            if seen == Observation::Improved {
                let best = args.out.join("best");
                trainer
                    .weights()
                    .save_dir(&best)
                    .with_context(|| format!("cannot write {}", best.display()))?;
            }
            bar.suspend(|| {
                eprintln!(
                    "validation at step {}: mean KL {kl:.4} ({}) | {}",
                    trainer.step,
                    match seen {
                        Observation::Improved => "best so far, weights in OUT/best".to_string(),
                        Observation::NoBetter { misses } =>
                            format!("no better {misses}/{}", early.patience),
                        Observation::Stop => "no better: stopping early".to_string(),
                    },
                    gate_summary(&stats)
                )
            });
            if seen == Observation::Stop {
                break;
            }
        }
    }
    bar.finish_and_clear();
    let seconds = train_start.elapsed().as_secs_f64();
    let steps = trainer.step - first_step;
    checkpoint::save(&trainer, &args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    println!(
        "trained {steps} steps in {seconds:.1} s ({:.3} s/step, {} rows per gate per step); wrote {}",
        seconds / steps.max(1) as f64,
        trainer.options.batch_rows,
        args.out.display()
    );
    if let Some((step, kl)) = early.best() {
        println!(
            "best validation mean KL {kl:.4} at step {step}: weights in {}",
            args.out.join("best").display()
        );
    }
    if let (Some(e), Some(before)) = (&eval, before) {
        let after = trainer.evaluate_held_out(e);
        println!(
            "held-out data {}:",
            args.eval_data.as_ref().expect("eval").display()
        );
        println!("| gate | rows | KL before | KL after | agreement before | agreement after |");
        println!("|---|---|---|---|---|---|");
        for (b, a) in before.iter().zip(&after) {
            println!(
                "| {} | {} | {:.4} | {:.4} | {:.3} | {:.3} |",
                a.gate,
                a.rows,
                b.kl,
                a.kl,
                b.agreement(),
                a.agreement()
            );
        }
    }
    Ok(())
}
