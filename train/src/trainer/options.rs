//! The training settings ([`TrainOptions`], stored in checkpoints): what is trained, for how long
//! and how, and their checks.

use crate::align::AlignKind;
use crate::error::{Error, Result};
use crate::schedule::Schedule;
use reference::m2r2::config::M2r2Config;
use serde::{Deserialize, Serialize};

/// Training settings (stored in checkpoints).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainOptions {
    /// Gates (1-based) whose interval's adapters are trained.
    pub train_gates: Vec<usize>,
    /// Total optimizer steps (each step updates every trained gate once).
    pub steps: usize,
    /// Fast rows per gate per step.
    pub batch_rows: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Final learning rate of the cosine decay.
    pub lr_min: f64,
    pub warmup: usize,
    pub weight_decay: f64,
    /// Global L2 norm the gradient of one gate is clipped to.
    pub clip: f64,
    /// Distillation temperature tau.
    pub temperature: f64,
    /// Weight of the cross-entropy on the teacher's argmax beside the KL
    /// ([`kl_loss`](crate::head::kl_loss)); 0: the KL alone.
    #[serde(default)]
    pub hard_label_weight: f64,
    /// Optional alignment of the exit state with `s_N`, and its weight.
    pub align: Option<AlignKind>,
    pub align_weight: f64,
    /// Also align the fast state after each inner layer `i` of the interval with the slow residual
    /// at depth `d_j(i)` (the intermediate targets of docs/m2r2/streams.md), with `align`'s kind
    /// and weight (one term per inner layer). Needs `align`.
    #[serde(default)]
    pub align_intermediate: bool,
    /// Seed of the row sampling (and of the adapters' initialisation, see
    /// [`initial_weights`](super::initial_weights)).
    pub seed: u64,
    /// Train only the bridge's maps: the adapters stay as given (so early exit, which never reads
    /// the bridge, is unchanged).
    #[serde(default)]
    pub bridge_only: bool,
}

impl TrainOptions {
    pub fn schedule(&self) -> Schedule {
        Schedule {
            lr_max: self.lr,
            lr_min: self.lr_min,
            warmup: self.warmup,
            steps: self.steps,
        }
    }

    pub(super) fn validate(&self, config: &M2r2Config) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        if self.train_gates.is_empty() {
            return bad("no gate to train".into());
        }
        for &g in &self.train_gates {
            config.check_gate(g, "gate")?;
        }
        if self.batch_rows == 0 || self.steps == 0 {
            return bad("steps and batch rows must be at least 1".into());
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) || self.lr_min < 0.0 || self.lr_min > self.lr {
            return bad(format!(
                "learning rates must satisfy 0 <= lr_min <= lr, lr > 0 (got lr {}, lr_min {})",
                self.lr, self.lr_min
            ));
        }
        if self.temperature.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
            || self.clip.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
        {
            return bad("temperature and clip must be positive".into());
        }
        if !(self.hard_label_weight >= 0.0 && self.hard_label_weight.is_finite()) {
            return bad(format!(
                "the hard-label weight (--hard-label-weight) must be finite and >= 0 (got {})",
                self.hard_label_weight
            ));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return bad(format!(
                "the weight decay (--weight-decay) must be finite and >= 0 (got {})",
                self.weight_decay
            ));
        }
        if self.align_intermediate && self.align.is_none() {
            return bad(
                "intermediate alignment needs an alignment kind (--align cosine | mse)".into(),
            );
        }
        Ok(())
    }
}
