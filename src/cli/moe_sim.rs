//! `m2r2 moe-sim`: ahead-of-time MoE expert loading (docs/MOE_AOT.md): trace the experts of a
//! greedy decode with the fast stream alongside, then simulate a device expert cache for each
//! prediction policy (`moe_report`, docs/MOE_AOT.md).

use crate::cli::args::moe_sim::MoeSimArgs;
use crate::cli::{common, moe_checks, moe_report};
use anyhow::Result;
use reference::base::config::ModelConfig;
use reference::io::builtin;
use std::path::Path;

pub type Args = MoeSimArgs;

pub fn run(args: &Args) -> Result<()> {
    // Every flag that the model does not decide, then those its config does, before the weights
    // are read (a real Mixtral checkpoint takes a while).
    moe_checks::check_flags(args)?;
    if let Some(config) = config_before_loading(&args.model) {
        moe_checks::check_config(args, &config, &args.model)?;
    }
    let loaded = common::load(&args.model)?;
    moe_report::run_loaded(args, &loaded)
}

/// The config of the model `spec` names, where it can be read without the weights: a built-in
/// model, or a Hugging Face folder's `config.json`. `None` otherwise, or when it cannot be read:
/// loading the model then says why (and `run_loaded` checks the config it loaded).
fn config_before_loading(spec: &str) -> Option<ModelConfig> {
    match spec {
        "tiny" => return Some(builtin::tiny_config()),
        "tiny-moe" => return Some(builtin::tiny_moe_config()),
        "smollm2" => return None, // the fetched GGUF, not a folder of that name
        _ => {}
    }
    let path = Path::new(spec).join("config.json");
    let text = std::fs::read_to_string(&path).ok()?;
    ModelConfig::from_hf_json(&text, &path.display().to_string()).ok()
}
