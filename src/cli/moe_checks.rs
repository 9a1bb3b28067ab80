//! `m2r2 moe-sim`'s flags checked in three rounds, each as early as what it needs is known:
//! [`check_flags`] before anything is loaded, [`check_config`] once the model's config is known,
//! and [`check_context`] (prompt plus `--steps`) once the prompt is encoded; all before tracing.

use crate::cli::args::moe_sim::MoeSimArgs;
use anyhow::{Result, bail};
use reference::base::config::{MAX_CONTEXT, ModelConfig};
use reference::moe_aot::memory_sim::{CapacityScope, Eviction};

/// Refuse flags that make no sense whatever the model, before anything is loaded.
pub fn check_flags(args: &MoeSimArgs) -> Result<()> {
    if let Some(path) = &args.plot {
        crate::cli::common::check_plot(path)?;
    }
    // (flag, value, unit the simulator scales it by)
    for (flag, v, scale) in [
        ("--bandwidth-gbps", args.bandwidth_gbps, 1e9),
        ("--device-gbps", args.device_gbps, 1e9),
        ("--tflops", args.tflops, 1e12),
        ("--bytes-per-param", args.bytes_per_param, 1.0),
    ] {
        check_positive(flag, v, scale)?;
    }
    // A link without a fixed cost per transfer is a fair what-if: 0 is allowed (-0 is not: the
    // report would print it as -0.0).
    let latency = args.latency_us;
    if !(latency.is_finite() && latency.is_sign_positive()) {
        bail!("--latency-us must be a finite number >= 0, got {latency}");
    }
    if !(latency * 1e-6).is_finite() {
        bail!("--latency-us {latency:e} is out of range");
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if args.steps > MAX_CONTEXT {
        bail!(
            "--steps {} is more than any model's context (at most {MAX_CONTEXT} positions): lower --steps",
            args.steps
        );
    }
    if args.warmup >= args.steps {
        bail!(
            "--warmup {}: the warm-up leaves none of the {} decoded tokens of --steps to measure \
             (give --warmup below --steps)",
            args.warmup,
            args.steps
        );
    }
    // With per-layer pools, layer l evicts only its own experts, and only while it runs, when the
    // only predictions that name them (this token's, for layer l) are settled; no predictor
    // guesses the next token's experts. keep-predicted would report lru's numbers under its name.
    if args.eviction == Eviction::KeepPredicted && args.capacity_per_layer.is_some() {
        bail!(
            "--eviction keep-predicted needs --capacity, not --capacity-per-layer: a layer's own \
             pool only holds experts whose predictions are settled when it evicts, so it would be \
             exactly lru (give --capacity, or --eviction lru)"
        );
    }
    for (flag, capacity) in [
        ("--capacity", args.capacity),
        ("--capacity-per-layer", args.capacity_per_layer),
    ] {
        if capacity == Some(0) {
            bail!("{flag} must be at least 1: the device cache holds at least a token's experts");
        }
    }
    if args.policy.is_empty() {
        bail!("--policy needs at least one of lazy, next-gate, m2r2, oracle");
    }
    if let Some(p) = first_repeat(&args.policy) {
        bail!("--policy lists {p} twice: give each predictor once");
    }
    if let Some(capacities) = &args.sweep_capacities {
        if capacities.is_empty() {
            bail!("--sweep-capacities needs at least one capacity");
        }
        if capacities.contains(&0) {
            bail!("--sweep-capacities: every capacity must be at least 1, got 0");
        }
        if let Some(c) = first_repeat(capacities) {
            bail!("--sweep-capacities lists {c} twice: give each capacity once");
        }
    }
    if let Some(bandwidths) = &args.sweep_bandwidths {
        if bandwidths.is_empty() {
            bail!("--sweep-bandwidths needs at least one bandwidth");
        }
        for &b in bandwidths {
            check_positive("--sweep-bandwidths", b, 1e9)?;
        }
        if let Some(b) = first_repeat(bandwidths) {
            bail!("--sweep-bandwidths lists {b} twice: give each bandwidth once");
        }
    }
    Ok(())
}

/// `v` (of `flag`) is a finite number > 0 that stays finite in the simulator's units (`v * scale`).
fn check_positive(flag: &str, v: f64, scale: f64) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        bail!("{flag} must be a finite number > 0, got {v}");
    }
    if !(v * scale).is_finite() {
        bail!("{flag} {v:e} is out of range");
    }
    Ok(())
}

