//! An append-only JSON-lines file that a stopped run continues: the one mechanism behind
//! `distill-data`'s `samples.jsonl` ([`crate::data::Run`]) and `distill-prompts`'
//! `candidates.jsonl` ([`crate::magpie::CandidateLog`]).
//!
//! Each record is one line, written and flushed as soon as it exists, so a run stopped at any
//! moment keeps everything it finished. The only damage a stop can do is a torn last line: one
//! without its newline that does not parse. [`JsonlLog::resume`] drops exactly that line (and
//! rewrites the file without it, so it is not appended after); any other line that does not parse
//! is refused, naming the file and the line.

use crate::error::{Error, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a run that writes a folder (`distill-data`, `distill-prompts`) treats what the folder
/// already holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A new run: the folder must be missing or empty (nothing is overwritten).
    Fresh,
    /// A new run over whatever the folder holds (`--force`): the run's own files are replaced.
    Force,
    /// Continue the run the folder holds (`--resume`), with the same settings.
    Resume,
}

impl Start {
    /// From the `--resume` and `--force` flags (which exclude each other).
    pub fn from_flags(resume: bool, force: bool) -> Start {
        match (resume, force) {
            (true, _) => Start::Resume,
            (false, true) => Start::Force,
            (false, false) => Start::Fresh,
        }
    }
}

/// Whether `dir` holds nothing (missing, or an empty folder); an error for a path that exists
/// and is not a folder.
pub fn folder_is_empty(dir: &Path) -> Result<bool> {
    if !dir.exists() {
        return Ok(true);
    }
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "--out {}: it exists and is not a folder",
            dir.display()
        )));
    }
    Ok(std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .next()
        .is_none())
}

/// A JSON-lines file open for appending.
pub struct JsonlLog {
    path: PathBuf,
    file: File,
}

impl JsonlLog {
    /// A new, empty log at `path` (whatever was there is replaced).
    pub fn create(path: &Path) -> Result<JsonlLog> {
        let file = File::create(path).map_err(|e| Error::io(path, e))?;
        Ok(JsonlLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Continue the log at `path` (a missing file is an empty log): its records in file order,
    /// with their 1-based line numbers for the caller's own checks. A torn last line is dropped and
    /// the file rewritten without it.
    pub fn resume<T: Serialize + DeserializeOwned>(
        path: &Path,
    ) -> Result<(JsonlLog, Vec<(usize, T)>)> {
        let records = if path.exists() {
            read_lines(path, true)?
        } else {
            Vec::new()
        };
        let mut log = JsonlLog::create(path)?;
        for (_, record) in &records {
            log.append(record)?;
        }
        Ok((log, records))
    }

    /// Append one record as a line, flushed at once.
    pub fn append<T: Serialize>(&mut self, record: &T) -> Result<()> {
        let line = serde_json::to_string(record).expect("serialisable") + "\n";
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|e| Error::io(&self.path, e))
    }
}

/// Every record of a JSON-lines file with its 1-based line number; blank lines are skipped. With
/// `torn_tail`, a last line without its newline that does not parse (a run stopped mid-write) is
/// dropped instead of refused.
pub fn read_lines<T: DeserializeOwned>(path: &Path, torn_tail: bool) -> Result<Vec<(usize, T)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut records = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(record) => records.push((i + 1, record)),
            Err(_) if torn_tail && i + 1 == lines.len() && !line.ends_with('\n') => break,
            Err(e) => {
                return Err(Error::Data {
                    file: path.display().to_string(),
                    msg: format!("line {}: {e}", i + 1),
                });
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Record {
        n: u32,
    }

    /// A stopped log keeps its lines; resuming drops a torn last line (and only that), rewrites
    /// the file without it and appends after the kept ones.
    #[test]
    fn resume_drops_only_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let (_, none) = JsonlLog::resume::<Record>(&path).unwrap();
        assert!(none.is_empty(), "a missing file is an empty log");
        let mut log = JsonlLog::create(&path).unwrap();
        log.append(&Record { n: 1 }).unwrap();
        log.append(&Record { n: 2 }).unwrap();
        drop(log);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text += "{\"n\": ";
        std::fs::write(&path, &text).unwrap();

        let (mut log, kept) = JsonlLog::resume::<Record>(&path).unwrap();
        assert_eq!(kept, [(1, Record { n: 1 }), (2, Record { n: 2 })]);
        log.append(&Record { n: 3 }).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n"
        );

        // A bad line that is not the torn tail is refused by file and line.
        std::fs::write(&path, "{\"n\":1}\nnot json\n{\"n\":3}\n").unwrap();
        let err = JsonlLog::resume::<Record>(&path).err().unwrap().to_string();
        assert!(err.contains("log.jsonl") && err.contains("line 2"), "{err}");
        // A last line with its newline was written whole: refused, not dropped.
        std::fs::write(&path, "{\"n\":1}\n{\"n\": \n").unwrap();
        assert!(JsonlLog::resume::<Record>(&path).is_err());
        assert!(read_lines::<Record>(&path, false).is_err());
    }
}
