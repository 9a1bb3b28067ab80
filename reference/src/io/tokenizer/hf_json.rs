//! A tokenizer from a HF checkpoint folder: `tokenizer.json` (the `tokenizers` pipeline, used as
//! is) and, beside it, `tokenizer_config.json` for the special tokens and the chat template
//! (`chat_template.jinja` takes precedence, as in transformers 5).

use super::{SpecialToken, Tokenizer};
use crate::error::{Error, Result};
use serde::de::IgnoredAny;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

impl Tokenizer {
    /// [`Tokenizer::from_file`] for a model whose logits have `vocab_size` rows: a tokenizer with
    /// more tokens (added ones included) was made for another model, and is refused naming the
    /// file. Its ids past the model's would be out of range, and those within it would encode text
    /// to another model's tokens without any error. Fewer is fine: models often pad their
    /// vocabulary.
    pub fn from_file_for(path: &Path, vocab_size: usize) -> Result<Tokenizer> {
        let tokenizer = Self::from_file(path)?;
        if tokenizer.vocab_size() > vocab_size {
            return Err(Error::Tokenizer(format!(
                "{}: the tokenizer has {} tokens, added ones included, but the model's vocabulary \
                 has {vocab_size}: it was made for another model (copy the model's own \
                 tokenizer.json)",
                path.display(),
                tokenizer.vocab_size()
            )));
        }
        Ok(tokenizer)
    }

    /// Load `tokenizer.json` at `path`; `tokenizer_config.json` and `chat_template.jinja` in the
    /// same folder are read when present (without a template the tokenizer uses ChatML).
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let label = path.display().to_string();
        let bytes = read_bounded(path, MAX_TOKENIZER_JSON_BYTES)?.ok_or_else(|| {
            Error::Tokenizer(format!("{label}: cannot load tokenizer.json: no such file"))
        })?;
        // JSON syntax and shape first: tokenizers 0.23 panics on some syntax errors (see
        // `guard`), and reports an object it does not expect as a syntax error.
        let top = serde_json::from_slice::<BTreeMap<String, IgnoredAny>>(&bytes).map_err(|e| {
            let what = match e.is_data() {
                true => "not a tokenizer (expected a JSON object)",
                false => "not valid JSON",
            };
            Error::Tokenizer(format!("{label}: {what}: {e}"))
        })?;
        if !top.contains_key("model") {
            return Err(Error::Tokenizer(format!(
                "{label}: not a tokenizer: it has no `model` (the vocabulary and its algorithm)"
            )));
        }
        if let Some(key) = top
            .keys()
            .find(|k| !TOKENIZER_JSON_FIELDS.contains(&k.as_str()))
        {
            return Err(Error::Tokenizer(format!(
                "{label}: unknown field `{key}` (a tokenizer.json has {})",
                TOKENIZER_JSON_FIELDS.join(", ")
            )));
        }
        let inner = super::guard::guarded(&label, || tokenizers::Tokenizer::from_bytes(&bytes))?
            .map_err(|e| Error::Tokenizer(format!("{label}: cannot load tokenizer.json: {e}")))?;
        let dir = path.parent().unwrap_or(Path::new("."));

        let config_path = dir.join("tokenizer_config.json");
        let config = match read_bounded(&config_path, MAX_TOKENIZER_SIDE_FILE_BYTES)? {
            Some(text) => serde_json::from_slice::<Value>(&text).map_err(|e| {
                Error::Tokenizer(format!("{}: not valid JSON: {e}", config_path.display()))
            })?,
            None => Value::Null,
        };
        let special = |key: &str| -> Option<SpecialToken> {
            let content = match &config[key] {
                Value::String(s) => s.clone(),
                Value::Object(o) => o.get("content")?.as_str()?.to_string(),
                _ => return None,
            };
            let id = inner.token_to_id(&content)?;
            Some(SpecialToken { content, id })
        };
        let specials = [
            special("bos_token"),
            special("eos_token"),
            special("unk_token"),
            special("pad_token"),
        ];

        let jinja_path = dir.join("chat_template.jinja");
        let chat_template = match read_bounded(&jinja_path, MAX_TOKENIZER_SIDE_FILE_BYTES)? {
            Some(bytes) => Some((
                String::from_utf8(bytes).map_err(|e| {
                    Error::Tokenizer(format!("{}: not UTF-8: {e}", jinja_path.display()))
                })?,
                jinja_path.display().to_string(),
            )),
            None => template_of(&config["chat_template"]).map(|t| {
                let origin = format!("`chat_template` in {}", config_path.display());
                (t, origin)
            }),
        };
        Ok(Tokenizer::assemble(inner, specials, &[], chat_template))
    }
}

/// The top-level fields of a `tokenizer.json`; tokenizers 0.23 reports any other as a JSON syntax
/// error.
const TOKENIZER_JSON_FIELDS: [&str; 9] = [
    "version",
    "truncation",
    "padding",
    "added_tokens",
    "normalizer",
    "pre_tokenizer",
    "model",
    "post_processor",
    "decoder",
];

/// Bytes of a `tokenizer.json` at most (256 MiB; the largest in use, Gemma 3's, is 33 MB).
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 256 << 20;
/// Bytes of `tokenizer_config.json` or `chat_template.jinja` at most (16 MiB).
pub const MAX_TOKENIZER_SIDE_FILE_BYTES: u64 = 16 << 20;

