//! The trained weights and distillation data that `train-arla` and `draft-head` work on.

use super::model::ModelArgs;
use crate::cli::common;
use anyhow::{Context, Result};
use reference::io::load::LoadedModel;
use reference::m2r2::weights::M2r2Weights;
use std::path::PathBuf;
use train::data::DistillSample;

/// The trained weights and the data both `train-arla` and `draft-head` work on.
#[derive(clap::Args, Debug)]
pub struct TrainedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// M2R2 weights folder with the trained adapters (e.g. written by `m2r2 train`)
    #[arg(long = "m2r2", value_name = "DIR")]
    pub m2r2: PathBuf,
    /// Distillation data to train on (draft-head: where the token frequencies come from),
    /// comma-separated or repeated folders
    #[arg(long, value_name = "DIR", required = true, num_args = 1.., value_delimiter = ',')]
    pub data: Vec<PathBuf>,
    /// Held-out distillation data (train-arla calibrates its thresholds on it; draft-head's table,
    /// which chooses K, is measured on it): validation data of the training distribution (e.g.
    /// data/distill/smollm2-magpie-val), never the development prompts (data made from
    /// dev_prompts.jsonl, or sharing a prompt with --data, is refused)
    #[arg(long, value_name = "DIR")]
    pub dev_data: PathBuf,
    /// Use only the first N samples of --data (a shorter run; the folders in the order given)
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Use only the first N samples of --dev-data
    #[arg(long, value_name = "N")]
    pub dev_limit: Option<usize>,
}

/// What [`TrainedArgs`] names, loaded and checked.
pub struct Trained {
    pub loaded: LoadedModel,
    pub weights: M2r2Weights,
    pub data: Vec<DistillSample>,
    pub dev: Vec<DistillSample>,
}

impl TrainedArgs {
    pub fn load(&self) -> Result<Trained> {
        let loaded = common::load(&self.model.model)?;
        let config = &loaded.model.config;
        let weights = M2r2Weights::load_dir(&self.m2r2, config)
            .with_context(|| format!("cannot load M2R2 weights from {}", self.m2r2.display()))?;
        let (mut data, metas, _) = train::data::read_all(&self.data, config.vocab_size)?;
        let (mut dev, dev_meta) = train::data::read(&self.dev_data, config.vocab_size)?;
        for (dir, meta) in self.data.iter().zip(&metas) {
            let purpose = "train-arla fits ARLA and draft-head counts its tokens on it";
            train::data::refuse_dev_prompts("--data", dir, meta, purpose)?;
        }
        let purpose = "train-arla calibrates its thresholds on it and draft-head's table chooses K";
        train::data::refuse_dev_prompts("--dev-data", &self.dev_data, &dev_meta, purpose)?;
        if let Some(n) = self.limit {
            data.truncate(n);
        }
        if let Some(n) = self.dev_limit {
            dev.truncate(n);
        }
        if data.is_empty() || dev.is_empty() {
            anyhow::bail!("--limit and --dev-limit must leave at least one sample");
        }
        train::data::refuse_shared_prompts(&data, &self.data, &dev, "--dev-data", &self.dev_data)?;
        Ok(Trained {
            loaded,
            weights,
            data,
            dev,
        })
    }
}
