//! The deployment that the expert-prefetch simulator models (docs/MOE_AOT.md), per-layer compute
//! times from the cost model, and sweeps over capacity and bandwidth.
//!
//! Defaults \[ours\], chosen to resemble an on-device GPU serving an offloaded MoE model at batch 1
//! (docs/MOE_AOT.md explains them):
//!
//! | parameter | default | what it stands for |
//! |---|---|---|
//! | host -> device bandwidth | 25 GB/s | PCIe 4.0 x16 (31.5 GB/s raw), pinned copies |
//! | per-transfer latency | 10 us | copy launch and DMA setup |
//! | device memory bandwidth | 500 GB/s | a mid-range discrete GPU (GDDR6) |
//! | device compute | 30 TFLOP/s | its dense fp16 rate |
//! | bytes per parameter | 2 | bf16 / fp16 weights |
//!
//! Or `Timing::Measured`: the reference's own wall-clock time per layer while tracing.
//!
//! A layer's time is the roofline `max(FLOPs / rate, bytes / device bandwidth)` of its pre-MoE part
//! and of its experts separately, from [`CostModel`] (which counts f32 bytes; they are rescaled to
//! the deployment's bytes per parameter).

use crate::base::config::{Architecture, ModelConfig, MoeConfig};
use crate::base::work::Work;
use crate::error::{Error, Result};
use crate::m2r2::cost::CostModel;
use crate::m2r2::weights::M2r2Weights;
use crate::moe_aot::expert_prefetch::{ExpertTrace, Predictor};
use crate::moe_aot::memory_sim::{LayerTime, SimParams, compare};
use serde::Serialize;

/// The hardware the simulation assumes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Deployment {
    /// host -> device, bytes per second
    pub host_bandwidth: f64,
    /// seconds per transfer
    pub latency: f64,
    /// device memory, bytes per second
    pub device_bandwidth: f64,
    /// FLOP per second
    pub flops: f64,
    /// bytes per weight on the device and in host memory
    pub bytes_per_param: f64,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            host_bandwidth: 25e9,
            latency: 10e-6,
            device_bandwidth: 500e9,
            flops: 30e12,
            bytes_per_param: 2.0,
        }
    }
}

impl Deployment {
    /// Roofline seconds of `work` (whose bytes the cost model counts in f32).
    pub fn seconds(&self, work: Work) -> f64 {
        let bytes = work.weight_bytes as f64 * self.bytes_per_param / 4.0;
        (work.flops() as f64 / self.flops).max(bytes / self.device_bandwidth)
    }
}

/// Whose layer sizes set the compute and transfer times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Timing {
    /// the model that produced the trace
    Model,
    /// Mixtral-8x7B's sizes (D 4096, I 14336, 32/8 heads of 128) with the trace's layers and k
    Mixtral8x7b,
    /// the reference's own per-layer wall-clock times while tracing, split into pre-MoE and experts
    /// in the cost model's proportions (experts sized from the traced model)
    Measured,
}

impl Timing {
    pub fn name(self) -> &'static str {
        match self {
            Timing::Model => "model",
            Timing::Mixtral8x7b => "mixtral-8x7b",
            Timing::Measured => "measured",
        }
    }
}

impl std::str::FromStr for Timing {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "model" => Ok(Timing::Model),
            "mixtral-8x7b" => Ok(Timing::Mixtral8x7b),
            "measured" => Ok(Timing::Measured),
            _ => Err(Error::Invalid(format!(
                "unknown timing `{s}` (expected model, mixtral-8x7b or measured)"
            ))),
        }
    }
}

/// Mixtral-8x7B's config (HF `mistralai/Mixtral-8x7B-v0.1`) with `num_layers` layers and the
/// trace's expert counts.
pub fn mixtral_8x7b_config(num_layers: usize, num_experts: usize, top_k: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Mixtral,
        vocab_size: 32000,
        hidden_size: 4096,
        intermediate_size: 14336,
        num_hidden_layers: num_layers,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        head_dim: 128,
        max_position_embeddings: 32768,
        rms_norm_eps: 1e-5,
        rope_theta: 1e6,
        rope_scaling: crate::base::config::RopeScaling::Default,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        tie_word_embeddings: false,
        sliding_window: None,
        moe: Some(MoeConfig {
            num_local_experts: num_experts,
            num_experts_per_tok: top_k,
        }),
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
    }
}

/// Bytes of one expert (gate, up, down: `3 D I` weights).
pub fn expert_bytes(config: &ModelConfig, d: &Deployment) -> f64 {
    CostModel::new(config, None).expert_weights() as f64 * d.bytes_per_param
}

/// Per layer, the compute of one decode step at `position`: `fast` adds a fast-stream row in the
/// layers before the last gate (its adapter terms when `m2r2` is given).
pub fn layer_times(
    config: &ModelConfig,
    m2r2: Option<&M2r2Weights>,
    fast_until: Option<usize>,
    position: usize,
    d: &Deployment,
) -> Vec<LayerTime> {
    let cost = CostModel::new(config, m2r2);
    (0..config.num_hidden_layers)
        .map(|l| {
            let fast: &[usize] = if fast_until.is_some_and(|e| l < e) {
                &[position]
            } else {
                &[]
            };
            let total = cost.layer(l, &[position], fast);
            if config.moe.is_none() {
                return LayerTime {
                    pre: d.seconds(total),
                    moe: 0.0,
                };
            }
            // The experts: every row runs k of them; the slow row's experts are read once.
            let experts = cost.experts(1 + fast.len(), 1);
            let pre = Work {
                weight_macs: total.weight_macs - experts.weight_macs,
                attention_macs: total.attention_macs,
                weight_bytes: total.weight_bytes - experts.weight_bytes,
            };
            LayerTime {
                pre: d.seconds(pre),
                moe: d.seconds(experts),
            }
        })
        .collect()
}

