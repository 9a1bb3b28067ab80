//! Training checkpoints: an M2R2 weights folder (PEFT layout, loadable by
//! `M2r2Weights::load_dir` and `--m2r2 DIR` unchanged) plus what resuming needs.
//!
//! | file                      | content                                                     |
//! |---------------------------|-------------------------------------------------------------|
//! | `m2r2_config.json`, `adapter_config.json`, `adapter_model.safetensors` | the weights |
//! | `trainer_state.json`      | step, options, per-gate optimizer step count, loss history  |
//! | `optimizer.safetensors`   | AdamW moments `gate{g}.m.{i}`, `gate{g}.v.{i}` (f32)        |

use crate::adamw::AdamW;
use crate::data::DistillSample;
use crate::error::{Error, Result};
use crate::slow_cache::SlowPass;
use crate::trainer::{GateState, StepLog, TrainOptions, Trainer};
use ndarray::Array2;
use reference::Model;
use reference::base::weights::TensorSource;
use reference::io::checkpoint::{SafetensorsSource, write_f32_safetensors};
use reference::m2r2::weights::M2r2Weights;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::Path;

pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

#[derive(Serialize, Deserialize)]
struct TrainerState {
    step: usize,
    options: TrainOptions,
    /// Per trained gate: AdamW's step count.
    optimizer_steps: Vec<(usize, u64)>,
    /// The training data's shape (samples, trainable rows): resuming needs the same data.
    data: (usize, usize),
    /// SHA-256 of the training data's tokens ([`data_digest`]); absent in checkpoints written
    /// before 2026-11-29, which resume on the shape alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data_sha256: Option<String>,
    history: Vec<StepLog>,
}

/// SHA-256 (hex) of distillation data as training reads it: each sample's tokens and first
/// trained row, in order.
pub(crate) fn data_digest(data: &[DistillSample]) -> String {
    let mut h = Sha256::new();
    for d in data {
        h.update((d.tokens.len() as u64).to_le_bytes());
        h.update((d.first_row() as u64).to_le_bytes());
        for t in &d.tokens {
            h.update(t.to_le_bytes());
        }
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// (samples, trainable rows) of distillation data.
fn data_shape(data: &[DistillSample]) -> (usize, usize) {
    let rows = data.iter().map(|s| s.tokens.len() - s.first_row()).sum();
    (data.len(), rows)
}

/// Write the trainer's weights and state into `dir` (created if needed).
pub fn save(trainer: &Trainer, dir: &Path) -> Result<()> {
    trainer.weights().save_dir(dir)?;
    let state = TrainerState {
        step: trainer.step,
        options: trainer.options.clone(),
        optimizer_steps: trainer.gates.iter().map(|g| (g.gate, g.opt.t)).collect(),
        data: (trainer.samples_count(), trainer.rows_available()),
        data_sha256: Some(trainer.data_sha256.clone()),
        history: trainer.history.clone(),
    };
    let path = dir.join(STATE_FILE);
    let text = serde_json::to_string_pretty(&state).expect("serialisable");
    std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))?;
    let mut tensors = Vec::new();
    for g in &trainer.gates {
        for (kind, list) in [("m", &g.opt.m), ("v", &g.opt.v)] {
            for (i, t) in list.iter().enumerate() {
                tensors.push((
                    format!("gate{}.{kind}.{i}", g.gate),
                    t.shape().to_vec(),
                    t.iter().copied().collect(),
                ));
            }
        }
    }
    write_f32_safetensors(&dir.join(OPTIMIZER_FILE), &tensors, None)?;
    Ok(())
}

/// The steps a checkpoint folder has done, read from its state alone (before the slow stream, so
/// that a `--steps` already reached is refused at once).
pub fn steps_done(dir: &Path) -> Result<usize> {
    Ok(read_state(dir)?.step)
}

fn read_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Data {
        file: path.display().to_string(),
        msg: format!("not a trainer state: {e}"),
    })
}

/// Rebuild a trainer from a checkpoint folder, on the same data. `steps` replaces the total step
/// count (to train longer than first planned); every other setting comes from the checkpoint.
pub fn resume(
    model: &Model,
    dir: &Path,
    data: &[DistillSample],
    steps: Option<usize>,
    slow: &mut SlowPass,
) -> Result<Trainer> {
    let weights = M2r2Weights::load_dir(dir, &model.config)?;
    let state = read_state(dir)?;
    let path = dir.join(STATE_FILE);
    if data_shape(data) != state.data {
        return Err(Error::Invalid(format!(
            "{} was trained on other data ({} samples, {} rows; given {} samples, {} rows): resume \
             with the same --data",
            dir.display(),
            state.data.0,
            state.data.1,
            data.len(),
            data_shape(data).1
        )));
    }
    if let Some(recorded) = &state.data_sha256
        && *recorded != data_digest(data)
    {
        return Err(Error::Invalid(format!(
            "{} was trained on other data (as many samples and rows, other tokens): resume with \
             the same --data, in the same order",
            dir.display()
        )));
    }
    let mut options = state.options;
    if let Some(s) = steps {
        options.steps = s;
    }
    let trainer = Trainer::new(model, weights, data, options, slow)?;
    let opt_path = dir.join(OPTIMIZER_FILE);
    let source = SafetensorsSource::open_files(std::slice::from_ref(&opt_path))?;
    let label = opt_path.display().to_string();
    let mut gates = Vec::new();
    for g in &trainer.gates {
        let t = state
            .optimizer_steps
            .iter()
            .find(|(gate, _)| *gate == g.gate)
            .map(|p| p.1)
            .ok_or_else(|| Error::Data {
                file: path.display().to_string(),
                msg: format!("no optimizer state for gate {}", g.gate),
            })?;
        let read = |kind: &str| -> Result<Vec<Array2<f32>>> {
            g.opt
                .m
                .iter()
                .enumerate()
                .map(|(i, like)| {
                    let name = format!("gate{}.{kind}.{i}", g.gate);
                    let raw = source.read(&name)?.ok_or_else(|| Error::Data {
                        file: label.clone(),
                        msg: format!("tensor `{name}` is missing"),
                    })?;
                    if raw.shape != like.shape() {
                        return Err(Error::Data {
                            file: label.clone(),
                            msg: format!(
                                "tensor `{name}` has shape {:?}, expected {:?}",
                                raw.shape,
                                like.shape()
                            ),
                        });
                    }
                    Array2::from_shape_vec(like.raw_dim(), raw.data).map_err(|_| Error::Data {
                        file: label.clone(),
                        msg: format!(
                            "tensor `{name}` has shape {:?}, expected {:?}",
                            raw.shape,
                            like.shape()
                        ),
                    })
                })
                .collect()
        };
        gates.push(GateState {
            gate: g.gate,
            adapters: g.adapters.clone(),
            opt: AdamW {
                config: g.opt.config,
                t,
                m: read("m")?,
                v: read("v")?,
            },
        });
    }
    trainer.with_state(gates, state.step, state.history)
}
