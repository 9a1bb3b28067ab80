//! `m2r2 logits`: teacher-forced logits of every position as one f32 safetensors tensor.

use crate::cli::args::model::{ModelArgs, PromptArgs};
use crate::cli::common;
use anyhow::{Context, Result};
use reference::io::checkpoint::write_f32_safetensors;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// Output file (its folder is created): tensor `logits`, f32 [T, vocab]; metadata `model`,
    /// `config_hash`, `tokens`
    #[arg(long, value_name = "FILE.safetensors")]
    pub out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    // a name another format reads would mislead (np.load of a safetensors file fails late)
    if let Some(ext) = args.out.extension().and_then(|e| e.to_str())
        && ["npy", "npz", "pt", "pth", "bin", "json"].contains(&ext)
    {
        anyhow::bail!(
            "--out {}: the file is safetensors, not .{ext}: name it FILE.safetensors",
            args.out.display()
        );
    }
    let loaded = common::load(&args.model.model)?;
    let tokens = common::prompt_tokens(&loaded, &args.prompt)?;
    // [T, V]
    let logits = loaded
        .model
        .teacher_forced_logits(&tokens)
        .map_err(common::prompt_only)?;
    let (t, v) = logits.dim();
    let metadata = HashMap::from([
        ("model".to_string(), loaded.name.clone()),
        ("config_hash".to_string(), loaded.model.config.hash()),
        ("tokens".to_string(), serde_json::to_string(&tokens)?),
    ]);
    let data: Vec<f32> = logits.iter().copied().collect();
    common::create_parent(&args.out)?;
    write_f32_safetensors(
        &args.out,
        &[("logits".into(), vec![t, v], data)],
        Some(metadata),
    )
    .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "wrote logits [{t}, {v}] of {} to {}",
        loaded.name,
        args.out.display()
    );
    Ok(())
}
