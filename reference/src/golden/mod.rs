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
//! Format versions. Version 1: greedy only. Version 2: the M2R2 modes (`early-exit`,
//! `speculative`), their extra tensors and metadata listed in `m2r2/mod.rs`. Version 3 (every golden
//! written now without a token tree) adds what a deployment's check needs:
//! - metadata `stop_tokens` (JSON ids the decode stops after, the model's end-of-turn tokens;
//!   `[]` when it was to run the whole budget, `--ignore-eos`) and `max_steps` (the budget); a
//!   file has fewer tokens than its budget only when the last is a stop token; older files ran
//!   the whole budget and do not say so;
//! - optional pins of the suite: `atol`, `rtol`, `expect_dtype` (the export precision it is for);
//! - speculative files: `verify_logits` and `draft_logits`, what the verifier and the draft
//!   produced along the recorded rounds (`m2r2/check.rs`), so that each graph is checked on its own.
//!
//! Version 4: speculative goldens that draft a token tree (`draft_length` = `tree`, the tree's
//! rounds and every node's verified row, [`m2r2::tree`]). Only those are written as version 4:
//! the other goldens keep version 3's layout and number, so readers of version 3 (an m2r2 from
//! before trees, the Python package) still read them.
//!
//! A reader of an older version refuses a newer file by its version; this one reads all five,
//! and a check of an older file reports what it lacks as skipped. It refuses what a file says
//! about itself that is not so (`metadata.rs`): a `config` that does not hash to
//! `config_hash`, a tensor or metadata key that no golden of its kind records, an `rtol` pinned
//! in an M2R2 golden (whose check takes atol alone).

use crate::base::config::ModelConfig;
use crate::error::{Error, Result};
use ndarray::Array2;

mod check;
mod compare;
mod file;
mod m2r2;
mod metadata;
mod record;
mod report;

pub use m2r2::{
    EngineGraphs, GraphOutputs, M2r2Golden, M2r2Record, RoundTensors, SpeculativeEngine,
    TreeEngine, TreeRecipe, TreeRounds, WeightsId, early_exit_logits, tree, weights_hash,
    weights_hash_without_defaults,
};
pub use report::{
    CheckReport, Divergence, StopRules, TensorCheck, Tolerance, compare, compare_int_rows,
    compare_ints, compare_rows, compare_stops, compare_within,
};

pub const GOLDEN_FORMAT: &str = "m2r2-golden";
/// The modes a golden records (metadata `mode`).
pub const GOLDEN_MODES: [&str; 3] = ["greedy", "early-exit", "speculative"];
/// The newest format version this reads.
pub const GOLDEN_FORMAT_VERSION: u32 = 5;
/// The version goldens without a token tree are written as (their layout has not changed since).
pub const WRITTEN_FORMAT_VERSION: u32 = 3;
/// The format version that introduced token-tree speculative goldens (written as such).
pub const TREE_FORMAT_VERSION: u32 = 4;
/// The format version that introduced token trees that change from round to round (grown per
/// branch, with a prompt-lookup branch), written as such; fixed trees stay version 4.
pub const GROWN_TREE_FORMAT_VERSION: u32 = 5;
/// The format version that introduced the M2R2 modes.
pub const M2R2_FORMAT_VERSION: u32 = 2;
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
    /// `stop_tokens`: the ids the decode stops after (the model's end-of-turn tokens); `[]` when
    /// it was to run the whole budget (`golden write --ignore-eos`); `None` for files before
    /// format version 3, which ran the whole budget without saying so.
    pub stop_tokens: Option<Vec<u32>>,
    /// `max_steps`: the token budget asked for (`None` before format version 3).
    pub max_steps: Option<usize>,
    /// The tolerance and precision the suite pins (format version 3).
    pub pins: Pins,
    /// The format version of the file it was read from; for a golden just recorded
    /// [`WRITTEN_FORMAT_VERSION`], or [`TREE_FORMAT_VERSION`] with a token tree. Written back as
    /// the same version.
    pub version: u32,
}

/// What a suite pins in its goldens so that a check does not take it from the thing under test
/// (metadata `atol`, `rtol`, `expect_dtype`; format version 3).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pins {
    pub atol: Option<f32>,
    pub rtol: Option<f32>,
    /// The weights precision of the export the golden is for (`f32`, `f16`).
    pub expect_dtype: Option<String>,
}

/// `text` (a value read from a file) as Rust's `{:?}` writes it, without the quotes, for a
/// message to quote between backticks: control characters show as `\u{1}` instead of reaching the
/// terminal raw, or being dropped by an XML report so that `gr\u{1}eedy` would read `greedy`.
pub fn shown(text: &str) -> String {
    let debug = format!("{text:?}");
    debug[1..debug.len() - 1].to_string()
}

impl Golden {
    /// The format version this golden is written as (the one it was read from).
    pub fn format_version(&self) -> u32 {
        self.version
    }

    /// The tokens a decode of this golden stops at (none for files before version 3).
    pub fn stops(&self) -> &[u32] {
        self.stop_tokens.as_deref().unwrap_or(&[])
    }

    /// The config recorded in the file.
    pub fn config(&self) -> Result<ModelConfig> {
        serde_json::from_str(&self.config_json)
            .map_err(|e| Error::format("golden metadata `config`", e.to_string()))
    }
}
