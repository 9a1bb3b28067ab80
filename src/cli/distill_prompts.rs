//! `m2r2 distill-prompts`: user prompts sampled from the model itself (the "Magpie" way,
//! docs/TRAINING.md "Prompts from the model itself"): the chat template up to the start of a user
//! turn, then the model's own message until it ends its turn; checked, deduplicated and written as
//! a prompts file for `distill-data --prompts` (format and checks: `train::magpie`).

use crate::cli::args::model::ModelArgs;
use crate::cli::common;
use crate::cli::progress;
use anyhow::{Context, Result, bail};
use reference::io::tokenizer::ChatMessage;
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use train::magpie::{
    Candidate, CandidateLog, MagpieMeta, MagpiePrompt, MagpieSettings, Start, Verdict, check_out,
    finish, sample_candidates, select, tally,
};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Folder to write (candidates.jsonl, prompts.jsonl, meta.json)
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// User messages to sample (the kept prompts are fewer: see meta.json), at most 1 000 000
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub count: usize,
    /// Seed of candidate i: S + i
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Sampling temperature of the user messages
    #[arg(long, value_name = "T", default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling of the user messages, in (0, 1] (default: off)
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    /// Longest user message, in tokens (longer ones are dropped as unfinished); the template's
    /// start plus N must fit the model's context
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub max_prompt_tokens: usize,
    /// Shortest kept prompt, in characters
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub min_chars: usize,
    /// Longest kept prompt, in characters
    #[arg(long, value_name = "N", default_value_t = 600)]
    pub max_chars: usize,
    /// Fraction of a prompt's letters that must be ASCII (English-only filter)
    #[arg(long, value_name = "X", default_value_t = 0.95)]
    pub min_ascii_letters: f64,
    /// Prompts files (`{"id", "prompt"}` per line; comma-separated or repeated) whose prompts must
    /// not appear in the output, e.g. held-out evaluation prompts, or the prompts of an earlier run
    /// when making a validation set (compared after lower-casing and whitespace folding)
    #[arg(long, value_name = "FILE.jsonl", num_args = 1.., value_delimiter = ',')]
    pub exclude: Vec<PathBuf>,
    /// Sequences sampled together (each message is bitwise the same at any batch size; at most
    /// the messages left to sample)
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub batch: usize,
    /// Continue a stopped run into the same --out (same settings)
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Start a new run in an --out that is not empty (replacing a finished or unfinished run there)
    #[arg(long)]
    pub force: bool,
}

/// The marker standing in for the user's message while the template is rendered.
const MARKER: &str = "\u{1}M2R2-USER-MESSAGE\u{1}";

/// Candidates one run samples at most: every request is planned in memory before sampling starts.
const MAX_COUNT: usize = 1_000_000;