/// The first value that `values` holds twice.
fn first_repeat<T: PartialEq>(values: &[T]) -> Option<&T> {
    values
        .iter()
        .enumerate()
        .find(|&(i, v)| values[..i].contains(v))
        .map(|(_, v)| v)
}

/// The device cache that the flags ask for, within the model's experts.
#[derive(Clone, Copy, Debug)]
pub struct Cache {
    pub scope: CapacityScope,
    /// Experts the cache holds (over all MoE layers, or per layer: see `scope`).
    pub capacity: usize,
    /// Every expert in the scope of the capacity: what a cache holding everything holds.
    pub total: usize,
    /// E: experts per MoE layer.
    pub num_experts: usize,
    /// k: experts per token and layer; no capacity may be smaller.
    pub top_k: usize,
}

/// Refuse flags that this model cannot run (a dense model, capacities below k or above every
/// expert of the scope, a `--steps` beyond the context), given only its config: no weights loaded
/// yet and nothing traced. `name` is the model's name in messages.
pub fn check_config(args: &MoeSimArgs, config: &ModelConfig, name: &str) -> Result<Cache> {
    let Some(moe) = &config.moe else {
        bail!(
            "{name} is a dense model: moe-sim needs an MoE model (tiny-moe or a Mixtral checkpoint)"
        );
    };
    let (e, k) = (moe.num_local_experts, moe.num_experts_per_tok);
    // Every layer of an MoE config is an MoE block (`ModelConfig::moe`).
    let layers = config.num_hidden_layers;
    let (scope, flag, capacity, total, held) = match args.capacity_per_layer {
        Some(c) => (
            CapacityScope::PerLayer,
            "--capacity-per-layer",
            c,
            e,
            format!("the {e} experts of one of {name}'s MoE layers"),
        ),
        None => {
            let total = layers.saturating_mul(e);
            (
                CapacityScope::Global,
                "--capacity",
                args.capacity
                    .unwrap_or(layers.saturating_mul(e.div_ceil(2))),
                total,
                format!("the {total} experts of {name} ({layers} MoE layers x {e})"),
            )
        }
    };
    let check = |flag: &str, c: usize| -> Result<()> {
        if c < k {
            bail!("{flag} {c} is below k = {k} experts per token: a layer's experts must fit");
        }
        if c > total {
            bail!(
                "{flag} {c} is more than {held}: a larger cache holds nothing more (give at most \
                 {total})"
            );
        }
        Ok(())
    };
    check(flag, capacity)?;
    for &c in args.sweep_capacities.iter().flatten() {
        check("--sweep-capacities", c)?;
    }
    // At least one prompt token before the decoded ones.
    if args.steps >= config.max_position_embeddings {
        bail!(
            "--steps {} does not fit in {name}'s context of {} positions with even one prompt \
             token: lower --steps",
            args.steps,
            config.max_position_embeddings
        );
    }
    Ok(Cache {
        scope,
        capacity,
        total,
        num_experts: e,
        top_k: k,
    })
}

/// Refuse a prompt of `prompt_len` tokens and `--steps` that do not fit in the model's context
/// together. The trace feeds the prompt and then `--steps` decoded tokens (the last of its
/// `--steps + 1` tokens is never fed), so it needs exactly `prompt_len + steps` positions: what
/// `generate` needs for `--max-new-tokens` = `--steps + 1`.
pub fn check_context(
    args: &MoeSimArgs,
    prompt_len: usize,
    config: &ModelConfig,
    name: &str,
) -> Result<()> {
    let context = config.max_position_embeddings;
    match prompt_len.checked_add(args.steps) {
        Some(needed) if needed <= context => Ok(()),
        needed => bail!(
            "the prompt's {prompt_len} tokens and --steps {} need {} positions but {name}'s context \
             holds {context} (shorten the prompt or lower --steps)",
            args.steps,
            needed.map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string()),
        ),
    }
}
