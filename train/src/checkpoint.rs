//! Training checkpoints: an M2R2 weights folder (PEFT layout, loadable by
//! `M2r2Weights::load_dir` and `--m2r2 DIR` unchanged) plus what resuming needs.
//!
//! | file                      | content                                                     |
//! |---------------------------|-------------------------------------------------------------|
//! | `m2r2_config.json`, `adapter_config.json`, `adapter_model.safetensors` | the weights |
//! | `trainer_state.json`      | step, options, per-gate optimizer step count, loss history, the base model's config hash and weights' SHA-256, the early-stopping record, the SHA-256 of the files below |
//! | `optimizer.safetensors`   | AdamW moments `gate{g}.m.{i}`, `gate{g}.v.{i}` (f32)        |
//!
//! Saves are atomic per file and the trainer state is written last
//! ([`checkpoint_files`](crate::checkpoint_files)); resume refuses files that are not those the
//! state records, and another base model or other training data.

use crate::adamw::AdamW;
use crate::base_digest::base_weights_sha256;
use crate::checkpoint_files::{Staged, check_digests, finish_interrupted_save};
use crate::checkpoint_validation::ValidationRecord;
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
use std::collections::BTreeMap;
use std::path::Path;

pub use crate::checkpoint_files::{OPTIMIZER_FILE, STATE_FILE};

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
    /// The base model's config hash (`ModelConfig::hash`); absent in checkpoints written before
    /// 2026-11-30 and in saves without a [`RunRecord`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model_config_hash: Option<String>,
    /// SHA-256 of the base model's weights ([`base_weights_sha256`]); absent in checkpoints
    /// written before 2026-11-30 (a resume of those compares the config alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_weights_sha256: Option<String>,
    /// SHA-256 of the files this state goes with, by name
    /// ([`DIGESTED`](crate::checkpoint_files::DIGESTED)); absent before 2026-11-30.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    files_sha256: Option<BTreeMap<String, String>>,
    /// Early stopping so far (`--val-data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    validation: Option<ValidationRecord>,
    history: Vec<StepLog>,
}

/// What a checkpoint records beside the trainer's own state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunRecord {
    /// The base model's config hash (`ModelConfig::hash`): a resume on a model of another config
    /// is refused.
    pub model_config_hash: Option<String>,
    /// SHA-256 of the base model's weights ([`base_weights_sha256`]): a resume on a model of the
    /// same config with other weights (another fine-tune or quantisation) is refused too.
    pub base_weights_sha256: Option<String>,
    /// Early stopping so far, restored on resume.
    pub validation: Option<ValidationRecord>,
}

/// A checkpoint as [`inspect`] reads it, before any model or data is loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct Saved {
    /// Steps done.
    pub step: usize,
    /// The run's total steps.
    pub steps: usize,
    pub record: RunRecord,
    /// Whether the state records its files' digests (checked); older checkpoints do not.
    pub files_checked: bool,
    /// Whether a save killed while renaming its files into place was completed first.
    pub finished_save: bool,
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

/// [`save_with`] without a record (no model identity, no early stopping).
pub fn save(trainer: &Trainer, dir: &Path) -> Result<()> {
    save_with(trainer, dir, &RunRecord::default())
}

/// Write the trainer's weights and state, with `record`, into `dir` (created if needed): every
/// file through a temporary name, the trainer state (with the other files' SHA-256) last.
pub fn save_with(trainer: &Trainer, dir: &Path, record: &RunRecord) -> Result<()> {
    stage(trainer, dir, record)?.commit(STATE_FILE)
}

/// Every file of a save, written into the staging folder of `dir`.
fn stage(trainer: &Trainer, dir: &Path, record: &RunRecord) -> Result<Staged> {
    let staged = Staged::new(dir)?;
    trainer.weights().save_dir(staged.path())?;
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
    write_f32_safetensors(&staged.path().join(OPTIMIZER_FILE), &tensors, None)?;
    let state = TrainerState {
        step: trainer.step,
        options: trainer.options.clone(),
        optimizer_steps: trainer.gates.iter().map(|g| (g.gate, g.opt.t)).collect(),
        data: (trainer.samples_count(), trainer.rows_available()),
        data_sha256: Some(trainer.data_sha256.clone()),
        model_config_hash: record.model_config_hash.clone(),
        base_weights_sha256: record.base_weights_sha256.clone(),
        files_sha256: Some(staged.digests()?),
        validation: record.validation.clone(),
        history: trainer.history.clone(),
    };
    let path = staged.path().join(STATE_FILE);
    let text = serde_json::to_string_pretty(&state).expect("serialisable");
    std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))?;
    Ok(staged)
}

