//! `m2r2 distill-data`: self-distillation data for training the accelerator adapters
//! (docs/TRAINING.md): the base model's own responses to chat-templated prompts, written as token
//! sequences (format: `train::data`).

use crate::cli::args::model::{ModelArgs, PromptArgs};
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use train::data::{DistillMeta, Run, Start, check_out, prompts};
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
    /// Responses per prompt (more than 1 needs --temperature: greedy responses are all the same)
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub samples_per_prompt: usize,
    /// Longest response, in tokens (each prompt's tokens plus N must fit the model's context)
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
    /// Sequences decoded together (each response is bitwise the same at any batch size; at most
    /// the samples left to make)
    #[arg(long, value_name = "N", default_value_t = train::distill::DEFAULT_BATCH)]
    pub batch: usize,
    /// Continue a stopped run in --out (same settings and prompts): keep its samples, make the rest
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Start a new run in an --out that is not empty (replacing a finished or unfinished run there)
    #[arg(long)]
    pub force: bool,
}

/// The prompts shown in a refusal, at most.
const SHOWN: usize = 5;

/// Samples one run makes at most (prompts x `--samples-per-prompt`): every request is planned in
/// memory before decoding starts. Far beyond any run of these tools (the SmolLM2 training data:
/// 2 384 samples, 685 k tokens).
const MAX_SAMPLES: usize = 1_000_000;

pub fn run(args: &Args) -> Result<()> {
    if args.samples_per_prompt == 0 || args.max_new_tokens == 0 {
        bail!("--samples-per-prompt and --max-new-tokens must be at least 1");
    }
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if args.limit == Some(0) {
        bail!("--limit must be at least 1");
    }
    if let Some(t) = args.temperature
        && !(t > 0.0 && t.is_finite())
    {
        bail!("--temperature must be a finite number > 0 (leave it out for greedy), got {t}");
    }
    if args.temperature.is_none() && args.samples_per_prompt > 1 {
        bail!(
            "--samples-per-prompt {} without --temperature: greedy decoding is deterministic, so \
             every sample of a prompt would be the same response; give --temperature T to sample \
             them, or leave --samples-per-prompt out",
            args.samples_per_prompt
        );
    }
    let start = Start::from_flags(args.resume, args.force);
    check_out(&args.out, start)?;
    let mut prompts = prompts::read(&args.prompts)?;
    refuse_empty(&args.prompts, &prompts)?;
    if let Some(n) = args.limit {
        if n > prompts.len() {
            eprintln!(
                "note: --limit {n} is more than the {} prompts of {}: all of them are used",
                prompts.len(),
                args.prompts.display()
            );
        }
        prompts.truncate(n);
    }
    let total = prompts
        .len()
        .checked_mul(args.samples_per_prompt)
        .filter(|&n| n <= MAX_SAMPLES)
        .with_context(|| {
            format!(
                "{} prompts x --samples-per-prompt {} is more than the {MAX_SAMPLES} samples one \
                 run makes: split the prompts, or lower --samples-per-prompt",
                prompts.len(),
                args.samples_per_prompt
            )
        })?;
    common::check_seed_range(args.seed, total, "samples")?;
    let loaded = common::load(&args.model.model)?;
    loaded
        .tokenizer()
        .context("distill-data renders each prompt with the model's chat template")?;
    let encoded: Vec<(String, Vec<u32>)> = prompts
        .iter()
        .map(|p| {
            let prompt = PromptArgs {
                prompt: Some(p.prompt.clone()),
                chat: true,
                tokens: None,
            };
            let tokens = common::prompt_tokens(&loaded, &prompt).with_context(|| {
                format!(
                    "{} line {} (prompt `{}`)",
                    args.prompts.display(),
                    p.line,
                    p.id
                )
            })?;
            Ok((p.id.clone(), tokens))
        })
        .collect::<Result<_>>()?;
    check_lengths(args, &loaded, &prompts, &encoded)?;
    let options = DistillOptions {
        samples_per_prompt: args.samples_per_prompt,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        seed: args.seed,
        stop_tokens: loaded.stop_tokens(),
    };
    let planned = DistillMeta {
        model: loaded.name.clone(),
        config_hash: Some(loaded.model.config.hash()),
        prompts: args.prompts.display().to_string(),
        prompts_sha256: Some(prompts::digest(&prompts)),
        samples_per_prompt: args.samples_per_prompt,
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        seed: args.seed,
        samples: total,
        tokens: 0,
    };
    let vocab = loaded.model.config.vocab_size;
    let mut run = Run::start(&args.out, &planned, start, vocab, &encoded)?;
    let done = run.done();
    if !done.is_empty() {
        eprintln!(
            "resuming {}: {} of {total} samples already written",
            args.out.display(),
            done.len()
        );
    }
    // each response is bitwise the same at any batch size: more sequences than are left to make
    // would only reserve room for them
    let batch = args.batch.min(total - done.len()).max(1);
    if args.batch > total && args.batch > train::distill::DEFAULT_BATCH {
        eprintln!(
            "note: --batch {} is more than the {total} samples of this run: at most {batch} are \
             decoded together",
            args.batch
        );
    }
    let mut counter = progress::Counter::new("samples", total, done.len());
    let mut finished = done.len();
    let start = std::time::Instant::now();
    let mut generated = 0usize;
    let mut failed = None;
    generate_samples_batched(&loaded.model, &encoded, &options, batch, &done, &mut |s| {
        generated += s.tokens.len() - s.prompt_len;
        if failed.is_none() {
            failed = run.append(s).err();
        }
        finished += 1;
        counter.update(finished, generated);
    })?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    counter.finish();
    let seconds = start.elapsed().as_secs_f64();
    let order: Vec<String> = encoded.iter().map(|(id, _)| id.clone()).collect();
    let samples = run.finish(&order, planned)?;
    println!(
        "{}",
        summary(&samples, done.len(), generated, seconds, args)
    );
    Ok(())
}

