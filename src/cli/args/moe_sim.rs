//! The flags of `m2r2 moe-sim` (also how `m2r2 demo` runs its MoE section, with their defaults).

use super::model::PromptArgs;
use reference::moe_aot::expert_prefetch::Predictor;
use reference::moe_aot::memory_sim::Eviction;
use reference::moe_aot::sweep::Timing;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct MoeSimArgs {
    /// tiny-moe | a Hugging Face Mixtral checkpoint folder (MoE GGUF files are not read)
    #[arg(long, value_name = "MODEL", default_value = "tiny-moe")]
    pub model: String,
    #[command(flatten)]
    pub prompt: PromptArgs,
    /// M2R2 weights folder, or `none` for zero adapters (default: the model's built-in weights:
    /// seeded random for tiny-moe, zeros otherwise)
    #[arg(long, value_name = "DIR|none")]
    pub m2r2: Option<String>,
    /// Decoded tokens to trace and simulate (greedy, no stop tokens); more than --warmup, and the
    /// prompt and these must fit in the model's context together
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub steps: usize,
    /// Device cache capacity in experts, over all MoE layers: from k (experts per token) to every
    /// expert of the model (default: half of every layer's experts)
    #[arg(long, value_name = "C", conflicts_with = "capacity_per_layer")]
    pub capacity: Option<usize>,
    /// Device cache capacity in experts per MoE layer, from k to the experts of a layer (instead of
    /// --capacity)
    #[arg(long, value_name = "C")]
    pub capacity_per_layer: Option<usize>,
    /// Host -> device bandwidth in GB/s
    #[arg(long, value_name = "B", default_value_t = 25.0)]
    pub bandwidth_gbps: f64,
    /// Fixed cost of one expert transfer, microseconds (0: none)
    #[arg(long, value_name = "US", default_value_t = 10.0)]
    pub latency_us: f64,
    /// Device memory bandwidth in GB/s (compute times: roofline with --tflops)
    #[arg(long, value_name = "B", default_value_t = 500.0)]
    pub device_gbps: f64,
    /// Device compute in TFLOP/s
    #[arg(long, value_name = "T", default_value_t = 30.0)]
    pub tflops: f64,
    /// Bytes per weight on device and host (2: bf16; 0.5: 4-bit)
    #[arg(long, value_name = "N", default_value_t = 2.0)]
    pub bytes_per_param: f64,
    /// Layer times and expert sizes: model (the traced model's sizes) | mixtral-8x7b | measured
    /// (the reference's own per-layer wall-clock times while tracing, the traced model's experts)
    #[arg(long, value_name = "SIZES", value_parser = parse_timing, default_value = "model")]
    pub timing: Timing,
    /// Predictors to simulate, comma separated, each at most once: lazy, next-gate, m2r2, oracle
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_predictor,
          default_value = "lazy,next-gate,m2r2,oracle")]
    pub policy: Vec<Predictor>,
    /// Eviction policy: lru | keep-predicted
    #[arg(long, value_name = "POLICY", value_parser = parse_eviction, default_value = "lru")]
    pub eviction: Eviction,
    /// Decoded tokens simulated first and left out of the metrics (fewer than --steps)
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub warmup: usize,
    /// Capacities of the sweep, comma separated, each once and counted as --capacity or
    /// --capacity-per-layer counts (default: k, then every eighth of all experts)
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub sweep_capacities: Option<Vec<usize>>,
    /// Host bandwidths of the sweep in GB/s, comma separated, each once (default: --bandwidth-gbps)
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub sweep_bandwidths: Option<Vec<f64>>,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// Draw hit rate and speedup over lazy against capacity as an SVG file
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

fn parse_timing(text: &str) -> Result<Timing, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

fn parse_predictor(text: &str) -> Result<Predictor, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}

fn parse_eviction(text: &str) -> Result<Eviction, String> {
    text.parse().map_err(|e: reference::Error| e.to_string())
}
