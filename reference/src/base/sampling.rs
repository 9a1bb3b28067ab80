//! Choosing the next token: greedy, or sampling with temperature, top-k and top-p from a seeded RNG
//! (ChaCha8, so the same seed gives the same tokens on every machine).
//!
//! The filters apply in HF's order: temperature, then top-k, then top-p.

use crate::base::ops::{argmax, softmax_inplace};
use crate::error::{Error, Result};
use ndarray::ArrayViewMut1;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// > 0; logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches p, in (0, 1].
    pub top_p: Option<f32>,
    pub seed: u64,
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature > 0.0 && self.temperature.is_finite()) {
            return Err(Error::Invalid(format!(
                "temperature must be > 0, got {}",
                self.temperature
            )));
        }
        if self.top_k == Some(0) {
            return Err(Error::Invalid("top-k must be at least 1".into()));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(Error::Invalid(format!("top-p must be in (0, 1], got {p}")));
        }
        Ok(())
    }
}

/// The distribution that sampling draws from: `softmax(logits / T)` restricted by top-k and top-p and
/// renormalised.
pub fn sampling_distribution(logits: &[f32], params: &SamplingParams) -> Vec<f32> {
    let mut probs: Vec<f32> = logits.iter().map(|l| l / params.temperature).collect();
    if probs.contains(&f32::INFINITY) {
        // A temperature so small that `l / T` overflows: softmax would be NaN (inf - inf). Its
        // limit as T -> 0 is uniform over the largest logits (greedy, up to ties).
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let ties = logits.iter().filter(|&&l| l == max).count() as f32;
        probs = logits
            .iter()
            .map(|&l| if l == max { 1.0 / ties } else { 0.0 })
            .collect();
    } else {
        softmax_inplace(ArrayViewMut1::from(probs.as_mut_slice()));
    }
    // Most likely first; ties keep ascending id order.
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let mut keep = params.top_k.unwrap_or(probs.len()).min(probs.len());
    if let Some(p) = params.top_p {
        // Renormalise over the top-k first, as HF's warpers see the top-k-masked logits.
        let mass: f32 = order[..keep].iter().map(|&i| probs[i]).sum();
        let mut cumulative = 0.0f32;
        for (n, &i) in order[..keep].iter().enumerate() {
            cumulative += probs[i] / mass;
            if cumulative >= p {
                keep = n + 1;
                break;
            }
        }
    }
    let mut out = vec![0.0f32; probs.len()];
    let mass: f32 = order[..keep].iter().map(|&i| probs[i]).sum();
    for &i in &order[..keep] {
        out[i] = probs[i] / mass;
    }
    out
}

/// Draw an index from `probs` (which sum to one) with one uniform number.
pub fn draw(probs: &[f32], rng: &mut impl Rng) -> usize {
    let u: f32 = rng.random();
    let mut cumulative = 0.0f32;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            cumulative += p;
            last = i;
            if u < cumulative {
                return i;
            }
        }
    }
    last // rounding left u above the total: the last possible token
}

/// Greedy or seeded sampling.
#[derive(Clone, Debug)]
pub enum Sampler {
    Greedy,
    Sample {
        params: SamplingParams,
        rng: Box<ChaCha8Rng>,
    },
}

impl Sampler {
    pub fn new(params: Option<SamplingParams>) -> Result<Self> {
        Ok(match params {
            None => Sampler::Greedy,
            Some(params) => {
                params.validate()?;
                let rng = Box::new(ChaCha8Rng::seed_from_u64(params.seed));
                Sampler::Sample { params, rng }
            }
        })
    }

