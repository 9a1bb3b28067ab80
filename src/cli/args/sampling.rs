//! The sampling flags: `--temperature`, `--top-k`, `--top-p`, `--seed`.

use anyhow::{Result, bail};
use reference::base::sampling::SamplingParams;

/// Sampling flags: greedy unless `--temperature` > 0.
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sample at this temperature (> 0); absent or 0: greedy
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Sample only among the K most likely tokens (K >= 1)
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Sample only among the most likely tokens whose probability reaches P, in (0, 1]
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Seed of the sampler (same seed, same tokens on every machine) [default: 0]
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampling parameters, or `None` for greedy. Checked before any model is loaded.
    pub fn params(&self) -> Result<Option<SamplingParams>> {
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            bail!("--top-p must be in (0, 1], got {p}");
        }
        if self.top_k == Some(0) {
            bail!("--top-k must be at least 1");
        }
        let temperature = match self.temperature {
            None => 0.0,
            Some(t) if t.is_finite() && t >= 0.0 => t,
            Some(t) => bail!("--temperature must be a finite number >= 0 (0 is greedy), got {t}"),
        };
        if temperature == 0.0 {
            let unread: Vec<&str> = [
                (self.top_k.is_some(), "--top-k"),
                (self.top_p.is_some(), "--top-p"),
                (self.seed.is_some(), "--seed"),
            ]
            .into_iter()
            .filter_map(|(given, flag)| given.then_some(flag))
            .collect();
            if !unread.is_empty() {
                eprintln!(
                    "note: {}: read only when sampling (--temperature > 0); decoding greedily",
                    unread.join("/")
                );
            }
            return Ok(None);
        }
        let params = SamplingParams {
            temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed.unwrap_or(0),
        };
        params.validate()?;
        Ok(Some(params))
    }
}
