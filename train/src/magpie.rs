//! Prompts from the model's own distribution (docs/TRAINING.md "Prompts from the model itself"),
//! the "Magpie" way (Xu et al. 2024, arXiv 2406.08464): render the chat template up to the start of
//! a user turn (system prompt, then the user header), let the model sample the user message until
//! it ends its turn, and keep the messages that pass a few checks. No external data is needed, and
//! the prompts are of the kind the model itself expects to answer, which is what the adapters are
//! trained on afterwards.
//!
//! A run's folder:
//!
//! | file               | content                                                              |
//! |--------------------|----------------------------------------------------------------------|
//! | `candidates.jsonl` | every sampled message as it finishes: `{"seed", "tokens", "ended"}`  |
//! | `prompts.jsonl`    | the kept prompts, `{"id", "prompt", "seed"}` (what `distill-data --prompts` reads) |
//! | `meta.json`        | the settings and how many candidates each check removed              |
//! | `progress.json`    | only while a run is unfinished: its settings, for `--resume`          |
//!
//! Candidate `i` is sampled with seed `seed + i`; selection runs over the candidates in seed order,
//! so a resumed run selects exactly what an uninterrupted one does.

use crate::error::{Error, Result};
pub use crate::jsonl_log::Start;
use crate::jsonl_log::{JsonlLog, folder_is_empty, read_lines};
use reference::Model;
use reference::base::batch::{BatchRequest, generate_batch};
use reference::base::generate::GenerateOptions;
use reference::base::sampling::SamplingParams;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

pub const CANDIDATES_FILE: &str = "candidates.jsonl";
pub const PROMPTS_FILE: &str = "prompts.jsonl";
pub const META_FILE: &str = "meta.json";
pub const PROGRESS_FILE: &str = "progress.json";

/// How candidates are sampled and which are kept (stored in `meta.json` / `progress.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MagpieSettings {
    pub model: String,
    /// The model's config hash (`ModelConfig::hash`): what `--resume` compares, since one model
    /// can be named two ways (`smollm2`, or the path to its GGUF). Absent in runs from before it
    /// was recorded; those are compared by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_hash: Option<String>,
    /// Candidates sampled.
    pub count: usize,
    pub seed: u64,
    pub temperature: f32,
    pub top_p: Option<f32>,
    /// Longest user message sampled, in tokens (a longer one is cut and dropped as unfinished).
    pub max_prompt_tokens: usize,
    pub min_chars: usize,
    pub max_chars: usize,
    /// Of the message's letters, at least this fraction must be ASCII (an English-only filter).
    pub min_ascii_letters: f64,
    /// Prompts file whose prompts are kept out (e.g. held-out evaluation prompts), if any.
    pub exclude: Option<String>,
    /// [`exclude_digest`] of the prompts kept out: what `--resume` compares, whatever the file's
    /// spelling. Absent without `--exclude`, and in runs from before it was recorded; those are
    /// compared by the file's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_sha256: Option<String>,
}

/// SHA-256 of the normalised texts of the prompts kept out, in sorted order ([`prompts::digest`]
/// of them without ids); `None` for none.
///
/// [`prompts::digest`]: crate::data::prompts::digest
pub fn exclude_digest(normalised: &std::collections::BTreeSet<String>) -> Option<String> {
    let lines: Vec<crate::data::prompts::PromptLine> = normalised
        .iter()
        .map(|text| crate::data::prompts::PromptLine {
            line: 0,
            id: String::new(),
            prompt: text.clone(),
        })
        .collect();
    (!lines.is_empty()).then(|| crate::data::prompts::digest(&lines))
}

