//! Hostile inputs (docs/TESTING.md "Hostile inputs and fuzzing"): one entry point per loader, bytes
//! in, `Result` out and ignored. The fuzz targets in `fuzz/` (cargo-fuzz / libFuzzer), the corpus
//! replay in CI (`tests/tests/fuzz_replay.rs`) and the proptest mutation harness all call [`run`],
//! so a finding of one is checked by the others.
//!
//! A file loader takes the bytes as the file. A folder loader takes them as one of the folder's
//! files, picked by the first byte (modulo the number of files), the others being a valid folder
//! made by [`seeds`]: the fuzzer then mutates one file at a time of an otherwise loadable folder,
//! which is where the checks between files (shapes against configs, ids against vocabularies) are.

mod folder;
mod seeds;

pub use seeds::seeds;

use folder::Folder;
use reference::golden::Golden;
use reference::io::gguf::reader::GgufFile;
use reference::io::tokenizer::{ChatMessage, Tokenizer};
use reference::m2r2::weights::M2r2Weights;
use std::path::Path;

/// A loader under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// GGUF reader: header, metadata, tensor table, every tensor dequantised.
    Gguf,
    /// A llama GGUF loaded as a model with its tokenizer and chat template (`load_gguf`).
    GgufModel,
    /// A HF checkpoint folder: `config.json`, `model.safetensors`.
    HfCheckpoint,
    /// A sharded HF checkpoint: `model.safetensors.index.json` and two shards.
    HfSharded,
    /// `config.json` alone (transformers 4.x and 5.x layouts).
    HfConfig,
    /// `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`: loaded, encode, decode,
    /// chat template rendered.
    Tokenizer,
    /// A chat template's text, rendered with a conversation.
    ChatTemplate,
    /// A PEFT LoRA folder: `adapter_config.json`, `adapter_model.safetensors`.
    Peft,
    /// An M2R2 weights folder: `m2r2_config.json`, the PEFT files, `arla.safetensors`,
    /// `draft_head.json`.
    M2r2Folder,
    /// A golden file.
    Golden,
    /// An ONNX export folder: `m2r2_export.json`, `draft_head.json`, the tokenizer files.
    ExportFolder,
}

impl Target {
    pub const ALL: [Target; 11] = [
        Target::Gguf,
        Target::GgufModel,
        Target::HfCheckpoint,
        Target::HfSharded,
        Target::HfConfig,
        Target::Tokenizer,
        Target::ChatTemplate,
        Target::Peft,
        Target::M2r2Folder,
        Target::Golden,
        Target::ExportFolder,
    ];

    /// The name of the fuzz target and of its corpus folders.
    pub fn name(self) -> &'static str {
        match self {
            Target::Gguf => "gguf",
            Target::GgufModel => "gguf_model",
            Target::HfCheckpoint => "hf_checkpoint",
            Target::HfSharded => "hf_sharded",
            Target::HfConfig => "hf_config",
            Target::Tokenizer => "tokenizer",
            Target::ChatTemplate => "chat_template",
            Target::Peft => "peft",
            Target::M2r2Folder => "m2r2_folder",
            Target::Golden => "golden",
            Target::ExportFolder => "export_folder",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Feed `data` to `target`'s loader: `true` when it loaded (and the tokenizer, if any, worked),
/// `false` on an error. Errors are the expected outcome of most inputs; a panic, a hang or an
/// allocation the file's size does not justify is a finding.
pub fn run(target: Target, data: &[u8]) -> bool {
    match target {
        Target::Gguf => GgufFile::from_bytes("fuzz.gguf".into(), data.to_vec()).is_ok_and(|file| {
            file.tensor_infos()
                .iter()
                .map(|info| file.tensor_f32(&info.name).is_ok())
                .fold(true, |a, b| a & b)
        }),
        Target::HfConfig => {
            let text = String::from_utf8_lossy(data);
            reference::ModelConfig::from_hf_json(&text, "config.json").is_ok()
        }
        Target::Golden => Folder::with_file(target, 0, data, |dir| {
            Golden::read(&dir.join(seeds::GOLDEN_FILE)).is_ok()
        }),
        // The template as `chat_template.jinja` of a valid tokenizer folder.
        Target::ChatTemplate => Folder::with_file(target, 2, data, tokenizer_folder),
        _ => Folder::with(target, data, |dir| match target {
            Target::GgufModel => reference::io::load::load_gguf(&dir.join("model.gguf"))
                .is_ok_and(|loaded| loaded.tokenizer().is_ok_and(use_tokenizer)),
            Target::HfCheckpoint | Target::HfSharded => {
                reference::io::checkpoint::load_hf_dir(dir).is_ok()
            }
            Target::Tokenizer => tokenizer_folder(dir),
            Target::Peft => reference::io::peft::PeftLora::read(dir, &seeds::tiny().config).is_ok(),
            Target::M2r2Folder => M2r2Weights::load_dir(dir, &seeds::tiny().config).is_ok(),
            Target::ExportFolder => onnx_runner::manifest::ExportDir::open(dir).is_ok_and(
                |export| matches!(export.tokenizer(), Ok(Some(tok)) if use_tokenizer(&tok)),
            ),
            _ => unreachable!("file targets are handled above"),
        }),
    }
}

/// Write `target`'s valid folder (the one whose files the folder targets replace) into `dir`.
pub fn write_valid_folder(target: Target, dir: &Path) {
    let base = seeds::base(target);
    for (name, bytes) in base.files.iter().chain(&base.fixed) {
        std::fs::write(dir.join(name), bytes).expect("write the valid folder");
    }
}

fn tokenizer_folder(dir: &Path) -> bool {
    Tokenizer::from_file(&dir.join("tokenizer.json")).is_ok_and(|tok| use_tokenizer(&tok))
}

/// What the CLI does with a tokenizer: encode, decode, render the chat template (`true` when all
/// of it worked; an out-of-range id to decode is also tried, and may fail).
fn use_tokenizer(tok: &Tokenizer) -> bool {
    let encoded = tok
        .encode("Hello <|im_start|>world\n\u{e9}\u{1f600}", true)
        .is_ok_and(|ids| tok.decode(&ids, false).is_ok());
    let _ = tok.decode(&[0, 1, 2, u32::MAX], true);
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Why is the sky blue?"),
    ];
    encoded && tok.apply_chat_template(&messages, true).is_ok()
}
