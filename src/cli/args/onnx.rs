//! The flags of commands that run an export folder on ONNX Runtime (`run`, `bench --onnx`): the
//! execution provider, and `--draft-head` checked against what the export holds.

use super::m2r2::OnOff;
use anyhow::{Result, bail};
use onnx_runner::ep::{DimRanges, Ep, EpConfig, TensorRtOptions};
use onnx_runner::manifest::ExportDir;
use std::path::PathBuf;

/// The execution provider flags, shared by `run` and `bench --onnx`.
#[derive(clap::Args, Clone, Debug)]
pub struct EpArgs {
    /// Execution provider: cpu | cuda | tensorrt (a GPU provider needs ORT_DYLIB_PATH pointing at
    /// an onnxruntime-gpu build)
    #[arg(long, value_name = "EP", default_value = "cpu")]
    pub ep: Ep,
    /// CUDA / TensorRT device
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub device_id: i32,
    /// Run on the CPU when the provider cannot be registered (the report says which ran)
    #[arg(long)]
    pub ep_fallback: bool,
    /// TensorRT: build fp16 engines
    #[arg(long)]
    pub trt_fp16: bool,
    /// TensorRT: engine and timing cache folder (default: <DIR>/trt_cache)
    #[arg(long, value_name = "DIR")]
    pub trt_cache: Option<PathBuf>,
}

impl EpArgs {
    /// The provider config for an export; TensorRT profiles cover `1..=draft_len + 1` rows.
    pub fn config(&self, export: &ExportDir, draft_len: usize) -> EpConfig {
        let config = &export.manifest.config;
        EpConfig {
            device_id: self.device_id,
            fallback: self.ep_fallback,
            tensorrt: TensorRtOptions {
                fp16: self.trt_fp16,
                cache_dir: Some(
                    self.trt_cache
                        .clone()
                        .unwrap_or_else(|| export.dir.join("trt_cache")),
                ),
                ranges: Some(DimRanges::from_model(
                    draft_len,
                    config.max_position_embeddings,
                )),
            },
            ..EpConfig::new(self.ep)
        }
    }
}

/// `--draft-head` against an export: draft.onnx has the head it was exported with, so `on` needs
/// a pruned one and `off` a full one.
pub fn check_draft_head(export: &ExportDir, choice: Option<OnOff>) -> Result<()> {
    let dir = export.dir.display();
    match (choice, &export.draft_head) {
        (Some(OnOff::On), None) => bail!(
            "--draft-head on: the export {dir} has no pruned draft head (its draft.onnx scores the \
             whole vocabulary); export again from an M2R2 folder with a draft_head.json"
        ),
        (Some(OnOff::Off), Some(head)) => bail!(
            "--draft-head off: the export {dir} was made with a pruned draft head of {} tokens \
             (its draft.onnx scores only those); export again with `m2r2 export --draft-head off` \
             for the full head",
            head.len()
        ),
        _ => Ok(()),
    }
}
