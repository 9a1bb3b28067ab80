//! Self-distillation data generation (docs/TRAINING.md): the base model's own responses to prompts,
//! with the reference's batched decoding (greedy, or sampled with a temperature). Batching changes
//! only the speed: each response is bitwise the one `generate` gives alone
//! (`reference::base::batch`).

use crate::data::DistillSample;
use crate::error::Result;
use reference::Model;
use reference::base::batch::{BatchRequest, generate_batch};
use reference::base::generate::GenerateOptions;
use reference::base::sampling::SamplingParams;
use std::collections::HashSet;

/// Sequences decoded together by default: on 2 CPU cores the per-step weight read is shared by 8
/// rows while the products stay memory-bound (docs/PERFORMANCE.md).
pub const DEFAULT_BATCH: usize = 8;

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

/// Generate `samples_per_prompt` responses to each `(id, prompt tokens)`, [`DEFAULT_BATCH`] at a
/// time; `on_sample` sees each finished sample (progress). Returned in prompt, then sample order.
pub fn generate_samples(
    model: &Model,
    prompts: &[(String, Vec<u32>)],
    options: &DistillOptions,
    on_sample: &mut dyn FnMut(&DistillSample),
) -> Result<Vec<DistillSample>> {
    generate_samples_batched(
        model,
        prompts,
        options,
        DEFAULT_BATCH,
        &HashSet::new(),
        on_sample,
    )
}

/// [`generate_samples`] with `batch` sequences in flight, leaving out the `(prompt id, sample)`
/// pairs in `done` (a resumed run). `on_sample` sees samples as they finish, in finishing order
/// (to write them at once); the returned samples are in prompt, then sample order.
pub fn generate_samples_batched(
    model: &Model,
    prompts: &[(String, Vec<u32>)],
    options: &DistillOptions,
    batch: usize,
    done: &HashSet<(String, usize)>,
    on_sample: &mut dyn FnMut(&DistillSample),
) -> Result<Vec<DistillSample>> {
    let mut todo = Vec::new(); // (prompt index, sample index)
    let mut requests = Vec::new();
    for (i, (id, prompt)) in prompts.iter().enumerate() {
        for k in 0..options.samples_per_prompt {
            if done.contains(&(id.clone(), k)) {
                continue;
            }
            let seed = options
                .seed
                .wrapping_add((i * options.samples_per_prompt + k) as u64);
            todo.push((i, k));
            requests.push(BatchRequest {
                prompt: prompt.clone(),
                options: GenerateOptions {
                    max_new_tokens: options.max_new_tokens,
                    stop_tokens: options.stop_tokens.clone(),
                    sampling: options.temperature.map(|temperature| SamplingParams {
                        temperature,
                        top_k: None,
                        top_p: None,
                        seed,
                    }),
                },
            });
        }
    }
    let sample = |r: usize, response: &[u32]| {
        let (i, k) = todo[r];
        let (id, prompt) = &prompts[i];
        let mut tokens = prompt.clone();
        tokens.extend(response);
        DistillSample {
            prompt_id: id.clone(),
            sample: k,
            prompt_len: prompt.len(),
            tokens,
        }
    };
    let run = generate_batch(model, &requests, batch, &mut |r, generation| {
        on_sample(&sample(r, &generation.tokens))
    })?;
    Ok(run
        .generations
        .iter()
        .enumerate()
        .map(|(r, g)| sample(r, &g.tokens))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reference::base::generate::generate;
    use reference::io::builtin::{random_model, tiny_config};

    /// Batched, resumed generation gives each sample exactly what one-by-one `generate` gives it.
    #[test]
    fn batched_and_resumed_equal_one_by_one() {
        let model = random_model(tiny_config(), 5).unwrap();
        let prompts: Vec<(String, Vec<u32>)> = (0..4)
            .map(|i| (format!("p{i}"), vec![1 + i as u32, 7, 9 + 2 * i as u32]))
            .collect();
        let options = DistillOptions {
            samples_per_prompt: 2,
            max_new_tokens: 6,
            temperature: Some(0.9),
            seed: 11,
            stop_tokens: vec![],
        };
        let done: HashSet<(String, usize)> = [("p1".to_string(), 0), ("p3".to_string(), 1)].into();
        let mut seen = 0;
        let got =
            generate_samples_batched(&model, &prompts, &options, 3, &done, &mut |_| seen += 1)
                .unwrap();
        assert_eq!(seen, 6);
        assert_eq!(got.len(), 6);
        for s in &got {
            assert!(!done.contains(&(s.prompt_id.clone(), s.sample)));
            let i: usize = s.prompt_id[1..].parse().unwrap();
            let generate_options = GenerateOptions {
                max_new_tokens: 6,
                stop_tokens: vec![],
                sampling: Some(SamplingParams {
                    temperature: 0.9,
                    top_k: None,
                    top_p: None,
                    seed: 11 + (i * 2 + s.sample) as u64,
                }),
            };
            let alone = generate(&model, &prompts[i].1, &generate_options, &mut |_, _| {}).unwrap();
            assert_eq!(s.tokens[s.prompt_len..], alone.tokens[..]);
        }
    }
}
