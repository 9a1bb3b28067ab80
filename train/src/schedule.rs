//! Learning-rate schedule: linear warm-up, then cosine decay to a floor.
//!
//! ```text
//! lr(s) = lr_max * (s + 1) / warmup                                   s < warmup
//! lr(s) = lr_min + (lr_max - lr_min) * (1 + cos(pi * q)) / 2          q = (s - warmup) / (steps - warmup)
//! ```

/// Schedule settings.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Schedule {
    pub lr_max: f64,
    pub lr_min: f64,
    pub warmup: usize,
    pub steps: usize,
}

impl Schedule {
    /// Learning rate of step `s` (0-based).
    pub fn lr(&self, s: usize) -> f64 {
        if s < self.warmup {
            return self.lr_max * (s + 1) as f64 / self.warmup as f64;
        }
        let span = self.steps.saturating_sub(self.warmup).max(1);
        let q = ((s - self.warmup) as f64 / span as f64).min(1.0);
        self.lr_min + (self.lr_max - self.lr_min) * 0.5 * (1.0 + (std::f64::consts::PI * q).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed() {
        let s = Schedule {
            lr_max: 1.0,
            lr_min: 0.1,
            warmup: 4,
            steps: 14,
        };
        assert_eq!(s.lr(0), 0.25);
        assert_eq!(s.lr(3), 1.0);
        assert_eq!(s.lr(4), 1.0); // cos(0)
        assert!((s.lr(9) - 0.55).abs() < 1e-12); // halfway: (max + min) / 2
        assert!((s.lr(14) - 0.1).abs() < 1e-12);
        assert!((s.lr(100) - 0.1).abs() < 1e-12);
    }
}
