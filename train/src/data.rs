//! Self-distillation data (docs/TRAINING.md): the base model's own responses to prompts, as token
//! sequences.
//!
//! A data folder holds:
//!
//! | file            | content                                                                 |
//! |-----------------|-------------------------------------------------------------------------|
//! | `samples.jsonl` | one sample per line: `{"prompt_id", "sample", "prompt_len", "tokens"}`  |
//! | `meta.json`     | how it was made: model, prompts file, samples per prompt, max new tokens, temperature, seed |
//! | `progress.json` | only while a run is unfinished: the planned `meta.json` (`tokens` 0)      |
//!
//! A run appends each sample to `samples.jsonl` as it finishes, so a stopped run keeps its work and
//! `--resume` continues it ([`Run`]); when it completes, `samples.jsonl` is rewritten in prompt, then
//! sample order, `meta.json` written and `progress.json` removed: a folder with `meta.json` and no
//! `progress.json` is complete.
//!
//! `tokens` is the chat-templated prompt followed by the response; `prompt_len` counts the prompt
//! tokens. The fast rows trained are positions `prompt_len - 1 .. len`: the rows whose next token
//! is the model's own response (and the row after the last response token).

use crate::error::{Error, Result};
use crate::jsonl_log::{JsonlLog, read_lines};
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

/// How a data folder was generated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistillMeta {
    pub model: String,
    pub prompts: String,
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

    /// The first setting in which two runs differ (the counts aside), if any.
    pub fn differing_setting(&self, other: &DistillMeta) -> Option<&'static str> {
        [
            ("model", self.model == other.model),
            ("prompts", self.prompts == other.prompts),
            (
                "samples_per_prompt",
                self.samples_per_prompt == other.samples_per_prompt,
            ),
            (
                "max_new_tokens",
                self.max_new_tokens == other.max_new_tokens,
            ),
            ("temperature", self.temperature == other.temperature),
            ("seed", self.seed == other.seed),
        ]
        .into_iter()
        .find(|(_, same)| !same)
        .map(|(name, _)| name)
    }
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
    let path = dir.join(SAMPLES_FILE);
    let samples = read_samples(&path, vocab_size, false)?;
    if samples.is_empty() {
        return Err(Error::Data {
            file: path.display().to_string(),
            msg: "no samples".into(),
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
            "an unfinished distill-data run ({PROGRESS_FILE}, no {META_FILE}): finish it with \
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

/// A data folder being written: samples appended as they finish, resumable.
pub struct Run {
    dir: PathBuf,
    log: JsonlLog,
    /// Samples already in the folder (a resumed run) and appended since, in writing order.
    pub samples: Vec<DistillSample>,
}

impl Run {
    /// Start writing `dir` for a run planned as `planned` (`samples`: the planned count). Fresh
    /// (`resume` false): whatever the folder held is replaced. Resumed: the samples already written
    /// by a run with the same settings are kept (a torn last line dropped); other settings are
    /// refused, naming the first that differs.
    pub fn start(
        dir: &Path,
        planned: &DistillMeta,
        resume: bool,
        vocab_size: usize,
    ) -> Result<Run> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let samples_path = dir.join(SAMPLES_FILE);
        let earlier = [PROGRESS_FILE, META_FILE]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists())
            .filter(|_| resume);
        if let Some(path) = &earlier {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
            let earlier: DistillMeta = serde_json::from_str(&text).map_err(|e| Error::Data {
                file: path.display().to_string(),
                msg: format!("not a distillation meta file: {e}"),
            })?;
            if let Some(field) = earlier.differing_setting(planned) {
                return Err(Error::Data {
                    file: path.display().to_string(),
                    msg: format!(
                        "--resume: this folder was started with another `{field}`; \
                         rerun with the same settings or write a new folder"
                    ),
                });
            }
        }
        let (log, samples) = if earlier.is_some() {
            let (log, lines) = JsonlLog::resume(&samples_path)?;
            (log, check_samples(&samples_path, lines, vocab_size)?)
        } else {
            (JsonlLog::create(&samples_path)?, Vec::new())
        };
        let _ = std::fs::remove_file(dir.join(META_FILE));
        let progress = dir.join(PROGRESS_FILE);
        let text = serde_json::to_string_pretty(planned).expect("serialisable");
        std::fs::write(&progress, text + "\n").map_err(|e| Error::io(&progress, e))?;
        Ok(Run {
            dir: dir.to_path_buf(),
            log,
            samples,
        })
    }

    /// The `(prompt id, sample)` pairs already written.
    pub fn done(&self) -> std::collections::HashSet<(String, usize)> {
        self.samples
            .iter()
            .map(|s| (s.prompt_id.clone(), s.sample))
            .collect()
    }

    /// Append one finished sample (one line, written through at once).
    pub fn append(&mut self, sample: &DistillSample) -> Result<()> {
        self.log.append(sample)?;
        self.samples.push(sample.clone());
        Ok(())
    }

    /// Complete the folder: samples in `order` (prompt ids), then sample index; `meta.json`
    /// written with the final counts; `progress.json` removed.
    pub fn finish(mut self, order: &[String], mut meta: DistillMeta) -> Result<Vec<DistillSample>> {
        let rank: std::collections::HashMap<&str, usize> = order
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        self.samples
            .sort_by_key(|s| (rank.get(s.prompt_id.as_str()).copied(), s.sample));
        meta.samples = self.samples.len();
        meta.tokens = self.samples.iter().map(|s| s.tokens.len()).sum();
        write(&self.dir, &self.samples, &meta)?;
        let progress = self.dir.join(PROGRESS_FILE);
        std::fs::remove_file(&progress).map_err(|e| Error::io(&progress, e))?;
        Ok(self.samples)
    }
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
