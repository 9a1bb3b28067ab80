//! `m2r2 distill-data`: self-distillation data for training the accelerator adapters
//! (docs/TRAINING.md): the base model's own responses to chat-templated prompts, written as token
//! sequences (format: `train::data`).

use crate::cli::args::model::{ModelArgs, PromptArgs};
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Result, bail};
use std::path::PathBuf;
use train::data::{DistillMeta, Run};
use train::distill::{DistillOptions, generate_samples_batched};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompts, one JSON object per line with `id` and `prompt` (e.g. ../shared/data/train_prompts.jsonl)
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: PathBuf,
    /// Folder to write (samples.jsonl, meta.json)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Responses per prompt
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub samples_per_prompt: usize,
    /// Longest response, in tokens
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Sampling temperature (default: greedy, the verifier's own decoding)
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    /// Seed of sample k of prompt i: S + i * K + k
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Use only the first N prompts (smoke runs)
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Sequences decoded together (each response is bitwise the same at any batch size)
    #[arg(long, value_name = "N", default_value_t = train::distill::DEFAULT_BATCH)]
    pub batch: usize,
    /// Continue a stopped run into the same --out (same settings): keep its samples, make the rest
    #[arg(long)]
    pub resume: bool,
}

pub fn run(args: &Args) -> Result<()> {
    if args.samples_per_prompt == 0 || args.max_new_tokens == 0 {
        bail!("--samples-per-prompt and --max-new-tokens must be at least 1");
    }
    let mut prompts = common::read_prompts(&args.prompts)?;
    if let Some(n) = args.limit {
        if n == 0 {
            bail!("--limit must be at least 1");
        }
        prompts.truncate(n);
    }
    let loaded = common::load(&args.model.model)?;
    let encoded: Vec<(String, Vec<u32>)> = prompts
        .iter()
        .map(|(id, text)| {
            let prompt = PromptArgs {
                prompt: Some(text.clone()),
                chat: true,
                tokens: None,
            };
            Ok((id.clone(), common::prompt_tokens(&loaded, &prompt)?))
        })
        .collect::<Result<_>>()?;
    let options = DistillOptions {
        samples_per_prompt: args.samples_per_prompt,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        seed: args.seed,
        stop_tokens: loaded.stop_tokens(),
    };
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let total = encoded.len() * args.samples_per_prompt;
    let planned = DistillMeta {
        model: loaded.name.clone(),
        prompts: args.prompts.display().to_string(),
        samples_per_prompt: args.samples_per_prompt,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        seed: args.seed,
        samples: total,
        tokens: 0,
    };
    let vocab = loaded.model.config.vocab_size;
    let mut run = Run::start(&args.out, &planned, args.resume, vocab)?;
    let done = run.done();
    if !done.is_empty() {
        eprintln!(
            "resuming {}: {} of {total} samples already written",
            args.out.display(),
            done.len()
        );
    }
    let mut counter = progress::Counter::new("samples", total, done.len());
    let mut finished = done.len();
    let start = std::time::Instant::now();
    let mut generated = 0usize;
    let mut failed = None;
    generate_samples_batched(
        &loaded.model,
        &encoded,
        &options,
        args.batch,
        &done,
        &mut |s| {
            generated += s.tokens.len() - s.prompt_len;
            if failed.is_none() {
                failed = run.append(s).err();
            }
            finished += 1;
            counter.update(finished, generated);
        },
    )?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    counter.finish();
    let seconds = start.elapsed().as_secs_f64();
    let order: Vec<String> = encoded.iter().map(|(id, _)| id.clone()).collect();
    let samples = run.finish(&order, planned)?;
    let meta_tokens: usize = samples.iter().map(|s| s.tokens.len()).sum();
    println!(
        "wrote {} samples ({} response tokens, {} tokens in all) to {} in {:.1} s ({:.1} response tokens/s)",
        samples.len(),
        generated,
        meta_tokens,
        args.out.display(),
        seconds,
        generated as f64 / seconds.max(1e-9)
    );
    Ok(())
}
