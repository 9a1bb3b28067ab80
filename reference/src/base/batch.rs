//! Batched decoding of independent sequences: up to `B` requests in flight, each with its own KV
//! cache, length, sampler and stop rule, all of their new rows multiplied by each weight together.
//!
//! On memory-bound hardware a decode step of one row costs a full read of the weights; `B` rows
//! share that read, so throughput grows with `B` until the products become compute-bound. Batch
//! invariance (`matmul::linear` computes every output as one dot product in a fixed order; attention
//! and norms are row-wise) makes every sequence's tokens and logits bitwise those of
//! [`generate`](crate::base::generate::generate) on it alone, whatever else is in the batch.
//!
//! A finished sequence leaves the batch and the next request takes its place (its prompt is
//! prefilled in the same step as the others' decode rows).

use crate::base::generate::{GenerateOptions, Generation, decode_positions};
use crate::base::kv_cache::KvCache;
use crate::base::model::{BatchOutput, Model};
use crate::base::sampling::Sampler;
use crate::base::work::Work;
use crate::error::{Error, Result};
use std::time::Instant;

/// One sequence to decode.
#[derive(Clone, Debug)]
pub struct BatchRequest {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
}

/// Everything a batched run produced.
#[derive(Clone, Debug)]
pub struct BatchRun {
    /// In request order. `prefill_seconds` is the time from a request's admission to its first
    /// token, `decode_seconds` the rest; both are shared with the batch's other sequences, and
    /// `work` is left zero (the batch's work is not split between sequences).
    pub generations: Vec<Generation>,
    /// Work of all steps, prompts' prefill included.
    pub work: Work,
    pub seconds: f64,
}

/// A sequence in flight.
struct InFlight {
    request: usize,
    cache: KvCache,
    sampler: Sampler,
    /// Tokens to feed next step: the prompt, then the last emitted token.
    pending: Vec<u32>,
    tokens: Vec<u32>,
    admitted: Instant,
    first_token: Option<f64>,
}

