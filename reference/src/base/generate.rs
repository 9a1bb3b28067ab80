//! Autoregressive decoding with the base model: prefill the prompt in one chunk, then one token at a
//! time from the KV cache.

use crate::base::kv_cache::KvCache;
use crate::base::model::{Model, Output};
use crate::base::sampling::{Sampler, SamplingParams};
use crate::base::work::Work;
use crate::error::{Error, Result};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Stop after emitting any of these (the stop token is kept in the output, as HF does).
    pub stop_tokens: Vec<u32>,
    /// `None`: greedy.
    pub sampling: Option<SamplingParams>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Work of the decode steps (the prompt's prefill excluded).
    pub work: Work,
}

impl Generation {
    /// Decode speed: tokens after the first, per decode second (the first token comes from prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if self.decode_seconds > 0.0 {
            n as f64 / self.decode_seconds
        } else {
            0.0
        }
    }
}

/// Cache positions a decode of `new_tokens` after `prompt` tokens writes: the prompt, then every
/// emitted token but the newest (the last one is emitted, never fed). Without new tokens only the
/// prefill runs.
pub fn decode_positions(prompt: usize, new_tokens: usize) -> usize {
    prompt.saturating_add(new_tokens.saturating_sub(1))
}

/// The forward passes of one engine for autoregressive decoding. [`generate_with`] is the decoding
/// loop, shared by the reference ([`ReferenceGreedy`]) and the ONNX runner (`OnnxModel`), so both
/// choose, stream and stop exactly alike.
pub trait GreedyBackend {
    /// Forget any earlier sequence and make room for `capacity` positions (refused beyond what the
    /// engine holds).
    fn start(&mut self, capacity: usize) -> Result<()>;
    /// Feed `tokens` after the cached positions: the logits of the last one, and the work done
    /// (zero where the engine does not count it).
    fn feed(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, Work)>;
}

/// The reference model with its KV cache.
pub struct ReferenceGreedy<'a> {
    model: &'a Model,
    cache: KvCache,
}

impl<'a> ReferenceGreedy<'a> {
    pub fn new(model: &'a Model) -> Self {
        ReferenceGreedy {
            model,
            cache: KvCache::new(&model.config, 0),
        }
    }
}

impl GreedyBackend for ReferenceGreedy<'_> {
    fn start(&mut self, capacity: usize) -> Result<()> {
        self.cache = self.model.new_cache(capacity)?;
        Ok(())
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, Work)> {
        let Output { logits, work } = self.model.forward(tokens, &mut self.cache)?;
        Ok((logits.row(logits.nrows() - 1).to_vec(), work))
    }
}

/// Decode up to `max_new_tokens` after `prompt` with the reference. `on_token(token, logits_row)`
/// sees every emitted token and the logits it was chosen from (for streaming output and goldens).
pub fn generate(
    model: &Model,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &[f32]),
) -> Result<Generation> {
    generate_with(&mut ReferenceGreedy::new(model), prompt, options, on_token)
}

/// The decoding loop on any engine: prefill the prompt in one chunk, then one token at a time,
/// chosen by one [`Sampler`], until a stop token or `max_new_tokens`.
pub fn generate_with(
    backend: &mut dyn GreedyBackend,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &[f32]),
) -> Result<Generation> {
    if prompt.is_empty() {
        return Err(Error::Invalid(
            "the prompt is empty: give at least one token".into(),
        ));
    }
    let mut sampler = Sampler::new(options.sampling.clone())?;
    backend.start(decode_positions(prompt.len(), options.max_new_tokens))?;

    let start = Instant::now();
    let (mut last, _) = backend.feed(prompt)?;
    let prefill_seconds = start.elapsed().as_secs_f64();

    let mut tokens = Vec::with_capacity(options.max_new_tokens);
    let start = Instant::now();
    let mut work = Work::default();
    while tokens.len() < options.max_new_tokens {
        let token = sampler.next(&last);
        tokens.push(token);
        on_token(token, &last);
        if options.stop_tokens.contains(&token) || tokens.len() == options.max_new_tokens {
            break;
        }
        let (logits, step) = backend.feed(&[token])?;
        work += step;
        last = logits;
    }
    Ok(Generation {
        prompt_tokens: prompt.to_vec(),
        tokens,
        prefill_seconds,
        decode_seconds: start.elapsed().as_secs_f64(),
        work,
    })
}

/// Greedy continuation of `prompt`.
pub fn greedy(
    model: &Model,
    prompt: &[u32],
    max_new_tokens: usize,
    stop_tokens: &[u32],
) -> Result<Vec<u32>> {
    let options = GenerateOptions {
        max_new_tokens,
        stop_tokens: stop_tokens.to_vec(),
        sampling: None,
    };
    Ok(generate(model, prompt, &options, &mut |_, _| {})?.tokens)
}
