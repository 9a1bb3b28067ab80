//! Training throughput for `m2r2 bench --cost-shape`: optimizer steps of one gate's adapters on
//! synthetic samples (fixed pseudo-random token ids; the arithmetic of a step does not depend on
//! the ids), timed the way `m2r2 train` runs them.

use crate::cli::step_times::bench_prompt;
use anyhow::{Context, Result};
use reference::io::load::LoadedModel;
use reference::m2r2::weights::M2r2Weights;
use serde::Serialize;
use std::time::Instant;
use train::data::DistillSample;
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
