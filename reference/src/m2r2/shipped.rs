//! Trained M2R2 weights that ship inside the crate, so that `--model smollm2` decodes
//! speculatively with trained adapters, ARLA and a pruned draft head without a download.
//!
//! The files are an ordinary M2R2 weights folder (`m2r2_config.json`, PEFT adapter, `arla.safetensors`,
//! `draft_head.json`, `bridge.safetensors`; table in [`crate::m2r2::weights`]) committed under `reference/assets/` in f16
//! and compiled into the binary with `include_bytes!`. This file only holds the bytes;
//! `M2r2Weights::load_shipped` writes them into a temporary folder and reads it with
//! `M2r2Weights::load_dir`, so shipped weights go through exactly the validation of a user's folder. `reference/assets/smollm2-m2r2/README.md` gives the command,
//! data and seed that reproduce them.

/// One file of a shipped weights folder.
pub struct ShippedFile {
    pub name: &'static str,
    pub bytes: &'static [u8],
}

/// A shipped M2R2 weights folder for one base model.
pub struct ShippedWeights {
    /// The `--model` name it belongs to.
    pub model: &'static str,
    /// Where it lives in the repository (for messages).
    pub path: &'static str,
    pub files: &'static [ShippedFile],
}

macro_rules! shipped_file {
    ($dir:literal, $name:literal) => {
        ShippedFile {
            name: $name,
            bytes: include_bytes!(concat!("../../assets/", $dir, "/", $name)),
        }
    };
}

/// SmolLM2-135M-Instruct: draft-gate adapters, ARLA, a pruned draft head and the bridge trained on
/// its own responses (docs/TRAINING.md).
pub const SMOLLM2: ShippedWeights = ShippedWeights {
    model: "smollm2",
    path: "reference/assets/smollm2-m2r2",
    files: &[
        shipped_file!("smollm2-m2r2", "m2r2_config.json"),
        shipped_file!("smollm2-m2r2", "adapter_config.json"),
        shipped_file!("smollm2-m2r2", "adapter_model.safetensors"),
        shipped_file!("smollm2-m2r2", "arla.safetensors"),
        shipped_file!("smollm2-m2r2", "draft_head.json"),
        shipped_file!("smollm2-m2r2", "bridge.safetensors"),
    ],
};

/// Every shipped folder.
pub const SHIPPED: [&ShippedWeights; 1] = [&SMOLLM2];

/// The shipped weights of the model called `model_name`, if any.
pub fn shipped_for(model_name: &str) -> Option<&'static ShippedWeights> {
    SHIPPED.into_iter().find(|s| s.model == model_name)
}
