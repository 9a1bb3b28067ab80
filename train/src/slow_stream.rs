//! The frozen slow stream of one data sample, computed once and kept: everything a fast row of a
//! trained interval depends on (docs/m2r2/streams.md, docs/m2r2/shared_kv.md).
//!
//! Given the frozen base model, fast row `(t, j)` depends only on the slow residual `s_{e_j}` at
//! position `t` and the slow K/V of interval `j`'s layers at positions `< t`; its teacher is the
//! base model's final distribution at `t`, recomputed from the final slow residual `s_N`. So one
//! base forward per sample (the reference's own `layer_forward`, so the K/V are exactly the
//! inference cache) gives every input of every fast row, and rows can be batched freely.

use crate::error::{Error, Result};
use crate::real::{Real, lift};
use ndarray::Array2;
use reference::Model;
use reference::m2r2::config::M2r2Config;

/// Refuse `tokens` longer than `model`'s context in the words of data: the cache's own error
/// advises `generate`'s flags. The commands check their data first, naming file and line
/// ([`crate::data::check_context`]); this stops any other sample (held-out data) as clearly.
fn check_fits(model: &Model, tokens: &[u32]) -> Result<()> {
    let context = model.context_length();
    if tokens.len() <= context {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "a sample has {} tokens, more than the model's context of {context} positions (remove \
         it from its data, or make the data again with `m2r2 distill-data` and this model, which \
         keeps every sample within its context)",
        tokens.len()
    )))
}

/// The slow-stream quantities of one token sequence.
#[derive(Clone, Debug)]
pub struct SlowSample<F> {
    pub tokens: Vec<u32>,
    /// First position whose fast rows are trained (the first response position's input row).
    pub first_row: usize,
    /// Per interval `j` (`0..J`): `s_{e_j}` `[T, D]`, kept for the trained intervals only.
    pub starts: Vec<Option<Array2<F>>>,
    /// Per code layer: cached (K, V) `[T, Hkv*Dh]` (keys rotated), kept for the trained
    /// intervals' layers only.
    pub kv: Vec<Option<(Array2<F>, Array2<F>)>>,
    /// `s_N` `[T, D]`: the teacher's final residual.
    pub last: Array2<F>,
    /// Per interval `j`: `s_{d_j(i)}` `[T, D]` for `i = 1..k_j` (the slow residual the fast state
    /// after the interval's `i`-th layer estimates, docs/m2r2/streams.md), kept for the trained
    /// intervals only when asked for (`--align-intermediate`): `k_j - 1` more rows of `D` per
    /// position, 6 for SmolLM2's gate 1.
    pub aligned: Vec<Option<Vec<Array2<F>>>>,
}

impl<F: Real> SlowSample<F> {
    /// Run the base model over `tokens` once and keep what the intervals `intervals` need.
    pub fn compute(
        model: &Model,
        config: &M2r2Config,
        tokens: &[u32],
        first_row: usize,
        intervals: &[usize],
    ) -> Result<Self> {
        Self::compute_with(model, config, tokens, first_row, intervals, false)
    }

    /// [`compute`](Self::compute), also keeping the intermediate alignment targets
    /// ([`aligned`](Self::aligned)) of the intervals when `keep_aligned`.
    pub fn compute_with(
        model: &Model,
        config: &M2r2Config,
        tokens: &[u32],
        first_row: usize,
        intervals: &[usize],
        keep_aligned: bool,
    ) -> Result<Self> {
        let n = model.config.num_hidden_layers;
        // The depths d_j(i), i = 1..k_j, of each interval whose targets are kept.
        let depths: Vec<Vec<usize>> = (0..config.num_gates())
            .map(|j| match keep_aligned && intervals.contains(&j) {
                true => (1..config.interval_len(j))
                    .map(|i| config.aligned_depth(j, i))
                    .collect(),
                false => Vec::new(),
            })
            .collect();
        let mut aligned: Vec<Option<Vec<Array2<F>>>> = depths
            .iter()
            .map(|d| (!d.is_empty()).then(Vec::new))
            .collect();
        check_fits(model, tokens)?;
        let mut cache = model.new_cache(tokens.len())?;
        model.check_input(tokens, 0, &cache)?;
        let mut s = model.embed(tokens);
        let mut starts = vec![None; config.num_gates()];
        let mut kv = vec![None; n];
        for (l, kv_l) in kv.iter_mut().enumerate() {
            let owner = intervals
                .iter()
                .copied()
                .find(|&j| config.interval_layers(j).contains(&l));
            if let Some(j) = owner
                && config.boundary(j) == l
            {
                starts[j] = Some(lift(s.view()));
            }
            model.layer_forward(l, &mut s, 0, &mut cache);
            // `s` is now s_{l+1}
            for (d, kept) in depths.iter().zip(&mut aligned) {
                if let Some(kept) = kept
                    && d.contains(&(l + 1))
                {
                    kept.push(lift(s.view()));
                }
            }
            if owner.is_some() {
                let (k, v) = cache.layer(l, tokens.len());
                *kv_l = Some((lift(k), lift(v)));
            }
        }
        Ok(SlowSample {
            tokens: tokens.to_vec(),
            first_row,
            starts,
            kv,
            last: lift(s.view()),
            aligned,
        })
    }

    /// Number of positions.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}
