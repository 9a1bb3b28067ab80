//! Recording a greedy golden: decode with the reference and keep every step's logits.

use super::Golden;
use crate::base::model::Model;
use crate::base::ops::argmax;
use crate::error::{Error, Result};
use ndarray::Array2;

impl Golden {
    /// Record `steps` greedy tokens after `prompt`.
    pub fn record_greedy(
        model: &Model,
        name: &str,
        prompt: &[u32],
        steps: usize,
    ) -> Result<Golden> {
        let (tokens, logits) = replay(model, prompt, steps, None)?;
        Ok(Golden {
            model: name.into(),
            config_hash: model.config.hash(),
            config_json: serde_json::to_string(&model.config).expect("config serialises"),
            mode: "greedy".into(),
            prompt_tokens: prompt.to_vec(),
            tokens,
            logits,
            m2r2: None,
        })
    }
}

/// Decode `steps` tokens after `prompt` and collect each step's logits. With `forced`, feed those
/// tokens instead of the argmax (so logits stay comparable after a mismatch); the argmax tokens are
/// returned either way.
pub(super) fn replay(
    model: &Model,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
) -> Result<(Vec<u32>, Array2<f32>)> {
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    let mut cache = model.new_cache(prompt.len() + steps)?;
    let first = model.forward(prompt, &mut cache)?.logits;
    let mut row = first.row(first.nrows() - 1).to_owned();
    let mut logits = Array2::zeros((steps, model.config.vocab_size));
    let mut greedy = Vec::with_capacity(steps);
    for step in 0..steps {
        logits.row_mut(step).assign(&row);
        let chosen = argmax(row.as_slice().expect("contiguous")) as u32;
        greedy.push(chosen);
        if step + 1 < steps {
            let next = forced.map_or(chosen, |f| f[step]);
            row = model.forward(&[next], &mut cache)?.logits.row(0).to_owned();
        }
    }
    Ok((greedy, logits))
}