/// The steps a checkpoint folder has done, read from its state alone (before the slow stream, so
/// that a `--steps` already reached is refused at once).
pub fn steps_done(dir: &Path) -> Result<usize> {
    Ok(read_state(dir)?.step)
}

/// (steps done, steps of the run) of a checkpoint folder, read from its state alone.
pub fn progress(dir: &Path) -> Result<(usize, usize)> {
    let state = read_state(dir)?;
    Ok((state.step, state.options.steps))
}

/// Read a checkpoint's state and check that its files are those it records (before any model or
/// data is loaded, so that a broken checkpoint is refused at once), after completing a save that
/// was killed while renaming its files into place.
pub fn inspect(dir: &Path) -> Result<Saved> {
    let finished_save = finish_interrupted_save(dir)?;
    let state = read_state(dir)?;
    if let Some(files) = &state.files_sha256 {
        check_digests(dir, files, state.step)?;
    }
    Ok(Saved {
        step: state.step,
        steps: state.options.steps,
        record: RunRecord {
            model_config_hash: state.model_config_hash,
            base_weights_sha256: state.base_weights_sha256,
            validation: state.validation,
        },
        files_checked: state.files_sha256.is_some(),
        finished_save,
    })
}

fn read_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    if dir.is_dir() && !path.exists() {
        return Err(Error::Invalid(format!(
            "{} holds no {STATE_FILE}: it is not a checkpoint of `m2r2 train` (to train on from \
             M2R2 weights, start a new run with --init {})",
            dir.display(),
            dir.display()
        )));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Data {
        file: path.display().to_string(),
        msg: format!("not a trainer state: {e}"),
    })
}

/// [`resume_with`] without its record.
pub fn resume(
    model: &Model,
    dir: &Path,
    data: &[DistillSample],
    steps: Option<usize>,
    slow: &mut SlowPass,
) -> Result<Trainer> {
    Ok(resume_with(model, dir, data, steps, slow)?.0)
}

