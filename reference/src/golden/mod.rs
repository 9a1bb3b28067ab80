//! Golden files: a decode recorded by the reference so that any other implementation (or a later
//! version of this one) can be checked against it, tensor by tensor.
//!
//! Format (safetensors). Every mode:
//! - `prompt_tokens`: I64 `[P]`
//! - `tokens`: I64 `[n]`, the emitted tokens
//! - `logits`: F32 `[n, V]`, row i is the distribution token i was chosen from
//! - metadata: `format = "m2r2-golden"`, `format_version`, `model` (name as given), `config_hash`
//!   ([`ModelConfig::hash`]), `config` (the config as JSON), `mode`, `m2r2_version`.
//!
//! `mode = greedy` files are format version 1 (unchanged since version 1, so older readers keep
//! reading them). The M2R2 modes (`early-exit`, `speculative`) are format version 2: their extra
//! tensors and metadata are listed in [`m2r2`]. A version-1 reader refuses them instead of checking
//! them as greedy decodes.

use crate::base::config::ModelConfig;
use crate::error::{Error, Result};
use ndarray::Array2;

mod check;
mod compare;
mod file;
mod m2r2;
mod record;

pub use check::{
    CheckReport, TensorCheck, Tolerance, compare, compare_ints, compare_padded, compare_within,
};
pub use m2r2::{M2r2Golden, M2r2Record, SpeculativeEngine, early_exit_logits, weights_hash};

pub const GOLDEN_FORMAT: &str = "m2r2-golden";
/// The newest format version this reads and writes (greedy files are still written as version 1).
pub const GOLDEN_FORMAT_VERSION: u32 = 2;
/// The format version of `mode = greedy` files.
pub const GREEDY_FORMAT_VERSION: u32 = 1;
/// Default tolerance of `golden check` on logits: f32 through a different but valid reduction order
/// (another BLAS, another runtime) moves logits by about 1e-5 on the small models; 1e-4 leaves room.
pub const DEFAULT_ATOL: f32 = 1e-4;

#[derive(Clone, Debug, PartialEq)]
pub struct Golden {
    pub model: String,
    pub config_hash: String,
    pub config_json: String,
    pub mode: String,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    /// `[n, V]`
    pub logits: Array2<f32>,
    /// The M2R2 mode's settings and per-step records; `None` for `mode = greedy`.
    pub m2r2: Option<M2r2Golden>,
    /// Who wrote the file (metadata `m2r2_version`): this crate's version for files the reference
    /// writes (and for a golden just recorded), `m2r2-golden-python X` for the Python package's;
    /// `None` for a file without the field.
    pub writer: Option<String>,
}

impl Golden {
    /// The format version this golden is written as.
    pub fn format_version(&self) -> u32 {
        if self.m2r2.is_some() {
            GOLDEN_FORMAT_VERSION
        } else {
            GREEDY_FORMAT_VERSION
        }
    }

    /// The config recorded in the file.
    pub fn config(&self) -> Result<ModelConfig> {
        serde_json::from_str(&self.config_json)
            .map_err(|e| Error::format("golden metadata `config`", e.to_string()))
    }
}
