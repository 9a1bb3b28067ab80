//! `m2r2 init-m2r2`: write a folder of seeded random M2R2 weights (accelerator adapters and ARLA)
//! for a model, loadable by `--m2r2 DIR`. Useful to exercise every path before trained weights exist;
//! random adapters make the fast stream differ from the slow one, so drafts are sometimes rejected.

use crate::cli::args::m2r2::parse_targets;
use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use anyhow::{Context, Result, bail};
use reference::m2r2::config::{M2r2Config, parse_gates};
use reference::m2r2::weights::M2r2Weights;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Exit gates as comma-separated layer counts, strictly increasing in 1..N, e.g. 2,4,6
    /// (default: 3 gates, 4 near-equal intervals)
    #[arg(long, value_name = "E1,E2,...")]
    pub gates: Option<String>,
    /// Adapter rank r (default 16)
    #[arg(long, value_name = "R")]
    pub rank: Option<usize>,
    /// Adapter alpha; the adapter term is scaled by alpha / r (default 2 r, as `train`'s)
    #[arg(long, value_name = "A")]
    pub alpha: Option<f32>,
    /// Linear maps carrying adapters, comma-separated:
    /// q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (default: all; attention only on
    /// MoE models)
    #[arg(long, value_name = "LIST")]
    pub targets: Option<String>,
    /// Draft gate g_d, 1-based (default 1)
    #[arg(long, value_name = "G")]
    pub draft_gate: Option<usize>,
    /// Tokens drafted per verification (default 4)
    #[arg(long, value_name = "N")]
    pub draft_len: Option<usize>,
    /// ARLA latent size d_lat (default 64)
    #[arg(long, value_name = "L")]
    pub arla_latent: Option<usize>,
    /// ARLA exit threshold tau, stored in m2r2_config.json (default 0.5)
    #[arg(long, value_name = "X")]
    pub threshold: Option<f32>,
    /// Seed of the adapters (ARLA uses seed + 1)
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Folder to write (created if needed)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Write into a non-empty folder, replacing the M2R2 files there (a `train` checkpoint's
    /// trainer files and best/ too; other files are kept)
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if !args.force
        && let Ok(mut entries) = std::fs::read_dir(&args.out)
        && entries.next().is_some()
    {
        bail!(
            "{} is not empty: choose an empty or new folder, or pass --force to replace its M2R2 files",
            args.out.display()
        );
    }
    common::check_out_folder(&args.out, "--out")?;
    let loaded = common::load(&args.model.model)?;
    let model = &loaded.model.config;

    let mut config = M2r2Config::default_for(model);
    if let Some(gates) = &args.gates {
        config.gates = parse_gates(gates)?;
    }
    if let Some(rank) = args.rank {
        common::check_low_rank("--rank", rank, model.hidden_size)?;
        config.rank = rank;
        config.alpha = 2.0 * rank as f32;
    }
    if let Some(alpha) = args.alpha {
        if !(alpha.is_finite() && alpha > 0.0) {
            bail!(
                "--alpha must be a finite number > 0 (the adapters' scale is alpha / r), got \
                 {alpha}"
            );
        }
        config.alpha = alpha;
    }
    if let Some(targets) = &args.targets {
        config.targets = parse_targets(targets)?;
    }
    if let Some(g) = args.draft_gate {
        config.draft_gate = g;
    }
    if let Some(n) = args.draft_len {
        config.draft_len = n;
    }
    if let Some(l) = args.arla_latent {
        common::check_low_rank("--arla-latent", l, model.hidden_size)?;
        config.arla.latent = l;
    }
    if let Some(x) = args.threshold {
        config.arla.threshold = x;
    }
    let weights = M2r2Weights::random(model, config, args.seed)
        .with_context(|| format!("invalid M2R2 settings for {}", loaded.name))?;
    if args.force {
        common::report_cleared(&args.out)?;
    }
    weights
        .save_dir(&args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;

    let config = &weights.config;
    let adapters = weights.accelerator.parameter_count();
    let arla = weights.arla.as_ref().map_or(0, |a| {
        a.norm.len()
            + a.proj.len()
            + a.gate_embed.len()
            + a.wq.len()
            + a.wk.len()
            + a.wv.len()
            + a.wo.len()
            + 1
    });
    let base = model.parameter_count();
    let targets: Vec<&str> = config.targets.iter().map(|t| t.module()).collect();
    println!(
        "wrote seeded random M2R2 weights (seed {}) for {} to {}",
        args.seed,
        loaded.name,
        args.out.display()
    );
    println!(
        "  gates after layers {:?} of {}; draft gate {}, draft length {}",
        config.gates, model.num_hidden_layers, config.draft_gate, config.draft_len
    );
    println!(
        "  accelerator: rank {}, alpha {}, targets {}: {} parameters ({:.2}% of the base model's {})",
        config.rank,
        config.alpha,
        targets.join(","),
        adapters,
        100.0 * adapters as f64 / base.max(1) as f64,
        base
    );
    println!(
        "  ARLA: latent {}, threshold {}: {arla} parameters",
        config.arla.latent, config.arla.threshold
    );
    println!(
        "  files: m2r2_config.json, adapter_config.json, adapter_model.safetensors, arla.safetensors"
    );
    Ok(())
}