/// Measured whole-layer seconds split into pre-MoE and experts in the proportions of `model`'s
/// cost-model times (`model` from [`layer_times`]).
pub fn split_measured(measured: &[f64], model: &[LayerTime]) -> Vec<LayerTime> {
    measured
        .iter()
        .zip(model)
        .map(|(&m, t)| {
            let total = t.pre + t.moe;
            let pre = if total > 0.0 { m * t.pre / total } else { m };
            LayerTime { pre, moe: m - pre }
        })
        .collect()
}

/// One point of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepPoint {
    pub capacity: usize,
    pub bandwidth_gbps: f64,
    pub policy: String,
    pub hit_rate: f64,
    pub stall_per_token_seconds: f64,
    pub time_per_token_seconds: f64,
    pub speedup_over_lazy: f64,
}

/// `predictors` at every capacity and host bandwidth (GB/s), the rest of `base` unchanged.
pub fn sweep(
    trace: &ExpertTrace,
    predictors: &[Predictor],
    base: &SimParams,
    capacities: &[usize],
    bandwidths_gbps: &[f64],
) -> Result<Vec<SweepPoint>> {
    let mut points = Vec::new();
    for &bandwidth_gbps in bandwidths_gbps {
        for &capacity in capacities {
            let params = SimParams {
                capacity,
                bandwidth: bandwidth_gbps * 1e9,
                ..base.clone()
            };
            for r in compare(trace, predictors, &params)? {
                points.push(SweepPoint {
                    capacity,
                    bandwidth_gbps,
                    policy: r.policy,
                    hit_rate: r.hit_rate,
                    stall_per_token_seconds: r.stall_per_token_seconds,
                    time_per_token_seconds: r.time_per_token_seconds,
                    speedup_over_lazy: r.speedup_over_lazy.expect("compare fills it"),
                });
            }
        }
    }
    Ok(points)
}

/// Default sweep capacities: k, then every eighth of `total` experts up to all of them.
pub fn default_capacities(top_k: usize, total: usize) -> Vec<usize> {
    let mut caps = vec![top_k];
    for i in 1..=8 {
        let c = (i * total).div_ceil(8).max(top_k);
        if caps.last() != Some(&c) {
            caps.push(c);
        }
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::builtin::tiny_moe_config;

    #[test]
    fn capacities_hand_values() {
        assert_eq!(
            default_capacities(2, 64),
            vec![2, 8, 16, 24, 32, 40, 48, 56, 64]
        );
        assert_eq!(default_capacities(2, 8), vec![2, 3, 4, 5, 6, 7, 8]);
    }

    /// Mixtral-8x7B in bf16: an expert is 3 * 4096 * 14336 * 2 B = 352.3 MB; the two experts of a
    /// decode step take 704.6 MB / 500 GB/s = 1.409 ms; the attention projections
    /// (2 * 4096^2 + 2 * 4096 * 1024) * 2 B = 83.9 MB take 0.168 ms (plus norms and router).
    #[test]
    fn mixtral_times_hand_values() {
        let d = Deployment::default();
        let c = mixtral_8x7b_config(2, 8, 2);
        assert_eq!(expert_bytes(&c, &d), 352_321_536.0);
        let t = layer_times(&c, None, None, 0, &d);
        approx::assert_relative_eq!(t[0].moe, 2.0 * 352_321_536.0 / 500e9, max_relative = 1e-12);
        let attn = (2 * 4096 * 4096 + 2 * 4096 * 1024) as f64 * 2.0;
        let norms_router = (2 * 4096 + 8 * 4096) as f64 * 2.0;
        approx::assert_relative_eq!(
            t[0].pre,
            (attn + norms_router) / 500e9,
            max_relative = 1e-12
        );
        // A fast row doubles the expert FLOPs but reads no more bytes: still memory bound.
        let f = layer_times(&c, None, Some(1), 0, &d);
        assert_eq!(f[0].moe, t[0].moe);
        assert_eq!(f[1], t[1]);
    }

    #[test]
    fn measured_times_are_split_like_the_cost_model() {
        let model = [
            LayerTime { pre: 1.0, moe: 3.0 },
            LayerTime { pre: 0.0, moe: 0.0 },
        ];
        assert_eq!(
            split_measured(&[8.0, 2.0], &model),
            vec![
                LayerTime { pre: 2.0, moe: 6.0 },
                LayerTime { pre: 2.0, moe: 0.0 }
            ]
        );
    }

    #[test]
    fn tiny_moe_expert_size() {
        let d = Deployment::default();
        assert_eq!(
            expert_bytes(&tiny_moe_config(), &d),
            (3 * 64 * 96 * 2) as f64
        );
    }
}
