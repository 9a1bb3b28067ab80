//! Training throughput for `m2r2 bench --cost-shape`: optimizer steps of one gate's adapters on
//! synthetic samples (fixed pseudo-random token ids; the arithmetic of a step does not depend on
//! the ids), timed the way `m2r2 train` runs them. [`untrainable`] asks the trainer first whether
//! it can train the gate's adapters on the model at all (not on an MoE model).

use crate::cli::step_times::bench_prompt;
use anyhow::{Context, Result};
use reference::io::load::LoadedModel;
use reference::m2r2::weights::M2r2Weights;
use serde::Serialize;
use std::time::Instant;
use train::data::DistillSample;
use train::fast_stream::FrozenBase;
use train::trainer::{TrainOptions, Trainer, initial_weights};

/// Fast rows per optimizer step measured (the `m2r2 train` default).
pub const ROWS_PER_STEP: usize = 64;
/// Synthetic samples: this many, each a prompt of `PROMPT` tokens and `RESPONSE` response tokens.
const SAMPLES: usize = 4;
const PROMPT: usize = 16;
const RESPONSE: usize = 80;

/// Training throughput of one gate.
#[derive(Clone, Debug, Serialize)]
pub struct TrainingSpeed {
    /// The trained gate (1-based): the draft gate.
    pub gate: usize,
    pub rows_per_step: usize,
    /// Median milliseconds of one optimizer step (forward, backward, clipping, AdamW).
    pub step_ms: f64,
    pub rows_per_second: f64,
}

/// Why the trainer cannot train `gate`'s adapters on this model, or `None` when it can. Asked of
/// the trainer itself, before anything is timed: [`FrozenBase::new`] over the layers
/// [`Trainer::new`] freezes for the gate (its interval) is where the trainer refuses what it does
/// not handle (a sparse MoE layer: adapters are trained on dense SwiGLU blocks only), with
/// [`train::Error::Unsupported`]. Any other error stays an error.
pub fn untrainable(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    gate: usize,
) -> Result<Option<String>> {
    let layers = weights.config.interval_layers(gate - 1);
    match FrozenBase::<f32>::new(&loaded.model, layers) {
        Ok(_) => Ok(None),
        Err(train::Error::Unsupported(why)) => Ok(Some(why)),
        Err(e) => Err(e).context("the training bench's frozen layers"),
    }
}

/// Time `repeats` training steps of `gate` (after one warm-up step) with `weights`' adapter
/// settings, starting from PEFT's initialisation.
pub fn training_speed(
    loaded: &LoadedModel,
    weights: &M2r2Weights,
    gate: usize,
    repeats: usize,
) -> Result<TrainingSpeed> {
    let model = &loaded.model;
    let ids = bench_prompt(loaded, PROMPT + RESPONSE + SAMPLES);
    let data: Vec<DistillSample> = (0..SAMPLES)
        .map(|i| DistillSample {
            prompt_id: format!("bench-{i}"),
            sample: 0,
            prompt_len: PROMPT,
            tokens: ids[i..i + PROMPT + RESPONSE].to_vec(),
        })
        .collect();
    let steps = repeats + 1;
    let options = TrainOptions {
        train_gates: vec![gate],
        steps,
        batch_rows: ROWS_PER_STEP,
        lr: 2e-3,
        lr_min: 2e-4,
        warmup: 0,
        weight_decay: 0.0,
        clip: 1.0,
        temperature: 1.0,
        hard_label_weight: 0.0,
        align: None,
        align_weight: 0.0,
        align_intermediate: false,
        seed: 0,
        bridge_only: false,
    };
    let start = initial_weights(model, weights.config.clone(), 0)
        .context("the M2R2 settings of the training bench")?;
    let mut slow = train::slow_cache::SlowPass::default();
    let mut trainer = Trainer::new(model, start, &data, options, &mut slow)?;
    let mut times = Vec::with_capacity(repeats);
    for i in 0..steps {
        let t = Instant::now();
        trainer.train_step();
        if i > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let step_ms = crate::cli::decode_speed::median(&times);
    Ok(TrainingSpeed {
        gate,
        rows_per_step: ROWS_PER_STEP,
        step_ms,
        rows_per_second: ROWS_PER_STEP as f64 / (step_ms / 1e3).max(1e-12),
    })
}
