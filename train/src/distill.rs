//! Self-distillation data generation (issue 7): the base model's own responses to prompts, with the
//! reference's `generate` (greedy, or sampled with a temperature).

use crate::data::DistillSample;
use crate::error::Result;
use reference::Model;
use reference::base::generate::{GenerateOptions, generate};
use reference::base::sampling::SamplingParams;

/// Settings of a generation run.
#[derive(Clone, Debug, PartialEq)]
pub struct DistillOptions {
    pub samples_per_prompt: usize,
    pub max_new_tokens: usize,
    /// `None`: greedy (then one sample per prompt is enough).
    pub temperature: Option<f32>,
    /// Sample `k` of prompt `i` uses seed `seed + i * samples_per_prompt + k`.
    pub seed: u64,
    pub stop_tokens: Vec<u32>,
}

/// Generate `samples_per_prompt` responses to each `(id, prompt tokens)`; `on_sample` sees each
/// finished sample (progress).
pub fn generate_samples(
    model: &Model,
    prompts: &[(String, Vec<u32>)],
    options: &DistillOptions,
    on_sample: &mut dyn FnMut(&DistillSample),
) -> Result<Vec<DistillSample>> {
    let mut out = Vec::new();
    for (i, (id, prompt)) in prompts.iter().enumerate() {
        for k in 0..options.samples_per_prompt {
            let seed = options
                .seed
                .wrapping_add((i * options.samples_per_prompt + k) as u64);
            let generate_options = GenerateOptions {
                max_new_tokens: options.max_new_tokens,
                stop_tokens: options.stop_tokens.clone(),
                sampling: options.temperature.map(|temperature| SamplingParams {
                    temperature,
                    top_k: None,
                    top_p: None,
                    seed,
                }),
            };
            let generation = generate(model, prompt, &generate_options, &mut |_, _| {})?;
            let mut tokens = prompt.clone();
            tokens.extend(&generation.tokens);
            let sample = DistillSample {
                prompt_id: id.clone(),
                sample: k,
                prompt_len: prompt.len(),
                tokens,
            };
            on_sample(&sample);
            out.push(sample);
        }
    }
    Ok(out)
}
