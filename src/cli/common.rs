//! What several commands share: the `--model` argument and loading, the prompt arguments
//! (`--prompt [--chat]` or `--tokens`), prompts files (`{"id", "prompt"}` per line), error
//! printing, number formatting and output folders.

use crate::cli::args::model::{PromptArgs, TokenIds};
use crate::cli::progress;
use anyhow::{Context, Result, anyhow, bail};
use reference::io::load::{LoadedModel, load_model};
use reference::io::tokenizer::{ChatMessage, Tokenizer};
use std::io::BufRead;
use std::time::Instant;

/// Load a model, with a spinner while it loads (on a terminal) and a one-line summary on stderr.
pub fn load(spec: &str) -> Result<LoadedModel> {
    let spinner = progress::spinner(format!("loading {spec}"));
    let start = Instant::now();
    let loaded = load_model(spec).with_context(|| format!("cannot load model `{spec}`"));
    spinner.finish_and_clear();
    let loaded = loaded?;
    eprintln!(
        "loaded {} ({} parameters, {} layers) from {} in {:.2} s",
        loaded.name,
        count(loaded.model.config.parameter_count() as f64),
        loaded.model.config.num_hidden_layers,
        loaded.source,
        start.elapsed().as_secs_f64()
    );
    Ok(loaded)
}

/// The prompt's token ids. Text is encoded with the model's tokenizer: plain text with its special
/// tokens added (HF `tokenizer(text)`), chat text rendered by the chat template and then encoded
/// without adding special tokens again (HF `apply_chat_template(..., tokenize=True)`, whose template
/// already writes them).
pub fn prompt_tokens(loaded: &LoadedModel, args: &PromptArgs) -> Result<Vec<u32>> {
    prompt_tokens_with(loaded.tokenizer(), args)
}

/// [`prompt_tokens`] with the tokenizer given directly (its error is reported only when text needs
/// encoding).
pub fn prompt_tokens_with(
    tokenizer: reference::Result<&Tokenizer>,
    args: &PromptArgs,
) -> Result<Vec<u32>> {
    let tokens = match (&args.tokens, &args.prompt) {
        (Some(TokenIds(ids)), _) => ids.clone(),
        (None, Some(text)) => {
            let tokenizer =
                tokenizer.map_err(|e| anyhow!("{e}; pass --tokens instead of --prompt"))?;
            if args.chat {
                let messages = [ChatMessage::new("user", text.as_str())];
                let rendered = tokenizer
                    .apply_chat_template(&messages, true)
                    .context("cannot apply the chat template")?;
                tokenizer.encode(&rendered, false)?
            } else {
                tokenizer.encode(text, true)?
            }
        }
        (None, None) => bail!("give a prompt: --prompt TEXT or --tokens IDS"),
    };
    if tokens.is_empty() {
        bail!("the prompt encodes to no tokens: give a non-empty prompt");
    }
    Ok(tokens)
}

/// `error` and its causes, `: `-separated, skipping a cause whose text the message already holds.
/// An error that exits with its own code instead of 1 (`golden check`: 2 when a golden could not
/// be checked at all, as opposed to 1 for a mismatch).
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

pub fn error_chain(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// `134.5 M`-style counts.
pub fn count(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2} G", n / 1e9),
        n if n >= 1e6 => format!("{:.1} M", n / 1e6),
        n if n >= 1e4 => format!("{:.1} k", n / 1e3),
        n => format!("{n}"),
    }
}

/// Decimal bytes: `538.1 MB`.
pub fn bytes(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.2} GB", n / 1e9),
        n if n >= 1e6 => format!("{:.1} MB", n / 1e6),
        n if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        n => format!("{n} B"),
    }
}

/// Print one JSON value as the whole of stdout. Serialised directly, not through
/// `serde_json::Value`: that widens every `f32` to `f64`, so a threshold of 0.9 printed as
/// 0.8999999761581421 while `m2r2_config.json` (written directly) said 0.9.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", json_text(value)?);
    Ok(())
}

/// What [`print_json`] prints.
fn json_text(value: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string_pretty(value).context("cannot serialise the JSON report")
}

