//! Self-distillation data (docs/TRAINING.md): the base model's own responses to prompts, as token
//! sequences.
//!
//! A data folder holds:
//!
//! | file            | content                                                                 |
//! |-----------------|-------------------------------------------------------------------------|
//! | `samples.jsonl` | one sample per line: `{"prompt_id", "sample", "prompt_len", "tokens"}`  |
//! | `meta.json`     | how it was made: model, prompts file and the SHA-256 of its prompts ([`prompts::digest`]), samples per prompt, max new tokens, temperature, seed; the counts of samples and tokens |
//! | `progress.json` | only while a run is unfinished: the planned `meta.json` (`tokens` 0)      |
//!
//! A run appends each sample to `samples.jsonl` as it finishes, so a stopped run keeps its work and
//! `--resume` continues it ([`Run`]); when it completes, `samples.jsonl` is rewritten in prompt, then
//! sample order, `meta.json` written and `progress.json` removed: a folder with `meta.json` and no
//! `progress.json` is complete, and [`read`] refuses any other (or one whose counts disagree with
//! `samples.jsonl`). A new run refuses a folder that holds anything unless forced ([`Start`]).
//!
//! `tokens` is the chat-templated prompt followed by the response; `prompt_len` counts the prompt
//! tokens. The fast rows trained are positions `prompt_len - 1 .. len`: the rows whose next token
//! is the model's own response (and the row after the last response token).

use crate::error::{Error, Result};
pub use crate::jsonl_log::Start;
use crate::jsonl_log::read_lines;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// File of the samples.
pub const SAMPLES_FILE: &str = "samples.jsonl";
/// File of the settings the data was generated with.
pub const META_FILE: &str = "meta.json";
/// File of an unfinished run's settings.
pub const PROGRESS_FILE: &str = "progress.json";

/// One token sequence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillSample {
    pub prompt_id: String,
    /// Index of this response among the prompt's samples.
    pub sample: usize,
    pub prompt_len: usize,
    /// Prompt then response.
    pub tokens: Vec<u32>,
}

impl DistillSample {
    /// The first trained row (`prompt_len - 1`).
    pub fn first_row(&self) -> usize {
        self.prompt_len - 1
    }
}

/// The development prompts' file name (`../shared/data/dev_prompts.jsonl`): users judge the
/// speed-up on them, so no command trains or tunes on data made from them
/// ([`refuse_dev_prompts`]); measuring on them (`train --eval-data`) is what they are for.
pub const DEV_PROMPTS_FILE: &str = "dev_prompts.jsonl";

pub mod prompts;
mod run;
pub use run::{Run, check_out};

/// How a data folder was generated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillMeta {
    pub model: String,
    /// The prompts file as given on the command line.
    pub prompts: String,
    /// [`prompts::digest`] of the prompts used (after `--limit`): what `--resume` compares. Absent
    /// in folders written before it was recorded; those are compared by the prompts file's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts_sha256: Option<String>,
    pub samples_per_prompt: usize,
    pub max_new_tokens: usize,
    /// `None`: greedy.
    pub temperature: Option<f32>,
    pub seed: u64,
    pub samples: usize,
    pub tokens: usize,
}

impl DistillMeta {
    /// Whether the data was made from the development prompts (its prompts file is named
    /// [`DEV_PROMPTS_FILE`]).
    pub fn from_dev_prompts(&self) -> bool {
        Path::new(&self.prompts)
            .file_name()
            .is_some_and(|f| f == DEV_PROMPTS_FILE)
    }

