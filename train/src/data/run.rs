//! A data folder being written ([`Run`]): samples appended as they finish, `--resume` continuing
//! a stopped run, a new run refusing a folder that holds anything unless forced ([`Start`]).

use super::{
    DistillMeta, DistillSample, META_FILE, PROGRESS_FILE, SAMPLES_FILE, check_samples, write,
};
use crate::error::{Error, Result};
use crate::jsonl_log::{JsonlLog, Start, folder_is_empty, read_lines};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// A data folder being written: samples appended as they finish, resumable.
pub struct Run {
    dir: PathBuf,
    log: JsonlLog,
    /// Samples already in the folder (a resumed run) and appended since, in writing order.
    pub samples: Vec<DistillSample>,
}

/// What a folder holds, for a run about to write it.
enum Holds {
    /// Missing or empty.
    Nothing,
    /// A finished run (`meta.json`, no `progress.json`) of this many samples.
    Finished(usize),
    /// An unfinished run (`progress.json`).
    Unfinished,
    /// Something else.
    Other,
}

fn holds(dir: &Path) -> Result<Holds> {
    if folder_is_empty(dir)? {
        return Ok(Holds::Nothing);
    }
    if dir.join(PROGRESS_FILE).exists() {
        return Ok(Holds::Unfinished);
    }
    let meta = dir.join(META_FILE);
    if meta.exists() {
        let samples = std::fs::read_to_string(&meta)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("samples").and_then(|n| n.as_u64()))
            .unwrap_or(0);
        return Ok(Holds::Finished(samples as usize));
    }
    Ok(Holds::Other)
}

/// Refuse to write `dir` as `start` asks, before any work: a fresh run over a folder that holds
/// anything (a finished run is replaced only with `--force`, an unfinished one is continued with
/// `--resume`), a resume of a folder that holds no run. Nothing is written.
pub fn check_out(dir: &Path, start: Start) -> Result<()> {
    let shown = dir.display();
    match (start, holds(dir)?) {
        (Start::Force, _)
        | (Start::Fresh, Holds::Nothing)
        | (Start::Resume, Holds::Finished(_) | Holds::Unfinished) => Ok(()),
        (Start::Fresh, Holds::Finished(n)) => Err(Error::Invalid(format!(
            "--out {shown} holds a finished distill-data run ({n} samples): pass --force to \
             replace it, or choose another --out"
        ))),
        (Start::Fresh, Holds::Unfinished) => Err(Error::Invalid(format!(
            "--out {shown} holds an unfinished distill-data run ({PROGRESS_FILE}): pass --resume \
             to continue it (same flags), --force to start it over, or choose another --out"
        ))),
        (Start::Fresh, Holds::Other) => Err(Error::Invalid(format!(
            "--out {shown} is not empty and holds no distill-data run: choose an empty or new \
             folder, or pass --force to write there (replacing {SAMPLES_FILE} and {META_FILE})"
        ))),
        (Start::Resume, Holds::Nothing) if !dir.exists() => Err(Error::Invalid(format!(
            "--resume: {shown} does not exist, so there is no run to continue (check the path; \
             without --resume a new run starts there)"
        ))),
        (Start::Resume, Holds::Nothing | Holds::Other) => Err(Error::Invalid(format!(
            "--resume: {shown} holds no distill-data run (no {PROGRESS_FILE} or {META_FILE}) to \
             continue (check the path; without --resume a new run starts in an empty folder)"
        ))),
    }
}

impl Run {
    /// Start writing `dir` for a run planned as `planned` (`samples`: the planned count) over
    /// `prompts` (`(id, prompt tokens)`), as `start` says ([`check_out`]). Fresh or forced:
    /// nothing is kept. Resumed: the samples already written by a run with the same settings are
    /// kept (a torn last line dropped); other settings are refused naming each that differs, and
    /// so is a sample whose prompt id, index or prompt tokens are not those of `prompts`. Every
    /// check runs before the folder is changed.
    pub fn start(
        dir: &Path,
        planned: &DistillMeta,
        start: Start,
        vocab_size: usize,
        prompts: &[(String, Vec<u32>)],
    ) -> Result<Run> {
        check_out(dir, start)?;
        let samples_path = dir.join(SAMPLES_FILE);
        let earlier = [PROGRESS_FILE, META_FILE]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.exists())
            .filter(|_| start == Start::Resume);
        let kept = if let Some(path) = &earlier {
            let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
            let earlier: DistillMeta = serde_json::from_str(&text).map_err(|e| Error::Data {
                file: path.display().to_string(),
                msg: format!("not a distillation meta file: {e}"),
            })?;
            let differ = earlier.differing_settings(planned);
            if !differ.is_empty() {
                return Err(Error::Data {
                    file: path.display().to_string(),
                    msg: format!(
                        "--resume: this folder was started with other settings: {}; rerun with \
                         the same settings, or write a new folder",
                        differ.join(", ")
                    ),
                });
            }
            let lines = if samples_path.exists() {
                read_lines(&samples_path, true)?
            } else {
                Vec::new()
            };
            let kept = check_samples(&samples_path, lines.clone(), vocab_size)?;
            check_belong(&samples_path, &lines, planned, prompts)?;
            Some(kept)
        } else {
            None
        };
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let (log, samples) = match kept {
            Some(kept) => (JsonlLog::resume::<DistillSample>(&samples_path)?.0, kept),
            None => (JsonlLog::create(&samples_path)?, Vec::new()),
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

/// Refuse a resumed run's sample that is not one the run would make: its prompt id not among
/// `prompts`, its index not below the samples per prompt, its prompt tokens not the prompt's, or
/// the same `(prompt id, sample)` twice.
fn check_belong(
    path: &Path,
    lines: &[(usize, DistillSample)],
    planned: &DistillMeta,
    prompts: &[(String, Vec<u32>)],
) -> Result<()> {
    let by_id: HashMap<&str, &[u32]> = prompts
        .iter()
        .map(|(id, tokens)| (id.as_str(), tokens.as_slice()))
        .collect();
    let mut seen = HashSet::new();
    for (line, s) in lines {
        let why = match by_id.get(s.prompt_id.as_str()) {
            None => Some("its prompt id is not one of --prompts (after --limit)".to_string()),
            Some(_) if s.sample >= planned.samples_per_prompt => Some(format!(
                "its sample index is not below --samples-per-prompt {}",
                planned.samples_per_prompt
            )),
            Some(tokens) if s.tokens.get(..s.prompt_len) != Some(*tokens) => {
                Some("its prompt tokens are not those of the prompt with that id now".to_string())
            }
            Some(_) if !seen.insert((s.prompt_id.as_str(), s.sample)) => {
                Some("the same prompt id and sample is on an earlier line".to_string())
            }
            Some(_) => None,
        };
        if let Some(why) = why {
            return Err(Error::Data {
                file: path.display().to_string(),
                msg: format!(
                    "line {line} (prompt `{}`, sample {}): --resume: {why}; this folder was made \
                     from other prompts (rerun without --resume and with --force, or write a new \
                     folder)",
                    s.prompt_id, s.sample
                ),
            });
        }
    }
    Ok(())
}
