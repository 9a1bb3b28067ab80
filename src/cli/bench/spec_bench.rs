//! The speculative bench's runs: its prompt and options ([`SpecBench`]), the reference's timed
//! greedy and speculative runs, one greedy run's figures ([`GreedyRun`]), one speculative run
//! timed, and the medians of the runs.

use crate::cli::args::bench::Sizes;
use crate::cli::bench::results::{EngineResult, Spread, median};
use anyhow::{Result, bail};
use reference::base::generate::{GenerateOptions, Generation, generate};
use reference::decode::draft_verify::ReferenceSpeculation;
use reference::decode::speculative::{
    DraftLength, SpeculativeBackend, SpeculativeOptions, speculative_generate,
};
use reference::decode::timed::Timed;
use reference::decode::tree_backend::tree_positions;
use reference::io::load::LoadedModel;
use reference::m2r2::fast_stream::M2r2;
use reference::m2r2::weights::M2r2Weights;
use std::time::Instant;

/// The prompt and options of a speculative bench (reference alone, or against ONNX Runtime).
pub struct SpecBench<'a> {
    loaded: &'a LoadedModel,
    draft_gate: usize,
    repeats: usize,
    decode_tokens: usize,
    pub(super) prompt: Vec<u32>,
    pub(super) greedy_options: GenerateOptions,
    pub(super) spec_options: SpeculativeOptions,
}

impl<'a> SpecBench<'a> {
    pub fn new(
        loaded: &'a LoadedModel,
        draft_gate: usize,
        draft_len: usize,
        sizes: &Sizes,
    ) -> Result<Self> {
        let config = &loaded.model.config;
        // a chain of drafts is a tree of drafts + 1 nodes
        let needed = tree_positions(0, sizes.prompt_len, sizes.decode_tokens, draft_len + 1);
        if needed > config.max_position_embeddings {
            bail!(
                "--prompt-len {} and --decode-tokens {} need {needed} positions (the last round \
                 drafts up to {draft_len} past the last token), more than the context of {} ({})",
                sizes.prompt_len,
                sizes.decode_tokens,
                loaded.name,
                config.max_position_embeddings
            );
        }
        // A fixed pseudo-random prompt; no stop tokens, so every run decodes exactly
        // `decode_tokens`.
        let prompt: Vec<u32> = (0..sizes.prompt_len as u64)
            .map(|i| ((i * 2_654_435_761 + 12_345) % config.vocab_size as u64) as u32)
            .collect();
        Ok(SpecBench {
            loaded,
            draft_gate,
            repeats: sizes.repeats,
            decode_tokens: sizes.decode_tokens,
            prompt,
            greedy_options: GenerateOptions {
                max_new_tokens: sizes.decode_tokens,
                stop_tokens: vec![],
                sampling: None,
            },
            spec_options: SpeculativeOptions {
                max_new_tokens: sizes.decode_tokens,
                stop_tokens: vec![],
                draft_length: DraftLength::Fixed(draft_len),
                sampling: None,
            },
        })
    }

    /// The reference's greedy and speculative runs with `weights` (its pruned draft head when it
    /// has one): one warm-up, then `repeats` timed runs.
    pub(super) fn reference_runs(
        &self,
        weights: &M2r2Weights,
    ) -> Result<Vec<(GreedyRun, SpecRun)>> {
        let model = &self.loaded.model;
        let mut runs = Vec::new();
        for i in 0..=self.repeats {
            let g = generate(model, &self.prompt, &self.greedy_options, &mut |_, _| {})?;
            let capacity =
                self.prompt.len() + self.decode_tokens + self.spec_options.draft_length.max() + 1;
            let mut backend = ReferenceSpeculation::new(
                M2r2::new(model, weights),
                self.draft_gate,
                None,
                capacity,
            )?;
            let run = timed_speculative(&mut backend, &self.prompt, &self.spec_options, &g.tokens)?;
            if i > 0 {
                runs.push((GreedyRun::of(&g), run));
            }
        }
        Ok(runs)
    }

    /// The reference's medians with `weights`.
    pub fn reference(&self, weights: &M2r2Weights) -> Result<EngineResult> {
        Ok(summarise(
            "reference".into(),
            &self.reference_runs(weights)?,
        ))
    }
}

/// One greedy run's figures: the prompt's prefill (the time to the first token) and the decode
/// after it.
pub(super) struct GreedyRun {
    pub(super) tokens_per_second: f64,
    pub(super) prefill_tokens_per_second: f64,
}

impl GreedyRun {
    pub(super) fn of(g: &Generation) -> Self {
        GreedyRun {
            tokens_per_second: g.decode_tokens_per_second(),
            prefill_tokens_per_second: g.prompt_tokens.len() as f64 / g.prefill_seconds.max(1e-12),
        }
    }
}

/// One speculative run's figures.
pub(super) struct SpecRun {
    tokens_per_second: f64,
    mean_accepted_length: f64,
    ms_per_draft: f64,
    ms_per_verify: f64,
    equals_greedy: bool,
}

pub(super) fn timed_speculative(
    backend: &mut dyn SpeculativeBackend,
    prompt: &[u32],
    options: &SpeculativeOptions,
    greedy_tokens: &[u32],
) -> Result<SpecRun> {
    let mut timed = Timed::new(backend);
    let start = Instant::now();
    let out = speculative_generate(&mut timed, prompt, options)?;
    let decode = start.elapsed().as_secs_f64() - timed.times.prefill_seconds;
    Ok(SpecRun {
        tokens_per_second: out.tokens.len().saturating_sub(1) as f64 / decode.max(1e-12),
        mean_accepted_length: out.mean_accepted_length(),
        ms_per_draft: timed.times.ms_per_draft(),
        ms_per_verify: timed.times.ms_per_verify(),
        equals_greedy: out.tokens == greedy_tokens,
    })
}

pub(super) fn summarise(engine: String, runs: &[(GreedyRun, SpecRun)]) -> EngineResult {
    let m =
        |f: &dyn Fn(&(GreedyRun, SpecRun)) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    EngineResult {
        engine,
        onnx: None,
        static_cache: None,
        prefill_tokens_per_second: m(&|r| r.0.prefill_tokens_per_second),
        greedy_tokens_per_second: m(&|r| r.0.tokens_per_second),
        speculative_tokens_per_second: m(&|r| r.1.tokens_per_second),
        mean_accepted_length: m(&|r| r.1.mean_accepted_length),
        ms_per_draft_step: m(&|r| r.1.ms_per_draft),
        ms_per_verify_step: m(&|r| r.1.ms_per_verify),
        speculative_equals_greedy: runs.iter().all(|r| r.1.equals_greedy),
        speculative_over_greedy: Spread::of(
            &runs
                .iter()
                .map(|r| r.1.tokens_per_second / r.0.tokens_per_second)
                .collect::<Vec<_>>(),
        ),
        greedy_over_first_export: None,
        prefill_over_first_export: None,
    }
}
