//! One entry point for every way a user names a model: `tiny`, `tiny-moe`, `smollm2`, a HF checkpoint
//! folder, or a `.gguf` file.

use crate::ModelConfig;
use crate::base::model::Model;
use crate::base::weights::Weights;
use crate::error::{Error, Result};
use crate::io::builtin::{self, BUILTIN_NAMES, BUILTIN_VOCAB};
use crate::io::checkpoint;
use crate::io::folder_kind;
use crate::io::gguf::{self, GgufFile};
use crate::io::hub;
use crate::io::tokenizer::Tokenizer;
use std::path::Path;

/// A model with its tokenizer and a name for reports.
pub struct LoadedModel {
    pub model: Model,
    /// `None` for a HF folder without `tokenizer.json`.
    pub tokenizer: Option<Tokenizer>,
    /// What the user asked for: a built-in name, `smollm2`, or the path.
    pub name: String,
    /// Where the weights came from (file or folder), for `info` and goldens.
    pub source: String,
}

impl LoadedModel {
    /// The tokenizer, or an error saying this model has none (callers that take token ids say
    /// so).
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            Error::Invalid(format!(
                "{} has no tokenizer (no tokenizer.json in the folder)",
                self.name
            ))
        })
    }

    /// Tokens that end a generation ([`stop_tokens`]).
    pub fn stop_tokens(&self) -> Vec<u32> {
        stop_tokens(&self.model.config, self.tokenizer.as_ref())
    }
}

/// Tokens that end a generation: the config's EOS ids, then the tokenizer's end-of-turn tokens not
/// among them. Exports record the list (`stop_token_ids` in m2r2_export.json), so that a runner
/// without the tokenizer stops where `generate` does.
pub fn stop_tokens(config: &ModelConfig, tokenizer: Option<&Tokenizer>) -> Vec<u32> {
    let mut stop = config.eos_token_ids.clone();
    for id in tokenizer.map(|t| t.eos_token_ids()).unwrap_or_default() {
        if !stop.contains(&id) {
            stop.push(id);
        }
    }
    stop
}

/// Load the model named by `spec`.
pub fn load_model(spec: &str) -> Result<LoadedModel> {
    if BUILTIN_NAMES.contains(&spec) {
        return Ok(LoadedModel {
            model: builtin::builtin(spec)?,
            tokenizer: Some(Tokenizer::byte_level_builtin(BUILTIN_VOCAB)?),
            name: spec.into(),
            source: format!("built-in (seed {:#x})", builtin::BUILTIN_SEED),
        });
    }
    if spec == "smollm2" {
        let path = hub::require_smollm2()?;
        let mut loaded = load_gguf(&path)?;
        loaded.name = "smollm2".into();
        return Ok(loaded);
    }
    let path = Path::new(spec);
    if path.is_dir() {
        let wanted = "a Hugging Face checkpoint folder";
        if let Some(why) = folder_kind::lacking(path, folder_kind::HF_CONFIG_FILE, wanted) {
            return Err(Error::Invalid(why));
        }
        let model = checkpoint::load_hf_dir(path)?;
        let tokenizer_json = path.join("tokenizer.json");
        let tokenizer = if tokenizer_json.is_file() {
            Some(Tokenizer::from_file_for(
                &tokenizer_json,
                model.config.vocab_size,
            )?)
        } else {
            None
        };
        return Ok(LoadedModel {
            model,
            tokenizer,
            name: spec.into(),
            source: path.display().to_string(),
        });
    }
    if path.is_file() && is_gguf_name(path) {
        return load_gguf(path);
    }
    if path.exists() {
        return Err(Error::Invalid(format!(
            "{spec}: not a model (expected a HF checkpoint folder or a .gguf file)"
        )));
    }
    Err(Error::Invalid(format!(
        "unknown model `{spec}`: not a built-in ({}), not `smollm2`, and no such file or folder",
        BUILTIN_NAMES.join(", ")
    )))
}

/// Whether `path` is named as a GGUF file: `.gguf` in any case (`model.GGUF`).
fn is_gguf_name(path: &Path) -> bool {
    path.extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("gguf"))
}

/// A llama-architecture GGUF file with its tokenizer.
pub fn load_gguf(path: &Path) -> Result<LoadedModel> {
    let file = GgufFile::open(path)?;
    let config = gguf::config_from_gguf(&file)?;
    let weights = Weights::load(&config, &gguf::GgufSource::new(&file, &config))?;
    let tokenizer = Tokenizer::from_gguf(&file)?;
    Ok(LoadedModel {
        model: Model::new(config, weights),
        tokenizer: Some(tokenizer),
        name: path.display().to_string(),
        source: path.display().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.gguf` file is read as GGUF whatever the case of its extension; other files are not
    /// models.
    #[test]
    fn gguf_files_by_extension_in_any_case() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["m.gguf", "m.GGUF", "m.Gguf", "m.txt", "gguf"] {
            let path = dir.path().join(name);
            std::fs::write(&path, b"not a gguf file").unwrap();
            let Err(err) = load_model(path.to_str().unwrap()) else {
                panic!("{name} loaded");
            };
            let err = err.to_string();
            let read_as_gguf = err.contains("corrupt or unsupported file");
            assert_eq!(
                read_as_gguf,
                name.to_lowercase().ends_with(".gguf"),
                "{name}: {err}"
            );
        }
    }
}