/// Whether `a` and `b` name the same existing folder (any spelling of its path).
pub fn same_folder(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// `--force`: clear the M2R2 weights and trainer files of `dir` before other weights are written
/// there ([`train::checkpoint_files::clear_weights`]), saying what went.
pub fn report_cleared(dir: &std::path::Path) -> Result<()> {
    let removed = train::checkpoint_files::clear_weights(dir)
        .with_context(|| format!("--force: cannot clear {}", dir.display()))?;
    if !removed.is_empty() {
        eprintln!(
            "--force: removed {} from {}",
            removed.join(", "),
            dir.display()
        );
    }
    Ok(())
}

/// Refuse an output folder (`flag`: `--out`) that could not be written, before any long work: a
/// path that is, or lies below, something other than a folder, or a distillation data folder.
pub fn check_out_folder(path: &std::path::Path, flag: &str) -> Result<()> {
    let shown = path.display();
    // the nearest part of the path that exists must be a folder
    if let Some(existing) = path
        .ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        && !existing.is_dir()
    {
        anyhow::bail!(
            "{flag} {shown}: `{}` exists and is not a folder",
            existing.display()
        );
    }
    if path.join("samples.jsonl").exists() {
        anyhow::bail!("{flag} {shown} holds distillation data: choose another folder");
    }
    Ok(())
}

/// Refuse a low-rank width (`flag`: `--rank`, `--arla-latent`) above the model's hidden size
/// `hidden`: a map through more dimensions than the residual has adds parameters (and memory),
/// never rank.
pub fn check_low_rank(flag: &str, value: usize, hidden: usize) -> Result<()> {
    if value > hidden {
        anyhow::bail!(
            "{flag} {value} is wider than the model's hidden size {hidden}: give at most {hidden}"
        );
    }
    Ok(())
}

/// Refuse `--seed S` when a run's seeds `S + i` for its `count` `what` (candidates, samples) pass
/// 2^64 - 1: they would wrap around to 0, 1, ..., another run's seeds, and so its samples.
pub fn check_seed_range(seed: u64, count: usize, what: &str) -> Result<()> {
    let last = (count as u64).saturating_sub(1);
    if seed.checked_add(last).is_none() {
        anyhow::bail!(
            "--seed {seed}: the {count} {what} of this run take seeds {seed} + i, which pass \
             2^64 - 1 and would wrap around to the seeds 0, 1, ... of another run: give a --seed \
             of at most {}",
            u64::MAX - last
        );
    }
    Ok(())
}

/// The reference's context error (which names no flag) with the flag that sets the new tokens
/// (`--max-new-tokens`, `--steps`, ...) named; any other error as it is.
pub fn name_budget_flag(error: anyhow::Error, what: &str, flag: &str) -> anyhow::Error {
    match error.downcast_ref::<reference::error::Error>() {
        Some(&reference::error::Error::ContextOverflow { needed, capacity }) => anyhow::anyhow!(
            "{what} needs {needed} positions but the context holds {capacity} (shorten the \
             prompt or lower {flag})"
        ),
        _ => error,
    }
}

/// The reference's error for a command that decodes nothing new (`logits`, `analyze`): its
/// context error without the advice to ask for fewer new tokens; any other error as it is.
pub fn prompt_only(error: reference::Error) -> anyhow::Error {
    match error {
        reference::Error::ContextOverflow { needed, capacity } => anyhow::anyhow!(
            "the prompt has {needed} tokens but the context holds {capacity}: shorten the prompt"
        ),
        e => e.into(),
    }
}

/// Create the folder an output file goes in (`--out`, `--junit`), as `mkdir -p` would; nothing
/// for a bare file name. A part of the path that is a file is named as such (the system's own
/// words are "File exists").
pub fn create_parent(path: &std::path::Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Some(file) = parent
            .ancestors()
            .find(|p| !p.as_os_str().is_empty() && p.exists())
            .filter(|p| !p.is_dir())
        {
            anyhow::bail!(
                "cannot create {}: {} is a file, not a folder",
                parent.display(),
                file.display()
            );
        }
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    Ok(())
}

/// Refuse a `--plot` path before the work it draws: plots are SVG, so the name must end in
/// `.svg` (a `.png` of SVG text opens nowhere), and it must not be a folder; its folder is
/// created.
pub fn check_plot(path: &std::path::Path) -> Result<()> {
    let shown = path.display();
    if !path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"))
    {
        anyhow::bail!("--plot {shown}: plots are drawn as SVG: give a file name ending in .svg");
    }
    if path.is_dir() {
        anyhow::bail!("--plot {shown} is a folder: give a file name ending in .svg");
    }
    create_parent(path)
}

/// `(line, id, prompt text)` of every prompt of a prompts file, `line` 1-based (blank lines hold
/// none), for errors about a prompt.
pub fn read_prompts(path: &std::path::Path) -> Result<Vec<(usize, String, String)>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |what: &str| format!("{} line {}: {what}", path.display(), i + 1);
        let value: serde_json::Value =
            serde_json::from_str(&line).with_context(|| bad("not JSON"))?;
        let field = |name: &str| {
            value
                .get(name)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .with_context(|| bad(&format!("missing string field `{name}`")))
        };
        out.push((i + 1, field("id")?, field("prompt")?));
    }
    if out.is_empty() {
        bail!("{} holds no prompts", path.display());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `f32` prints as the shortest decimal that reads back to it, as in the config files
    /// (tune-drafting's report once said 0.8999999761581421 for the 0.9 it wrote).
    #[test]
    fn f32_fields_print_as_written() {
        let config = reference::m2r2::config::DynamicDraftConfig {
            gate: reference::m2r2::exit_gate::GateKind::Arla,
            threshold: 0.9,
        };
        let text = json_text(&config).unwrap();
        assert!(text.contains("\"threshold\": 0.9\n"), "{text}");
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["threshold"].as_f64(), Some(0.9));
    }

    #[test]
    fn error_chain_skips_repeated_causes() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let error = anyhow::Error::new(io)
            .context("f.bin: gone")
            .context("cannot load model `f`");
        assert_eq!(error_chain(&error), "cannot load model `f`: f.bin: gone");
    }
}
