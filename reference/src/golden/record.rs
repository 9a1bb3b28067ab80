//! Recording a greedy golden: decode with the reference and keep every step's logits.

use super::Golden;
use crate::base::generate::{GreedyBackend, ReferenceGreedy, decode_positions};
use crate::base::model::Model;
use crate::base::ops::argmax;
use crate::error::{Error, Result};
use ndarray::Array2;

impl Golden {
    /// Record `steps` greedy tokens after `prompt` (without stopping at end of turn).
    pub fn record_greedy(
        model: &Model,
        name: &str,
        prompt: &[u32],
        steps: usize,
    ) -> Result<Golden> {
        Golden::record_greedy_until(model, name, prompt, steps, &[])
    }

    /// Record up to `steps` greedy tokens after `prompt`, stopping after the first of `stops`
    /// (the model's end-of-turn tokens) as a deployment does.
    pub fn record_greedy_until(
        model: &Model,
        name: &str,
        prompt: &[u32],
        steps: usize,
        stops: &[u32],
    ) -> Result<Golden> {
        let mut backend = ReferenceGreedy::new(model);
        let (tokens, logits) = replay_on(
            &mut backend,
            model.config.vocab_size,
            prompt,
            steps,
            None,
            stops,
        )?;
        Ok(Golden {
            model: name.into(),
            config_hash: model.config.hash(),
            config_json: serde_json::to_string(&model.config).expect("config serialises"),
            mode: "greedy".into(),
            prompt_tokens: prompt.to_vec(),
            tokens,
            logits,
            m2r2: None,
            writer: Some(env!("CARGO_PKG_VERSION").into()),
            stop_tokens: Some(stops.to_vec()),
            max_steps: Some(steps),
            pins: Default::default(),
            version: super::WRITTEN_FORMAT_VERSION,
        })
    }
}

/// Decode up to `steps` tokens after `prompt` on any engine (an ONNX Runtime session, the
/// reference) and collect each step's `vocab` logits. With `forced`, feed those tokens instead
/// of the argmax (teacher forcing, so logits stay comparable after a mismatch) for all `steps`;
/// without, stop after the first token in `stops`. The argmax tokens are returned either way.
pub(super) fn replay_on(
    backend: &mut dyn GreedyBackend,
    vocab: usize,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
    stops: &[u32],
) -> Result<(Vec<u32>, Array2<f32>)> {
    if prompt.is_empty() {
        return Err(Error::Invalid("the prompt is empty".into()));
    }
    backend.start(decode_positions(prompt.len(), steps))?;
    let mut row = backend.feed(prompt)?.0;
    let mut logits = Array2::zeros((steps, vocab));
    let mut greedy = Vec::with_capacity(steps);
    for step in 0..steps {
        if row.len() != vocab {
            return Err(Error::Invalid(format!(
                "the engine returned {} logits at step {step}, the golden has {vocab} per step",
                row.len()
            )));
        }
        logits
            .row_mut(step)
            .assign(&ndarray::ArrayView1::from(&row[..]));
        let chosen = argmax(&row) as u32;
        greedy.push(chosen);
        if forced.is_none() && stops.contains(&chosen) {
            let n = greedy.len();
            return Ok((greedy, logits.slice_move(ndarray::s![..n, ..])));
        }
        if step + 1 < steps {
            let next = forced.map_or(chosen, |f| f[step]);
            row = backend.feed(&[next])?.0;
        }
    }
    Ok((greedy, logits))
}
