//! Prompts files as `distill-data --prompts` reads them: one JSON object per line with string
//! fields `id` and `prompt` (other fields, e.g. `distill-prompts`' `seed`, are ignored; blank lines
//! are skipped).
//!
//! Ids must be unique: a run's samples are keyed by `(prompt id, sample)`, so a resumed run would
//! take the second prompt of a repeated id for done and drop it. The prompts a run used are
//! identified by [`digest`], recorded in the data folder's `meta.json`, so `--resume` notices a
//! file whose contents changed (and accepts the same file under another path spelling).

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::Path;

/// One prompt of a prompts file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptLine {
    /// 1-based line number in the file.
    pub line: usize,
    pub id: String,
    pub prompt: String,
}

/// Every prompt of the prompts file at `path`, in file order. Refused, naming the file and line:
/// a line that is not a JSON object with string `id` and `prompt`, an id given twice (both lines
/// named), a file without prompts.
pub fn read(path: &Path) -> Result<Vec<PromptLine>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let bad = |msg: String| Error::Data {
        file: path.display().to_string(),
        msg,
    };
    let mut out: Vec<PromptLine> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("line {n}: not JSON ({e})")))?;
        let field = |name: &str| {
            value
                .get(name)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .ok_or_else(|| bad(format!("line {n}: missing string field `{name}`")))
        };
        let (id, prompt) = (field("id")?, field("prompt")?);
        if let Some(first) = seen.insert(id.clone(), n) {
            return Err(bad(format!(
                "line {n}: prompt id `{id}` is also the id of line {first}: ids must be unique \
                 (samples are keyed by prompt id)"
            )));
        }
        out.push(PromptLine {
            line: n,
            id,
            prompt,
        });
    }
    if out.is_empty() {
        return Err(bad("holds no prompts".into()));
    }
    Ok(out)
}

/// SHA-256 (hex) of the `(id, prompt)` list, in order: what identifies a run's prompts whatever
/// the file's path, formatting or extra fields.
pub fn digest(prompts: &[PromptLine]) -> String {
    let mut h = Sha256::new();
    for p in prompts {
        for text in [&p.id, &p.prompt] {
            h.update((text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        }
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_refuses_and_digests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        std::fs::write(
            &path,
            "{\"id\": \"a\", \"prompt\": \"x\", \"seed\": 1}\n\n{\"id\": \"b\", \"prompt\": \"y\"}\n",
        )
        .unwrap();
        let got = read(&path).unwrap();
        assert_eq!(
            got.iter()
                .map(|p| (p.line, p.id.as_str()))
                .collect::<Vec<_>>(),
            [(1, "a"), (3, "b")]
        );
        // the digest ignores formatting and extra fields, not the contents
        std::fs::write(
            &path,
            "{\"prompt\":\"x\",\"id\":\"a\"}\n{\"id\":\"b\",\"prompt\":\"y\"}",
        )
        .unwrap();
        let same = read(&path).unwrap();
        assert_eq!(digest(&same), digest(&got));
        std::fs::write(
            &path,
            "{\"id\":\"a\",\"prompt\":\"xy\"}\n{\"id\":\"b\",\"prompt\":\"\"}",
        )
        .unwrap();
        assert_ne!(digest(&read(&path).unwrap()), digest(&got));

        for (text, needles) in [
            (
                "{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":\"b\",\"prompt\":\"y\"}\n{\"id\":\"a\",\"prompt\":\"z\"}\n",
                &["line 3", "`a`", "line 1", "unique"][..],
            ),
            ("{\"prompt\":\"x\"}\n", &["line 1", "`id`"]),
            ("{\"id\":\"a\",\"prompt\":3}\n", &["line 1", "`prompt`"]),
            (
                "{\"id\":\"a\",\"prompt\":\"x\"}\nnot json\n",
                &["line 2", "not JSON"],
            ),
            ("\n  \n", &["holds no prompts"]),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = read(&path).unwrap_err().to_string();
            for needle in needles.iter().chain(&["p.jsonl"]) {
                assert!(err.contains(needle), "{needle}: {err}");
            }
        }
        let err = read(&dir.path().join("nope.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("nope.jsonl"), "{err}");
    }
}
