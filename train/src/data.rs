//! Self-distillation data (issue 7): the base model's own responses to prompts, as token sequences.
//!
//! A data folder holds:
//!
//! | file            | content                                                                 |
//! |-----------------|-------------------------------------------------------------------------|
//! | `samples.jsonl` | one sample per line: `{"prompt_id", "sample", "prompt_len", "tokens"}`  |
//! | `meta.json`     | how it was made: model, prompts file, samples per prompt, max new tokens, temperature, seed |
//!
//! `tokens` is the chat-templated prompt followed by the response; `prompt_len` counts the prompt
//! tokens. The fast rows trained are positions `prompt_len - 1 .. len`: the rows whose next token
//! is the model's own response (and the row after the last response token).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// File of the samples.
pub const SAMPLES_FILE: &str = "samples.jsonl";
/// File of the settings the data was generated with.
pub const META_FILE: &str = "meta.json";

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
    let text = std::fs::read_to_string(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
    let meta: DistillMeta = serde_json::from_str(&text).map_err(|e| Error::Data {
        file: meta_path.display().to_string(),
        msg: format!("not a distillation meta file: {e}"),
    })?;
    let path = dir.join(SAMPLES_FILE);
    let file = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    let label = path.display().to_string();
    let mut samples = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io(&path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |msg: String| Error::Data {
            file: label.clone(),
            msg: format!("line {}: {msg}", i + 1),
        };
        let s: DistillSample = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
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
    if samples.is_empty() {
        return Err(Error::Data {
            file: label,
            msg: "no samples".into(),
        });
    }
    Ok((samples, meta))
}

/// Read several data folders (e.g. greedy and sampled responses) as one training set, in the
/// order given; each folder's meta is returned for provenance.
pub fn read_all(
    dirs: &[PathBuf],
    vocab_size: usize,
) -> Result<(Vec<DistillSample>, Vec<DistillMeta>)> {
    let mut samples = Vec::new();
    let mut metas = Vec::new();
    for dir in dirs {
        let (more, meta) = read(dir, vocab_size)?;
        samples.extend(more);
        metas.push(meta);
    }
    Ok((samples, metas))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> DistillMeta {
        DistillMeta {
            model: "tiny".into(),
            prompts: "p.jsonl".into(),
            samples_per_prompt: 1,
            max_new_tokens: 4,
            temperature: None,
            seed: 0,
            samples: 1,
            tokens: 5,
        }
    }

    #[test]
    fn round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let s = DistillSample {
            prompt_id: "a".into(),
            sample: 0,
            prompt_len: 2,
            tokens: vec![1, 2, 3, 4, 5],
        };
        write(dir.path(), std::slice::from_ref(&s), &meta()).unwrap();
        let (back, m) = read(dir.path(), 10).unwrap();
        assert_eq!(back, vec![s]);
        assert_eq!(m, meta());
        assert_eq!(back[0].first_row(), 1);
        let err = read(dir.path(), 5).unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("token 5"), "{err}");
        std::fs::write(
            dir.path().join(SAMPLES_FILE),
            "{\"prompt_id\":\"a\",\"sample\":0,\"prompt_len\":0,\"tokens\":[1]}\n",
        )
        .unwrap();
        let err = read(dir.path(), 10).unwrap_err().to_string();
        assert!(err.contains("prompt_len 0"), "{err}");
    }

    #[test]
    fn read_all_concatenates_in_order_and_names_a_bad_folder() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let sample = |id: &str, tokens: Vec<u32>| DistillSample {
            prompt_id: id.into(),
            sample: 0,
            prompt_len: 1,
            tokens,
        };
        write(a.path(), &[sample("a", vec![1, 2])], &meta()).unwrap();
        write(
            b.path(),
            &[sample("b", vec![3]), sample("c", vec![4, 5])],
            &meta(),
        )
        .unwrap();
        let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
        let (all, metas) = read_all(&dirs, 10).unwrap();
        let ids: Vec<&str> = all.iter().map(|s| s.prompt_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(metas.len(), 2);
        let missing = [a.path().to_path_buf(), a.path().join("nope")];
        let err = read_all(&missing, 10).unwrap_err().to_string();
        assert!(err.contains("nope"), "{err}");
    }
}
