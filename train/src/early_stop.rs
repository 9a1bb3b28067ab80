//! Early stopping on held-out data of the training distribution: stop when the validation loss has
//! not improved for `patience` evaluations in a row, and remember the best evaluation (whose
//! weights the caller keeps).

/// What one evaluation meant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Observation {
    /// A new best loss (keep these weights).
    Improved,
    /// Not better than the best; `misses` evaluations in a row so far.
    NoBetter { misses: usize },
    /// `patience` evaluations in a row without improvement: stop.
    Stop,
}

/// The state of early stopping.
#[derive(Clone, Debug, PartialEq)]
pub struct EarlyStop {
    pub patience: usize,
    best: Option<(usize, f64)>,
    misses: usize,
}

impl EarlyStop {
    /// `patience >= 1` evaluations without improvement end training.
    pub fn new(patience: usize) -> Self {
        EarlyStop {
            patience: patience.max(1),
            best: None,
            misses: 0,
        }
    }

    /// Record the validation loss `loss` after `step` steps. A loss counts as better only when
    /// strictly lower than the best (a NaN never is).
    pub fn observe(&mut self, step: usize, loss: f64) -> Observation {
        if self.best.is_none_or(|(_, best)| loss < best) && !loss.is_nan() {
            self.best = Some((step, loss));
            self.misses = 0;
            return Observation::Improved;
        }
        self.misses += 1;
        if self.misses >= self.patience {
            Observation::Stop
        } else {
            Observation::NoBetter {
                misses: self.misses,
            }
        }
    }

    /// `(step, loss)` of the best evaluation so far.
    pub fn best(&self) -> Option<(usize, f64)> {
        self.best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loss sequence by hand: improvements reset the count, ties and NaN do not improve.
    #[test]
    fn stops_after_patience_evaluations_without_improvement() {
        let mut e = EarlyStop::new(2);
        assert_eq!(
            e.observe(100, f64::NAN),
            Observation::NoBetter { misses: 1 }
        );
        assert_eq!(e.observe(200, 3.0), Observation::Improved);
        assert_eq!(e.observe(300, 3.0), Observation::NoBetter { misses: 1 });
        assert_eq!(e.observe(400, 2.5), Observation::Improved);
        assert_eq!(e.observe(500, 2.6), Observation::NoBetter { misses: 1 });
        assert_eq!(e.best(), Some((400, 2.5)));
        assert_eq!(e.observe(600, 2.7), Observation::Stop);
        assert_eq!(EarlyStop::new(0).patience, 1);
    }
}