    /// Every setting in which the run that wrote `self` differs from the one planned as `now`
    /// (the counts aside), each as `` `field` (--flag: what it was, what it is now)``. The prompts
    /// are compared by their digest where both runs recorded one, else by the file's path (the
    /// same file under two spellings is the same).
    pub fn differing_settings(&self, now: &DistillMeta) -> Vec<String> {
        let mut out = Vec::new();
        let differ = |out: &mut Vec<String>, field: &str, flag: &str, was: String, is: String| {
            if was != is {
                out.push(format!("`{field}` ({flag}: {was} there, {is} now)"));
            }
        };
        differ(
            &mut out,
            "model",
            "--model",
            self.model.clone(),
            now.model.clone(),
        );
        match (&self.prompts_sha256, &now.prompts_sha256) {
            (Some(was), Some(is)) => {
                if was != is {
                    out.push(format!(
                        "`prompts` (--prompts {}: its prompts differ from those of the run, \
                         sha256 {} there, {} now: the file changed since, or --limit differs)",
                        now.prompts,
                        &was[..was.len().min(12)],
                        &is[..is.len().min(12)]
                    ));
                }
            }
            _ => {
                if !same_file(&self.prompts, &now.prompts) {
                    out.push(format!(
                        "`prompts` (--prompts: {} there, {} now; this folder predates the \
                         prompts' digest, so it is matched by the file's path)",
                        self.prompts, now.prompts
                    ));
                }
            }
        }
        differ(
            &mut out,
            "samples_per_prompt",
            "--samples-per-prompt",
            self.samples_per_prompt.to_string(),
            now.samples_per_prompt.to_string(),
        );
        differ(
            &mut out,
            "max_new_tokens",
            "--max-new-tokens",
            self.max_new_tokens.to_string(),
            now.max_new_tokens.to_string(),
        );
        let temperature = |t: Option<f32>| t.map_or("greedy".to_string(), |t| t.to_string());
        differ(
            &mut out,
            "temperature",
            "--temperature",
            temperature(self.temperature),
            temperature(now.temperature),
        );
        differ(
            &mut out,
            "seed",
            "--seed",
            self.seed.to_string(),
            now.seed.to_string(),
        );
        out
    }
}

/// Whether two prompts-file paths name the same file: the same text, the same file on disk, or the
/// same path once `.` components are dropped.
fn same_file(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Ok(x), Ok(y)) = (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        return x == y;
    }
    let plain = |p: &str| -> PathBuf {
        Path::new(p)
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect()
    };
    plain(a) == plain(b)
}

/// Write `samples` and `meta` into `dir` (created if needed).
pub fn write(dir: &Path, samples: &[DistillSample], meta: &DistillMeta) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(SAMPLES_FILE);
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?);
    for s in samples {
        let line = serde_json::to_string(s).expect("serialisable");
        writeln!(out, "{line}").map_err(|e| Error::io(&path, e))?;
    }
    out.flush().map_err(|e| Error::io(&path, e))?;
    let path = dir.join(META_FILE);
    let text = serde_json::to_string_pretty(meta).expect("serialisable");
    std::fs::write(&path, text + "\n").map_err(|e| Error::io(&path, e))
}

/// Read a data folder, checking every sample against the vocabulary and its own lengths.
pub fn read(dir: &Path, vocab_size: usize) -> Result<(Vec<DistillSample>, DistillMeta)> {
    let meta_path = dir.join(META_FILE);
    let text = match std::fs::read_to_string(&meta_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || !dir.is_dir() => {
            return Err(Error::Data {
                file: dir.display().to_string(),
                msg: missing_meta(dir),
            });
        }
        Err(e) => return Err(Error::io(&meta_path, e)),
    };
    let meta: DistillMeta = serde_json::from_str(&text).map_err(|e| Error::Data {
        file: meta_path.display().to_string(),
        msg: format!("not a distillation meta file: {e}"),
    })?;
    if dir.join(PROGRESS_FILE).exists() {
        return Err(Error::Data {
            file: dir.display().to_string(),
            msg: missing_meta(dir),
        });
    }
    let path = dir.join(SAMPLES_FILE);
    let samples = read_samples(&path, vocab_size, false)?;
    if samples.is_empty() {
        return Err(Error::Data {
            file: path.display().to_string(),
            msg: "no samples".into(),
        });
    }
    let tokens: usize = samples.iter().map(|s| s.tokens.len()).sum();
    if (meta.samples, meta.tokens) != (samples.len(), tokens) {
        return Err(Error::Data {
            file: dir.display().to_string(),
            msg: format!(
                "{META_FILE} counts {} samples of {} tokens but {SAMPLES_FILE} holds {} of {tokens}: \
                 the folder was changed or cut after the run finished (make it again with \
                 `m2r2 distill-data --force --out {}` and the run's other flags)",
                meta.samples,
                meta.tokens,
                samples.len(),
                dir.display()
            ),
        });
    }
    Ok((samples, meta))
}

