//! `m2r2 draft-head`: the pruned draft head (drafts that score `K` tokens instead of the whole
//! vocabulary, `reference::m2r2::draft_head`): choose the `K` most frequent response tokens of the
//! distillation data, measure on held-out data how often the pruned draft still equals the base
//! model's token, and write the chosen subset into an M2R2 weights folder (`draft_head.json`). The
//! verifier keeps the full head, so output stays lossless.

use crate::cli::args::trained::{Trained, TrainedArgs};
use anyhow::{Context, Result, bail};
use reference::m2r2::cost::CostModel;
use train::draft_head::{DraftHead, most_frequent, pruned_agreement};

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("data", |a| a.help(
        "Distillation data whose response tokens are counted (the K most frequent make the \
         head), comma-separated or repeated folders"
    )),
    mut_arg("dev_data", |a| a.help(
        "Held-out distillation data the table is measured on (it chooses K): validation data of \
         the training distribution (e.g. data/distill/smollm2-magpie-val), never the development \
         prompts (data made from dev_prompts.jsonl, or sharing a prompt with --data, is refused)"
    )),
)]
pub struct Args {
    #[command(flatten)]
    pub trained: TrainedArgs,
    /// Subset sizes to compare, comma-separated (default: those of 256,1024,4096,8192 smaller
    /// than the vocabulary, else half the vocabulary)
    #[arg(long, value_name = "K,...")]
    pub sizes: Option<String>,
    /// Write the subset of this size into --m2r2's folder as draft_head.json
    #[arg(long, value_name = "K")]
    pub write: Option<usize>,
}

pub fn run(args: &Args) -> Result<()> {
    let Trained {
        loaded,
        weights,
        data,
        dev,
    } = args.trained.load()?;
    let model = &loaded.model;
    let config = &model.config;
    let sizes: Vec<usize> = match &args.sizes {
        Some(list) => list
            .split(',')
            .map(|k| {
                k.trim()
                    .parse::<usize>()
                    .with_context(|| format!("--sizes: `{k}` is not a size"))
            })
            .collect::<Result<_>>()?,
        None => {
            let smaller: Vec<usize> = [256, 1024, 4096, 8192]
                .into_iter()
                .filter(|&k| k < config.vocab_size)
                .collect();
            match smaller.is_empty() {
                true => vec![(config.vocab_size / 2).max(1)],
                false => smaller,
            }
        }
    };
    if sizes.iter().any(|&k| k == 0 || k > config.vocab_size) {
        bail!(
            "--sizes must lie in 1..={} (the vocabulary)",
            config.vocab_size
        );
    }
    if let Some(k) = args.write
        && (k == 0 || k > config.vocab_size)
    {
        bail!("--write must lie in 1..={}", config.vocab_size);
    }
    let heads: Vec<DraftHead> = sizes
        .iter()
        .map(|&k| most_frequent(&data, config.vocab_size, k))
        .collect();
    let gate = weights.config.draft_gate;
    let result = pruned_agreement(model, &weights, gate, &dev, &heads)?;
    // Multiply-adds of one draft step: the draft gate's layers on one slow and one fast row (the
    // linear maps, an MoE layer's router and k experts per row; attention and adapters are
    // small), then the head on the fast row.
    let cost = CostModel::new(config, None);
    let per_layer = cost.attention_projections(2) + cost.feed_forward(2, 1);
    let layers = weights.config.gate_layer(gate) * per_layer.weight_macs as usize;
    let d = config.hidden_size;
    let n = result.rows.max(1) as f64;
    println!(
        "draft gate {gate} on {} held-out rows; draft step = layers 1..{} on a slow and a fast row + head",
        result.rows,
        weights.config.gate_layer(gate)
    );
    println!(
        "| head | tokens scored | base token covered | draft = base token | head MMACs | draft step MMACs |"
    );
    println!("|---|---|---|---|---|---|");
    let mmacs = |x: usize| x as f64 / 1e6;
    println!(
        "| full | {} | 1.000 | {:.3} | {:.2} | {:.2} |",
        config.vocab_size,
        result.full as f64 / n,
        mmacs(config.vocab_size * d),
        mmacs(layers + config.vocab_size * d)
    );
    for (h, &k) in sizes.iter().enumerate() {
        println!(
            "| pruned | {k} | {:.3} | {:.3} | {:.2} | {:.2} |",
            result.covered[h] as f64 / n,
            result.pruned[h] as f64 / n,
            mmacs(k * d),
            mmacs(layers + k * d)
        );
    }
    if let Some(k) = args.write {
        most_frequent(&data, config.vocab_size, k).save(&args.trained.m2r2)?;
        println!(
            "wrote the {k}-token draft head into {}",
            args.trained.m2r2.display()
        );
    }
    Ok(())
}