/// Decode every request with at most `batch` sequences in flight. `on_done(i, generation)` sees each
/// request as it finishes (in finishing order), for progress and for writing results as they come.
pub fn generate_batch(
    model: &Model,
    requests: &[BatchRequest],
    batch: usize,
    on_done: &mut dyn FnMut(usize, &Generation),
) -> Result<BatchRun> {
    if batch == 0 {
        return Err(Error::Invalid("the batch size must be at least 1".into()));
    }
    let start = Instant::now();
    let mut done: Vec<Option<Generation>> = vec![None; requests.len()];
    let mut active: Vec<InFlight> = Vec::with_capacity(batch);
    let mut next = 0;
    let mut work = Work::default();
    loop {
        while active.len() < batch && next < requests.len() {
            let a = admit(model, &requests[next], next)?;
            next += 1;
            if requests[a.request].options.max_new_tokens == 0 {
                let (i, generation) = finish(a, requests);
                on_done(i, &generation);
                done[i] = Some(generation);
            } else {
                active.push(a);
            }
        }
        if active.is_empty() {
            break;
        }
        let pending: Vec<Vec<u32>> = active
            .iter_mut()
            .map(|a| std::mem::take(&mut a.pending))
            .collect();
        let chunks: Vec<&[u32]> = pending.iter().map(Vec::as_slice).collect();
        let mut caches: Vec<&mut KvCache> = active.iter_mut().map(|a| &mut a.cache).collect();
        let BatchOutput { logits, work: step } = model.forward_batch(&chunks, &mut caches)?;
        work += step;
        let mut still = Vec::with_capacity(active.len());
        for (mut a, logits) in active.into_iter().zip(logits) {
            let options = &requests[a.request].options;
            let token = a
                .sampler
                .next(logits.row(logits.nrows() - 1).as_slice().expect("row"));
            a.tokens.push(token);
            a.first_token
                .get_or_insert_with(|| a.admitted.elapsed().as_secs_f64());
            if options.stop_tokens.contains(&token) || a.tokens.len() >= options.max_new_tokens {
                let (i, generation) = finish(a, requests);
                on_done(i, &generation);
                done[i] = Some(generation);
            } else {
                a.pending = vec![token];
                still.push(a);
            }
        }
        active = still;
    }
    Ok(BatchRun {
        generations: done
            .into_iter()
            .map(|g| g.expect("every request finishes"))
            .collect(),
        work,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Check a request and give it a cache and a sampler.
fn admit(model: &Model, request: &BatchRequest, index: usize) -> Result<InFlight> {
    if request.prompt.is_empty() {
        return Err(Error::Invalid(format!(
            "request {index}: the prompt is empty: give at least one token"
        )));
    }
    Ok(InFlight {
        request: index,
        cache: model.new_cache(decode_positions(
            request.prompt.len(),
            request.options.max_new_tokens,
        ))?,
        sampler: Sampler::new(request.options.sampling.clone())?,
        pending: request.prompt.clone(),
        tokens: Vec::with_capacity(request.options.max_new_tokens),
        admitted: Instant::now(),
        first_token: None,
    })
}

fn finish(a: InFlight, requests: &[BatchRequest]) -> (usize, Generation) {
    let total = a.admitted.elapsed().as_secs_f64();
    let prefill = a.first_token.unwrap_or(total);
    (
        a.request,
        Generation {
            prompt_tokens: requests[a.request].prompt.clone(),
            tokens: a.tokens,
            prefill_seconds: prefill,
            decode_seconds: total - prefill,
            work: Work::default(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::generate::generate;
    use crate::base::sampling::SamplingParams;
    use crate::io::builtin::{random_model, tiny_config, tiny_moe_config};
    use proptest::prelude::*;

    fn request(prompt: Vec<u32>, max_new_tokens: usize, seed: Option<u64>) -> BatchRequest {
        BatchRequest {
            prompt,
            options: GenerateOptions {
                max_new_tokens,
                stop_tokens: vec![3],
                sampling: seed.map(|seed| SamplingParams {
                    temperature: 1.3,
                    top_k: None,
                    top_p: None,
                    seed,
                }),
            },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Every sequence decoded in a batch emits exactly the tokens it emits alone (greedy and
        /// seeded sampling, dense and MoE, sequences finishing and being replaced mid-batch).
        #[test]
        fn batch_equals_alone(
            moe in any::<bool>(),
            batch in 1usize..5,
            requests in proptest::collection::vec(
                (proptest::collection::vec(0u32..64, 1..7), 0usize..7, proptest::option::of(0u64..100)),
                1..6,
            ),
        ) {
            let config = if moe { tiny_moe_config() } else { tiny_config() };
            let model = random_model(config, 7).unwrap();
            let requests: Vec<BatchRequest> = requests
                .into_iter()
                .map(|(p, n, seed)| request(p, n, seed))
                .collect();
            let mut order = Vec::new();
            let run = generate_batch(&model, &requests, batch, &mut |i, _| order.push(i)).unwrap();
            order.sort_unstable();
            prop_assert_eq!(order, (0..requests.len()).collect::<Vec<_>>());
            for (r, got) in requests.iter().zip(&run.generations) {
                let alone = generate(&model, &r.prompt, &r.options, &mut |_, _| {}).unwrap();
                prop_assert_eq!(&got.tokens, &alone.tokens);
                prop_assert_eq!(&got.prompt_tokens, &r.prompt);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// `Model::forward_batch`: each sequence's logits and cache are bitwise those of its own
        /// `forward`, whatever the other sequences' lengths and positions.
        #[test]
        fn forward_batch_equals_forward(
            moe in any::<bool>(),
            seqs in proptest::collection::vec(
                (proptest::collection::vec(0u32..64, 0..6), proptest::collection::vec(0u32..64, 1..6)),
                1..5,
            ),
        ) {
            let config = if moe { tiny_moe_config() } else { tiny_config() };
            let model = random_model(config, 11).unwrap();
            let mut alone = Vec::new();
            let mut batched = Vec::new();
            for (prefix, _) in &seqs {
                let mut cache = model.new_cache(12).unwrap();
                model.forward(prefix, &mut cache).unwrap();
                batched.push(cache.clone());
                alone.push(cache);
            }
            let chunks: Vec<&[u32]> = seqs.iter().map(|(_, c)| c.as_slice()).collect();
            let mut caches: Vec<&mut KvCache> = batched.iter_mut().collect();
            let out = model.forward_batch(&chunks, &mut caches).unwrap();
            for ((chunk, cache), (logits, got)) in chunks.iter().zip(&mut alone).zip(out.logits.iter().zip(&batched)) {
                let want = model.forward(chunk, cache).unwrap().logits;
                prop_assert_eq!(logits, &want);
                prop_assert_eq!(got.len(), cache.len());
                prop_assert!(got.prefix_equals(cache, cache.len()));
            }
        }
    }

    #[test]
    fn refuses_bad_requests() {
        let model = random_model(tiny_config(), 1).unwrap();
        let err = generate_batch(&model, &[request(vec![], 2, None)], 2, &mut |_, _| {});
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("request 0: the prompt is empty")
        );
        let err = generate_batch(&model, &[request(vec![1], 2, None)], 0, &mut |_, _| {});
        assert!(err.unwrap_err().to_string().contains("batch size"));
        let err = generate_batch(&model, &[request(vec![1, 999], 2, None)], 1, &mut |_, _| {});
        assert!(err.unwrap_err().to_string().contains("999"));
    }
}