    /// The next token from one row of logits.
    pub fn next(&mut self, logits: &[f32]) -> u32 {
        match self {
            Sampler::Greedy => argmax(logits) as u32,
            Sampler::Sample { params, rng } => {
                draw(&sampling_distribution(logits, params), rng.as_mut()) as u32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_abs_diff_eq;

    fn params(t: f32, k: Option<usize>, p: Option<f32>) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_k: k,
            top_p: p,
            seed: 7,
        }
    }

    /// Pruned draft logits are -inf outside the subset: those tokens get probability 0 under
    /// every filter, the rest is the distribution over the subset (hand-computed).
    #[test]
    fn minus_infinity_rows_get_zero_probability() {
        let ninf = f32::NEG_INFINITY;
        // ln of [0.5, 0.3, 0.2] at tokens 1, 3, 4
        let logits = [ninf, 0.5f32.ln(), ninf, 0.3f32.ln(), 0.2f32.ln(), ninf];
        for (k, p, want) in [
            (None, None, [0.0f32, 0.5, 0.0, 0.3, 0.2, 0.0]),
            (Some(5), None, [0.0, 0.5, 0.0, 0.3, 0.2, 0.0]),
            (Some(2), None, [0.0, 0.625, 0.0, 0.375, 0.0, 0.0]),
            (None, Some(0.7), [0.0, 0.625, 0.0, 0.375, 0.0, 0.0]),
        ] {
            let q = sampling_distribution(&logits, &params(1.0, k, p));
            assert_abs_diff_eq!(q.as_slice(), want.as_slice(), epsilon = 1e-6);
        }
        let q = sampling_distribution(&logits, &params(1.0, None, None));
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..200 {
            assert!([1, 3, 4].contains(&draw(&q, &mut rng)));
        }
    }

    #[test]
    fn filters_hand_computed() {
        // ln of [0.5, 0.3, 0.15, 0.05]
        let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
        let all = sampling_distribution(&logits, &params(1.0, None, None));
        assert_abs_diff_eq!(
            all.as_slice(),
            [0.5f32, 0.3, 0.15, 0.05].as_slice(),
            epsilon = 1e-6
        );
        let k2 = sampling_distribution(&logits, &params(1.0, Some(2), None));
        assert_abs_diff_eq!(
            k2.as_slice(),
            [0.625f32, 0.375, 0.0, 0.0].as_slice(),
            epsilon = 1e-6
        );
        // top-p 0.8: 0.5 + 0.3 reaches 0.8.
        let p8 = sampling_distribution(&logits, &params(1.0, None, Some(0.8)));
        assert_abs_diff_eq!(
            p8.as_slice(),
            [0.625f32, 0.375, 0.0, 0.0].as_slice(),
            epsilon = 1e-6
        );
        // Temperature 0.5 squares the odds: [0.25, 0.09, 0.0225, 0.0025] / 0.365
        let t = sampling_distribution(&logits, &params(0.5, None, None));
        assert_abs_diff_eq!(t[0], 0.25 / 0.365, epsilon = 1e-6);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let run = || {
            let mut s = Sampler::new(Some(params(0.8, Some(20), Some(0.9)))).unwrap();
            (0..30).map(|_| s.next(&logits)).collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        assert!(
            a.iter().any(|&t| t != a[0]),
            "sampling should not be constant: {a:?}"
        );
    }

    /// A temperature so small that `logits / T` overflows f32 drew token 0 from a NaN
    /// distribution; the limit T -> 0 is greedy (uniform over tied maxima).
    #[test]
    fn overflowing_temperatures_are_greedy() {
        let logits = [1.0, 3.0, -2.0, 3.0, 0.5];
        for t in [1e-38, 1e-40, 1e-45] {
            let probs = sampling_distribution(&logits, &params(t, None, None));
            assert_eq!(probs, vec![0.0, 0.5, 0.0, 0.5, 0.0], "T = {t}");
            let probs = sampling_distribution(&[1.0, 3.0, -2.0], &params(t, None, None));
            assert_eq!(probs, vec![0.0, 1.0, 0.0], "T = {t}");
        }
    }

    #[test]
    fn bad_params_are_refused() {
        assert!(Sampler::new(Some(params(0.0, None, None))).is_err());
        assert!(Sampler::new(Some(params(1.0, Some(0), None))).is_err());
        assert!(Sampler::new(Some(params(1.0, None, Some(1.5)))).is_err());
    }
}
