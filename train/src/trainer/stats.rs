//! What training reports: one gate's loss and agreement over some rows ([`GateStats`]), a logged
//! step ([`StepLog`]), and the mean KL over the gates that early stopping watches ([`mean_kl`]).

use serde::{Deserialize, Serialize};

/// Loss and agreement of one gate over some rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GateStats {
    pub gate: usize,
    /// `tau^2 * mean KL(p_base || p_exit)`
    pub kl: f64,
    /// Weighted alignment term (0 without one).
    pub align: f64,
    /// Rows whose exit argmax equals the base model's argmax.
    pub agree: usize,
    pub rows: usize,
}

impl GateStats {
    /// Top-1 agreement with the base model.
    pub fn agreement(&self) -> f64 {
        self.agree as f64 / self.rows.max(1) as f64
    }

    /// Pool `other` into these statistics (row-weighted means, summed counts).
    pub fn add(&mut self, other: &GateStats) {
        let n = (self.rows + other.rows).max(1) as f64;
        self.kl = (self.kl * self.rows as f64 + other.kl * other.rows as f64) / n;
        self.align = (self.align * self.rows as f64 + other.align * other.rows as f64) / n;
        self.agree += other.agree;
        self.rows += other.rows;
    }
}

/// One logged step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLog {
    pub step: usize,
    pub lr: f64,
    pub gates: Vec<GateStats>,
}

/// The row-weighted mean KL over the gates of `stats` (the early-stopping criterion).
pub fn mean_kl(stats: &[GateStats]) -> f64 {
    let rows: usize = stats.iter().map(|s| s.rows).sum();
    stats.iter().map(|s| s.kl * s.rows as f64).sum::<f64>() / rows.max(1) as f64
}