impl MagpieSettings {
    /// Every setting in which the run that wrote `self` differs from `now`, each as
    /// `--flag (what it was, what it is now)`. The model is compared by its config hash and the
    /// `--exclude` prompts by their digest where both runs recorded one, else by name.
    pub fn differing_settings(&self, now: &MagpieSettings) -> Vec<String> {
        let show = |v: Option<String>| v.unwrap_or_else(|| "none".into());
        let mut out = Vec::new();
        match (&self.config_hash, &now.config_hash) {
            (Some(was), Some(is)) if was != is => out.push(format!(
                "--model (`{}` of config {was} there, `{}` of config {is} now: another model)",
                self.model, now.model
            )),
            (Some(_), Some(_)) => {}
            _ if self.model != now.model => {
                out.push(format!("--model ({} there, {} now)", self.model, now.model))
            }
            _ => {}
        }
        let others = [
            ("--count", self.count.to_string(), now.count.to_string()),
            ("--seed", self.seed.to_string(), now.seed.to_string()),
            (
                "--temperature",
                self.temperature.to_string(),
                now.temperature.to_string(),
            ),
            (
                "--top-p",
                show(self.top_p.map(|p| p.to_string())),
                show(now.top_p.map(|p| p.to_string())),
            ),
            (
                "--max-prompt-tokens",
                self.max_prompt_tokens.to_string(),
                now.max_prompt_tokens.to_string(),
            ),
            (
                "--min-chars",
                self.min_chars.to_string(),
                now.min_chars.to_string(),
            ),
            (
                "--max-chars",
                self.max_chars.to_string(),
                now.max_chars.to_string(),
            ),
            (
                "--min-ascii-letters",
                self.min_ascii_letters.to_string(),
                now.min_ascii_letters.to_string(),
            ),
        ];
        out.extend(
            others
                .into_iter()
                .filter(|(_, was, is)| was != is)
                .map(|(flag, was, is)| format!("{flag} ({was} there, {is} now)")),
        );
        match (&self.exclude_sha256, &now.exclude_sha256) {
            (Some(was), Some(is)) if was != is => out.push(format!(
                "--exclude ({} there, {} now: the run was started excluding other prompts, \
                 compared by content)",
                show(self.exclude.clone()),
                show(now.exclude.clone())
            )),
            (Some(_), Some(_)) => {}
            _ if self.exclude != now.exclude => out.push(format!(
                "--exclude ({} there, {} now)",
                show(self.exclude.clone()),
                show(now.exclude.clone())
            )),
            _ => {}
        }
        out
    }
}

/// One sampled user message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    pub seed: u64,
    /// The message's tokens, without the end-of-turn token.
    pub tokens: Vec<u32>,
    /// Whether the model ended its turn (an end-of-turn token) within the token limit.
    pub ended: bool,
}

/// What selection decided for a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Kept,
    /// No end of turn within `max_prompt_tokens`.
    Unfinished,
    TooShort,
    TooLong,
    /// Special-token text (`<|...|>`) inside the message.
    Template,
    NotEnglish,
    /// The same text (after [`normalise`]) as an earlier kept prompt.
    Duplicate,
    /// The same text as a prompt of the `exclude` file.
    Excluded,
}

/// A prompt's text for duplicate detection: lower case, runs of whitespace as one space, no
/// leading or trailing whitespace or punctuation.
pub fn normalise(text: &str) -> String {
    let words: Vec<String> = text.split_whitespace().map(str::to_lowercase).collect();
    words
        .join(" ")
        .trim_matches(|c: char| c.is_ascii_punctuation() || c.is_whitespace())
        .to_string()
}

/// The checks on one decoded message, duplicates aside.
pub fn check(text: &str, ended: bool, settings: &MagpieSettings) -> Verdict {
    let text = text.trim();
    let chars = text.chars().count();
    let letters: Vec<char> = text.chars().filter(|c| c.is_alphabetic()).collect();
    let ascii = letters.iter().filter(|c| c.is_ascii()).count();
    if !ended {
        Verdict::Unfinished
    } else if chars < settings.min_chars {
        Verdict::TooShort
    } else if chars > settings.max_chars {
        Verdict::TooLong
    } else if text.contains("<|") {
        Verdict::Template
    } else if letters.is_empty()
        || (ascii as f64) < settings.min_ascii_letters * letters.len() as f64
    {
        Verdict::NotEnglish
    } else {
        Verdict::Kept
    }
}

/// The verdict of every candidate, in the order given (seed order): [`check`], then exclusion and
/// duplicates among the kept ones. `texts[i]` is candidate `i`'s decoded message.
pub fn select(
    texts: &[(String, bool)],
    settings: &MagpieSettings,
    exclude: &HashSet<String>,
) -> Vec<Verdict> {
    let mut seen = HashSet::new();
    texts
        .iter()
        .map(|(text, ended)| match check(text, *ended, settings) {
            Verdict::Kept => {
                let key = normalise(text);
                if exclude.contains(&key) {
                    Verdict::Excluded
                } else if !seen.insert(key) {
                    Verdict::Duplicate
                } else {
                    Verdict::Kept
                }
            }
            other => other,
        })
        .collect()
}