/// The closing line: the folder's totals, then (after a resume, split from the earlier run's)
/// what this run made and how fast.
fn summary(
    samples: &[train::data::DistillSample],
    earlier: usize,
    generated: usize,
    seconds: f64,
    args: &Args,
) -> String {
    let all: usize = samples.iter().map(|s| s.tokens.len()).sum();
    let responses: usize = samples.iter().map(|s| s.tokens.len() - s.prompt_len).sum();
    let rate = generated as f64 / seconds.max(1e-9);
    let made = samples.len() - earlier;
    let this_run = match earlier {
        0 => format!("in {seconds:.1} s ({rate:.1} response tokens/s)"),
        _ => format!(
            "({earlier} from the earlier run; this run made {made} of them, {generated} response \
             tokens, in {seconds:.1} s, {rate:.1} response tokens/s)"
        ),
    };
    format!(
        "wrote {} samples ({responses} response tokens, {all} tokens in all) to {} {this_run}",
        samples.len(),
        args.out.display(),
    )
}

/// Refuse a prompt whose `id` or `prompt` is empty (or blank), naming its line: an empty id
/// cannot key its samples, an empty prompt asks nothing.
fn refuse_empty(path: &std::path::Path, prompts: &[prompts::PromptLine]) -> Result<()> {
    for p in prompts {
        for (field, value) in [("id", &p.id), ("prompt", &p.prompt)] {
            if value.trim().is_empty() {
                bail!(
                    "{} line {}: empty `{field}`: every prompt needs a non-blank id and prompt \
                     text. Nothing was generated or written",
                    path.display(),
                    p.line
                );
            }
        }
    }
    Ok(())
}

/// Refuse, before anything is generated, every prompt whose chat-templated tokens and
/// `--max-new-tokens` do not fit the model's context (the sample would not fit, nor train),
/// naming the prompts by id and line and the longest `--max-new-tokens` that would fit.
fn check_lengths(
    args: &Args,
    loaded: &reference::io::load::LoadedModel,
    prompts: &[prompts::PromptLine],
    encoded: &[(String, Vec<u32>)],
) -> Result<()> {
    let context = loaded.model.context_length();
    let long: Vec<(&prompts::PromptLine, usize)> = prompts
        .iter()
        .zip(encoded)
        .map(|(p, (_, tokens))| (p, tokens.len()))
        .filter(|&(_, n)| n.saturating_add(args.max_new_tokens) > context)
        .collect();
    if long.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = long
        .iter()
        .take(SHOWN)
        .map(|(p, n)| format!("`{}` (line {}, {n} tokens)", p.id, p.line))
        .collect();
    let more = long.len().saturating_sub(SHOWN);
    // Prompts that fill the context alone need leaving out; the others a lower --max-new-tokens.
    let (full, fitting): (Vec<_>, Vec<_>) = long.iter().partition(|&&(_, n)| n >= context);
    let lower = fitting
        .iter()
        .map(|&&(_, n)| n)
        .max()
        .map(|longest| format!("lower --max-new-tokens to at most {}", context - longest));
    let fix = match (full.len(), lower) {
        (0, Some(lower)) => format!(
            "{lower}, or leave {} out of the prompts file",
            if long.len() == 1 { "it" } else { "them" }
        ),
        (_, lower) => {
            let ids: Vec<String> = full.iter().map(|(p, _)| format!("`{}`", p.id)).collect();
            format!(
                "leave {} out of the prompts file (alone {} the context){}",
                ids.join(", "),
                if full.len() == 1 {
                    "it fills"
                } else {
                    "each fills"
                },
                lower.map_or(String::new(), |l| format!(
                    ", and {l} or leave the others out too"
                ))
            )
        }
    };
    let (verb, count) = if long.len() == 1 {
        ("does", format!("prompt {}", named.join("")))
    } else {
        (
            "do",
            format!(
                "{} of the {} prompts, {}{}",
                long.len(),
                prompts.len(),
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ),
        )
    };
    bail!(
        "{}: {count} {verb} not fit {}'s context of {context} positions with --max-new-tokens {} \
         (a prompt's chat-templated tokens plus --max-new-tokens must fit); {fix}. Nothing was \
         generated or written",
        args.prompts.display(),
        loaded.name,
        args.max_new_tokens,
    )
}
