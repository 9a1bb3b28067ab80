//! The check that the model's context holds every sample a command runs, made once the data meets
//! the model (`train`, `train-arla`, `tune-drafting`), before any pass: a sample too long would
//! otherwise stop the slow stream or the trace midway with the cache's error, which names neither
//! the file nor the line, and whose advice is `generate`'s.

use super::{DistillSample, SAMPLES_FILE};
use crate::error::{Error, Result};
use crate::jsonl_log::read_lines;
use std::path::PathBuf;

/// What a command needs of the model's context for each sample.
pub struct ContextNeed<'a> {
    /// The model's context in positions (`max_position_embeddings`).
    pub context: usize,
    /// Positions a sample is run in beyond its tokens, and why, for the message (`tune-drafting`
    /// traces with one more); `None`: exactly its tokens (the slow stream, ARLA's exit states).
    pub extra: Option<(usize, &'a str)>,
    /// What to do about a sample that does not fit, for the message.
    pub advice: &'a str,
}

/// The advice for a command that runs each sample as it is: `distill-data` keeps every sample of
/// a model within its context, so a longer one was made for another model, or edited.
const SHORTEN_DATA: &str = "remove the line, or make the data again with `m2r2 distill-data` \
                                and this model, which keeps every sample within its context";

impl ContextNeed<'static> {
    /// A command that runs each sample in exactly its tokens (the slow stream of `train`, ARLA's
    /// exit states) in a context of `context` positions.
    pub fn exact(context: usize) -> Self {
        ContextNeed {
            context,
            extra: None,
            advice: SHORTEN_DATA,
        }
    }
}

impl ContextNeed<'_> {
    /// Positions `sample` is run in.
    fn positions(&self, sample: &DistillSample) -> usize {
        sample.tokens.len() + self.extra.map_or(0, |(n, _)| n)
    }

    /// Why `sample` does not fit, without its place.
    fn message(&self, sample: &DistillSample) -> String {
        let (tokens, context) = (sample.tokens.len(), self.context);
        let run = match self.extra {
            Some((n, why)) => format!(", and {why}: {} positions", tokens + n),
            None => String::new(),
        };
        format!(
            "the sample has {tokens} tokens{run}, more than the model's context of {context} \
             positions ({})",
            self.advice
        )
    }
}

/// Refuse the first of `samples` that needs more positions than `need.context`, naming its file
/// and line. `samples` are those [`read_all`](super::read_all) read from `dirs`, in order, perhaps
/// cut after (`--limit`, `--max-new-tokens`): the line is found again by the sample's place, on
/// the error path only, so the usual run reads nothing twice.
pub fn check_context(
    dirs: &[PathBuf],
    samples: &[DistillSample],
    need: &ContextNeed,
) -> Result<()> {
    let Some(i) = samples
        .iter()
        .position(|s| need.positions(s) > need.context)
    else {
        return Ok(());
    };
    let sample = &samples[i];
    Err(match locate(dirs, i) {
        Some((file, line)) => Error::Data {
            file: file.display().to_string(),
            msg: format!("line {line}: {}", need.message(sample)),
        },
        // the folder changed since it was read: name the sample instead
        None => Error::Data {
            file: folders(dirs),
            msg: format!(
                "sample {} (prompt {}): {}",
                i + 1,
                sample.prompt_id,
                need.message(sample)
            ),
        },
    })
}

/// The `samples.jsonl` and line number of sample `index` of the folders `dirs` read in order
/// (blank lines are skipped by the reader, so the line is not the index); `None` when the files
/// no longer hold that many samples.
fn locate(dirs: &[PathBuf], mut index: usize) -> Option<(PathBuf, usize)> {
    for dir in dirs {
        let path = dir.join(SAMPLES_FILE);
        let lines = read_lines::<DistillSample>(&path, false).ok()?;
        match lines.get(index) {
            Some(&(line, _)) => return Some((path, line)),
            None => index -= lines.len(),
        }
    }
    None
}

/// `dirs` as one comma-separated label.
fn folders(dirs: &[PathBuf]) -> String {
    let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    names.join(",")
}
