//! The trainer a new `m2r2 train` run starts from: fresh adapters at the ranks `--rank` gives (one
//! for all gates or one per gate), or the `--init` folder's, whose trained gates `--rank` may widen
//! (`Accelerator::widen`: the same adapter terms, new directions to train), with the bridge of
//! `--bridge-rank` and the training settings of the flags. An `--init` folder loses ARLA and what
//! reads it (`init_weights`); the data must fit the model's context.

use super::Args;
use super::bridge::add_bridge;
use super::flags;
use crate::cli::args::m2r2::parse_targets;
use anyhow::{Context, Result, bail};
use reference::Model;
use reference::m2r2::config::{
    DEFAULT_RANK, DEFAULT_THRESHOLD, DynamicDraftConfig, M2r2Config, parse_gates,
};
use reference::m2r2::exit_gate::GateKind;
use reference::m2r2::exit_threshold::ExitThreshold;
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;
use train::data::{ContextNeed, DistillSample, check_context};
use train::slow_cache::SlowPass;
use train::trainer::{TrainOptions, Trainer, initial_weights, initial_weights_ranked};

/// The trainer of a new run (not `--resume`) of `model` (called `name`) on `data`, the slow
/// stream through `slow`. `batch_rows` is `--batch-rows` capped at the rows of the data.
pub fn new_trainer(
    args: &Args,
    model: &Model,
    name: &str,
    data: &[DistillSample],
    batch_rows: usize,
    slow: &mut SlowPass,
) -> Result<Trainer> {
    check_context(
        &args.data,
        data,
        &ContextNeed::exact(model.context_length()),
    )?;
    let init = match &args.init {
        Some(dir) => Some(init_weights(dir, model)?),
        None => None,
    };
    let mut config = match &init {
        Some(w) => w.config.clone(),
        None => M2r2Config::default_for(&model.config),
    };
    if let Some(g) = &args.gates {
        config.gates = parse_gates(g)?;
    }
    // --bridge-only trains the bridge alone: only its gate's passes are run
    let bridge_gate = config.bridge.as_ref().map_or(config.draft_gate, |b| b.gate);
    let train_gates = match flags::train_gates(args.train_gates.as_deref())? {
        Some(gates) => gates,
        None if args.bridge_only => vec![bridge_gate],
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
        steps: args.steps(),
        batch_rows,
        lr: args.lr,
        lr_min: args.lr_min.unwrap_or(args.lr / 10.0),
        warmup: args.warmup.unwrap_or(args.steps() / 20),
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
            .with_context(|| format!("invalid M2R2 settings for {name}"))?;
    if let Some(rank) = args.bridge_rank {
        let sample = data.first().map(|d| d.tokens.as_slice());
        weights = add_bridge(model, weights, rank, &args.bridge_sites, args.seed, sample)?;
    }
    match &weights.config.bridge {
        // the bridge trains with the adapters of the gate it is read at
        Some(b) if !options.train_gates.contains(&b.gate) => bail!(
            "the bridge trains with its draft gate's adapters: add gate {} to --train-gates",
            b.gate
        ),
        Some(b) if args.bridge_only && options.train_gates != [b.gate] => bail!(
            "--bridge-only trains the bridge alone, which gate {g} reads: --train-gates {:?} would \
             run the other gates' passes for nothing; leave out --train-gates (or give {g})",
            options.train_gates,
            g = b.gate
        ),
        None if args.bridge_only => bail!(
            "--bridge-only trains the bridge alone, and the weights have no bridge: add one with \
             --bridge-rank, or --init a folder that has one"
        ),
        _ => {}
    }
    Ok(Trainer::new(model, weights, data, options, slow)?)
}

/// The `--init` weights in `dir`, without what was fitted to their adapters' exit states (ARLA,
/// the pruned draft head: docs/TRAINING.md) and without the settings that read ARLA's score, so
/// the written folder runs as it is; notes name what was reset, and the confidence or entropy
/// thresholds kept, which were chosen for the old adapters.
fn init_weights(dir: &Path, model: &Model) -> Result<M2r2Weights> {
    let mut w = M2r2Weights::load_dir(dir, &model.config)
        .with_context(|| format!("cannot load the --init weights folder {}", dir.display()))?;
    let had_arla = w.arla.take().is_some();
    w.draft_head = None;
    let (reset, kept) = split_score_settings(&mut w.config, had_arla);
    let dir = dir.display();
    if !reset.is_empty() {
        eprintln!(
            "note: --init {dir}: ARLA is dropped (it was fitted to the old adapters' exit states), \
             and the settings that read its score are reset: {}",
            redo(&reset)
        );
    }
    if !kept.is_empty() {
        eprintln!(
            "note: --init {dir}: these thresholds are kept, but were chosen for its adapters, not \
             the ones trained now: {}",
            redo(&kept)
        );
    }
    Ok(w)
}

/// A setting `--init` reset or kept, as the note names it, and the command that chooses it again.
type Noted = (String, &'static str);

/// `train-arla` calibrates ARLA's threshold and the early exit.
const TRAIN_ARLA: &str = "`m2r2 train-arla`";
/// `tune-drafting` chooses the drafting defaults.
const TUNE_DRAFTING: &str = "`m2r2 tune-drafting`";

/// `settings` for a note: each named, then the commands that choose them again, each once.
fn redo(settings: &[Noted]) -> String {
    let names: Vec<&str> = settings.iter().map(|(name, _)| name.as_str()).collect();
    let mut commands: Vec<&str> = Vec::new();
    for &(_, command) in settings {
        if !commands.contains(&command) {
            commands.push(command);
        }
    }
    format!(
        "{}; run {} on the new weights",
        names.join("; "),
        commands.join(" and ")
    )
}

/// Split the settings of `config` that compare a gate's score: those that read ARLA's, which the
/// new weights lack, are reset to what a config without them means (the default early exit, fixed
/// drafting, the whole tree every round); the confidence and entropy thresholds are kept. With
/// `had_arla` (the folder had ARLA weights) `arla.threshold` is ARLA's calibration and is reset
/// to the default too; without, it is the default early exit's own threshold, kept.
fn split_score_settings(config: &mut M2r2Config, had_arla: bool) -> (Vec<Noted>, Vec<Noted>) {
    let (mut reset, mut kept) = (Vec::new(), Vec::new());
    match &config.early_exit {
        Some(e) if e.gate == GateKind::Arla => {
            config.early_exit = None;
            let now = "early exit now uses the confidence gate at `arla.threshold`";
            reset.push((format!("`early_exit` (arla gate; {now})"), TRAIN_ARLA));
        }
        Some(e) => {
            let at = ExitThreshold::PerGate(e.thresholds.clone());
            kept.push((format!("`early_exit` ({} >= {at})", e.gate), TRAIN_ARLA));
        }
        None => {}
    }
    if had_arla && config.arla.threshold != DEFAULT_THRESHOLD {
        let was = config.arla.threshold;
        config.arla.threshold = DEFAULT_THRESHOLD;
        let note = format!("`arla.threshold` {was} (now the default {DEFAULT_THRESHOLD})");
        reset.push((note, TRAIN_ARLA));
    }
    for (name, now, slot) in dynamic_drafting(config) {
        match slot.as_ref().map(|d| (d.gate, d.threshold)) {
            Some((GateKind::Arla, _)) => {
                *slot = None;
                reset.push((format!("`{name}` (arla gate; {now})"), TUNE_DRAFTING));
            }
            Some((gate, threshold)) => {
                kept.push((format!("`{name}` ({gate} >= {threshold})"), TUNE_DRAFTING));
            }
            None => {}
        }
    }
    (reset, kept)
}

/// Every dynamic drafting setting of `config` (the chain's, the tree's, and the same for ONNX
/// Runtime): its name in `m2r2_config.json`, what drafts without it, and the setting.
fn dynamic_drafting(
    config: &mut M2r2Config,
) -> Vec<(String, &'static str, &mut Option<DynamicDraftConfig>)> {
    const CHAIN: &str = "speculative decoding now drafts `draft_len` tokens";
    const TREE: &str = "the whole tree is now drafted every round";
    let mut slots = vec![(
        "dynamic_draft".to_string(),
        CHAIN,
        &mut config.dynamic_draft,
    )];
    if let Some(t) = &mut config.draft_tree {
        slots.push(("draft_tree.dynamic".into(), TREE, &mut t.dynamic));
    }
    if let Some(o) = &mut config.onnx_drafting {
        slots.push((
            "onnx_drafting.dynamic_draft".into(),
            CHAIN,
            &mut o.dynamic_draft,
        ));
        if let Some(t) = &mut o.draft_tree {
            slots.push((
                "onnx_drafting.draft_tree.dynamic".into(),
                TREE,
                &mut t.dynamic,
            ));
        }
    }
    slots
}

/// `--rank` as one rank per gate (`None`: that gate's rank is left as it is). Empty `rank` is
/// [`DEFAULT_RANK`] for fresh adapters and no change with `--init`; one value is every gate's
/// (with `--init`: every trained gate's); otherwise one value per gate.
pub fn per_gate(
    rank: &[usize],
    gates: usize,
    init: bool,
    train_gates: &[usize],
) -> Result<Vec<Option<usize>>> {
    if rank.contains(&0) {
        bail!("--rank: ranks must be positive");
    }
    Ok(match rank {
        [] if init => vec![None; gates],
        [] => vec![Some(DEFAULT_RANK); gates],
        [r] if init => (1..=gates)
            .map(|g| train_gates.contains(&g).then_some(*r))
            .collect(),
        [r] => vec![Some(*r); gates],
        list if list.len() == gates => list.iter().copied().map(Some).collect(),
        list => bail!(
            "--rank has {} values, but there are {gates} gates: give one rank, or one per gate",
            list.len()
        ),
    })
}

/// The PEFT default rank `r` of fresh adapters at `ranks`: the most common one (the smallest on a
/// tie), so the fewest pairs need a `rank_pattern` entry.
pub fn default_rank(ranks: &[usize]) -> usize {
    let count = |r: usize| ranks.iter().filter(|&&x| x == r).count();
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted
        .into_iter()
        .max_by_key(|&r| (count(r), std::cmp::Reverse(r)))
        .unwrap_or(DEFAULT_RANK)
}

/// Fresh adapters for `config` at `ranks` (`A` random from `seed`, `B = 0`), or `init` with its
/// trained gates that have no adapters filled in fresh and the ranks of `ranks` applied: a trained
/// gate is widened to its rank (seed `seed + g` for gate g's new rows), an untrained gate must
/// already have it.
pub fn starting_weights(
    model: &Model,
    config: M2r2Config,
    init: Option<M2r2Weights>,
    ranks: &[Option<usize>],
    train_gates: &[usize],
    seed: u64,
) -> Result<M2r2Weights> {
    let Some(mut w) = init else {
        let ranks: Vec<usize> = ranks.iter().map(|r| r.unwrap_or(config.rank)).collect();
        return Ok(initial_weights_ranked(model, config, &ranks, seed)?);
    };
    // A trained gate without adapters in --init starts fresh (A random, B = 0).
    let fresh = initial_weights(model, config, seed)?;
    // (gates out of range are refused by Trainer::new, which names them)
    for &g in train_gates.iter().filter(|&&g| w.config.has_gate(g)) {
        for l in w.config.interval_layers(g - 1) {
            if w.accelerator.layers[l].is_none() {
                w.accelerator.layers[l] = fresh.accelerator.layers[l].clone();
            }
        }
    }
    for (g, rank) in (1..).zip(ranks) {
        let Some(rank) = *rank else { continue };
        let layers = w.config.interval_layers(g - 1);
        if train_gates.contains(&g) {
            w.accelerator
                .widen(layers, rank, seed.wrapping_add(g as u64))
                .with_context(|| format!("--rank {rank} for gate {g}"))?;
        } else if let Some(l) = layers
            .clone()
            .find(|&l| w.accelerator.layer_ranks(l).iter().any(|&r| r != rank))
        {
            bail!(
                "--rank {rank} for gate {g}: gate {g} is not trained (see --train-gates), so its \
                 adapters keep their ranks {:?} (layer {l}); give that rank or train the gate",
                w.accelerator.layer_ranks(l)
            );
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists() {
        assert_eq!(per_gate(&[], 3, false, &[1]).unwrap(), vec![Some(16); 3]);
        assert_eq!(per_gate(&[], 3, true, &[1]).unwrap(), vec![None; 3]);
        assert_eq!(per_gate(&[8], 3, false, &[1]).unwrap(), vec![Some(8); 3]);
        assert_eq!(
            per_gate(&[32], 3, true, &[1, 3]).unwrap(),
            vec![Some(32), None, Some(32)]
        );
        assert_eq!(
            per_gate(&[32, 16, 8], 3, true, &[1]).unwrap(),
            vec![Some(32), Some(16), Some(8)]
        );
        let e = per_gate(&[32, 16], 3, false, &[1]).unwrap_err().to_string();
        assert!(
            e.contains("--rank has 2 values, but there are 3 gates"),
            "{e}"
        );
        assert!(per_gate(&[0], 3, false, &[1]).is_err());
        assert_eq!(default_rank(&[32, 16, 16]), 16);
        assert_eq!(default_rank(&[32, 16, 8]), 8);
        assert_eq!(default_rank(&[32, 32, 8]), 32);
    }
}