/// How many candidates got each verdict.
pub fn tally(verdicts: &[Verdict]) -> BTreeMap<Verdict, usize> {
    let mut counts = BTreeMap::new();
    for v in verdicts {
        *counts.entry(*v).or_insert(0) += 1;
    }
    counts
}

/// Sample the candidates with seeds `settings.seed + i` for `i < settings.count`, except those in
/// `done`, `batch` sequences at a time, after `prefix` (the template up to the user message);
/// `on_candidate` sees each as it finishes. Each candidate is bitwise what decoding it alone gives.
pub fn sample_candidates(
    model: &Model,
    prefix: &[u32],
    settings: &MagpieSettings,
    stop_tokens: &[u32],
    batch: usize,
    done: &HashSet<u64>,
    on_candidate: &mut dyn FnMut(&Candidate),
) -> Result<()> {
    let seeds: Vec<u64> = (0..settings.count as u64)
        .map(|i| settings.seed.wrapping_add(i))
        .filter(|s| !done.contains(s))
        .collect();
    let requests: Vec<BatchRequest> = seeds
        .iter()
        .map(|&seed| BatchRequest {
            prompt: prefix.to_vec(),
            options: GenerateOptions {
                max_new_tokens: settings.max_prompt_tokens,
                stop_tokens: stop_tokens.to_vec(),
                sampling: Some(SamplingParams {
                    temperature: settings.temperature,
                    top_k: None,
                    top_p: settings.top_p,
                    seed,
                }),
            },
        })
        .collect();
    generate_batch(model, &requests, batch, &mut |r, generation| {
        let tokens = &generation.tokens;
        let ended = tokens.last().is_some_and(|t| stop_tokens.contains(t));
        let message = if ended {
            &tokens[..tokens.len() - 1]
        } else {
            &tokens[..]
        };
        on_candidate(&Candidate {
            seed: seeds[r],
            tokens: message.to_vec(),
            ended,
        });
    })?;
    Ok(())
}

/// Refuse to write `dir` as `start` asks, before any work: a fresh run over a folder that holds
/// anything (a finished run is replaced only with `--force`), a resume of a folder that holds no
/// unfinished run. Nothing is written.
pub fn check_out(dir: &Path, start: Start) -> Result<()> {
    let shown = dir.display();
    let unfinished = dir.join(PROGRESS_FILE).exists();
    let finished = !unfinished && dir.join(META_FILE).exists();
    match start {
        Start::Force => {
            folder_is_empty(dir)?;
            Ok(())
        }
        Start::Resume if unfinished => Ok(()),
        Start::Resume if !dir.exists() => Err(Error::Invalid(format!(
            "--resume: {shown} does not exist, so there is no run to continue (check the path; \
             without --resume a new run starts there)"
        ))),
        Start::Resume if finished => Err(Error::Invalid(format!(
            "--resume: {shown} is not an unfinished distill-prompts run (no {PROGRESS_FILE}): it \
             is finished; pass --force instead to sample it again"
        ))),
        Start::Resume => Err(Error::Invalid(format!(
            "--resume: {shown} is not an unfinished distill-prompts run (no {PROGRESS_FILE})"
        ))),
        Start::Fresh if folder_is_empty(dir)? => Ok(()),
        Start::Fresh if finished => Err(Error::Invalid(format!(
            "--out {shown} holds a finished distill-prompts run: pass --force to replace it, or \
             choose another --out"
        ))),
        Start::Fresh if unfinished => Err(Error::Invalid(format!(
            "--out {shown} holds an unfinished distill-prompts run: pass --resume to continue it \
             (same flags), --force to start it over, or choose another --out"
        ))),
        Start::Fresh => Err(Error::Invalid(format!(
            "--out {shown} is not empty and not a distill-prompts run (nothing for --resume): \
             choose another --out, or pass --force to write there (replacing {CANDIDATES_FILE}, \
             {PROMPTS_FILE} and {META_FILE})"
        ))),
    }
}

/// A run's candidates file: start or resume (same settings), append, read back.
pub struct CandidateLog {
    log: JsonlLog,
}