/// Rebuild a trainer from a checkpoint folder, on the same data, with the record saved beside it.
/// `steps` replaces the total step count (to train longer than first planned); every other setting
/// comes from the checkpoint. Refused: files that are not those the state records, a model of
/// another config or other weights than the recorded ones, other data.
pub fn resume_with(
    model: &Model,
    dir: &Path,
    data: &[DistillSample],
    steps: Option<usize>,
    slow: &mut SlowPass,
) -> Result<(Trainer, RunRecord)> {
    finish_interrupted_save(dir)?;
    let state = read_state(dir)?;
    let path = dir.join(STATE_FILE);
    if let Some(files) = &state.files_sha256 {
        check_digests(dir, files, state.step)?;
    }
    let hash = model.config.hash();
    if let Some(recorded) = &state.model_config_hash
        && *recorded != hash
    {
        return Err(Error::Invalid(format!(
            "{} was trained on a model of config {recorded}, given one of config {hash}: resume \
             with the same --model",
            dir.display()
        )));
    }
    let base_weights = base_weights_sha256(model);
    if let Some(recorded) = &state.base_weights_sha256
        && *recorded != base_weights
    {
        return Err(Error::Invalid(format!(
            "{} was trained on a base model of the same config but other weights (SHA-256 \
             {:.16}..., given {:.16}...): resume with the same --model (another fine-tune or \
             quantisation of it is another model)",
            dir.display(),
            recorded,
            base_weights
        )));
    }
    let weights = M2r2Weights::load_dir(dir, &model.config)?;
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
    let record = RunRecord {
        model_config_hash: Some(hash),
        base_weights_sha256: Some(base_weights),
        validation: state.validation,
    };
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
    let trainer = trainer.with_state(gates, state.step, state.history)?;
    Ok((trainer, record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint_files::STAGING_DIR;
    use crate::trainer::initial_weights;
    use reference::io::builtin::builtin;
    use reference::m2r2::config::M2r2Config;

    /// Two samples of `tiny` tokens (a 4-token prompt, 8 response tokens).
    fn data() -> Vec<DistillSample> {
        (0..2)
            .map(|i| DistillSample {
                prompt_id: format!("p{i}"),
                sample: 0,
                prompt_len: 4,
                tokens: (0..12).map(|k| (17 * i + 5 * k + 1) as u32 % 300).collect(),
            })
            .collect()
    }

    /// A trainer of gate 1 of `model` for 4 steps on `data`.
    fn trainer(model: &Model, data: &[DistillSample], slow: &mut SlowPass) -> Trainer {
        let weights = initial_weights(model, M2r2Config::default_for(&model.config), 3).unwrap();
        let options = TrainOptions {
            train_gates: vec![1],
            steps: 4,
            batch_rows: 8,
            lr: 3e-3,
            lr_min: 3e-4,
            warmup: 0,
            weight_decay: 0.0,
            clip: 1.0,
            temperature: 1.0,
            hard_label_weight: 0.0,
            align: None,
            align_weight: 0.0,
            align_intermediate: false,
            seed: 1,
            bridge_only: false,
        };
        Trainer::new(model, weights, data, options, slow).unwrap()
    }

    /// A resume on a model of the same config with one weight changed is refused (it would train
    /// on a mixture of two base models); on the recorded weights it goes on.
    #[test]
    fn a_resume_on_other_base_weights_is_refused() {
        let model = builtin("tiny").unwrap();
        let data = data();
        let slow = &mut SlowPass::default();
        let mut trainer = trainer(&model, &data, slow);
        trainer.train_step();
        let dir = tempfile::tempdir().unwrap();
        let record = RunRecord {
            model_config_hash: Some(model.config.hash()),
            base_weights_sha256: Some(base_weights_sha256(&model)),
            validation: None,
        };
        save_with(&trainer, dir.path(), &record).unwrap();
        let mut other = model.clone();
        other.weights.layers[3].mlp_norm[0] += 1e-3;
        let e = resume(&other, dir.path(), &data, None, slow)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("was trained on a base model of the same config but other weights"),
            "{e}"
        );
        let (resumed, kept) = resume_with(&model, dir.path(), &data, None, slow).unwrap();
        assert_eq!((resumed.step, kept), (1, record));
    }

    /// A save killed after renaming its adapters into place (the rest of its files, state
    /// included, still staged) is completed by the next resume, which continues from it; without
    /// its staged state the mixed folder is refused, naming the adapters file.
    #[test]
    fn a_save_killed_between_renames_is_completed_or_refused() {
        let model = builtin("tiny").unwrap();
        let data = data();
        let slow = &mut SlowPass::default();
        let mut trainer = trainer(&model, &data, slow);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let record = RunRecord {
            model_config_hash: Some(model.config.hash()),
            base_weights_sha256: None,
            validation: None,
        };
        trainer.train_step();
        save_with(&trainer, d, &record).unwrap();
        trainer.train_step();
        let staged = stage(&trainer, d, &record).unwrap();
        let adapters = reference::io::peft::ADAPTER_WEIGHTS_FILE;
        std::fs::rename(staged.path().join(adapters), d.join(adapters)).unwrap();
        // (a copy of the mixed folder without the staged state)
        let mixed = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(d).unwrap() {
            let f = f.unwrap().path();
            if f.is_file() {
                std::fs::copy(&f, mixed.path().join(f.file_name().unwrap())).unwrap();
            }
        }
        let e = inspect(mixed.path()).unwrap_err().to_string();
        assert!(
            e.contains("adapter_model.safetensors is not the file"),
            "{e}"
        );

        let saved = inspect(d).unwrap();
        assert!(saved.finished_save);
        assert_eq!((saved.step, saved.record), (2, record));
        assert!(!d.join(STAGING_DIR).exists());
        let resumed = resume(&model, d, &data, None, slow).unwrap();
        assert_eq!(resumed.step, 2);
        assert_eq!(resumed.weights(), trainer.weights());
    }
}