/// The file's bytes, `None` when it does not exist; refused past `limit` bytes before reading.
fn read_bounded(path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    let size = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    if size > limit {
        return Err(Error::Tokenizer(format!(
            "{}: {size} bytes, more than the {limit} a tokenizer file may have",
            path.display()
        )));
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| Error::io(path, e))
}

/// `chat_template` is a string, or a list of `{name, template}` of which `default` is used.
fn template_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer with more tokens than the model's vocabulary is refused naming the file; as
    /// many or fewer load.
    #[test]
    fn a_tokenizer_larger_than_the_model_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let json_path = dir.path().join("tokenizer.json");
        let builtin = Tokenizer::byte_level_builtin(300).unwrap();
        builtin.backend().save(&json_path, false).unwrap();
        let tokens = builtin.vocab_size();
        for vocab in [tokens, tokens + 20] {
            Tokenizer::from_file_for(&json_path, vocab).unwrap();
        }
        let err = Tokenizer::from_file_for(&json_path, tokens - 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tokenizer.json"), "{err}");
        assert!(
            err.contains(&format!("has {tokens} tokens")) && err.contains("another model"),
            "{err}"
        );
    }

    #[test]
    fn round_trip_through_tokenizer_json() {
        let dir = tempfile::tempdir().unwrap();
        let builtin = Tokenizer::byte_level_builtin(300).unwrap();
        let json_path = dir.path().join("tokenizer.json");
        builtin.backend().save(&json_path, false).unwrap();

        // Without tokenizer_config.json: same ids, no special tokens known, ChatML.
        let plain = Tokenizer::from_file(&json_path).unwrap();
        let text = "<|im_start|>héllo the world 😀";
        assert_eq!(
            plain.encode(text, true).unwrap(),
            builtin.encode(text, true).unwrap()
        );
        assert_eq!(plain.eos_token_ids(), vec![258]); // <|im_end|> found by name
        assert!(plain.chat_template_is_fallback());

        let config = r#"{"eos_token": {"content": "<|endoftext|>"}, "bos_token": "<|im_start|>",
            "chat_template": [{"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"}]}"#;
        std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
        let t = Tokenizer::from_file(&json_path).unwrap();
        assert_eq!((t.bos_token_id(), t.eos_token_id()), (Some(257), Some(256)));
        assert_eq!(t.eos_token_ids(), vec![256, 258]);
        let messages = [super::super::ChatMessage::new("user", "hi")];
        assert_eq!(
            t.apply_chat_template(&messages, false).unwrap(),
            "<|im_start|>hi"
        );

        std::fs::write(
            dir.path().join("chat_template.jinja"),
            "[{{ messages[0].role }}]",
        )
        .unwrap();
        let t = Tokenizer::from_file(&json_path).unwrap();
        assert_eq!(t.apply_chat_template(&messages, false).unwrap(), "[user]");

        // a template that does not parse is named by the file (and field) it came from
        let broken = "{% for m in messages %}{{ m.content";
        std::fs::write(dir.path().join("chat_template.jinja"), broken).unwrap();
        let err = Tokenizer::from_file(&json_path)
            .unwrap()
            .check_chat_template()
            .unwrap_err()
            .to_string();
        assert!(err.contains("chat_template.jinja): syntax error"), "{err}");
        std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
        let config = serde_json::json!({ "chat_template": broken }).to_string();
        std::fs::write(dir.path().join("tokenizer_config.json"), config).unwrap();
        let err = Tokenizer::from_file(&json_path)
            .unwrap()
            .apply_chat_template(&messages, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("chat template (`chat_template` in ")
                && err.contains("tokenizer_config.json): syntax error"),
            "{err}"
        );

        std::fs::write(dir.path().join("tokenizer_config.json"), "{not json").unwrap();
        let err = Tokenizer::from_file(&json_path).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer_config.json: not valid JSON"),
            "{err}"
        );
        // Sizes past the limits are refused before reading (sparse files: nothing is written).
        std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
        let big = std::fs::File::create(dir.path().join("chat_template.jinja")).unwrap();
        big.set_len(MAX_TOKENIZER_SIDE_FILE_BYTES + 1).unwrap();
        let err = Tokenizer::from_file(&json_path).unwrap_err().to_string();
        assert!(
            err.contains("chat_template.jinja: 16777217 bytes, more than the 16777216"),
            "{err}"
        );
        let big = std::fs::File::create(&json_path).unwrap();
        big.set_len(MAX_TOKENIZER_JSON_BYTES + 1).unwrap();
        let err = Tokenizer::from_file(&json_path).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.json: 268435457 bytes, more than the"),
            "{err}"
        );

        // valid JSON that is not a tokenizer, said so rather than as tokenizers' syntax error
        for (text, want) in [
            (r#"{"foo": 1}"#, "not a tokenizer: it has no `model`"),
            (
                "[1, 2]",
                "not a tokenizer (expected a JSON object): invalid type: sequence",
            ),
            (r#"{"model": "#, "not valid JSON"),
            (
                r#"{"model": {}, "foo": 1}"#,
                "unknown field `foo` (a tokenizer.json has version,",
            ),
        ] {
            std::fs::write(&json_path, text).unwrap();
            let err = Tokenizer::from_file(&json_path).unwrap_err().to_string();
            assert!(err.contains(&format!("tokenizer.json: {want}")), "{err}");
        }

        let err = Tokenizer::from_file(&dir.path().join("missing.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("missing.json: cannot load tokenizer.json"),
            "{err}"
        );
    }
}