impl CandidateLog {
    /// Open `dir` for a run with `settings`, as `start` says ([`check_out`]): a fresh run needs an
    /// empty or missing folder, a forced one replaces the run's files, a resumed one needs an
    /// unfinished run's folder made with the same settings (each differing one named), and goes
    /// on with the run's record in `settings` (its spellings of the model and `--exclude`).
    /// Returns the log and the candidates already sampled (a torn last line dropped). Every check
    /// runs before the folder is changed.
    pub fn open(
        dir: &Path,
        settings: &mut MagpieSettings,
        start: Start,
    ) -> Result<(Self, Vec<Candidate>)> {
        check_out(dir, start)?;
        let progress = dir.join(PROGRESS_FILE);
        let path = dir.join(CANDIDATES_FILE);
        if start == Start::Resume {
            let text = std::fs::read_to_string(&progress).map_err(|e| Error::io(&progress, e))?;
            let planned: MagpieSettings = serde_json::from_str(&text)
                .map_err(|e| Error::Invalid(format!("{}: {e}", progress.display())))?;
            let differ = planned.differing_settings(settings);
            if !differ.is_empty() {
                return Err(Error::Invalid(format!(
                    "--resume: {} was started with other settings: {}; give the same flags",
                    dir.display(),
                    differ.join(", ")
                )));
            }
            if path.exists() {
                check_belong(&path, &read_lines(&path, true)?, &planned)?;
            }
            let (log, earlier) = JsonlLog::resume(&path)?;
            let earlier = earlier.into_iter().map(|(_, c)| c).collect();
            *settings = planned;
            return Ok((CandidateLog { log }, earlier));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        for name in [META_FILE, PROMPTS_FILE] {
            let _ = std::fs::remove_file(dir.join(name));
        }
        std::fs::write(
            &progress,
            serde_json::to_string_pretty(settings).expect("serialisable"),
        )
        .map_err(|e| Error::io(&progress, e))?;
        let log = JsonlLog::create(&path)?;
        Ok((CandidateLog { log }, Vec::new()))
    }

    /// Append one candidate (flushed: a stopped run keeps it).
    pub fn append(&mut self, c: &Candidate) -> Result<()> {
        self.log.append(c)
    }
}

/// Refuse a resumed run's candidate that is not one the run would sample: its seed outside
/// `seed..seed + count`, the same seed on an earlier line, or more tokens than
/// `max_prompt_tokens`. (Otherwise it would be selected, counted and written as a prompt of a run
/// that never sampled it.)
fn check_belong(path: &Path, lines: &[(usize, Candidate)], planned: &MagpieSettings) -> Result<()> {
    let seeds = planned.seed..planned.seed.saturating_add(planned.count as u64);
    let mut seen = HashSet::new();
    for (line, c) in lines {
        let why = if !seeds.contains(&c.seed) {
            format!(
                "its seed is not one of the run's {} seeds from --seed {}",
                planned.count, planned.seed
            )
        } else if !seen.insert(c.seed) {
            "the same seed is on an earlier line".to_string()
        } else if c.tokens.len() > planned.max_prompt_tokens {
            format!(
                "it has {} tokens, more than --max-prompt-tokens {}",
                c.tokens.len(),
                planned.max_prompt_tokens
            )
        } else {
            continue;
        };
        return Err(Error::Data {
            file: path.display().to_string(),
            msg: format!(
                "line {line} (seed {}): --resume: {why}; this file was not written by this run \
                 (rerun without --resume and with --force, or write a new folder)",
                c.seed
            ),
        });
    }
    Ok(())
}

/// One kept prompt, as `distill-data --prompts` reads it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MagpiePrompt {
    pub id: String,
    pub prompt: String,
    pub seed: u64,
}

/// What `meta.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MagpieMeta {
    pub settings: MagpieSettings,
    pub verdicts: BTreeMap<Verdict, usize>,
    pub prompts: usize,
}

/// Finish a run in `dir`: `prompts.jsonl` (the kept prompts in seed order) and `meta.json`, and
/// remove `progress.json`.
pub fn finish(dir: &Path, prompts: &[MagpiePrompt], meta: &MagpieMeta) -> Result<()> {
    let io = |e: std::io::Error| Error::io(dir, e);
    let mut text = String::new();
    for p in prompts {
        text += &serde_json::to_string(p).expect("serialisable");
        text.push('\n');
    }
    std::fs::write(dir.join(PROMPTS_FILE), text).map_err(io)?;
    std::fs::write(
        dir.join(META_FILE),
        serde_json::to_string_pretty(meta).expect("serialisable"),
    )
    .map_err(io)?;
    std::fs::remove_file(dir.join(PROGRESS_FILE)).map_err(io)
}

#[cfg(test)]
mod tests;