pub fn run(args: &Args) -> Result<()> {
    if args.count == 0 || args.max_prompt_tokens == 0 || args.batch == 0 {
        bail!("--count, --max-prompt-tokens and --batch must be at least 1");
    }
    if args.count > MAX_COUNT {
        bail!(
            "--count {} is more than the {MAX_COUNT} candidates one run samples: split the run \
             over seeds (--seed)",
            args.count
        );
    }
    common::check_seed_range(args.seed, args.count, "candidates")?;
    if !(args.temperature > 0.0 && args.temperature.is_finite()) {
        bail!("--temperature must be positive (got {})", args.temperature);
    }
    if let Some(p) = args.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        bail!("--top-p must be in (0, 1], got {p}");
    }
    if args.min_chars > args.max_chars {
        bail!(
            "--min-chars {} is above --max-chars {}: no prompt could be kept",
            args.min_chars,
            args.max_chars
        );
    }
    if !(0.0..=1.0).contains(&args.min_ascii_letters) {
        bail!(
            "--min-ascii-letters must be in 0..=1 (got {})",
            args.min_ascii_letters
        );
    }
    let start = Start::from_flags(args.resume, args.force);
    check_out(&args.out, start)?;
    let mut exclude: BTreeSet<String> = BTreeSet::new();
    for path in &args.exclude {
        exclude.extend(
            common::read_prompts(path)?
                .iter()
                .map(|(_, _, text)| train::magpie::normalise(text)),
        );
    }
    let loaded = common::load(&args.model.model)?;
    let tokenizer = loaded
        .tokenizer()
        .context("distill-prompts samples user messages with the model's chat template")?;
    // The template up to where the user's message starts: rendered around a marker, cut before it.
    let rendered = tokenizer
        .apply_chat_template(&[ChatMessage::new("user", MARKER)], false)
        .context("cannot apply the chat template")?;
    let Some(cut) = rendered.find(MARKER) else {
        bail!(
            "{}'s chat template does not place the user's message in its output",
            loaded.name
        );
    };
    let prefix = tokenizer.encode(&rendered[..cut], false)?;
    let context = loaded.model.context_length();
    if prefix.len().saturating_add(args.max_prompt_tokens) > context {
        bail!(
            "--max-prompt-tokens {} does not fit {}'s context of {context} positions after the \
             template's {} tokens before the user message: give at most {}",
            args.max_prompt_tokens,
            loaded.name,
            prefix.len(),
            context.saturating_sub(prefix.len())
        );
    }
    let stop = loaded.stop_tokens();
    let mut settings = MagpieSettings {
        model: loaded.name.clone(),
        config_hash: Some(loaded.model.config.hash()),
        count: args.count,
        seed: args.seed,
        temperature: args.temperature,
        top_p: args.top_p,
        max_prompt_tokens: args.max_prompt_tokens,
        min_chars: args.min_chars,
        max_chars: args.max_chars,
        min_ascii_letters: args.min_ascii_letters,
        exclude: (!args.exclude.is_empty()).then(|| {
            let names: Vec<String> = args
                .exclude
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            names.join(",")
        }),
        exclude_sha256: train::magpie::exclude_digest(&exclude),
    };
    let (mut log, mut candidates) = CandidateLog::open(&args.out, &mut settings, start)?;
    if !candidates.is_empty() {
        eprintln!(
            "resuming {}: {} of {} candidates already sampled",
            args.out.display(),
            candidates.len(),
            args.count
        );
    }
    let done: HashSet<u64> = candidates.iter().map(|c| c.seed).collect();
    // each message is bitwise the same at any batch size: more sequences than are left to sample
    // would only reserve room for them
    let batch = args.batch.min(args.count - done.len()).max(1);
    let mut counter = progress::Counter::new("user messages", args.count, done.len());
    let started = std::time::Instant::now();
    let mut tokens = 0usize;
    let mut failed = None;
    sample_candidates(
        &loaded.model,
        &prefix,
        &settings,
        &stop,
        batch,
        &done,
        &mut |c| {
            tokens += c.tokens.len() + usize::from(c.ended);
            if failed.is_none() {
                failed = log.append(c).err();
            }
            candidates.push(c.clone());
            counter.update(candidates.len(), tokens);
        },
    )?;
    if let Some(e) = failed {
        return Err(e.into());
    }
    counter.finish();
    candidates.sort_by_key(|c: &Candidate| c.seed);
    let texts: Vec<(String, bool)> = candidates
        .iter()
        .map(|c| Ok((tokenizer.decode(&c.tokens, false)?, c.ended)))
        .collect::<Result<_>>()?;
    let exclude: HashSet<String> = exclude.into_iter().collect();
    let verdicts = select(&texts, &settings, &exclude);
    let prompts: Vec<MagpiePrompt> = candidates
        .iter()
        .zip(&texts)
        .zip(&verdicts)
        .filter(|(_, v)| **v == Verdict::Kept)
        .map(|((c, (text, _)), _)| MagpiePrompt {
            id: format!("magpie-{}", c.seed),
            prompt: text.trim().to_string(),
            seed: c.seed,
        })
        .collect();
    let counts = tally(&verdicts);
    finish(
        &args.out,
        &prompts,
        &MagpieMeta {
            settings,
            verdicts: counts.clone(),
            prompts: prompts.len(),
        },
    )?;
    let summary: Vec<String> = counts
        .iter()
        .map(|(v, n)| {
            format!(
                "{} {n}",
                serde_json::to_string(v)
                    .unwrap_or_default()
                    .trim_matches('"')
            )
        })
        .collect();
    println!(
        "wrote {} prompts of {} candidates to {} ({}) in {:.1} s ({:.1} tokens/s)",
        prompts.len(),
        candidates.len(),
        args.out.join(train::magpie::PROMPTS_FILE).display(),
        summary.join(", "),
        started.elapsed().as_secs_f64(),
        tokens as f64 / started.elapsed().as_secs_f64().max(1e-9)
    );
    if prompts.is_empty() {
        bail!(
            "no prompt passed the filters: of {} candidates, {}; {} holds the candidates and \
             meta.json (a new run there needs --force)",
            candidates.len(),
            rejections(&counts, args).join(", "),
            args.out.display()
        );
    }
    Ok(())
}

/// Each verdict's count with the flag that set its rule (where one does).
fn rejections(counts: &std::collections::BTreeMap<Verdict, usize>, args: &Args) -> Vec<String> {
    counts
        .iter()
        .filter(|(v, _)| **v != Verdict::Kept)
        .map(|(v, n)| {
            let rule = match v {
                Verdict::Kept => String::new(),
                Verdict::Unfinished => format!(
                    " (no end of turn within --max-prompt-tokens {})",
                    args.max_prompt_tokens
                ),
                Verdict::TooShort => format!(" (under --min-chars {})", args.min_chars),
                Verdict::TooLong => format!(" (over --max-chars {})", args.max_chars),
                Verdict::Template => " (special-token text in the message)".into(),
                Verdict::NotEnglish => format!(
                    " (under --min-ascii-letters {} of the letters ASCII)",
                    args.min_ascii_letters
                ),
                Verdict::Duplicate => " (the same text as an earlier kept prompt)".into(),
                Verdict::Excluded => " (a prompt of --exclude)".into(),
            };
            let name = serde_json::to_string(v).unwrap_or_default();
            format!("{n} {}{rule}", name.trim_matches('"'))
        })
        .collect()
}