/// Why a folder without `meta.json` is not data to read: missing, unfinished, or something else.
fn missing_meta(dir: &Path) -> String {
    if !dir.is_dir() {
        "no such data folder (`m2r2 distill-data --out DIR` makes one)".into()
    } else if dir.join(PROGRESS_FILE).is_file() {
        format!(
            "an unfinished distill-data run ({PROGRESS_FILE}): finish it with \
             `m2r2 distill-data --resume --out {}` and the run's other flags",
            dir.display()
        )
    } else {
        format!(
            "not a distillation data folder: it has no {META_FILE} (`m2r2 distill-data` writes one)"
        )
    }
}

/// Every sample of a `samples.jsonl`, checked against the vocabulary and its own lengths. With
/// `torn_tail`, a last line without its newline that does not parse (a run stopped mid-write) is
/// dropped instead of refused.
fn read_samples(path: &Path, vocab_size: usize, torn_tail: bool) -> Result<Vec<DistillSample>> {
    check_samples(path, read_lines(path, torn_tail)?, vocab_size)
}

/// The samples of `path` (with their line numbers) checked against the vocabulary and their own
/// lengths.
fn check_samples(
    path: &Path,
    lines: Vec<(usize, DistillSample)>,
    vocab_size: usize,
) -> Result<Vec<DistillSample>> {
    let label = path.display().to_string();
    let mut samples = Vec::new();
    for (line, s) in lines {
        let bad = |msg: String| Error::Data {
            file: label.clone(),
            msg: format!("line {line}: {msg}"),
        };
        if s.prompt_len == 0 || s.prompt_len > s.tokens.len() {
            return Err(bad(format!(
                "prompt_len {} must be in 1..={} (the number of tokens)",
                s.prompt_len,
                s.tokens.len()
            )));
        }
        if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(bad(format!(
                "token {t} is outside the vocabulary (size {vocab_size})"
            )));
        }
        samples.push(s);
    }
    Ok(samples)
}

/// Read several data folders (e.g. greedy and sampled responses) as one training set, in the
/// order given; each folder's meta is returned for provenance, and its sample count (the slow-stream
/// cache keeps one file per folder).
pub fn read_all(
    dirs: &[PathBuf],
    vocab_size: usize,
) -> Result<(Vec<DistillSample>, Vec<DistillMeta>, Vec<usize>)> {
    let (mut samples, mut metas, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for dir in dirs {
        let (more, meta) = read(dir, vocab_size)?;
        counts.push(more.len());
        samples.extend(more);
        metas.push(meta);
    }
    Ok((samples, metas, counts))
}

/// Refuse data folder `dir`, given as `flag`, when it was made from the development prompts:
/// `purpose` says what the command does with it (e.g. "train-arla calibrates its thresholds on it").
pub fn refuse_dev_prompts(flag: &str, dir: &Path, meta: &DistillMeta, purpose: &str) -> Result<()> {
    if !meta.from_dev_prompts() {
        return Ok(());
    }
    Err(Error::Data {
        file: dir.join(META_FILE).display().to_string(),
        msg: format!(
            "{flag} {} was made from {}: {purpose}, and the development prompts are for \
             evaluation only (use held-out data of the training distribution, e.g. \
             data/distill/smollm2-magpie-val)",
            dir.display(),
            meta.prompts
        ),
    })
}

/// The distinct prompts of `samples` (token ids up to `prompt_len`).
fn prompts(samples: &[DistillSample]) -> HashSet<&[u32]> {
    samples.iter().map(|s| &s.tokens[..s.prompt_len]).collect()
}

/// Refuse held-out `held` (from `held_dir`, given as `flag`) when any of its prompts also starts a
/// sample of the data the command trains on (`train`, from `train_dirs`): its figures would not
/// be held out.
pub fn refuse_shared_prompts(
    train: &[DistillSample],
    train_dirs: &[PathBuf],
    held: &[DistillSample],
    flag: &str,
    held_dir: &Path,
) -> Result<()> {
    let held = prompts(held);
    let shared = held.intersection(&prompts(train)).count();
    if shared == 0 {
        return Ok(());
    }
    let dirs: Vec<String> = train_dirs.iter().map(|d| d.display().to_string()).collect();
    Err(Error::Data {
        file: held_dir.join(SAMPLES_FILE).display().to_string(),
        msg: format!(
            "{flag}: {shared} of its {} prompts are also prompts of the training data (--data \
             {}): held-out figures need held-out prompts",
            held.len(),
            dirs.join(",")
        ),
    })
}

#[cfg(test)]
mod tests;
