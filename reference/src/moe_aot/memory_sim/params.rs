//! What the memory simulator is told: eviction policy, capacity scope, layer times, link and cache
//! parameters.

use super::*;

/// Which cached expert makes room for a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Eviction {
    Lru,
    KeepPredicted,
}

impl Eviction {
    pub fn name(self) -> &'static str {
        match self {
            Eviction::Lru => "lru",
            Eviction::KeepPredicted => "keep-predicted",
        }
    }
}

impl std::str::FromStr for Eviction {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "lru" => Ok(Eviction::Lru),
            "keep-predicted" => Ok(Eviction::KeepPredicted),
            _ => Err(Error::Invalid(format!(
                "unknown eviction policy `{s}` (expected lru or keep-predicted)"
            ))),
        }
    }
}

/// Whether `capacity` counts experts over all layers or in each layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityScope {
    Global,
    PerLayer,
}

/// Compute time of one layer, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayerTime {
    /// attention, norms and router: before the experts are needed
    pub pre: f64,
    /// the experts (or the dense MLP)
    pub moe: f64,
}

/// Everything the simulator needs besides the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SimParams {
    /// Experts the device cache holds (in all, or per layer: see `scope`); at least k.
    pub capacity: usize,
    pub scope: CapacityScope,
    pub eviction: Eviction,
    /// Bytes of one expert (gate, up and down projections).
    pub expert_bytes: f64,
    /// Host -> device bandwidth, bytes per second.
    pub bandwidth: f64,
    /// Fixed cost of one transfer, seconds.
    pub latency: f64,
    /// Per layer: the base model's compute.
    pub compute: Vec<LayerTime>,
    /// Per layer: the compute with the fast stream's rows (what `m2r2` pays).
    pub fast_compute: Vec<LayerTime>,
    /// Decoded tokens simulated first and left out of every metric.
    pub warmup_tokens: usize,
}

impl SimParams {
    /// Seconds one expert transfer occupies the copy engine.
    pub fn transfer_seconds(&self) -> f64 {
        self.latency + self.expert_bytes / self.bandwidth
    }

    /// Refuse parameters, and traces, that the simulator cannot run.
    pub(super) fn validate(&self, trace: &ExpertTrace) -> Result<()> {
        let bad = |msg: String| Err(Error::Invalid(msg));
        if self.capacity < trace.top_k {
            return bad(format!(
                "capacity {} is below k = {} experts per token: a layer's experts must fit",
                self.capacity, trace.top_k
            ));
        }
        for (name, v) in [
            ("bandwidth", self.bandwidth),
            ("expert size", self.expert_bytes),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(format!("{name} must be positive and finite, got {v}"));
            }
        }
        if !(self.latency.is_finite() && self.latency >= 0.0) {
            return bad(format!(
                "latency must be >= 0 and finite, got {}",
                self.latency
            ));
        }
        for (name, times) in [
            ("compute", &self.compute),
            ("fast_compute", &self.fast_compute),
        ] {
            if times.len() != trace.num_layers {
                return bad(format!(
                    "{name} has {} layers, the trace {}",
                    times.len(),
                    trace.num_layers
                ));
            }
            if times
                .iter()
                .any(|t| !(t.pre >= 0.0 && t.moe >= 0.0 && (t.pre + t.moe).is_finite()))
            {
                return bad(format!("{name}: layer times must be >= 0 and finite"));
            }
        }
        if self.warmup_tokens >= trace.steps.len() {
            return bad(format!(
                "{} warm-up tokens leave none of the {} decoded tokens to measure",
                self.warmup_tokens,
                trace.steps.len()
            ));
        }
        if trace.moe_layers().is_empty() {
            return bad("the trace has no MoE layer".into());
        }
        for (t, step) in trace.steps.iter().enumerate() {
            if step.layers.len() != trace.num_layers {
                return bad(format!(
                    "step {t} has {} layers, the trace {}",
                    step.layers.len(),
                    trace.num_layers
                ));
            }
            for (l, layer) in step.layers.iter().enumerate() {
                let Some(layer) = layer else { continue };
                let valid = |experts: &[usize]| {
                    experts.iter().all(|&e| e < trace.num_experts)
                        && (1..experts.len()).all(|i| !experts[..i].contains(&experts[i]))
                };
                if layer.used.len() != trace.top_k || !valid(&layer.used) {
                    return bad(format!(
                        "step {t} layer {l}: used experts {:?} are not {} distinct experts below {}",
                        layer.used, trace.top_k, trace.num_experts
                    ));
                }
                for p in Predictor::ALL {
                    for guess in p.predictions(step, l) {
                        if guess.at > IssuePoint::start(l) || !valid(&guess.experts) {
                            return bad(format!(
                                "step {t} layer {l}: {p} predicts {:?} at {:?}, not distinct experts \
                                 below {} issued by the start of the layer",
                                guess.experts, guess.at, trace.num_experts
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
