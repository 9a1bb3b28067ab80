//! AdamW (Loshchilov & Hutter; PyTorch `torch.optim.AdamW` semantics) and global-norm gradient
//! clipping, over a list of parameter tensors.
//!
//! ```text
//! p <- p - lr * wd * p                                   (decoupled weight decay)
//! m <- b1 m + (1 - b1) g        v <- b2 v + (1 - b2) g^2
//! p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//! ```

use crate::real::Real;
use ndarray::{Array2, Zip};

/// Hyper-parameters (PyTorch defaults except the weight decay).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Moments of every parameter tensor, in the order the tensors are passed.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW<F> {
    pub config: AdamWConfig,
    /// Steps taken (t).
    pub t: u64,
    pub m: Vec<Array2<F>>,
    pub v: Vec<Array2<F>>,
}

impl<F: Real> AdamW<F> {
    /// Zero moments shaped like `params`.
    pub fn new<'a>(config: AdamWConfig, params: impl Iterator<Item = &'a Array2<F>>) -> Self {
        let m: Vec<Array2<F>> = params.map(|p| Array2::zeros(p.raw_dim())).collect();
        AdamW {
            config,
            t: 0,
            v: m.clone(),
            m,
        }
    }

    /// One update of `params` with `grads` (same order and shapes as at construction).
    ///
    /// # Panics
    /// If the number or shapes of the tensors differ from construction.
    pub fn step<'a, 'b>(
        &mut self,
        lr: f64,
        params: impl Iterator<Item = &'a mut Array2<F>>,
        grads: impl Iterator<Item = &'b Array2<F>>,
    ) where
        F: 'a + 'b,
    {
        self.t += 1;
        let c = self.config;
        let (b1, b2) = (F::c(c.beta1), F::c(c.beta2));
        let bc1 = F::c(1.0 - c.beta1.powi(self.t as i32));
        let bc2 = F::c(1.0 - c.beta2.powi(self.t as i32));
        let (lr_f, decay, eps) = (F::c(lr), F::c(1.0 - lr * c.weight_decay), F::c(c.eps));
        let mut count = 0;
        for (((p, g), m), v) in params.zip(grads).zip(&mut self.m).zip(&mut self.v) {
            count += 1;
            Zip::from(p).and(g).and(m).and(v).for_each(|p, &g, m, v| {
                *p *= decay;
                *m = b1 * *m + (F::one() - b1) * g;
                *v = b2 * *v + (F::one() - b2) * g * g;
                *p -= lr_f * (*m / bc1) / ((*v / bc2).sqrt() + eps);
            });
        }
        assert_eq!(count, self.m.len(), "AdamW: parameter count changed");
    }
}

/// Scale `grads` so their global L2 norm is at most `max_norm` (PyTorch `clip_grad_norm_`); returns
/// the norm before clipping.
pub fn clip_grad_norm<'a, F: Real>(
    grads: impl Iterator<Item = &'a mut Array2<F>>,
    max_norm: f64,
) -> f64 {
    let mut grads: Vec<&mut Array2<F>> = grads.collect();
    let norm = grads
        .iter()
        .map(|g| {
            g.iter()
                .map(|&x| (x * x).to_f64().unwrap_or(f64::NAN))
                .sum::<f64>()
        })
        .sum::<f64>()
        .sqrt();
    if norm > max_norm {
        let scale = F::c(max_norm / (norm + 1e-6));
        for g in grads.iter_mut() {
            g.mapv_inplace(|x| x * scale);
        }
    }
    norm
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    /// First step: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) = lr * sign(g).
    #[test]
    fn first_step_is_signed_lr() {
        let mut p = array![[1.0f64, -2.0]];
        let g = array![[0.5f64, -3.0]];
        let mut opt = AdamW::new(AdamWConfig::default(), [&p].into_iter());
        opt.step(0.1, [&mut p].into_iter(), [&g].into_iter());
        approx::assert_abs_diff_eq!(p, array![[0.9, -1.9]], epsilon = 1e-7);
        // Decoupled decay: p (1 - lr wd) before the Adam update.
        let mut q = array![[1.0f64]];
        let cfg = AdamWConfig {
            weight_decay: 0.5,
            ..AdamWConfig::default()
        };
        let mut opt = AdamW::new(cfg, [&q].into_iter());
        opt.step(0.1, [&mut q].into_iter(), [&array![[1.0f64]]].into_iter());
        approx::assert_abs_diff_eq!(q, array![[0.95 - 0.1]], epsilon = 1e-7);
    }

    /// Minimises a quadratic.
    #[test]
    fn minimises_a_quadratic() {
        let mut p = array![[3.0f64, -4.0]];
        let mut opt = AdamW::new(AdamWConfig::default(), [&p].into_iter());
        for _ in 0..500 {
            let g = &p * 2.0; // d/dp |p|^2
            opt.step(0.05, [&mut p].into_iter(), [&g].into_iter());
        }
        assert!(p.iter().all(|v| v.abs() < 1e-2), "{p}");
    }

    #[test]
    fn clipping_hand_computed() {
        let mut a = array![[3.0f64]];
        let mut b = array![[4.0f64]];
        let norm = clip_grad_norm([&mut a, &mut b].into_iter(), 1.0);
        assert_eq!(norm, 5.0);
        approx::assert_abs_diff_eq!(a[[0, 0]], 0.6, epsilon = 1e-6);
        approx::assert_abs_diff_eq!(b[[0, 0]], 0.8, epsilon = 1e-6);
        // Below the limit nothing changes.
        assert_eq!(clip_grad_norm([&mut a].into_iter(), 10.0), a[[0, 0]]);
        assert_eq!(a[[0, 0]], 0.6 * 5.0 / (5.0 + 1e-6));
    }
}
